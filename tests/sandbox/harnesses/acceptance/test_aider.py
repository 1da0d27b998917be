"""Aider through the workflow: bwrap, gateway-only network, llama-server, scored.

Aider's "tools" are its edit formats: it sends no tool-calling requests, and the tool call it
executed is the file it wrote into the workspace (its summary's ``edited_files``).
"""

from __future__ import annotations

import pytest

from rolloutd.sandbox.harnesses.aider import AiderHarness
from tests.conftest import have_bwrap
from tests.support.harness_run import (
    HARNESS_TASK_MARKS,
    cli_installed,
    hello_world_task,
    print_figures,
    run_task,
)

pytestmark = HARNESS_TASK_MARKS


@pytest.mark.timeout(900)
@pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed")
@pytest.mark.skipif(
    not cli_installed(AiderHarness), reason="aider-chat not installed (scripts/setup.sh)"
)
async def test_aider_writes_the_file_and_is_scored(fleets):
    """Aider (compact profile) in bwrap with gateway-only network, against llama-server: every
    session is scored, its requests carry no tool messages (aider edits by its edit formats),
    and in at least one session aider applied the model's edit (a file in its summary's
    ``edited_files``). About 40 s here (37 s in a run of the whole acceptance tier)."""
    run = await run_task(
        fleets,
        hello_world_task(
            (
                "Create a new file hello.py that prints hello world. Reply with the "
                "line hello.py, then the whole file in a ```python fence."
            ),
            {"type": "aider", "profile": "compact"},
            max_tokens=64,
        ),
    )
    for s in run.sessions:
        assert s.result.reward is not None, (s.result.status, s.result.error, s.harness)
        assert s.completions and not any(
            c.messages[-1].get("role") == "tool" for c in s.completions
        )
    print_figures(run, "aider")
    # aider applied an edit of the model's: the file it made is its tool call. (With aider's
    # default reminder after the request, Qwen2.5-Coder-0.5B echoed the reminder instead:
    # the compact profile drops it.)
    assert any(s.harness["summary"]["edited_files"] for s in run.sessions), [
        s.harness.get("stdout", "")[-1500:] for s in run.sessions
    ]
