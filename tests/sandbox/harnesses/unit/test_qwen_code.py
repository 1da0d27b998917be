"""The qwen_code adapter with a stand-in CLI: its settings and command, and its summary. The
real CLI against llama-server under bwrap: ``acceptance/test_qwen_code.py``."""

from __future__ import annotations

import json

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV
from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.qwen_code import ENTRY_POINT, summarize_output
from rolloutd.types import HarnessSpec
from tests.support.contexts import SESSION_KEY, harness_context

INSTRUCTION = "Create a file hello.txt containing the word hello"


#: the stand-in CLI (unit/conftest.py ``fake_prefix``): package, entry, text, package.json
STAND_IN = (None, ENTRY_POINT, "// stand-in for the qwen CLI\n", None)


async def test_prepare_writes_offline_settings_and_keeps_key_off_argv(make_runtime, fake_prefix):
    runtime = await make_runtime("local")
    adapter = get_harness(HarnessSpec(type="qwen_code", max_turns=4, args=["--debug"]))
    command = await adapter.prepare(runtime, harness_context(instruction=INSTRUCTION))
    argv = command.command
    assert isinstance(argv, list)
    assert argv[:2] == ["node", str(fake_prefix / ENTRY_POINT)]
    assert argv[argv.index("--approval-mode") + 1] == "yolo"
    assert argv[argv.index("--max-session-turns") + 1] == "4"
    assert argv[argv.index("--auth-type") + 1] == "openai"
    assert "--debug" in argv
    assert argv[-1] == "--prompt=Create a file hello.txt containing the word hello"
    assert not any(SESSION_KEY in arg for arg in argv)
    assert command.env["OPENAI_API_KEY"] == SESSION_KEY
    assert command.env["OPENAI_BASE_URL"] == "http://127.0.0.1:8300/s/k/v1"
    settings = json.loads(await runtime.download(f"{runtime.home}/.qwen/settings.json"))
    assert settings["security"]["auth"]["selectedType"] == "openai"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["memory"]["enableManagedAutoMemory"] is False
    assert settings["model"]["maxSessionTurns"] == 4


async def test_prepare_without_the_cli_says_how_to_install(make_runtime, tmp_path, monkeypatch):
    monkeypatch.setenv(NPM_PREFIX_ENV, str(tmp_path / "empty"))
    runtime = await make_runtime("local")
    with pytest.raises(HarnessError, match="npm install --prefix"):
        await get_harness(HarnessSpec(type="qwen_code")).prepare(
            runtime, harness_context(instruction=INSTRUCTION)
        )


def test_summarize_output_flags_api_errors_despite_exit_zero():
    ok = (
        '{"type":"system","subtype":"init"}\n'
        '{"type":"result","is_error":false,"num_turns":2,"result":"Done.",'
        '"usage":{"input_tokens":3215,"output_tokens":17}}\n'
    )
    assert summarize_output(ok) == {
        "has_result": True,
        "is_error": False,
        "api_error": None,
        "num_turns": 2,
        "input_tokens": 3215,
        "output_tokens": 17,
        "result": "Done.",
    }
    failed = (
        '{"type":"result","is_error":false,"num_turns":1,"result":"[API Error: 400 '
        'request (17291 tokens) exceeds the available context size (8192 tokens)]"}'
    )
    summary = summarize_output(failed)
    assert summary["is_error"] and "17291 tokens" in summary["api_error"]
    assert summarize_output("not json\n")["is_error"]


# --------------------------------------------------------------------------- end to end
