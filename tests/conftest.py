from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden/ files from the current output (refused when CI is set)")


def pytest_configure(config):
    golden.enable_update(config.getoption("--update-golden"))


import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _exported_example_models():
    """Examples that compile an HF folder on ONNX are planned from its export once it exists; export
    them first so that goldens do not depend on which test ran before."""
    from pathlib import Path

    from compiler import check_file
    from compiler.ir.types import Backend
    from compiler.models import ModelError, resolve_path

    root = Path(__file__).resolve().parents[1]
    for recipe in sorted((root / "recipes").glob("*.recipe")):
        ir = check_file(recipe).ir
        try:
            path = resolve_path(ir.model)
        except ModelError:
            continue  # the package is not installed: its tests skip
        if ir.backend is Backend.ONNX and path.is_dir():
            from compiler.backends.onnx.export import export_folder

            export_folder(path)
