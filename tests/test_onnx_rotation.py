"""QuaRot's rotations on the ONNX backend (compiler/backends/onnx/rotation.py): R1 and R2 folded into a copy of the
graph's initializers, R4 run in the graph before each down projection. A rotated float graph computes what the
original does (every layer `-> none`: the output is the rotated model itself); a quantized one calibrates, rounds and
verifies on the rotated graph, whose down projections read their rotated inputs through their input quantizers;
`qrc plan` shows the rotated copy with its memory and time. Exported decoders (onnxruntime-genai's builder with
GroupQueryAttention, torch.onnx's with a tied head): tests/test_onnx_decoders.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from compiling import runner

from compiler.cli import app
from compiler.models import builtin

ort = pytest.importorskip("onnxruntime")

MODEL = "builtin:tiny-llama?layers=2&hidden=64&intermediate=128&heads=4&kv_heads=2&vocab=256"
RECIPE = """recipe rotated {{
    model "{model}"
    backend onnx
    {transform}
    quantize {{ type Linear -> {scheme} {head} }}
    {data}
    emit "{out}"
}}
"""
DATA = "calibrate { data synthetic { samples 8  seqlen 32 } }  verify { samples 4  metric cosine  at_least 0.95 }"


def _compile(tmp_path, settings: str | None, scheme: str = "none", data: str = "", command: str = "compile",
             model: str = MODEL):
    """`qrc compile` (or `plan`) of the recipe with `transform quarot {settings}` (None: no transform)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out" / "model.onnx"
    recipe = tmp_path / "r.recipe"
    head = '"lm_head" -> none' if scheme != "none" else ""
    transform = f"transform quarot {{ {settings} }}" if settings is not None else ""
    recipe.write_text(RECIPE.format(model=model, transform=transform, scheme=scheme, head=head, data=data, out=out))
    result = runner.invoke(app, [command, str(recipe)])
    assert result.exit_code == 0, result.output
    return out, result.output


def _logits(path, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    return session.run(None, {k: v for k, v in feed.items() if k in names})[0]


@pytest.mark.parametrize("settings", ["", "online r4", "online r4  block 16"])
def test_a_rotated_float_graph_computes_what_the_original_does(tmp_path, settings):
    """R1 + R2 (+ R4 online, + block-diagonal): the written float model's logits are the original's to float32's
    rounding, and R4 is a graph of its own before each down projection."""
    out, _ = _compile(tmp_path, settings)
    ids = np.random.RandomState(0).randint(0, 256, (2, 16)).astype(np.int64)
    original, rotated = _logits(builtin.onnx_path(MODEL), ids), _logits(out, ids)
    assert np.abs(rotated - original).max() <= 1e-4 * np.abs(original).max()
    graph = onnx.load(str(out), load_external_data=False).graph
    online = [n for n in graph.node if "qrc.online_r4" in n.name and n.op_type == "MatMul"]
    assert len(online) == (2 * 2 if "r4" in settings else 0)  # two products a down projection, two blocks
    norms = {t.name: t for t in graph.initializer if "layernorm" in t.name}
    assert norms and all(np.all(onnx.numpy_helper.to_array(t, str(out.parent)) == 1) for t in norms.values())


def test_w8a8_with_online_r4_calibrates_the_rotated_inputs_and_verifies(tmp_path):
    """Static W8A8: each down projection's input quantizer reads the online rotation's output, and the emitted
    model verifies in onnxruntime against the float one."""
    out, output = _compile(tmp_path, "online r4", "W8A8_STATIC", DATA)
    assert "verify" in output and "passed" in output
    assert "quarot: R1 64-wide, R2 16-wide, R4 128-wide, online" in output  # the summary's transform line
    graph = onnx.load(str(out), load_external_data=False).graph
    made = {o: n for n in graph.node for o in n.output}
    for node in graph.node:
        if node.op_type == "MatMul" and "down_proj" in node.name:
            dequantized = made[node.input[0]]
            assert dequantized.op_type == "DequantizeLinear"
            assert "qrc.online_r4" in made[made[dequantized.input[0]].input[0]].name  # Q(x·D), then DQ


def test_the_plan_shows_the_rotated_copy_with_its_memory_and_time(tmp_path):
    """`qrc plan` (no weight read): the load op writes the rotated copy first, and its time and peak count it."""
    from compiler.frontend import plan_file
    from compiler.plan.ops import LoadModel

    model = "builtin:tiny-llama?layers=8&hidden=1024&intermediate=2816&heads=8&kv_heads=4&vocab=16384"
    loads = []
    for name, settings in (("plain", None), ("rotated", "online r4")):
        _compile(tmp_path / name, settings, "W8A8_STATIC", DATA, "plan", model)
        planned = plan_file(tmp_path / name / "r.recipe", detected_free=16 << 30)
        assert planned.ok and planned.plan is not None
        loads.append(next(op for op in planned.plan.ops if isinstance(op, LoadModel)))
    plain, rotated = loads
    assert "every weight rotated into a copy of the model written first" in rotated.summary
    assert "the down projections' inputs by a 2816-wide one, online" in rotated.summary
    assert rotated.seconds > plain.seconds == 0.0
    assert rotated.peak_bytes > plain.peak_bytes + 2 * 4 * 16384 * 1024  # the embedding read and rotated, float32


def test_a_config_that_misstates_the_heads_stops_the_rotation_before_anything_is_written(tmp_path):
    """R2 turns blocks of the head width the config beside the graph gives: one that says 1 key/value head of 32
    where the graph has 2 of 16 fits every shape, and would rotate across heads. The rotated copy is run against the
    original on a few synthetic tokens first: Q422, and no output."""
    import json

    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(onnx.load(str(builtin.onnx_path(MODEL))), str(folder / "model.onnx"))  # weights inside the file
    (folder / "config.json").write_text(json.dumps({"num_attention_heads": 2, "num_key_value_heads": 1}))
    out = tmp_path / "out" / "model.onnx"
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model=folder / "model.onnx", transform="transform quarot", scheme="none", head="",
                                    data="", out=out))
    result = runner.invoke(app, ["compile", str(recipe)])
    assert result.exit_code == 2, result.output
    assert "Q422" in result.output and "Traceback" not in result.output
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_no_room_for_the_rotated_copy_is_said_at_check(tmp_path, monkeypatch):
    """The rotated copy goes to the temporary folder before anything else: `qrc check` says when it has no room
    for one more copy of the weights (Q417), rather than a compile failing on a full disk."""
    import collections

    import compiler.backends.onnx.rotation_check as rotation_check

    _compile(tmp_path, "online r4", command="check")  # room enough here
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(rotation_check.shutil, "disk_usage", lambda _: usage(1 << 20, 1 << 20, 1024))
    result = runner.invoke(app, ["check", str(tmp_path / "r.recipe")])
    assert result.exit_code == 2 and "Q417" in result.output and "rotated copy" in result.output, result.output
    # with `memory { disk }` the copy goes there (a folder the run makes: its nearest existing parent is measured)
    disk = tmp_path / "scratch" / "qrc"
    (tmp_path / "scratch").mkdir()
    recipe = tmp_path / "r.recipe"
    recipe.write_text(recipe.read_text().replace("    emit ", f'    memory {{ disk "{disk}" }}\n    emit ', 1))
    roomy = usage(1 << 40, 0, 1 << 40)
    monkeypatch.setattr(rotation_check.shutil, "disk_usage",
                        lambda folder: usage(1 << 20, 1 << 20, 1024) if Path(folder) == disk.parent else roomy)
    result = runner.invoke(app, ["check", str(recipe)], env={"COLUMNS": "300"})
    assert result.exit_code == 2 and f"in `{disk.parent}`" in result.output, result.output


def test_no_room_for_the_smoothed_copy_is_said_at_check(tmp_path, monkeypatch):
    """SmoothQuant on the ONNX backend writes a smoothed copy of the model first, as a rotation does: `qrc check`
    says when its folder has no room for it (Q417), with R4 after it or without."""
    import collections

    import compiler.backends.onnx.rotation_check as rotation_check

    usage = collections.namedtuple("usage", "total used free")
    for online in ("online r4", ""):
        recipe = tmp_path / "r.recipe"
        recipe.write_text(RECIPE.format(model=MODEL, transform=f"transform smoothquant {{ alpha 0.7  {online} }}",
                                        scheme="W8A8_STATIC", head='"lm_head" -> none', data=DATA,
                                        out=tmp_path / "out" / "model.onnx"))
        monkeypatch.setattr(rotation_check.shutil, "disk_usage", lambda _: usage(1 << 40, 0, 1 << 40))
        assert runner.invoke(app, ["check", str(recipe)]).exit_code == 0  # room enough
        monkeypatch.setattr(rotation_check.shutil, "disk_usage", lambda _: usage(1 << 20, 1 << 20, 1024))
        result = runner.invoke(app, ["check", str(recipe)])
        assert result.exit_code == 2 and "Q417" in result.output and "smoothed copy" in result.output, result.output


def _smoothed(tmp_path, online: str = "online r4"):
    """`qrc compile` of static W8A8 after `transform smoothquant { alpha 0.7  online r4 }` (or without R4); the
    result."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(RECIPE.format(model=MODEL, transform=f"transform smoothquant {{ alpha 0.7  {online} }}",
                                    scheme="W8A8_STATIC", head='"lm_head" -> none', data=DATA,
                                    out=tmp_path / "out" / "model.onnx"))
    return runner.invoke(app, ["compile", str(recipe)])


def test_smoothquant_then_online_r4_turns_every_down_projection_and_verifies(tmp_path):
    """R4 alone after SmoothQuant's fold: each down projection's weight W·diag(s)·D and its input turned by D in the
    graph (QuaRot's R4 nodes), its input quantizer reading x·D; the emitted model verifies against the float one,
    and its down weights, dequantized, are the unrotated compile's turned by D (the same smoothing: its statistics
    are gathered before R4)."""
    from compiler.quant.rotations import Turn

    result = _smoothed(tmp_path / "r4")
    assert result.exit_code == 0 and "passed" in result.output, result.output
    assert "each down projection's input turned online" in result.output
    plain = _smoothed(tmp_path / "plain", "")
    assert plain.exit_code == 0, plain.output
    graphs = {}
    for name in ("r4", "plain"):
        out = tmp_path / name / "out" / "model.onnx"
        graphs[name] = onnx.load(str(out))
    made = {o: n for n in graphs["r4"].graph.node for o in n.output}
    downs = [n for n in graphs["r4"].graph.node if n.op_type == "MatMul" and "down_proj" in n.name]
    assert len(downs) == 2
    for node in downs:
        dequantized = made[node.input[0]]
        assert "qrc.online_r4" in made[made[dequantized.input[0]].input[0]].name  # DQ(Q(x·D))
    d = Turn.seeded(128, 2)  # the torch backend's D for QuaRot's seed 0: seed + 2

    def down_weights(model) -> list[np.ndarray]:
        inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
        made_here = {o: n for n in model.graph.node for o in n.output}
        out = []
        for node in model.graph.node:
            if node.op_type == "MatMul" and "down_proj" in node.name:
                dq = made_here[node.input[1]]
                q, scale = inits[dq.input[0]], inits[dq.input[1]]
                out.append((q.astype(np.float32) * scale).T)  # [out, in], per output channel
        return out

    for turned, plain_w in zip(down_weights(graphs["r4"]), down_weights(graphs["plain"]), strict=True):
        expected = d.right(plain_w)
        assert np.abs(turned - expected).max() <= 0.02 * np.abs(expected).max()


def test_a_broken_online_turn_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """The smoothed and turned copy is run against the original on one chunk before calibration: with the weights
    turned but the graph not turning their inputs, Q422 and no output."""
    from compiler.backends.onnx.rotation import OnlineDown

    monkeypatch.setattr(OnlineDown, "edit", lambda self, model: None)
    result = _smoothed(tmp_path)
    assert result.exit_code == 2 and "Q422" in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
