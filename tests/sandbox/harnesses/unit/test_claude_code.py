"""The claude_code adapter with a stand-in CLI: its command, run on a local runtime, and its
summary. The real CLI: ``acceptance/test_claude_code.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV
from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.claude_code import ENTRY, PACKAGE, summarize_output
from rolloutd.types import HarnessSpec
from tests.support.contexts import SESSION_KEY, harness_context

INSTRUCTION = "--help create hello.py that prints 'hello world' $HOME"

#: stand-in for claude.exe: records argv, stdin and environment
FAKE_CLAUDE = """#!/usr/bin/env python3
import json, os, sys
json.dump({"argv": sys.argv[1:], "stdin": sys.stdin.read(), "env": dict(os.environ)},
          open("out.json", "w"))
"""


@pytest.fixture
def fake_claude(npm_package) -> Path:
    return npm_package(
        PACKAGE, ENTRY, FAKE_CLAUDE, package_json={"version": "2.0.0"}, executable=True
    )


@pytest.mark.parametrize("profile", ["default", "compact"])
async def test_claude_code_runs_print_mode_on_the_session(make_runtime, fake_claude, profile):
    runtime = await make_runtime("local")
    adapter = get_harness(
        HarnessSpec(
            type="claude_code",
            profile=profile,
            max_turns=3,
            args=["--debug"],
            env={"MY_VAR": "{model}"},
        )
    )
    assert type(adapter).cli_version() == "2.0.0"
    command = await adapter.prepare(
        runtime, harness_context(instruction=INSTRUCTION, dialects=("openai", "anthropic"))
    )
    assert SESSION_KEY not in str(command.command)
    process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
    assert await process.wait(60) == 0, process.stderr_path.read_text()
    out = json.loads(await runtime.download("out.json"))
    argv, env = out["argv"], out["env"]
    assert argv[0] == "-p" and argv[-1] == "--debug"
    assert argv[argv.index("--output-format") + 1] == "stream-json"
    assert argv[argv.index("--max-turns") + 1] == "3"
    assert argv[argv.index("--permission-mode") + 1] == "bypassPermissions"
    assert argv[argv.index("--model") + 1] == "Qwen2.5-Coder-0.5B-Instruct"
    assert out["stdin"] == INSTRUCTION
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8300/s/k"
    assert env["ANTHROPIC_API_KEY"] == SESSION_KEY
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["DISABLE_AUTOUPDATER"] == "1" and env["DISABLE_TELEMETRY"] == "1"
    assert env["MY_VAR"] == "Qwen2.5-Coder-0.5B-Instruct"
    settings = json.loads(await runtime.download(f"{runtime.home}/.claude/settings.json"))
    assert settings["permissions"]["defaultMode"] == "bypassPermissions"
    if profile == "compact":
        assert argv[argv.index("--setting-sources") + 1] == ""
        assert argv[argv.index("--tools") + 1] == "Bash,Read,Write,Edit"
        assert runtime.workdir in argv[argv.index("--system-prompt") + 1]
        assert "--strict-mcp-config" in argv and "--disable-slash-commands" in argv
    else:
        assert "--system-prompt" not in argv and "--tools" not in argv


async def test_claude_code_missing_names_the_setup_step(make_runtime, tmp_path, monkeypatch):
    monkeypatch.setenv(NPM_PREFIX_ENV, str(tmp_path / "empty"))
    runtime = await make_runtime("local")
    with pytest.raises(HarnessError, match="scripts/setup.sh"):
        await get_harness(HarnessSpec(type="claude_code")).prepare(
            runtime, harness_context(instruction=INSTRUCTION, dialects=("openai", "anthropic"))
        )


def test_summarize_output_reads_the_result_event():
    stream = (
        '{"type":"system","subtype":"init","tools":["Bash"]}\n'
        '{"type":"assistant","message":{"content":[{"type":"tool_use","name":"Bash"}]}}\n'
        '{"type":"result","subtype":"error_max_turns","is_error":true,"num_turns":3,'
        '"api_error_status":null,"usage":{"input_tokens":900,"output_tokens":40},'
        '"result":""}\n'
    )
    assert summarize_output(stream) == {
        "has_result": True,
        "is_error": True,
        "subtype": "error_max_turns",
        "num_turns": 3,
        "num_tool_uses": 1,
        "api_error_status": None,
        "input_tokens": 900,
        "output_tokens": 40,
        "result": "",
    }
    assert summarize_output("Killed\n")["is_error"]
