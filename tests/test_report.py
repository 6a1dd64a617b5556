"""`--report`: the Markdown report of a compile and of a plan (goldens: no dates, no absolute paths), the
HTML report opened in headless Chromium (no console messages, one SVG point per RSS sample, a
screenshot), and report paths refused before any work."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from compiling import ROOT, runner

from compiler.cli import app
from golden import assert_golden

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# A report of the same work reads the same, but for what was measured: memory and time.
MEASURED = [(re.compile(r"(\*\*(measured peak RSS|RSS samples|time)\*\*: ).*"), r"\1<measured>"),
            (re.compile(r"\(\d+ samples\)"), "(<measured> samples)"),
            (re.compile(r"measured \d[\d.]* (s|min)( \d+ s)?"), "measured <time>"),
            (re.compile(r"^.*Q447.*\n\n?", re.M), "")]  # a run past its plan (a loaded machine) is said; not golden


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


# What calibration and verification compute through onnxruntime is compared within a tolerance (`~x`,
# tests/golden.py): observed activation ranges and the verification figures.
CALIBRATED = [(re.compile(r"\[(-?[\d.e+-]+), (-?[\d.e+-]+)\] \|$", re.M), r"[~\1, ~\2] |"),
              (re.compile(r"^(- \*\*[\w ()._]+\*\*: )(-?[\d.e+-]+)", re.M), r"\1~\2")]


def _measured_masked(text: str) -> str:
    for pattern, replacement in MEASURED:
        text = pattern.sub(replacement, text)
    head, verification, rest = text.partition("## Verification")
    head = CALIBRATED[0][0].sub(CALIBRATED[0][1], head)
    return head + verification + CALIBRATED[1][0].sub(CALIBRATED[1][1], rest)


def test_compile_report_markdown_golden(tmp_path):
    # uint8 weights: onnxruntime's U8U8 kernel sums exactly on every x86 CPU, so the verification figures
    # agree between CI machines with and without VNNI (int8 weights' U8S8 kernel saturates without it)
    report = tmp_path / "report.md"
    result = runner.invoke(app, ["compile", "recipes/tiny-llama-w8a8-u8u8.recipe", "-o", str(tmp_path / "m.onnx"),
                                 "--set", "memory.ram=4GiB", "--report", str(report)])
    assert result.exit_code == 0, result.output
    text = report.read_text()
    assert str(tmp_path) not in text and str(ROOT) not in text
    assert "observed" in text and "weight SQNR dB" in text and "passed" in text
    assert_golden(_measured_masked(text), "reports/tiny-llama-w8a8-u8u8.compile.md")


def test_plan_report_markdown_golden(tmp_path):
    report = tmp_path / "plan.md"
    result = runner.invoke(app, ["plan", "recipes/tiny-llama-mixed.recipe", "--set", "memory.ram=4GiB",
                                 "--report", str(report)])
    assert result.exit_code == 0, result.output
    text = report.read_text()
    assert "Nothing was run" in text and "measured peak" not in text and "Verification" not in text
    assert_golden(text, "reports/tiny-llama-mixed.plan.md")


@pytest.mark.slow
def test_failed_verification_still_reports_how_it_fell_short(tmp_path):
    report = tmp_path / "report.md"
    result = runner.invoke(app, ["compile", "recipes/tiny-llama-w8a8.recipe", "-o", str(tmp_path / "m.onnx"),
                                 "--set", "verify.at_least=0.9999", "--report", str(report)])
    assert result.exit_code == 2 and "Q501" in result.output
    text = report.read_text()
    assert "top1 (at_least 0.9999)" in text and "FAILED" in text and "measured peak RSS" in text
    # the layers that cost the most, measured on the held-out samples, so the reader knows what to widen
    costliest = text.split("adds the most error")[1].split("## ")[0]
    assert costliest.count("| model.layers.") >= 3, costliest


def test_report_spells_out_schemes_and_recipe_and_marks_layers_the_search_moved(tmp_path):
    """A reader of `w4` sees its definition; the recipe as compiled is in the report; layers the mixed-precision
    search gave another scheme than their rule say so."""
    report = tmp_path / "report.md"
    result = runner.invoke(app, ["compile", "recipes/tiny-llama-mixed.recipe", "-o", str(tmp_path / "m.onnx"),
                                 "--set", "memory.ram=4GiB", "--report", str(report)])
    assert result.exit_code in (0, 2), result.output
    text = report.read_text()
    assert "| w4 | weights int4 group 64 symmetric | activations none | rounding rtn |" in text
    assert "## Recipe" in text and "mixed_precision {" in text and "choices [w4, w8]" in text
    moved = re.findall(r"\| (\S+) \| [^|]+ \| [^|]+ \| w8 \(search: from w4\) \|", text)
    assert moved, text


@pytest.mark.parametrize("bad", ["report.pdf", "reports"])
def test_report_path_refused_before_any_work(bad, tmp_path):
    (tmp_path / "reports").mkdir()
    out = tmp_path / "m.onnx"
    result = runner.invoke(app, ["compile", "recipes/tiny-llama-w8a8.recipe", "-o", str(out),
                                 "--report", str(tmp_path / bad)])
    assert result.exit_code == 2
    assert "Q239" in result.output and "Traceback" not in result.output
    assert not out.exists()


class _Dom(HTMLParser):
    """The SVG series and figure captions of the rendered page."""

    def __init__(self):
        super().__init__()
        self.series: dict[str, tuple[int, str]] = {}
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("class") == "series":
            self.series[a["data-name"]] = (int(a["data-points"]), a.get("points", ""))

    def handle_data(self, data):
        self.text.append(data)


def _chromium(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a browser starts: 4 s
@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="Chromium is not installed (CI installs Debian's chromium)")
def test_html_report_renders_in_headless_chromium(tmp_path):
    assert CHROMIUM is not None, "CI must install Chromium (see .ci/run)"
    report = tmp_path / "report.html"
    result = runner.invoke(app, ["compile", "recipes/tiny-llama-mixed.recipe", "-o", str(tmp_path / "m.onnx"),
                                 "--set", f"memory.disk={tmp_path / 'cache'}", "--report", str(report)])
    assert result.exit_code == 0, result.output
    dom = _chromium("--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert ":CONSOLE" not in dom.stderr, [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    page = _Dom()
    page.feed(dom.stdout)
    samples = int(re.search(r"Measured RSS \((\d+) samples\)", "".join(page.text)).group(1))
    count, points = page.series["measured RSS"]
    assert samples > 1 and count == samples == len(points.split())
    assert "greedy path (scores)" in page.series and "chosen" in page.series
    shot = tmp_path / "report.png"
    taken = _chromium(f"--screenshot={shot}", "--window-size=1280,2400", report.as_uri())
    assert taken.returncode == 0 and ":CONSOLE" not in taken.stderr
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_markdown_cells_carry_no_markup_and_reports_are_world_readable(tmp_path):
    """A hostile layer name cannot inject HTML into a Markdown viewer; the report file gets the same mode
    as the models qrc writes (0644 under the usual umask), not mkstemp's 0600."""
    import os

    from compiler.report.render import _md_cell

    assert _md_cell('<img src=x onerror="alert(1)">|x\ny') == '&lt;img src=x onerror="alert(1)">\\|x y'
    report = tmp_path / "plan.md"
    result = runner.invoke(app, ["plan", "recipes/tiny-llama-w4a16.recipe", "--report", str(report)])
    assert result.exit_code == 0, result.output
    umask = os.umask(0)
    os.umask(umask)
    assert report.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_run_past_its_plan_says_so_first(tmp_path, monkeypatch):
    """A measured peak more than 10% over the plan: Q447 in the compile's output with the op running at the
    highest sample, and the same line opening the HTML and Markdown reports, before the plan."""
    from compiler.backends.rss import RssSampler

    monkeypatch.setattr(RssSampler, "peak", property(lambda self: 50 * max(rss for _, rss, _ in self.samples)))
    for suffix in ("html", "md"):
        report = tmp_path / f"report.{suffix}"
        result = runner.invoke(app, ["compile", "recipes/tiny-llama-torch-w8a8.recipe", "-o", str(tmp_path / "out"),
                                     "--set", "verify.samples=2", "--report", str(report)])
        assert result.exit_code == 0, result.output
        assert "warning[Q447]" in result.output and "past its memory plan" in result.output, result.output
        assert re.search(r"\+\d+%, during `\w+`", result.output), result.output
        text = report.read_text()
        first = text.index("Q447")
        assert first < text.index("Plan") and "%" in text[first:first + 300], text[:2000]


def test_a_run_within_its_plan_says_nothing_of_it(tmp_path):
    report = tmp_path / "report.md"
    result = runner.invoke(app, ["compile", "recipes/tiny-llama-torch-w8a8.recipe", "-o", str(tmp_path / "out"),
                                 "--set", "verify.samples=2", "--report", str(report)])
    assert result.exit_code == 0, result.output
    from compiler.backends.result import OVER_PLAN

    ratio = float(re.search(r"peak RSS.*?\(([\d.]+)×\)", result.output, re.S).group(1))
    assert ("Q447" in result.output) == (ratio > OVER_PLAN), result.output
