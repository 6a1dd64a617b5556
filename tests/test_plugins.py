"""Plug-ins: a capability added from outside `compiler/` by registering it (compiler/plugins.py). Each toy here is
defined in this module only, and the recipe language, `qrc check`/`explain` and a compile take it by name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from typer.testing import CliRunner

from compiler.cli import app
from compiler.ir.methods import method_options
from compiler.plugins import CALIBRATION_METHODS

runner = CliRunner()
RECIPE = "recipes/tiny-llama-w8a8.recipe"


@dataclass(frozen=True, slots=True)
class ShrunkRange:
    """A toy calibration method: the running min/max, shrunk by `fraction`."""

    name: ClassVar[str] = "shrunk_range"
    summary: ClassVar[str] = "the running range times `fraction` (a test's toy)"
    settings: ClassVar[str] = "{ fraction F }"
    histogram: ClassVar[bool] = False
    grid_search: ClassVar[bool] = False
    fraction: float = 1.0

    @classmethod
    def configure(cls, decl, diags):
        found = method_options(decl, ("fraction",), diags)
        if "fraction" not in found:
            return cls()
        number = found["fraction"].value
        if not 0 < number.value <= 1:
            diags.error("Q209", f"`fraction {number.text}` is outside (0, 1]", number.span, "not a fraction",
                        help="write a fraction of the range, such as 0.5")
            return cls()
        return cls(number.value)

    def text(self) -> str:
        return f"method {self.name} {{ fraction {self.fraction:g} }}"

    def detail(self) -> str:
        return f"{self.name} × {self.fraction:g}"

    def range(self, observer, qtype, symmetric):
        found = observer.range()
        return None if found is None else (found[0] * self.fraction, found[1] * self.fraction)


@pytest.fixture
def shrunk_range():
    CALIBRATION_METHODS.register(ShrunkRange)
    yield ShrunkRange
    CALIBRATION_METHODS.unregister(ShrunkRange.name)


def _input_scales(path) -> dict[str, float]:
    """The scale of every QuantizeLinear in the emitted model (the inputs' ranges), by node name."""
    model = onnx.load(str(path))
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {n.name: float(values[n.input[1]]) for n in model.graph.node
            if n.op_type == "QuantizeLinear" and n.input[1] in values and values[n.input[1]].size == 1}


def test_a_calibration_method_from_outside_the_package_is_checked_explained_and_compiled(shrunk_range, tmp_path):
    setting = "calibrate.method=shrunk_range { fraction 0.5 }"
    checked = runner.invoke(app, ["check", RECIPE, "--set", setting, "--dump-ir"])
    assert checked.exit_code == 0, checked.output
    assert "method shrunk_range { fraction 0.5 }" in checked.output
    listed = runner.invoke(app, ["explain", "methods"]).output.splitlines()
    assert any(line.split(None, 1) == ["shrunk_range", "the running range times `fraction` (a test's toy)"]
               for line in listed), listed
    assert listed[listed.index(next(x for x in listed if x.startswith("shrunk_range"))) + 1].split() == \
        ["settings:", "{", "fraction", "F", "}"]

    wrong = runner.invoke(app, ["check", RECIPE, "--set", "calibrate.method=shrunk_range { fraction 3  bins 2 }"])
    assert wrong.exit_code == 2 and "Q209" in wrong.output and "`bins` is not a setting of `method shrunk_range`" \
        in wrong.output, wrong.output

    plain, shrunk = tmp_path / "minmax.onnx", tmp_path / "shrunk.onnx"
    for out, extra in ((plain, []), (shrunk, ["--set", setting])):
        done = runner.invoke(app, ["compile", RECIPE, "-o", str(out), "--set", "verify.at_least=0", *extra])
        assert done.exit_code == 0, done.output
    before, after = _input_scales(plain), _input_scales(shrunk)
    assert before and before.keys() == after.keys()
    ratios = np.array([after[k] / before[k] for k in before])
    assert np.allclose(ratios, 0.5, rtol=1e-5), ratios  # every input range is the toy's


def test_an_unknown_method_lists_the_registered_ones(shrunk_range):
    result = runner.invoke(app, ["check", RECIPE, "--set", "calibrate.method=shrunk"])
    assert result.exit_code == 2 and "Q107" in result.output and "did you mean `shrunk_range`?" in result.output


class NpzWriter:
    """A toy output writer: every tensor into one .npz file, staged beside the destination, moved in at commit."""

    def __init__(self, destination):
        self.destination = destination
        self.temp = destination.with_name(f".{destination.name}.qrc-tmp.npz")
        self.tensors: dict[str, np.ndarray] = {}
        self.keep, self.missing, self.where = False, set(), {}

    def specs(self):
        return []

    def put(self, name, tensor):
        self.tensors[name] = tensor.detach().cpu().numpy()

    put_float = put

    def put_encoded(self, name, data):
        raise NotImplementedError

    def copy_raw(self, name, *args, **kwargs):
        raise NotImplementedError

    def metadata(self, key, value):
        pass

    def finish(self):
        np.savez(self.temp, **self.tensors)
        return [self.temp]

    def commit(self):
        self.temp.replace(self.destination)
        return [self.destination]

    def abort(self):
        if not self.keep:
            self.temp.unlink(missing_ok=True)

    def written(self):
        return sorted(self.tensors)


class NpzTensors:
    """A toy torch output format: the rounded layers' tensors and the float rest, as arrays of one .npz file."""

    name = "npz_tensors"
    one_file = True
    path_help = "an .npz file path with `format npz_tensors`"
    emit_example = '`emit "out.npz" { format npz_tensors }`'
    opened_by_transformers = False
    verified_on = "qrc's model (an .npz of tensors has no loader)"
    planned_verified_on = "qrc's model (an .npz has no loader)"
    rounded_copy_verified = False
    encodes_whole_tensors = True

    @staticmethod
    def check(ir, assignment, diags):
        pass

    @staticmethod
    def keeps_own(qtype):
        return False

    @staticmethod
    def open(target, staged, resumed, attention):
        from compiler.backends.torch.formats import Opened
        return Opened(NpzWriter(target.output))

    @staticmethod
    def copies_beside_rounding(staging):
        return None

    @staticmethod
    def finish(staging, checked):
        replaced = {j.layer.weight for j in staging.jobs}
        for key in staging.model.shards.entries:
            if key not in replaced and key not in staging.writer.tensors:
                staging.writer.put(key, staging.model.shards.read(key))
        return []

    @staticmethod
    def check_staged(staging, checked):
        return None

    @staticmethod
    def rounding_scratch(w):
        return 0

    @staticmethod
    def file_scratch(w):
        return None


@pytest.fixture
def npz_tensors():
    from compiler.backends.torch.formats import TORCH_FORMATS
    from compiler.ir.types import EmitFormat
    from compiler.plugins import EMIT_FORMATS

    EMIT_FORMATS.register(EmitFormat("npz_tensors", ".npz", "every tensor as an array of one .npz (a test's toy)"))
    TORCH_FORMATS.register(NpzTensors)
    yield NpzTensors
    TORCH_FORMATS.unregister(NpzTensors.name)
    EMIT_FORMATS.unregister(NpzTensors.name)


TOY_FORMAT_RECIPE = """recipe toy_format {
    model "builtin:tiny-llama"
    backend torch
    quantize { type Linear -> W8A16   "lm_head" -> none }
    verify { samples 4  metric cosine  at_least 0.9 }
    emit "EMIT" { format npz_tensors }
}
"""


def test_an_output_format_from_outside_the_package_is_checked_planned_and_compiled(npz_tensors, tmp_path):
    recipe = tmp_path / "toy.recipe"
    recipe.write_text(TOY_FORMAT_RECIPE.replace("EMIT", str(tmp_path / "out.npz")))
    listed = runner.invoke(app, ["explain", "formats"]).output
    assert "npz_tensors" in listed and "safetensors" in listed, listed
    assert runner.invoke(app, ["check", str(recipe)]).exit_code == 0
    onnx = runner.invoke(app, ["check", str(recipe), "--set", "backend=onnx"])
    assert onnx.exit_code == 2 and "Q220" in onnx.output  # the ONNX backend does not write it
    planned = runner.invoke(app, ["plan", str(recipe), "--format", "text"])
    assert planned.exit_code == 0 and "write npz_tensors to" in planned.output, planned.output

    done = runner.invoke(app, ["compile", str(recipe)])
    assert done.exit_code == 0, done.output
    arrays = np.load(tmp_path / "out.npz")
    assert not (tmp_path / ".out.npz.qrc-tmp.npz").exists()
    q = "model.layers.0.self_attn.q_proj"
    # rounded and packed as the rounder hands them to any format (compressed-tensors' names: pack-quantized int8)
    assert arrays[f"{q}.weight_packed"].dtype == np.int32 and f"{q}.weight_scale" in arrays and f"{q}.weight" not in arrays
    assert arrays["lm_head.weight"].dtype == np.float32  # left float, copied by the format's finish


def test_an_unknown_output_format_is_named_with_the_registered_ones(tmp_path):
    result = runner.invoke(app, ["check", RECIPE, "--set", "emit.format=ggfu"])
    assert result.exit_code == 2 and "unknown keyword `ggfu`" in result.output and "did you mean `gguf`?" in result.output
    result = runner.invoke(app, ["check", RECIPE, "--set", "emit.format=zzz"])
    assert "expected one of `gguf`, `matmul_nbits`, `qdq` or `safetensors`" in result.output, result.output


def _halved(choice):
    """A toy rounding method's scale choice: each block's range halved (its largest values clip)."""
    return choice.at(0.5)


@pytest.fixture
def halved_range():
    from compiler.ir.types import Rounding
    from compiler.plugins import ROUNDINGS

    method = ROUNDINGS.register(Rounding("halved_range", "each block's range halved (a test's toy)", scales=_halved))
    yield method
    ROUNDINGS.unregister(method.name)


TOY_ROUNDING_RECIPE = """recipe toy_rounding {
    model "builtin:tiny-llama"
    backend BACKEND
    scheme w8 { weights int8 per_channel symmetric  rounding ROUNDING }
    quantize { type Linear -> w8   "lm_head" -> none }
    emit "EMIT"
}
"""


def _weight_scales(path, backend: str) -> dict[str, np.ndarray]:
    """Every quantized weight's scales in the emitted model, by layer."""
    if backend == "onnx":
        model = onnx.load(str(path))
        values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        return {n.input[0]: values[n.input[1]] for n in model.graph.node
                if n.op_type == "DequantizeLinear" and n.input[0] in values and values[n.input[0]].ndim == 2}
    from safetensors.numpy import load_file

    tensors = load_file(str(path / "model.safetensors"))
    return {k: v for k, v in tensors.items() if k.endswith(".weight_scale")}


@pytest.mark.parametrize("backend, emit", [("onnx", "out.onnx"), pytest.param("torch", "out", marks=pytest.mark.slow)])
def test_a_rounding_method_from_outside_the_package_is_checked_and_compiled(halved_range, tmp_path, backend, emit):
    scales = {}
    for rounding in ("rtn", "halved_range"):
        recipe = tmp_path / f"{rounding}.recipe"
        out = tmp_path / rounding / emit
        recipe.write_text(TOY_ROUNDING_RECIPE.replace("BACKEND", backend).replace("ROUNDING", rounding)
                          .replace("EMIT", str(out)))
        checked = runner.invoke(app, ["check", str(recipe), "--dump-ir"])
        assert checked.exit_code == 0 and f"rounding {rounding}" in checked.output, checked.output
        done = runner.invoke(app, ["compile", str(recipe)])
        assert done.exit_code == 0, done.output
        scales[rounding] = _weight_scales(out, backend)
    assert scales["rtn"] and scales["rtn"].keys() == scales["halved_range"].keys()
    for name, rtn in scales["rtn"].items():  # every block's scale is the toy's: half of rtn's
        assert np.allclose(scales["halved_range"][name].astype(np.float32), 0.5 * rtn.astype(np.float32),
                           rtol=1e-2), name
    assert "halved_range" in runner.invoke(app, ["explain", "roundings"]).output


def test_a_plug_in_rounding_is_refused_where_the_format_rounds_its_own_way(halved_range, tmp_path):
    recipe = tmp_path / "fp8.recipe"
    recipe.write_text(TOY_ROUNDING_RECIPE.replace("BACKEND", "torch").replace("EMIT", str(tmp_path / "out"))
                      .replace("int8 per_channel symmetric  rounding ROUNDING", "fp8 per_channel  rounding halved_range"))
    result = runner.invoke(app, ["check", str(recipe)])
    assert result.exit_code == 2 and "Q256" in result.output and "not halved_range" in result.output, result.output


def _doubled(stats, weights, transform):
    """A toy transform's scales: every input channel divided by 2, its weight columns times 2."""
    return np.full(weights[0].shape[1], 2.0, np.float32)


@pytest.fixture
def doubled_weights():
    from compiler.ir.types import TransformKind
    from compiler.plugins import TRANSFORMS

    kind = TRANSFORMS.register(TransformKind("doubled_weights", "inputs halved into weights doubled (a test's toy)",
                                             (), scales=_doubled))
    yield kind
    TRANSFORMS.unregister(kind.name)


TOY_TRANSFORM_RECIPE = """recipe toy_transform {
    model "builtin:tiny-llama"
    backend torch
    TRANSFORM
    quantize { type Linear -> W8A16   "lm_head" -> none }
    calibrate { data synthetic { samples 8  seqlen 16 } }
    emit "EMIT"
}
"""


@pytest.mark.slow  # 3-8 s: kept out of the quick loop's 3 minutes on a 2-core machine without AMX (2026-12-04)
def test_a_transform_from_outside_the_package_is_checked_and_compiled(doubled_weights, tmp_path):
    from safetensors.numpy import load_file

    folders = {}
    for name, transform in (("plain", ""), ("doubled", "transform doubled_weights")):
        recipe = tmp_path / f"{name}.recipe"
        folders[name] = tmp_path / name
        recipe.write_text(TOY_TRANSFORM_RECIPE.replace("TRANSFORM", transform).replace("EMIT", str(folders[name])))
        checked = runner.invoke(app, ["check", str(recipe), "--dump-ir"])
        assert checked.exit_code == 0, checked.output
        done = runner.invoke(app, ["compile", str(recipe)])
        assert done.exit_code == 0, done.output
    assert "transform doubled_weights {" in checked.output and "doubled_weights folded into" in done.output
    plain, doubled = (load_file(str(folders[n] / "model.safetensors")) for n in ("plain", "doubled"))
    norm = "model.layers.0.input_layernorm.weight"
    assert np.allclose(doubled[norm], plain[norm] / 2)  # the inputs halved where the norm makes them
    q = "model.layers.0.self_attn.q_proj.weight_scale"
    assert np.allclose(doubled[q].astype(np.float32), 2 * plain[q].astype(np.float32), rtol=1e-2)  # the weights doubled
    misspelled = tmp_path / "misspelled.recipe"
    misspelled.write_text(TOY_TRANSFORM_RECIPE.replace("TRANSFORM", "transform doubled_weight").replace("EMIT", "out"))
    wrong = runner.invoke(app, ["check", str(misspelled)])
    assert wrong.exit_code == 2 and "did you mean `doubled_weights`?" in wrong.output, wrong.output
    assert "doubled_weights" in runner.invoke(app, ["explain", "transforms"]).output


def test_registered_values_unpickle_as_the_registered_ones(halved_range):
    """torchrun's ranks and worker processes receive the IR pickled: `is` must still compare its registered values."""
    import pickle

    from compiler.ir.types import EmitFormat, Rounding, TransformKind

    for value in (EmitFormat.GGUF, Rounding.GPTQ, TransformKind.AWQ, halved_range):
        assert pickle.loads(pickle.dumps(value)) is value
    assert str(Rounding.GPTQ) == "gptq"


@pytest.fixture
def int6():
    from compiler.ir.types import QType
    from compiler.plugins import QTYPES

    qtype = QTYPES.register(QType("int6", "6-bit signed integers (a test's toy)", 6))
    yield qtype
    QTYPES.unregister(qtype.name)


TOY_TYPE_RECIPE = """recipe toy_type {
    model "builtin:tiny-llama"
    backend BACKEND
    scheme w6 { weights int6 per_channel symmetric }
    quantize { type Linear -> w6   "lm_head" -> none }
    verify { samples 4  metric cosine  at_least 0.99 }
    emit "EMIT"
}
"""


def test_a_scheme_type_from_outside_the_package_is_checked_and_compiled(int6, tmp_path):
    import json

    from safetensors.numpy import load_file

    from compiler.quant.pack_int32 import unpack_from_int32

    recipe = tmp_path / "int6.recipe"
    out = tmp_path / "out"
    recipe.write_text(TOY_TYPE_RECIPE.replace("BACKEND", "torch").replace("EMIT", str(out)))
    checked = runner.invoke(app, ["check", str(recipe), "--dump-ir"])
    assert checked.exit_code == 0 and "weights int6 per_channel symmetric" in checked.output, checked.output
    done = runner.invoke(app, ["compile", str(recipe)])
    assert done.exit_code == 0, done.output  # verified on qrc's model: cosine at least 0.99
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert next(iter(config["config_groups"].values()))["weights"]["num_bits"] == 6
    tensors = load_file(str(out / "model.safetensors"))
    q = "model.layers.0.self_attn.q_proj"
    inputs = int(tensors[f"{q}.weight_shape"][1])
    assert tensors[f"{q}.weight_packed"].shape[1] == -(-inputs * 6 // 32)  # six bits a weight
    values = unpack_from_int32(tensors[f"{q}.weight_packed"], 6, inputs)
    assert values.min() >= -32 and values.max() <= 31 and (np.abs(values) > 7).any()  # beyond int4's grid

    onnx_recipe = tmp_path / "int6-onnx.recipe"
    onnx_recipe.write_text(TOY_TYPE_RECIPE.replace("BACKEND", "onnx").replace("EMIT", str(tmp_path / "out.onnx")))
    refused = runner.invoke(app, ["check", str(onnx_recipe)])
    assert refused.exit_code == 2 and "Q257" in refused.output and "int6" in refused.output, refused.output
    assert "int6" in runner.invoke(app, ["explain", "types"]).output


INSTALLED_PLUGIN = '''"""A plug-in as a package installs it: registered when qrc imports it."""
from compiler.ir.types import Rounding
from compiler.plugins import ROUNDINGS

ROUNDINGS.register(Rounding("installed_toy", "each block's range times 0.75 (an installed toy)",
                            scales=lambda choice: choice.at(0.75)))
'''


def test_installed_plug_ins_are_loaded_from_their_entry_points_and_a_broken_one_is_reported(tmp_path):
    """A package declares its module in the entry-point group `qrc.plugins`: `qrc` imports it at start, so the
    command line (and torchrun's ranks, which run it too) know its names; one that cannot be imported is Q450."""
    import os
    import subprocess
    import sys

    (tmp_path / "toy_qrc_plugin.py").write_text(INSTALLED_PLUGIN)
    info = tmp_path / "toy_qrc_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-qrc-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[qrc.plugins]\ntoy = toy_qrc_plugin\nbroken = no_such_qrc_module\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}

    def qrc(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "compiler", *args], capture_output=True, text=True, env=env,
                              timeout=120)

    listed = qrc("explain", "roundings")
    assert listed.returncode == 0 and "installed_toy" in listed.stdout, listed.stdout + listed.stderr
    recipe = tmp_path / "r.recipe"
    recipe.write_text(TOY_ROUNDING_RECIPE.replace("BACKEND", "onnx").replace("ROUNDING", "installed_toy")
                      .replace("EMIT", str(tmp_path / "out.onnx")))
    checked = qrc("check", str(recipe))
    out = checked.stdout + checked.stderr
    assert checked.returncode == 0, out  # the installed method is known; the broken plug-in is a warning
    assert "warning[Q450]" in out and "broken = no_such_qrc_module" in out and "ModuleNotFoundError" in out, out


@pytest.mark.slow
def test_a_plug_in_types_folder_loads_in_transformers(int6, tmp_path):
    """The toy type's output where users run it: a random-weight Llama folder rounded to int6 is verified on the
    emitted folder as transformers loads it (compressed-tensors unpacks six bits a weight)."""
    import torch
    import transformers

    folder = tmp_path / "llama"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=128, tie_word_embeddings=False)
    ).eval().save_pretrained(folder)
    recipe = tmp_path / "r.recipe"
    recipe.write_text(TOY_TYPE_RECIPE.replace('"builtin:tiny-llama"', f'"{folder}"').replace("BACKEND", "torch")
                      .replace("per_channel", "group 64").replace("EMIT", str(tmp_path / "out")))
    done = runner.invoke(app, ["compile", str(recipe)])
    assert done.exit_code == 0, done.output
    said = re.sub(r"[│\s]+", " ", done.output)  # the summary box's lines joined
    assert "measured on the emitted folder, loaded as transformers loads it" in said, said
    assert "Q267" in done.output  # and says vLLM has no kernel for it
