"""Aider through the workflow: bwrap, gateway-only network, llama-server, scored.

Aider's "tools" are its edit formats: it sends no tool-calling requests, and the tool call it
executed is the file it wrote into the workspace (its summary's ``edited_files``).
"""

from __future__ import annotations

import os

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses.aider import AiderHarness
from tests.conftest import have_bwrap
from tests.support.harness_run import run_task

#: 2 in CI; the closing figures use 4 (ROLLOUTD_HARNESS_SAMPLES=4)
NUM_SAMPLES = int(os.environ.get("ROLLOUTD_HARNESS_SAMPLES", "2"))


def _installed() -> bool:
    try:
        AiderHarness.cli_version()
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
@pytest.mark.skipif(not _installed(), reason="aider-chat not installed (scripts/setup.sh)")
async def test_aider_writes_the_file_and_is_scored(fleets):
    """Aider (compact profile) in bwrap with gateway-only network, against llama-server: every
    session is scored, its requests carry no tool messages (aider edits by its edit formats),
    and in at least one session aider applied the model's edit (a file in its summary's
    ``edited_files``). Several minutes with the fleets' start; not yet timed on this machine."""
    run = await run_task(
        fleets,
        {
            "instruction": (
                "Create a new file hello.py that prints hello world. Reply with the "
                "line hello.py, then the whole file in a ```python fence."
            ),
            "num_samples": NUM_SAMPLES,
            "harness": {"type": "aider", "profile": "compact"},
            "runtime": {"type": "bwrap", "network": "gateway"},
            "evaluator": {
                "type": "test_on_output",
                "command": "python3 hello.py",
                "expected_output": "hello world",
            },
            "sampling": {"temperature": 0.2, "max_tokens": 64, "seed": 7},
            "phases": {"run_s": 600},
        },
    )
    for s in run.sessions:
        assert s.result.reward is not None, (s.result.status, s.result.error, s.harness)
        assert s.completions and not any(
            c.messages[-1].get("role") == "tool" for c in s.completions
        )
    print(
        "aider",
        [s.result.reward for s in run.sessions],
        [s.result.num_completions for s in run.sessions],
        [s.result.num_traces for s in run.sessions],
        [s.result.num_trainable_tokens for s in run.sessions],
        round(run.wall_s, 1),
        [s.harness.get("summary") for s in run.sessions],
    )
    # aider applied an edit of the model's: the file it made is its tool call. (With aider's
    # default reminder after the request, Qwen2.5-Coder-0.5B echoed the reminder instead:
    # the compact profile drops it.)
    assert any(s.harness["summary"]["edited_files"] for s in run.sessions), [
        s.harness.get("stdout", "")[-1500:] for s in run.sessions
    ]
