"""mini-SWE-agent through the workflow: bwrap, gateway-only network, llama-server, scored."""

from __future__ import annotations

import pytest

from rolloutd.sandbox.harnesses.mini_swe_agent import MiniSweAgentHarness
from tests.conftest import have_bwrap
from tests.support.harness_run import (
    HARNESS_TASK_MARKS,
    check_each_ran_a_tool_and_scored,
    cli_installed,
    hello_world_task,
    run_task,
)

pytestmark = HARNESS_TASK_MARKS


@pytest.mark.timeout(900)
@pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed")
@pytest.mark.skipif(
    not cli_installed(MiniSweAgentHarness), reason="mini-swe-agent not installed (scripts/setup.sh)"
)
async def test_mini_swe_agent_runs_its_bash_tool_and_is_scored(fleets):
    """mini-SWE-agent (compact profile, 2 turns) in bwrap with gateway-only network: in every
    session its bash tool ran (its output went back as a tool result) and the session is scored.
    About 265 s here with 2 samples under load 9-16, plus 32 s starting the fleets."""
    run = await run_task(
        fleets,
        hello_world_task(
            "Create a file hello.py that prints hello world.",
            {"type": "mini_swe_agent", "profile": "compact", "max_turns": 2},
        ),
    )
    check_each_ran_a_tool_and_scored(run, "mini_swe_agent")
