"""Acceptance: Gemini CLI runs a tool-using task through the workflow, scored, under bwrap.

The task goes through the trainer client to the shared fleets (real Temporal, llama-server with
Qwen2.5-Coder-0.5B-Instruct); the CLI speaks the Gemini dialect to its session from a bubblewrap
runtime that reaches only the gateway, with the compact profile (16K-token engine slots).
"""

from __future__ import annotations

import pytest

from rolloutd.sandbox.harnesses.gemini_cli import GeminiCliHarness
from tests.support.harness_run import (
    HARNESS_TASK_MARKS,
    check_scored_with_tools,
    hello_world_task,
    run_task,
    skip_unless_runnable_in_bwrap,
)

pytestmark = [
    *HARNESS_TASK_MARKS,
    pytest.mark.timeout(1800),
]


async def test_gemini_cli_makes_a_file_with_its_tools_and_is_scored(fleets):
    """Gemini CLI (compact profile, Gemini dialect) in bwrap with gateway-only network: every
    session is scored and recorded completions, and its own tool ran in at least one session.
    About 4 minutes here (232 s in a run of the whole acceptance tier)."""
    skip_unless_runnable_in_bwrap(GeminiCliHarness)
    run = await run_task(
        fleets,
        hello_world_task(
            "Use the write_file tool to create the file /workspace/hello.py "
            "containing print('hello world'). Then stop.",
            {"type": "gemini_cli", "profile": "compact", "max_turns": 3},
        ),
    )
    check_scored_with_tools(run, "gemini_cli")
