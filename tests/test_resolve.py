"""Resolution units: last rule wins, group instances, promotion rank."""

from __future__ import annotations

from compiler import Source, check_source
from compiler.ir.schemes import NONE, PRESETS
from compiler.models.names import compress
from compiler.resolve.groups import auto_gate_up_instances, auto_qkv_instances, pattern_instances, scheme_rank


def _resolve(body: str):
    text = 'recipe r {\n model "builtin:tiny-llama"\n' + body + "\n}\n"
    return check_source(Source("t.recipe", text), with_model=True)


def test_last_matching_rule_wins_and_unmatched_layers_stay_float():
    result = _resolve('quantize { "*.mlp.*" -> W8A16  "*.down_proj" -> W4A16 }')
    a = result.assignment
    assert a.of("model.layers.0.mlp.up_proj").scheme.name == "W8A16"
    assert a.of("model.layers.0.mlp.down_proj").scheme.name == "W4A16"
    assert a.of("model.layers.0.mlp.down_proj").rule.index == 2
    assert a.of("lm_head").scheme is NONE and a.of("lm_head").rule is None


def test_type_selector_matches_kind_or_op():
    result = _resolve('quantize { type Linear -> W8A16  type Embedding -> none }')
    assert result.ok
    assert result.assignment.of("model.embed_tokens").rule.index == 2
    assert result.assignment.of("lm_head").scheme.name == "W8A16"


def test_promotion_gives_every_member_the_widest_scheme():
    result = _resolve('quantize { "*" -> W4A16  "*.v_proj" -> W8A16 }\n group "*.self_attn.{q,k,v}_proj"')
    q = result.assignment.of("model.layers.1.self_attn.q_proj")
    assert (q.scheme.name, q.promoted_from, q.group) == ("W8A16", "W4A16", "model.layers.1.self_attn.{q,k,v}_proj")
    assert [d.code for d in result.diagnostics] == ["Q211"]


def test_pattern_instances_one_per_block_with_missing_members():
    names = ["a.layers.0.attn.q", "a.layers.0.attn.k", "a.layers.1.attn.q", "a.layers.1.attn.k", "a.layers.1.attn.v"]
    instances = pattern_instances("*.attn.{q,k,v}", names)
    assert [(i.name, i.missing) for i in instances] == [("a.layers.0.attn.{q,k,v}", ("v",)),
                                                        ("a.layers.1.attn.{q,k,v}", ())]


def test_auto_qkv_spellings():
    names = ["enc.0.Wq", "enc.0.Wk", "enc.0.Wv", "bert.l.0.query", "bert.l.0.key", "bert.l.0.value",
             "dec.0.qkv_proj", "dec.0.o_proj"]
    found = {i.name: i.members for i in auto_qkv_instances(names)}
    assert found == {"enc.0.{Wq,Wk,Wv}": ("enc.0.Wq", "enc.0.Wk", "enc.0.Wv"),
                     "bert.l.0.{query,key,value}": ("bert.l.0.query", "bert.l.0.key", "bert.l.0.value")}


def test_auto_gate_up_finds_each_mlp_and_each_expert():
    names = ["m.layers.0.mlp.gate_proj", "m.layers.0.mlp.up_proj", "m.layers.0.mlp.down_proj",
             "m.layers.1.moe.experts.0.w1", "m.layers.1.moe.experts.0.w3", "m.layers.1.moe.experts.0.w2",
             "m.layers.1.moe.experts.1.w1", "m.layers.1.moe.gate", "m.layers.2.mlp.gate_up_proj", "x.w1"]
    found = {i.name: i.members for i in auto_gate_up_instances(names)}
    assert found == {"m.layers.0.mlp.{gate_proj,up_proj}": ("m.layers.0.mlp.gate_proj", "m.layers.0.mlp.up_proj"),
                     "m.layers.1.moe.experts.0.{w1,w3}": ("m.layers.1.moe.experts.0.w1", "m.layers.1.moe.experts.0.w3")}


def test_scheme_rank_order():
    w4_64 = PRESETS["W4A16"].__class__("w4_64", PRESETS["W4A16"].weights.__class__(
        PRESETS["W4A16"].weights.qtype, PRESETS["W4A16"].weights.granularity, 64, True), None,
        PRESETS["W4A16"].rounding)
    ordered = sorted([PRESETS["W8A8"], NONE, PRESETS["W4A16"], PRESETS["W8A16"], w4_64], key=scheme_rank)
    assert [s.name for s in ordered] == ["W4A16", "w4_64", "W8A8", "W8A16", "none"]


def test_compress_names():
    names = [f"model.layers.{i}.self_attn.{p}_proj" for i in (0, 1, 2, 5) for p in "qkv"]
    assert compress(names) == ["model.layers.[0-2,5].self_attn.{q,k,v}_proj"]
