"""The mixed-precision search: the budget is never exceeded, the choice is deterministic, groups move as
one, scores are cached by content, every metric runs on both backends, and the searched model is
closer to float than uniform int4 of the same size and than random assignments of the same budget."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from compiling import ROOT, compile_
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from compiler.compile_run import compile_recipe
from compiler.frontend import check_file
from compiler.resolve.mixed import Unit, bit_limit, cheapest, choose, search_units

MIXED = "recipes/tiny-llama-mixed.recipe"


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


# ---- the choice under a budget -------------------------------------------------------------------

@st.composite
def problems(draw):
    count = draw(st.integers(1, 12))
    choices = draw(st.integers(2, 4))
    units, losses = [], {}
    for i in range(count):
        params = draw(st.integers(1, 10_000))
        per_weight = sorted(draw(st.lists(st.floats(2.0, 16.0), min_size=choices, max_size=choices)))
        units.append(Unit(f"u{i}", (f"u{i}",), params, tuple(int(b * params) for b in per_weight)))
        losses[f"u{i}"] = draw(st.lists(st.floats(0.0, 10.0), min_size=choices, max_size=choices))
    low = sum(u.bits[cheapest(u)] for u in units) / sum(u.params for u in units)
    budget = draw(st.floats(low + 1e-6, 17.0))
    return units, losses, budget


@given(problems())
@settings(max_examples=200, deadline=None)
def test_budget_never_exceeded_and_no_affordable_improvement_left(problem):
    units, losses, budget = problem
    chosen = choose(units, losses, budget)
    total = sum(u.bits[chosen[u.name]] for u in units)
    assert total <= bit_limit(units, budget)
    assert total <= budget * sum(u.params for u in units)
    for u in units:  # greedy stops only when no single move that saves loss still fits
        now = chosen[u.name]
        for k, bits in enumerate(u.bits):
            if losses[u.name][k] < losses[u.name][now]:
                assert total + bits - u.bits[now] > bit_limit(units, budget)
    assert choose(units, losses, budget) == chosen  # deterministic


def test_greedy_spends_the_budget_on_the_most_loss_saved_per_bit():
    units = [Unit("big", ("big",), 100, (400, 800)), Unit("small", ("small",), 10, (40, 80))]
    losses = {"big": [1.0, 0.0], "small": [0.5, 0.0]}  # per extra bit: big 1/400, small 0.5/40
    chosen = choose(units, losses, 4.4)  # 440 + 44 bits allowed: only the small unit fits
    assert chosen == {"big": 0, "small": 1}


# ---- compile -------------------------------------------------------------------------------------

def _compile(recipe: str, out: Path, *sets: str):
    return compile_recipe(Path(recipe), sets, out, Console(quiet=True))


def test_groups_uniform_and_budget_respected_in_the_emitted_model(tmp_path):
    result, planned = _compile(MIXED, tmp_path / "m.onnx", f"memory.disk={tmp_path / 'cache'}")
    search = result.search
    assert search.average_bits <= search.budget_bits
    assert {u.chosen for u in search.units} == {"w4", "w8"}  # the budget forces a real trade
    instances = {}
    for a in result.assignment.layers:
        if a.group:
            instances.setdefault(a.group, set()).add(a.scheme.name)
    assert len(instances) == 2 and all(len(schemes) == 1 for schemes in instances.values())
    # in the emitted model, every Q/K/V MatMulNBits of one block has the same bits and block size
    model = onnx.load(str(tmp_path / "m.onnx"))
    formats = {}
    for node in model.graph.node:
        match = re.search(r"layers\.(\d+)\.self_attn\.[qkv]_proj", node.input[1] if len(node.input) > 1 else "")
        if node.op_type == "MatMulNBits" and match:
            attrs = {a.name: a.i for a in node.attribute}
            formats.setdefault(match.group(1), set()).add((attrs["bits"], attrs["block_size"]))
    assert formats and all(len(f) == 1 for f in formats.values())
    chosen = {u.unit: u.chosen for u in search.units}
    for a in result.assignment.layers:  # the emitted schemes are the search's
        unit = a.group or a.layer.name
        if unit in chosen:
            assert a.scheme.name == chosen[unit]


def _flat(output: str) -> str:
    """The CLI's output as one line: the summary table wraps its cells."""
    return " ".join(output.replace("│", " ").split())


@pytest.mark.slow
def test_deterministic_and_a_budget_sweep_reuses_the_scores(tmp_path):
    cache = f"memory.disk={tmp_path / 'cache'}"
    first = compile_(MIXED, tmp_path / "a.onnx", cache)
    assert first.exit_code == 0, first.output
    assert "scores from the cache" not in _flat(first.output)
    again = compile_(MIXED, tmp_path / "b.onnx", cache)
    assert "scores from the cache" in _flat(again.output)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    files = list((tmp_path / "cache" / "sensitivity").glob("*.json"))
    assert len(files) == 1
    wider = compile_(MIXED, tmp_path / "c.onnx", cache, "mixed_precision.budget=6")
    assert wider.exit_code == 0, wider.output
    assert "scores from the cache" in _flat(wider.output) and "(budget 6)" in _flat(wider.output)
    assert len(list((tmp_path / "cache" / "sensitivity").glob("*.json"))) == 1
    other = compile_(MIXED, tmp_path / "d.onnx", cache, "mixed_precision.metric=snr")  # new setting: scored anew
    assert "scores from the cache" not in _flat(other.output)
    assert len(list((tmp_path / "cache" / "sensitivity").glob("*.json"))) == 2


@pytest.mark.slow
def test_a_damaged_score_cache_is_scored_again(tmp_path):
    cache = f"memory.disk={tmp_path / 'cache'}"
    assert compile_(MIXED, tmp_path / "a.onnx", cache).exit_code == 0
    scores, = (tmp_path / "cache" / "sensitivity").glob("*.json")
    scores.write_text('{"model.layers.0.self_attn.{q,k,v}_proj": ["x"]')
    again = compile_(MIXED, tmp_path / "b.onnx", cache)
    assert again.exit_code == 0, again.output
    assert "scores from the cache" not in _flat(again.output)
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


@pytest.mark.parametrize("backend", ["onnx", "torch"])
@pytest.mark.parametrize("metric", ["snr", "mse", "kld"])
def test_every_metric_runs_on_both_backends(backend, metric, tmp_path):
    sets = [f"mixed_precision.metric={metric}", f"memory.disk={tmp_path / 'cache'}"]
    if backend == "torch":
        recipe = "recipes/tiny-llama-torch-mixed.recipe"
        out = tmp_path / "out"
    else:
        recipe, out = MIXED, tmp_path / "m.onnx"
    result, _ = _compile(recipe, out, *sets)
    search = result.search
    assert search.metric.value == metric and search.average_bits <= search.budget_bits
    assert len({u.chosen for u in search.units}) == 2
    assert all(np.isfinite(u.losses).all() for u in search.units)
    if metric != "kld" or backend == "onnx":  # losses: lower is better, so the widest choice never loses
        assert all(u.losses[1] <= u.losses[0] + 1e-12 for u in search.units)


def test_plan_shows_the_search_with_its_cost(tmp_path):
    from typer.testing import CliRunner

    from compiler.cli import app

    result = CliRunner().invoke(app, ["plan", MIXED])
    assert result.exit_code == 0, result.output
    text = _flat(result.output)
    assert "score_sensitivity" in text and "assign_precision" in text
    assert "forward passes" in text and "never above 5 bits" in text


# ---- quality at bench size -----------------------------------------------------------------------

BENCH = "builtin:tiny-llama?layers=8&hidden=512&heads=8&kv_heads=2&vocab=32000&intermediate=1376"
QUALITY = """recipe quality {{
    model "{model}"
    backend torch
    scheme w4 = W4A16 {{ weights int4 per_channel symmetric }}
    scheme w4g32 = W4A16 {{ group 32 }}
    scheme w8 = W8A16
    quantize {{
        "model.layers.*" -> {base}
        "lm_head" -> {base}
{extra}    }}
    {search}
    calibrate {{ data synthetic {{ samples 16 seqlen 64 }} chunk 8 }}
    verify {{ samples 8 metric kld at_most 10 }}
    emit "out" {{ format safetensors }}
}}
"""


def _quality(tmp_path: Path, name: str, base: str, search: str = "", promoted=()) -> dict[str, float]:
    extra = "".join(f'        "{layer}" -> w8\n' for layer in promoted)
    recipe = tmp_path / f"{name}.recipe"
    recipe.write_text(QUALITY.format(model=BENCH, base=base, extra=extra, search=search))
    result, _ = _compile(str(recipe), tmp_path / name, f"memory.disk={tmp_path / 'cache'}")
    return {"kld": result.verify["kld"], "cosine": result.verify["cosine"], "result": result}


@pytest.mark.slow
def test_searched_model_is_closer_to_float_than_uniform_int4_of_the_same_size_and_random(tmp_path):
    search = ('group "*.self_attn.{q,k,v}_proj"\n'
              "    mixed_precision { choices [w4, w8] metric kld budget 5 bits samples 16 }")
    searched = _quality(tmp_path, "searched", "w4", search)
    assert searched["result"].search.average_bits <= 5
    uniform = _quality(tmp_path, "uniform", "w4g32")  # int4 in groups of 32: 5.0 bits per weight, the same size
    assert searched["kld"] < uniform["kld"] and searched["cosine"] > uniform["cosine"]

    planned = check_file(tmp_path / "searched.recipe", with_model=True)
    units = search_units(planned.ir, planned.assignment)
    random = []
    for seed in range(3):  # the same budget filled in a random order
        losses = {u.name: [1.0, float(r)] for u, r in zip(units, np.random.default_rng(seed).random(len(units)), strict=True)}
        chosen = choose(units, {k: [v[0], 1.0 - v[1]] for k, v in losses.items()}, 5.0)
        promoted = [m for u in units if chosen[u.name] == 1 for m in u.members]
        random.append(_quality(tmp_path, f"random{seed}", "w4", promoted=promoted))
    assert searched["kld"] < np.mean([r["kld"] for r in random])
    assert searched["cosine"] > np.mean([r["cosine"] for r in random])
