"""Plug-ins: a capability added from outside `compiler/` by registering it (compiler/plugins.py). Each toy here is
defined in this module only, and the recipe language, `qrc check`/`explain` and a compile take it by name."""

from __future__ import annotations

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
