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


