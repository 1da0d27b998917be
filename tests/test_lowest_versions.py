"""Every floor in pyproject.toml is a version the code works with: a fresh environment with the
lowest direct versions (``uv pip install --resolution lowest-direct``) passes the fast tests.

The inner run (scripts/lowest_versions.sh) deselects this test's ``lowest`` marker and names
its own test folders, so it never starts itself again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lowest

ROOT = Path(__file__).resolve().parents[1]


def _uv() -> str | None:
    beside = Path(sys.executable).parent / "uv"  # scripts/setup.sh installs uv into the venv
    return str(beside) if beside.is_file() else shutil.which("uv")


@pytest.mark.timeout(1800)
def test_lowest_direct_versions_pass_the_fast_tests(tmp_path: Path) -> None:
    uv = _uv()
    if uv is None:
        pytest.skip("uv is not installed (scripts/setup.sh installs it into the venv)")
    env = dict(
        os.environ,
        UV=uv,
        ROLLOUTD_LOWEST_VENV=str(tmp_path / "venv"),
        ROLLOUTD_LOWEST_PYTHON=sys.executable,
    )
    env.pop("PYTHONPATH", None)  # the inner run imports rolloutd from its own environment
    run = subprocess.run(
        ["bash", str(ROOT / "scripts" / "lowest_versions.sh")],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1700,
    )
    tail = "\n".join(run.stdout.splitlines()[-60:])
    assert run.returncode == 0, tail
    assert " passed" in tail and " failed" not in tail, tail
