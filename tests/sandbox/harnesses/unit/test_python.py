"""The python harness: the runner's contract, in a real process of a local or bwrap runtime."""

from __future__ import annotations

import pydantic
import pytest

from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.python import summarize_output
from rolloutd.types import HarnessSpec
from tests.support.contexts import SESSION_KEY, harness_context

#: an agent that checks what it was given, makes a file and calls nothing.
AGENT = """
import os, openai
async def agent(client, instruction, wd, *, model, max_turns):
    assert isinstance(client, openai.AsyncOpenAI)
    assert str(client.base_url).rstrip("/") == os.environ["OPENAI_BASE_URL"]
    assert client.max_retries == 0
    open(os.path.join(wd, "made.txt"), "w").write(instruction + "|" + model + "|" + str(max_turns))
    return "done"
async def failing(client, instruction, wd):
    raise ValueError("the agent gave up")
def not_async(client, instruction, wd):
    pass
"""


def test_python_harness_needs_an_entry():
    with pytest.raises(pydantic.ValidationError, match="harness.entry"):
        HarnessSpec(type="python")
    with pytest.raises(pydantic.ValidationError, match="pattern"):
        HarnessSpec(type="python", entry="no_function")


async def test_runner_calls_the_coroutine_in_its_own_process(make_runtime, runtime_type):
    """The runner imports the task's entry and awaits it in a process of the runtime, with an
    OpenAI client on the session's URL (no retries, no key on the command line), the
    instruction, model and turn limit; it prints a summary that parses as success, and the file
    the agent made is in the workspace. The podman case (acceptance) takes about 8 s here with
    the base image present."""
    runtime = await make_runtime(runtime_type)
    spec = HarnessSpec(
        type="python", entry="agents.mine:agent", max_turns=3, files={"agents/mine.py": AGENT}
    )
    command = await get_harness(spec).prepare(
        runtime,
        harness_context("http://127.0.0.1:9/s/k", instruction="make a file", model="qwen-test"),
    )
    assert not any(SESSION_KEY in arg for arg in command.command)
    result = await runtime.exec(command.command, env=command.env, cwd=command.cwd)
    assert result.exit_code == 0, result.stdout + result.stderr
    summary = summarize_output(result.stdout)
    assert summary == {
        "ok": True,
        "result": "done",
        "error": "",
        "error_type": "",
        "is_error": False,
    }
    made = await runtime.download(f"{runtime.workdir}/made.txt")
    assert made.decode() == "make a file|qwen-test|3"


@pytest.mark.parametrize(
    ("entry", "exit_code", "error_type"),
    [
        ("agents.mine:failing", 1, "ValueError"),
        ("agents.mine:not_async", 2, "TypeError"),
        ("agents.absent:agent", 2, "ModuleNotFoundError"),
    ],
)
async def test_runner_reports_what_went_wrong(make_runtime, entry, exit_code, error_type):
    runtime = await make_runtime("local")
    spec = HarnessSpec(type="python", entry=entry, files={"agents/mine.py": AGENT})
    command = await get_harness(spec).prepare(
        runtime,
        harness_context("http://127.0.0.1:9/s/k", instruction="make a file", model="qwen-test"),
    )
    result = await runtime.exec(command.command, env=command.env, cwd=command.cwd)
    assert result.exit_code == exit_code
    summary = summarize_output(result.stdout)
    assert summary["is_error"] and summary["error_type"] == error_type


def test_summary_without_an_outcome_line_is_an_error():
    assert summarize_output("killed\n")["error_type"] == "NoOutcome"
