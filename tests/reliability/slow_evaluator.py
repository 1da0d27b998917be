"""A slow evaluator for the kill tests: the eval worker can be killed while it scores.

``params``: ``journal`` (a host file: one ``start {session_id}`` line when an evaluation
begins and one ``done {session_id} {reward}`` line when it returns) and ``seconds`` (how long
it scores). The reward is 1.0 for a completed session with completions, else 0.0 (a pure
function of the stored session, as every evaluator must be, so a retry scores the same).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rolloutd.evaluators import EvaluationContext, EvaluationOutcome, Evaluator
from rolloutd.types import SessionStatus


class SlowEvaluator(Evaluator):
    """Session completed with completions: 1.0, else 0.0; after ``params.seconds``."""

    name = "slow"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        journal = Path(self.spec.params["journal"])
        _append(journal, f"start {ctx.session_id}")
        await asyncio.sleep(float(self.spec.params.get("seconds", 5)))
        reward = 1.0 if ctx.status == SessionStatus.COMPLETED and ctx.num_completions else 0.0
        _append(journal, f"done {ctx.session_id} {reward}")
        return EvaluationOutcome(reward=reward)


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")


def journal_lines(path: Path) -> list[tuple[str, str]]:
    """``(event, session_id)`` pairs from a journal."""
    if not path.exists():
        return []
    return [tuple(line.split()[:2]) for line in path.read_text().splitlines() if line.strip()]
