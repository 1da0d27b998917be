"""mini-SWE-agent through the workflow: bwrap, gateway-only network, llama-server, scored."""

from __future__ import annotations

import os

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses.mini_swe_agent import MiniSweAgentHarness
from tests.conftest import have_bwrap
from tests.support.harness_run import executed_tool_calls, run_task

#: 2 in CI; the closing figures use 4 (ROLLOUTD_HARNESS_SAMPLES=4)
NUM_SAMPLES = int(os.environ.get("ROLLOUTD_HARNESS_SAMPLES", "2"))


def _installed() -> bool:
    try:
        MiniSweAgentHarness.cli_version()
    except HarnessError:
        return False
    return True


@pytest.mark.temporal
@pytest.mark.engine
@pytest.mark.sandbox
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed")
@pytest.mark.skipif(not _installed(), reason="mini-swe-agent not installed (scripts/setup.sh)")
async def test_mini_swe_agent_runs_its_bash_tool_and_is_scored(fleets):
    """mini-SWE-agent (compact profile, 2 turns) in bwrap with gateway-only network: in every
    session its bash tool ran (its output went back as a tool result) and the session is scored.
    About 265 s here with 2 samples under load 9-16, plus 32 s starting the fleets."""
    run = await run_task(
        fleets,
        {
            "instruction": "Create a file hello.py that prints hello world.",
            "num_samples": NUM_SAMPLES,
            "harness": {"type": "mini_swe_agent", "profile": "compact", "max_turns": 2},
            "runtime": {"type": "bwrap", "network": "gateway"},
            "evaluator": {
                "type": "test_on_output",
                "command": "python3 hello.py",
                "expected_output": "hello world",
            },
            "sampling": {"temperature": 0.2, "max_tokens": 256, "seed": 7},
            "phases": {"run_s": 600},
        },
    )
    for s in run.sessions:
        # mini's bash tool ran: its output came back as a tool result in the next request
        assert executed_tool_calls(s.completions) >= 1, s.harness
        assert s.result.reward is not None, (s.result.status, s.result.error, s.harness)
    print(
        "mini_swe_agent",
        [s.result.reward for s in run.sessions],
        [s.result.num_completions for s in run.sessions],
        [s.result.num_traces for s in run.sessions],
        [s.result.num_trainable_tokens for s in run.sessions],
        round(run.wall_s, 1),
        [s.harness.get("summary") for s in run.sessions],
    )
