"""The pi harness's recipe: models.json per dialect, environment and argv, on a local runtime,
with a stand-in CLI. The real CLI: ``acceptance/test_pi.py``."""

from __future__ import annotations

import json

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV
from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.pi import (
    ENTRY,
    MAX_TURNS_EXTENSION,
    PACKAGE,
    summarize_output,
)
from rolloutd.types import HarnessSpec
from tests.support.contexts import ALL_DIALECTS, SESSION_KEY, harness_context

#: the stand-in CLI (unit/conftest.py ``fake_prefix``): package, entry, text, package.json
STAND_IN = (PACKAGE, ENTRY, "// stand-in for pi's cli.js\n", {"version": "0.73.1"})


@pytest.mark.parametrize(
    ("dialect", "api", "url"),
    [
        (None, "openai-completions", "http://g/s/k/v1"),
        ("responses", "openai-responses", "http://g/s/k/v1"),
        ("anthropic", "anthropic-messages", "http://g/s/k"),
    ],
)
async def test_dialect_picks_the_provider_api_and_url(make_runtime, fake_prefix, dialect, api, url):
    runtime = await make_runtime("local")
    spec = HarnessSpec(type="pi", dialect=dialect)
    command = await get_harness(spec).prepare(
        runtime, harness_context("http://g/s/k", dialects=ALL_DIALECTS)
    )
    argv = command.command
    assert isinstance(argv, list)
    assert argv[:3] == ["node", str(fake_prefix / "node_modules" / PACKAGE / ENTRY), "-p"]
    assert argv[argv.index("--mode") + 1] == "json"
    assert "--offline" in argv and "--no-session" in argv
    assert command.env["ROLLOUTD_MAX_TURNS"] == "10"
    extension = argv[argv.index("-e") + 1]
    assert (await runtime.download(extension)).decode() == MAX_TURNS_EXTENSION
    assert argv[-1] == "make hello.py"
    assert not any(SESSION_KEY in a for a in argv)
    assert command.env["ROLLOUTD_SESSION_KEY"] == SESSION_KEY
    text = (await runtime.download(f"{runtime.home}/.pi/agent/models.json")).decode()
    assert SESSION_KEY not in text
    provider = json.loads(text)["providers"]["rolloutd"]
    assert (provider["api"], provider["baseUrl"]) == (api, url)
    assert provider["apiKey"] == "ROLLOUTD_SESSION_KEY"
    assert provider["models"][0]["id"] == "Qwen2.5-Coder-0.5B-Instruct"


async def test_compact_profile_and_an_instruction_that_looks_like_an_option(
    make_runtime, fake_prefix
):
    runtime = await make_runtime("local")
    spec = HarnessSpec(type="pi", profile="compact")
    command = await get_harness(spec).prepare(
        runtime,
        harness_context(
            "http://g/s/k", instruction="--help me write hello.py", dialects=ALL_DIALECTS
        ),
    )
    argv = command.command
    assert argv[argv.index("--tools") + 1] == "read,bash,write"
    assert runtime.workdir in argv[argv.index("--system-prompt") + 1]
    # pi would parse "--help ..." as its own flag: the instruction goes in as a file
    assert argv[-1].startswith("@") and argv[-1].endswith(".rolloutd/instruction.md")
    assert await runtime.download(argv[-1][1:]) == b"--help me write hello.py"


async def test_gemini_dialect_and_missing_cli_are_refused(
    make_runtime, fake_prefix, tmp_path, monkeypatch
):
    runtime = await make_runtime("local")
    with pytest.raises(HarnessError, match="dialect='gemini'"):
        await get_harness(HarnessSpec(type="pi", dialect="gemini")).prepare(
            runtime, harness_context("http://g/s/k", dialects=ALL_DIALECTS)
        )
    monkeypatch.setenv(NPM_PREFIX_ENV, str(tmp_path / "empty"))
    with pytest.raises(HarnessError, match="scripts/setup.sh"):
        await get_harness(HarnessSpec(type="pi")).prepare(
            runtime, harness_context("http://g/s/k", dialects=ALL_DIALECTS)
        )


def test_summarize_reads_the_last_assistant_message():
    def end(message):
        return json.dumps({"type": "message_end", "message": message})

    out = "\n".join(
        [
            json.dumps({"type": "session", "id": "x"}),
            end({"role": "user", "content": []}),
            end(
                {
                    "role": "assistant",
                    "stopReason": "toolUse",
                    "content": [],
                    "usage": {"input": 800, "output": 40},
                }
            ),
            json.dumps({"type": "tool_execution_end", "toolName": "write", "isError": False}),
            end(
                {
                    "role": "assistant",
                    "stopReason": "stop",
                    "content": [{"type": "text", "text": "Done."}],
                    "usage": {"input": 900, "output": 3},
                }
            ),
        ]
    )
    assert summarize_output(out) == {
        "num_turns": 2,
        "num_tool_calls": 1,
        "tool_errors": 0,
        "is_error": False,
        "error": None,
        "stop_reason": "stop",
        "input_tokens": 1700,
        "output_tokens": 43,
        "result": "Done.",
    }
    failed = summarize_output(
        end(
            {
                "role": "assistant",
                "stopReason": "error",
                "content": [],
                "errorMessage": "400 status code (no body)",
            }
        )
    )
    assert failed["is_error"] and failed["error"] == "400 status code (no body)"
