"""An evaluator that raises: its session must keep its trajectory and report ``evaluator``."""

from __future__ import annotations

from rolloutd.evaluators import EvaluationContext, EvaluationOutcome, Evaluator


class RaisingEvaluator(Evaluator):
    """Raises ``ZeroDivisionError`` for every session (a bug in an evaluator's code)."""

    name = "raising"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        return EvaluationOutcome(reward=1.0 / len(ctx.artifacts.get("nothing", [])))
