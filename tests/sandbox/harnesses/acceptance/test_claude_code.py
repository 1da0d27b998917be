"""Acceptance: a claude_code task through the trainer client, under bwrap, scored by a check.

Real Temporal, real llama-server (Qwen2.5-Coder-0.5B, slots of 16K tokens), Claude Code 2.1 in
its compact profile speaking the Anthropic Messages API to the gateway. And the real CLI
alone on a local runtime against a provider that refuses every call: it sends its requests to
the session with the key in ``x-api-key``.
"""

from __future__ import annotations

import pytest

from rolloutd.sandbox.config import npm_prefix
from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.claude_code import ENTRY, PACKAGE
from rolloutd.types import HarnessSpec
from tests.conftest import have_bwrap
from tests.support.contexts import SESSION_KEY, harness_context
from tests.support.harness_run import (
    HARNESS_TASK_MARKS,
    NUM_SAMPLES,
    check_scored_with_tools,
    example_task,
    run_task,
)
from tests.support.refusing_provider import refusing_provider

INSTRUCTION = "--help create hello.py that prints 'hello world' $HOME"


pytestmark = [
    *HARNESS_TASK_MARKS,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
    pytest.mark.skipif(
        not (npm_prefix() / "node_modules" / PACKAGE / ENTRY).is_file(),
        reason=f"claude-code is not installed in {npm_prefix()}: bash scripts/setup.sh",
    ),
]


async def test_claude_code_task_runs_a_tool_and_is_scored(fleets):
    """The examples/harnesses.jsonl claude_code task (compact profile, Anthropic Messages) in
    bwrap through the trainer client: every session is scored and recorded completions, and in
    at least one a tool result went back to the model. About 480 s here with 2 samples under
    load 9-16, plus 47 s starting the fleets."""
    # a task id of its own per run: the example's id names a workflow of an earlier run
    run = await run_task(fleets, example_task("harness-claude-code-hello", num_samples=NUM_SAMPLES))
    check_scored_with_tools(run, "claude_code", tool_must_run=True)


@pytest.mark.harness
@pytest.mark.timeout(180)
async def test_real_claude_code_calls_the_session_with_the_compact_prompt(make_runtime):
    """Claude Code 2.1 sends its first request to the session, key in ``x-api-key``: against a
    provider that refuses every call it exits 1 with an error summary, and every POST it sent
    went to the session's ``/v1/messages``. About 2-6 s here (two runs)."""
    if not (npm_prefix() / "node_modules" / PACKAGE / ENTRY).is_file():
        pytest.skip(f"claude-code is not installed in {npm_prefix()} (bash scripts/setup.sh)")
    runtime = await make_runtime("local")
    adapter = get_harness(HarnessSpec(type="claude_code", profile="compact", max_turns=2))
    async with refusing_provider() as provider:
        command = await adapter.prepare(
            runtime,
            harness_context(
                f"{provider.url}/s/k", instruction=INSTRUCTION, dialects=("openai", "anthropic")
            ),
        )
        process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
        code = await process.wait(150)
    stdout = process.stdout_path.read_text()
    summary = adapter.summarize(stdout)
    assert code == 1 and summary is not None and summary["is_error"], stdout[-2000:]
    assert provider.seen, stdout[-2000:]
    # besides its calls, Claude Code sends a HEAD to the base URL (a reachability probe)
    posts = [(line, h) for line, h in provider.seen if line.startswith("POST ")]
    assert posts and all(line.startswith("POST /s/k/v1/messages") for line, _ in posts), posts
    assert all(h["x-api-key"] == SESSION_KEY for _, h in posts)
