"""The aider harness: its config, command and summary, with a stand-in CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import TOOLS_DIR_ENV
from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.aider import (
    CONFIG_FILE,
    METADATA_FILE,
    SETTINGS_FILE,
    summarize_output,
)
from rolloutd.types import HarnessSpec
from tests.support.contexts import SESSION_KEY, harness_context

#: stands in for `aider`: records its argv and environment.
FAKE_AIDER = """#!/bin/sh
printf '%s\\n' "$@" > "$HOME/aider.argv"
env > "$HOME/aider.env"
echo "Applied edit to hello.py"
"""


@pytest.fixture
def fake_tools(tool_cli) -> Path:
    return tool_cli("aider", FAKE_AIDER)


@pytest.mark.parametrize("profile", ["default", "compact"])
async def test_one_message_offline_with_the_key_in_the_environment(
    make_runtime, fake_tools, profile
):
    runtime = await make_runtime("local")
    spec = HarnessSpec(type="aider", profile=profile, args=["--verbose"])
    command = await get_harness(spec).prepare(
        runtime,
        harness_context("http://127.0.0.1:9/s/k", instruction="create hello.py", model="qwen-test"),
    )
    result = await runtime.exec(command.command, env=command.env, cwd=command.cwd)
    assert result.exit_code == 0
    argv = (await runtime.download(f"{runtime.home}/aider.argv")).decode().splitlines()
    assert argv == [
        "--config",
        f"{runtime.home}/{CONFIG_FILE}",
        "--message-file",
        f"{runtime.home}/.rolloutd/instruction.md",
        "--verbose",
    ]
    env = (await runtime.download(f"{runtime.home}/aider.env")).decode().splitlines()
    assert f"OPENAI_API_KEY={SESSION_KEY}" in env
    assert "OPENAI_API_BASE=http://127.0.0.1:9/s/k/v1" in env
    config = json.loads(await runtime.download(f"{runtime.home}/{CONFIG_FILE}"))
    assert SESSION_KEY not in json.dumps(config)
    assert config["model"] == "openai/qwen-test"
    assert config["yes-always"] and not config["git"] and not config["check-update"]
    assert config["analytics-disable"] and not config["show-model-warnings"]
    assert ("map-tokens" in config) == (profile == "compact")
    if profile == "compact":  # no format reminder after the request: a small model echoes it
        settings = json.loads(await runtime.download(f"{runtime.home}/{SETTINGS_FILE}"))
        assert settings == [
            {
                "name": "openai/qwen-test",
                "edit_format": "whole",
                "reminder": "none",
                "examples_as_sys_msg": True,
            }
        ]
        assert config["model-settings-file"] == f"{runtime.home}/{SETTINGS_FILE}"
    metadata = json.loads(await runtime.download(f"{runtime.home}/{METADATA_FILE}"))
    assert metadata["openai/qwen-test"]["input_cost_per_token"] == 0.0
    assert summarize_output(result.stdout)["edited_files"] == ["hello.py"]


async def test_missing_cli_names_the_setup_step(make_runtime, tmp_path, monkeypatch):
    monkeypatch.setenv(TOOLS_DIR_ENV, str(tmp_path / "empty"))
    runtime = await make_runtime("local")
    with pytest.raises(HarnessError, match="scripts/setup.sh"):
        await get_harness(HarnessSpec(type="aider")).prepare(
            runtime,
            harness_context(
                "http://127.0.0.1:9/s/k", instruction="create hello.py", model="qwen-test"
            ),
        )


def test_summary_flags_a_run_that_edited_nothing():
    out = (
        "Aider v0.86.2\nlitellm.APIConnectionError: connection refused\n"
        "Tokens: 1.2k sent, 0 received.\n"
    )
    summary = summarize_output(out)
    assert summary["is_error"] and summary["tokens"] == "1.2k sent, 0 received."
    assert summary["errors"] == ["litellm.APIConnectionError: connection refused"]
