"""The mini_swe_agent harness: its config, command and summary, with a stand-in CLI."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import TOOLS_DIR_ENV
from rolloutd.sandbox.harnesses import get_harness, harness_capabilities
from rolloutd.sandbox.harnesses.mini_swe_agent import (
    COMPACT_INSTANCE_TEMPLATE,
    CONFIG_FILE,
    summarize_output,
)
from rolloutd.types import HarnessSpec
from tests.support.contexts import SESSION_KEY, harness_context

#: stands in for `mini`: records its argv and environment, writes a trajectory to `-o`.
FAKE_MINI = """#!/bin/sh
printf '%s\\n' "$@" > "$HOME/mini.argv"
env > "$HOME/mini.env"
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
printf '{"info": {"exit_status": "Submitted", "submission": "", ' > "$out"
printf '"model_stats": {"api_calls": 2}}, "messages": [{"role": "exit", "extra": {}}]}' >> "$out"
exit 3
"""


@pytest.fixture
def fake_tools(tool_cli) -> Path:
    tools = tool_cli("mini", FAKE_MINI)
    (tools / "mini-swe-agent" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tools / "mini-swe-agent" / "bin" / "python")
    info = tools / "mini-swe-agent/lib/python3.11/site-packages/mini_swe_agent-2.4.6.dist-info"
    info.mkdir(parents=True)
    return tools


async def test_runs_headless_with_step_limit_and_cost_tracking_off(make_runtime, fake_tools):
    runtime = await make_runtime("local")
    spec = HarnessSpec(type="mini_swe_agent", max_turns=5, profile="compact", args=["--extra"])
    command = await get_harness(spec).prepare(
        runtime,
        harness_context(
            "http://127.0.0.1:9/s/k", instruction="-create hello.py", model="qwen-test"
        ),
    )
    assert not any(SESSION_KEY in arg for arg in command.command)
    result = await runtime.exec(command.command, env=command.env, cwd=command.cwd)
    assert result.exit_code == 3  # the CLI's own exit code, after the summary line
    assert summarize_output(result.stdout) == {
        "exit_status": "Submitted",
        "submission": "",
        "api_calls": 2,
        "num_messages": 1,
        "exception": "",
        "is_error": False,
    }
    argv = (await runtime.download(f"{runtime.home}/mini.argv")).decode().splitlines()
    assert argv[:3] == ["-y", "--exit-immediately", "-c"]
    assert argv[-2:] == ["--extra", "--task=-create hello.py"]
    env = dict(
        line.split("=", 1)
        for line in (await runtime.download(f"{runtime.home}/mini.env")).decode().splitlines()
        if "=" in line
    )
    assert env["OPENAI_API_KEY"] == SESSION_KEY
    assert env["MSWEA_CONFIGURED"] == "true"
    config = json.loads(await runtime.download(f"{runtime.home}/{CONFIG_FILE}"))
    assert SESSION_KEY not in json.dumps(config)
    assert (
        config["agent"]
        | {"step_limit": 5, "cost_limit": 0, "mode": "yolo", "agent_class": "default"}
        == config["agent"]
    )
    assert config["agent"]["instance_template"] == COMPACT_INSTANCE_TEMPLATE
    assert config["model"]["model_name"] == "openai/qwen-test"
    assert config["model"]["model_kwargs"]["api_base"] == "http://127.0.0.1:9/s/k/v1"
    assert config["model"]["cost_tracking"] == "ignore_errors"


async def test_missing_cli_names_the_setup_step(make_runtime, tmp_path, monkeypatch):
    monkeypatch.setenv(TOOLS_DIR_ENV, str(tmp_path / "empty"))
    runtime = await make_runtime("local")
    with pytest.raises(HarnessError, match="scripts/setup.sh"):
        await get_harness(HarnessSpec(type="mini_swe_agent")).prepare(
            runtime,
            harness_context(
                "http://127.0.0.1:9/s/k", instruction="-create hello.py", model="qwen-test"
            ),
        )
    assert "mini_swe_agent" in harness_capabilities()[1]


def test_capabilities_publish_the_installed_version(fake_tools):
    assert harness_capabilities()[0]["mini_swe_agent"] == "2.4.6"


def test_summary_tells_limits_from_submission():
    limits = '{"mini_swe_agent": {"exit_status": "LimitsExceeded", "api_calls": 5}}'
    assert summarize_output("noise\n" + limits)["is_error"]
    assert summarize_output("nothing")["exit_status"] == "NoSummary"
