"""The tools folder of Python harness CLIs: found by its setting, visible read-only in bwrap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rolloutd.sandbox.config import TOOLS_DIR_ENV, tool_python_dirs, tools_dir
from tests.sandbox.conftest import HAVE_BWRAP


def test_tools_dir_follows_its_setting(tmp_path, monkeypatch):
    monkeypatch.setenv(TOOLS_DIR_ENV, str(tmp_path / "tools"))
    assert tools_dir() == tmp_path / "tools"


def test_tool_python_dirs_are_the_bases_the_environments_link_to(tmp_path):
    base = tmp_path / "pythons" / "3.11"
    (base / "bin").mkdir(parents=True)
    for name in ("a", "b"):
        (tmp_path / "tools" / name).mkdir(parents=True)
        (tmp_path / "tools" / name / "pyvenv.cfg").write_text(
            f"home = {base}/bin\nversion_info = 3.11.7\n"
        )
    assert tool_python_dirs(tmp_path / "tools") == [base.resolve()]
    assert tool_python_dirs(tmp_path / "nothing") == []


@pytest.mark.sandbox
@pytest.mark.skipif(not HAVE_BWRAP, reason="bubblewrap is not installed")
async def test_bwrap_runs_a_tool_environment_read_only(make_runtime, tmp_path, monkeypatch):
    tools = tmp_path / "tools"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tools / "hello")], check=True
    )
    entry = tools / "bin" / "hello"
    entry.parent.mkdir()
    entry.write_text(f"#!{tools}/hello/bin/python\nimport sys\nprint('hello from', sys.prefix)\n")
    entry.chmod(0o755)
    monkeypatch.setenv(TOOLS_DIR_ENV, str(tools))
    runtime = await make_runtime("bwrap")
    result = await runtime.exec([str(entry)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"hello from {tools / 'hello'}"
    result = await runtime.exec(["touch", str(tools / "hello" / "x")])
    assert result.exit_code != 0
    assert not Path(tools / "hello" / "x").exists()
