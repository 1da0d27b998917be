"""The python harness through the workflow: examples/agents/file_agent.py in its own process
under bwrap, gateway-only network, llama-server, scored."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import have_bwrap
from tests.support.harness_run import check_each_ran_a_tool_and_scored, hello_world_task, run_task

AGENT = Path(__file__).parents[4] / "examples" / "agents" / "file_agent.py"


@pytest.mark.temporal
@pytest.mark.engine
@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed")
async def test_python_agent_calls_its_tools_and_is_scored(fleets):
    """examples/agents/file_agent.py as a python harness in bwrap with gateway-only network: in
    every session it ran a tool (its result went back to the model) and the session is scored.
    About 300 s here with 2 samples under load 14-24, plus 65 s starting the fleets."""
    run = await run_task(
        fleets,
        hello_world_task(
            "Use the write_file tool to create hello.py that prints hello world.",
            {
                "type": "python",
                "entry": "file_agent:agent",
                "max_turns": 2,
                "files": {"file_agent.py": AGENT.read_text()},
            },
        ),
    )
    check_each_ran_a_tool_and_scored(run, "python")
