"""The import graph of the package: one direction of dependency (syntax → ir → resolve → plan → backends →
the commands), no backend importing the other, and no circle. Built by grimp, which reads every import
statement, including the lazy ones inside functions."""

from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp")

# Lowest first. A module may import its own package, and any package of a lower layer; nothing else.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("compiler.source", "compiler.safe_files"),
    ("compiler.diagnostics", "compiler.codes", "compiler.exhaustive", "compiler.canonical", "compiler.plugins"),
    ("compiler.env_numbers", "compiler.ram_folders"),  # facts of the machine qrc runs on
    ("compiler.syntax",),
    ("compiler.ir",),
    ("compiler.models", "compiler.quant"),
    ("compiler.data",),
    ("compiler.resolve",),
    ("compiler.plan",),
    ("compiler.backends",),  # what the backends share: the program, specs, results, memory sampling
    ("compiler.backends.onnx", "compiler.backends.torch"),
    ("compiler.backends.registry",),  # the one place that names both backends (their light specs)
    ("compiler.outputs", "compiler.overrides", "compiler.report", "compiler.inspect_table"),
    ("compiler.destination",),  # the output path's checks, shared by `check` and `compile`
    ("compiler.frontend",),
    ("compiler.compile_run",),
    ("compiler.cli",),
    ("compiler.__main__", "compiler"),
)


def _unit(module: str) -> tuple[int, str]:
    """The layer of a module and the package it belongs to (the longest prefix named in LAYERS)."""
    best = max((p for layer in LAYERS for p in layer if module == p or module.startswith(p + ".")), key=len)
    return next(i for i, layer in enumerate(LAYERS) if best in layer), best


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("compiler", include_external_packages=False)


def _edges(graph):
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            yield importer, imported


def test_every_import_points_down(graph):
    up = []
    for importer, imported in _edges(graph):
        (low, unit), (high, other) = _unit(importer), _unit(imported)
        if unit != other and high >= low:
            up.append(f"{importer} → {imported}")
    assert up == [], "imports against the layering:\n" + "\n".join(up)


def test_no_import_circle(graph):
    circles = [f"{a} → {b} → … → {a}" for a, b in _edges(graph)
               if graph.chain_exists(importer=b, imported=a)]
    assert circles == [], "import circles:\n" + "\n".join(circles)


def test_the_layering_names_every_package(graph):
    """A new top-level module must be placed in LAYERS (the fallback to `compiler` would hide it)."""
    top = {".".join(m.split(".")[:2]) for m in graph.modules}
    named = {p for layer in LAYERS for p in layer}
    assert top <= named, f"not in LAYERS: {sorted(top - named)}"


def test_the_planner_never_asks_which_backend():
    """Each backend's spec supplies its own lowering; the shared planner names no backend and the cost model
    offers no yes/no fact to branch on (compiler/plan/target.py)."""
    import ast
    import inspect
    from pathlib import Path

    from compiler.plan.target import CostModel

    plan = Path(__file__).resolve().parents[1] / "compiler" / "plan"
    named = []
    for path in sorted(plan.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Backend":
                named.append(f"{path.name}:{node.lineno} Backend.{node.attr}")
    assert named == []
    flags = [name for name, member in inspect.getmembers(CostModel) if isinstance(member, property)
             and inspect.signature(member.fget).return_annotation in (bool, "bool")]
    assert flags == []


RECIPE_IR = ("compiler.ir.elaborate", "compiler.ir.printer", "compiler.ir.checks", "compiler.ir.schemes",
             "compiler.frontend")


def _run_modules(graph) -> dict[str, object]:
    """The backend modules the two executors run (themselves included), each with its parsed source."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    handlers = {"compiler.backends.onnx.execute", "compiler.backends.torch.execute"}
    reached = set(handlers)
    for module in handlers:
        reached |= {m for m in graph.find_upstream_modules(module) if m.startswith("compiler.backends")}
    trees = {}
    for module in sorted(reached):
        path = root / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = root / module.replace(".", "/") / "__init__.py"
        trees[module] = ast.parse(path.read_text(encoding="utf-8"))
    return trees


def test_handlers_read_their_ops_never_the_recipe(graph):
    """The executors and every backend module they run read what the plan's ops carry: none imports the
    recipe's IR (RecipeIR, or the modules that build and print it) or takes it as a parameter."""
    import ast

    reached = _run_modules(graph)
    found = []
    for module, tree in reached.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module in RECIPE_IR or any(a.name == "RecipeIR" for a in node.names)):
                found.append(f"{module}:{node.lineno} imports {node.module}")
            if isinstance(node, ast.arg) and node.arg == "ir":
                found.append(f"{module}:{node.lineno} takes `ir`")
            if isinstance(node, ast.Attribute) and node.attr == "ir":
                found.append(f"{module}:{node.lineno} reads `.ir`")
    assert len(reached) > 20 and found == [], found


def test_every_emitter_is_an_emitter():
    """A class of the backends that writes an output (it stages with `finish`, then `commit`s or `abort`s)
    names the Emitter protocol as its base, so mypy checks it implements the whole seam."""
    import importlib
    import inspect

    from compiler.backends.emitter import Emitter

    found = []
    for module in ("compiler.backends.onnx.emitters", "compiler.backends.torch.writer"):
        for _, cls in inspect.getmembers(importlib.import_module(module), inspect.isclass):
            if cls.__module__ == module and all(hasattr(cls, m) for m in ("finish", "commit", "abort", "put")):
                found.append(cls)
                assert Emitter in cls.__mro__, cls
    assert len(found) >= 3, found


def test_handlers_report_products_and_never_write_the_result(graph):
    """Handlers return frozen Products (compiler/backends/products.py) that the program assembles into the
    result; no module the executors run holds the result or writes into it."""
    import ast

    # the program assembles the result; BackendError (the package) carries it out of a failed verification
    assembly = {"compiler.backends.program", "compiler.backends.result", "compiler.backends.products", "compiler.backends"}
    found = []
    for module, tree in _run_modules(graph).items():
        if module in assembly:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "result":
                found.append(f"{module}:{node.lineno} holds `.result`")
            if isinstance(node, ast.arg) and node.arg == "result":
                found.append(f"{module}:{node.lineno} takes `result`")
    assert found == [], found
