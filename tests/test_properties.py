"""Property: whatever is done to a valid recipe, the front end answers with diagnostics, never a crash."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiler import DiagnosticError, Source, check_source, load_recipe
from compiler.diagnostics import render_all
from compiler.syntax.grammar import parser

RECIPES = [p.read_text(encoding="utf-8") for p in sorted((Path(__file__).parents[1] / "recipes").glob("*.recipe"))]


def _tokens(text: str) -> list[str]:
    """The recipe as tokens (with the whitespace between them folded into single spaces)."""
    return [str(tok) for tok in parser().lex(text)]


TOKENIZED = [_tokens(r) for r in RECIPES]


@st.composite
def mutated(draw) -> str:
    tokens = list(draw(st.sampled_from(TOKENIZED)))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(tokens) - 1))
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "bytes", "token"]))
        if op == "delete":
            del tokens[i]
        elif op == "duplicate":
            tokens.insert(i, tokens[i])
        elif op == "swap":
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif op == "bytes":
            tokens.insert(i, draw(st.binary(min_size=1, max_size=8)).decode("utf-8", errors="replace"))
        else:
            tokens.insert(i, draw(st.sampled_from(sorted({t for ts in TOKENIZED for t in ts}))))
    return " ".join(tokens)


def _front_end(text: str) -> None:
    result = check_source(Source("mutant.recipe", text))
    render_all(result.diagnostics)  # rendering must not fail either
    try:
        load_recipe(Source("mutant.recipe", text))
    except DiagnosticError as exc:
        assert exc.diagnostics and all(d.code.startswith("Q") for d in exc.diagnostics)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_recipes_only_raise_diagnostic_errors(text):
    _front_end(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_only_raises_diagnostic_errors(text):
    _front_end(text)


def test_lexed_recipes_still_parse():
    """The mutation base is sound: the unmutated token streams are valid recipes."""
    for tokens in TOKENIZED:
        assert check_source(Source("t.recipe", " ".join(tokens))).ok


def test_glob_with_many_stars_matches_fast():
    """A run of stars is one star: `**********x` once took over a minute (exponential backtracking)."""
    import time

    from compiler.ir.types import SelectorKind
    from compiler.resolve.selectors import _compiled

    name = "model.layers.12.self_attn.q_proj" * 3
    start = time.perf_counter()
    for pattern in ("**********x", "*a*a*a*a*a*a*a*a*a*a*b", "*" * 500 + "?"):
        _compiled(SelectorKind.GLOB, pattern).fullmatch(name)
    assert time.perf_counter() - start < 1.0


# ---- compile-side fuzz: recipes that check clean, compiled on a built-in ------------------------------------
SCHEMES = ("W8A16", "W8A8_STATIC", "W4A16", "FP8_DYNAMIC", "NVFP4A16", "W4A16 { group 32  rounding gptq }",
           "W8A8_STATIC { activations int8 per_tensor static }")


@st.composite
def compilable(draw) -> str:
    """A recipe over a small built-in Llama from independent choices: scheme, backend, mode, calibration
    method and size, chunk, verification."""
    backend = draw(st.sampled_from(["onnx", "torch"]))
    scheme = draw(st.sampled_from(SCHEMES))
    mode = draw(st.sampled_from(["full", "low_memory", "offload"]))
    method = draw(st.sampled_from(["minmax", "percentile", "mse", "entropy"]))
    samples, chunk = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    verify = draw(st.booleans())
    return (f'recipe fuzz {{\n model "builtin:tiny-llama?layers=1&hidden=64&intermediate=128&vocab=128"\n'
            f' backend {backend}\n scheme s = {scheme}\n quantize {{ type Linear -> s  "lm_head" -> none }}\n'
            f' calibrate {{ data synthetic {{ samples {samples}  seqlen 8 }}  chunk {chunk}  method {method} }}\n'
            f' memory {{ mode {mode} }}\n' + (" verify { samples 2  metric cosine  at_least 0 }\n" if verify else "")
            + "}\n")


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(compilable())
def test_recipes_that_check_clean_compile_or_refuse_with_a_code(tmp_path_factory, text):
    """Bounded compile-side fuzz: a recipe `qrc check` accepts either compiles (exit 0, the model written) or
    stops with a coded diagnostic and nothing written; never a traceback."""
    from typer.testing import CliRunner

    from compiler.cli import app

    folder = tmp_path_factory.mktemp("fuzz")
    recipe = folder / "r.recipe"
    recipe.write_text(text)
    runner = CliRunner()
    if runner.invoke(app, ["check", str(recipe)]).exit_code != 0:
        return
    out = folder / ("out" if "backend torch" in text else "m.onnx")
    result = runner.invoke(app, ["compile", str(recipe), "-o", str(out)])
    assert result.exception is None or isinstance(result.exception, SystemExit), (text, result.output)
    assert "Traceback" not in result.output, (text, result.output)
    if result.exit_code == 0:
        assert out.exists(), text
    else:
        assert result.exit_code == 2 and "error[Q" in result.output and not out.exists(), (text, result.output)
