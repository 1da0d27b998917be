"""The python harness through the workflow: examples/agents/file_agent.py in its own process
under bwrap, gateway-only network, llama-server, scored."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import have_bwrap
from tests.support.harness_run import executed_tool_calls, run_task

#: 2 in CI; the closing figures use 4 (ROLLOUTD_HARNESS_SAMPLES=4)
NUM_SAMPLES = int(os.environ.get("ROLLOUTD_HARNESS_SAMPLES", "2"))

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
        {
            "instruction": "Use the write_file tool to create hello.py that prints hello world.",
            "num_samples": NUM_SAMPLES,
            "harness": {
                "type": "python",
                "entry": "file_agent:agent",
                "max_turns": 2,
                "files": {"file_agent.py": AGENT.read_text()},
            },
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
        assert executed_tool_calls(s.completions) >= 1, s.harness
        assert s.result.reward is not None, (s.result.status, s.result.error, s.harness)
    print(
        "python",
        [s.result.reward for s in run.sessions],
        [s.result.num_completions for s in run.sessions],
        [s.result.num_traces for s in run.sessions],
        [s.result.num_trainable_tokens for s in run.sessions],
        round(run.wall_s, 1),
        [s.harness.get("summary") for s in run.sessions],
    )
