"""The opencode harness's recipe: opencode.json, environment and argv, on a local runtime."""

from __future__ import annotations

import json

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV
from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.opencode import CONFIG, ENTRY, PACKAGE, summarize_output
from rolloutd.types import HarnessSpec
from tests.support.contexts import SESSION_KEY, harness_context

MODEL = 'Qwen2.5-"Coder"'  # a quote in the name must stay valid JSON in the config


#: the stand-in CLI (unit/conftest.py ``fake_prefix``): package, entry, text, package.json
STAND_IN = (PACKAGE, ENTRY, "stand-in for the opencode executable\n", {"version": "1.18.33"})


async def test_config_points_at_the_session_and_allows_every_tool(make_runtime, fake_prefix):
    runtime = await make_runtime("local")
    spec = HarnessSpec(type="opencode", max_turns=5)
    command = await get_harness(spec).prepare(runtime, harness_context("http://g/s/k", model=MODEL))
    argv = command.command
    assert isinstance(argv, list)
    assert argv[:2] == [str(fake_prefix / "node_modules" / PACKAGE / ENTRY), "run"]
    assert argv[argv.index("-m") + 1] == f"rolloutd/{MODEL}"
    assert argv[-1] == "make hello.py"
    assert not any(SESSION_KEY in a for a in argv)
    assert command.env["ROLLOUTD_SESSION_KEY"] == SESSION_KEY
    assert command.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    assert command.env["OPENCODE_CONFIG"] == f"{runtime.home}/{CONFIG}"
    text = (await runtime.download(f"{runtime.home}/{CONFIG}")).decode()
    assert SESSION_KEY not in text
    config = json.loads(text)
    provider = config["provider"]["rolloutd"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {
        "baseURL": "http://g/s/k/v1",
        "apiKey": "{env:ROLLOUTD_SESSION_KEY}",
        "timeout": False,
        "headerTimeout": False,
        "chunkTimeout": False,
    }
    assert list(provider["models"]) == [MODEL]
    assert config["model"] == f"rolloutd/{MODEL}"
    assert config["autoupdate"] is False and config["share"] == "disabled"
    assert config["permission"]["*"] == "allow"
    assert config["agent"]["build"] == {"steps": 5}  # shipped prompt, turn cap


async def test_compact_profile_trims_prompt_and_tools(make_runtime, fake_prefix):
    runtime = await make_runtime("local")
    spec = HarnessSpec(type="opencode", profile="compact")
    command = await get_harness(spec).prepare(runtime, harness_context("http://g/s/k", model=MODEL))
    config = json.loads(await runtime.download(command.env["OPENCODE_CONFIG"]))
    assert runtime.workdir in config["agent"]["build"]["prompt"]
    assert config["permission"]["task"] == "deny" and config["permission"]["*"] == "allow"


async def test_missing_cli_names_the_setup_step(make_runtime, tmp_path, monkeypatch):
    monkeypatch.setenv(NPM_PREFIX_ENV, str(tmp_path / "empty"))
    runtime = await make_runtime("local")
    with pytest.raises(HarnessError, match="npm install --prefix .* opencode-ai"):
        await get_harness(HarnessSpec(type="opencode")).prepare(
            runtime, harness_context("http://g/s/k", model=MODEL)
        )


def test_summarize_counts_steps_tools_and_errors():
    out = "\n".join(
        json.dumps(e)
        for e in [
            {"type": "step_start", "part": {}},
            {"type": "tool_use", "part": {"tool": "write", "state": {"status": "completed"}}},
            {"type": "step_finish", "part": {"tokens": {"input": 1200, "output": 30}}},
            {"type": "text", "part": {"text": "Done."}},
            {"type": "step_finish", "part": {"tokens": {"input": 1300, "output": 5}}},
        ]
    )
    assert summarize_output(out) == {
        "num_steps": 2,
        "num_tool_calls": 1,
        "tool_errors": 0,
        "is_error": False,
        "error": None,
        "input_tokens": 2500,
        "output_tokens": 35,
        "result": "Done.",
    }
    failed = summarize_output(
        json.dumps({"type": "error", "error": {"name": "APIError", "data": {"message": "400 bad"}}})
    )
    assert failed["is_error"] and failed["error"] == "400 bad"
