"""Acceptance: pi runs a tool-using task through the workflow in each of its three dialects.

The task goes through the trainer client to the shared fleets (real Temporal, llama-server with
Qwen2.5-Coder-0.5B-Instruct); pi speaks OpenAI Chat, OpenAI Responses or Anthropic Messages
(``harness.dialect``) to its session from a bubblewrap runtime that reaches only the gateway.
pi has no turn limit of its own: the adapter's extension ends the agent loop after
``harness.max_turns`` turns (a 0.5B model repeats its write call otherwise).
"""

from __future__ import annotations

import os
import shutil

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses.pi import PiHarness
from tests.support.harness_run import check_scored_with_tools, run_task

#: 2 in CI; the closing figures use 4 (ROLLOUTD_HARNESS_SAMPLES=4)
NUM_SAMPLES = int(os.environ.get("ROLLOUTD_HARNESS_SAMPLES", "2"))

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.harness,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
]


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
async def test_pi_makes_a_file_with_its_tools_and_is_scored(fleets, dialect):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    try:
        PiHarness.cli_version()
    except HarnessError as e:
        pytest.skip(str(e))
    run = await run_task(
        fleets,
        {
            "instruction": "Use the write tool to create the file hello.py containing "
            "print('hello world'). Then stop.",
            "num_samples": NUM_SAMPLES,
            "harness": {"type": "pi", "dialect": dialect, "profile": "compact", "max_turns": 2},
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
    check_scored_with_tools(run, f"pi/{dialect}")
