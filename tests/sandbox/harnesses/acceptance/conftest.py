"""The adapters with their real CLIs: every test here is an acceptance test (it needs a harness
CLI installed by scripts/setup.sh, and most run a task through the real fleets), run by the
acceptance command, not by the default tier."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test collected from this folder ``acceptance``."""
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.acceptance)
