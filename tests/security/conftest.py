"""Fixtures of the adversarial suites against the Harbor verifier: the examples copied where
the fleets' policy allows them, and the four fleets of a module in a namespace of its own."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.taskset_stack import Rig, taskset_rig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def task_root(tmp_path_factory) -> Path:
    """examples/harbor copied below a folder the policy names."""
    root = tmp_path_factory.mktemp("sets")
    shutil.copytree(ROOT / "examples" / "harbor", root / "harbor")
    return root


@pytest.fixture(scope="module")
async def rig(request, temporal_server, engine, task_root) -> AsyncIterator[Rig]:
    """The four fleets in a fresh namespace named after the test module, on the real
    engine."""
    tag = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")[:12].replace("_", "-")
    async with taskset_rig(temporal_server.address, engine.url, task_root, tag) as rig:
        yield rig
