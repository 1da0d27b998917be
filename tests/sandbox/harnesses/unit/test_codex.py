"""The codex adapter with a stand-in CLI: its config and command, run on a local runtime, and
its summary. The real CLI: ``acceptance/test_codex.py``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV
from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.codex import ENTRY, PACKAGE, summarize_output
from rolloutd.types import HarnessSpec
from tests.support.contexts import SESSION_KEY, harness_context

INSTRUCTION = "-n create hello.py that prints 'hello world'"

#: stand-in for codex.js: records argv, stdin, its config and environment
FAKE_CODEX = """\
const fs = require("fs");
const home = process.env.CODEX_HOME;
fs.writeFileSync("out.json", JSON.stringify({
  argv: process.argv.slice(2), stdin: fs.readFileSync(0, "utf8"),
  config: fs.readFileSync(home + "/config.toml", "utf8"),
  key: process.env.OPENAI_API_KEY, home: home}));
"""


@pytest.fixture
def fake_codex(npm_package) -> Path:
    return npm_package(
        PACKAGE,
        ENTRY,
        FAKE_CODEX,
        package_json={"name": "@openai/codex", "version": "9.9.9"},
    )


@pytest.mark.parametrize("profile", ["default", "compact"])
async def test_codex_runs_exec_on_the_session_with_the_key_off_argv(
    make_runtime, fake_codex, profile
):
    runtime = await make_runtime("local")
    adapter = get_harness(HarnessSpec(type="codex", profile=profile, args=["--strict-config"]))
    assert type(adapter).cli_version() == "9.9.9"
    command = await adapter.prepare(runtime, harness_context(instruction=INSTRUCTION))
    assert SESSION_KEY not in str(command.command)
    process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
    assert await process.wait(60) == 0, process.stderr_path.read_text()
    out = json.loads(await runtime.download("out.json"))
    argv = out["argv"]
    assert argv[0] == "exec" and "--json" in argv and "--skip-git-repo-check" in argv
    assert "--dangerously-bypass-approvals-and-sandbox" in argv
    assert argv[argv.index("-C") + 1] == runtime.workdir
    assert argv[-2:] == ["-", "--strict-config"]  # the instruction on stdin, task args last
    assert out["stdin"] == INSTRUCTION
    assert out["key"] == SESSION_KEY and out["home"] == f"{runtime.home}/.codex"
    config = tomllib.loads(out["config"])
    assert config["model"] == "Qwen2.5-Coder-0.5B-Instruct"
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"] == "http://127.0.0.1:8300/s/k/v1"
    assert provider["wire_api"] == "responses" and provider["env_key"] == "OPENAI_API_KEY"
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"]["enabled"] is False
    assert config["approval_policy"] == "never"
    if profile == "compact":
        assert config["agents"]["enabled"] is False
        instructions = await runtime.download(config["model_instructions_file"])
        assert runtime.workdir in instructions.decode()
    else:
        assert "model_instructions_file" not in config and "features" not in config


#: stand-in with one call Codex refused (stderr only) and three tool calls, then forever
LOOPING_CODEX = """\
console.error("ERROR codex_core::tools::router: error=`justification` requires ...");
for (let i = 0; i < 3; i++)
  console.log(JSON.stringify({type: "item.completed",
                              item: {type: "command_execution", command: "ls"}}));
setInterval(() => {}, 1000);
"""


async def test_max_turns_stops_codex_after_that_many_tool_calls(make_runtime, fake_codex):
    (fake_codex / "node_modules" / PACKAGE / ENTRY).write_text(LOOPING_CODEX)
    runtime = await make_runtime("local")
    adapter = get_harness(HarnessSpec(type="codex", max_turns=3))
    command = await adapter.prepare(runtime, harness_context(instruction=INSTRUCTION))
    process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
    assert await process.wait(60) == 0, process.stderr_path.read_text()
    summary = adapter.summarize(process.stdout_path.read_text())
    assert summary is not None
    # the refused call and the items race to the count: it stops at the 2nd or 3rd item
    assert summary["num_commands"] in (2, 3) and summary["max_turns_reached"]
    assert not summary["is_error"]


async def test_codex_missing_names_the_setup_step(make_runtime, tmp_path, monkeypatch):
    monkeypatch.setenv(NPM_PREFIX_ENV, str(tmp_path / "empty"))
    runtime = await make_runtime("local")
    with pytest.raises(HarnessError, match="scripts/setup.sh"):
        await get_harness(HarnessSpec(type="codex")).prepare(
            runtime, harness_context(instruction=INSTRUCTION)
        )
    with pytest.raises(HarnessError, match="npm install --prefix"):
        get_harness(HarnessSpec(type="codex")).cli_version()


def test_summarize_output_reports_the_provider_error():
    failed = (
        '{"type":"thread.started","thread_id":"t"}\n'
        '{"type":"item.completed","item":{"type":"error","message":"Model metadata"}}\n'
        '{"type":"turn.started"}\n'
        '{"type":"error","message":"unexpected status 400 Bad Request"}\n'
        '{"type":"turn.failed","error":{"message":"unexpected status 400 Bad Request"}}\n'
    )
    summary = summarize_output(failed)
    assert summary["is_error"] and summary["error"] == "unexpected status 400 Bad Request"
    assert summary["num_warnings"] == 1 and not summary["completed"]
    ok = (
        '{"type":"item.completed","item":{"type":"command_execution","command":"ls"}}\n'
        '{"type":"item.completed","item":{"type":"agent_message","text":"Done."}}\n'
        '{"type":"turn.completed","usage":{"input_tokens":1200,"output_tokens":30}}\n'
    )
    assert summarize_output(ok) == {
        "completed": True,
        "max_turns_reached": False,
        "is_error": False,
        "error": None,
        "num_commands": 1,
        "num_warnings": 0,
        "input_tokens": 1200,
        "output_tokens": 30,
        "result": "Done.",
    }


# ------------------------------------------------------------- the real CLI, a fake provider
