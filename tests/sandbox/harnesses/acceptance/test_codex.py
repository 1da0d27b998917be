"""Acceptance: a codex task through the trainer client, under bwrap, scored by a check.

Real Temporal, real llama-server (Qwen2.5-Coder-0.5B, slots of 16K tokens), Codex 0.169 in
its compact profile speaking the Responses API to the gateway. And the real CLI alone on a
local runtime against a provider that refuses every call: it accepts every config key the
adapter writes and calls the session with its key.
"""

from __future__ import annotations

import pytest

from rolloutd.sandbox.config import npm_prefix
from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.codex import ENTRY, PACKAGE
from rolloutd.types import HarnessSpec
from tests.conftest import have_bwrap
from tests.support.contexts import SESSION_KEY, harness_context
from tests.support.harness_run import (
    HARNESS_TASK_MARKS,
    check_scored_with_tools,
    example_task,
    run_task,
)
from tests.support.refusing_provider import refusing_provider

INSTRUCTION = "-n create hello.py that prints 'hello world'"


pytestmark = [
    *HARNESS_TASK_MARKS,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
    pytest.mark.skipif(
        not (npm_prefix() / "node_modules" / PACKAGE / ENTRY).is_file(),
        reason=f"codex is not installed in {npm_prefix()}: bash scripts/setup.sh",
    ),
]


async def test_codex_task_runs_a_tool_and_is_scored(fleets):
    """The examples/harnesses.jsonl codex task (compact profile, Responses API) in bwrap through
    the trainer client: every session is scored and recorded completions, and in at least one
    codex ran its tool (a tool result in a later request, or the file it made passes the check).
    About 345 s here with 2 samples under load 9-16, plus 24 s starting the fleets."""
    # a task id of its own per run: the example's id names a workflow of an earlier run
    run = await run_task(fleets, example_task("harness-codex-hello"))
    # a tool result in a later request, or (max_turns 1 stops Codex right after its first
    # call) the file it made: the check runs hello.py, which only the harness wrote
    check_scored_with_tools(run, "codex")


@pytest.mark.harness
@pytest.mark.timeout(120)
async def test_real_codex_accepts_the_config_and_calls_the_session(make_runtime):
    """codex 0.169 reads every key we write (no "unrecognized" warning) and calls the session,
    in both profiles: every request a POST to its ``/responses`` with the session key. About
    2-5 s here (two runs)."""
    if not (npm_prefix() / "node_modules" / PACKAGE / ENTRY).is_file():
        pytest.skip(f"codex is not installed in {npm_prefix()} (bash scripts/setup.sh)")
    runtime = await make_runtime("local")
    async with refusing_provider() as provider:
        for profile in ("default", "compact"):
            await _run_refused(runtime, profile, f"{provider.url}/s/k/v1")
    assert provider.seen
    assert all(line.startswith("POST /s/k/v1/responses ") for line, _ in provider.seen)
    assert all(h["authorization"] == f"Bearer {SESSION_KEY}" for _, h in provider.seen)


async def _run_refused(runtime, profile: str, url: str) -> None:
    adapter = get_harness(HarnessSpec(type="codex", profile=profile))
    command = await adapter.prepare(
        runtime, harness_context(url.removesuffix("/v1"), instruction=INSTRUCTION)
    )
    process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
    assert await process.wait(90) == 1, process.stderr_path.read_text()[-2000:]
    stdout = process.stdout_path.read_text()
    summary = adapter.summarize(stdout)
    assert summary is not None and summary["is_error"] and "refused" in summary["error"]
    assert "unrecognized" not in stdout, stdout
