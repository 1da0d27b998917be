"""Old verifiers, reproduced as the operator's registered evaluators, to score a batch the way
a fleet did before a fix (``rolloutd reverify`` then scores it again with the fixed built-in).

``tests_humaneval_r1``: HumanEval as revision 1 of the ``humaneval`` evaluator scored it (an
answer passed when the program exited 0, whether or not ``check`` returned: an answer ending
in ``os._exit(0)`` passed). Its in-runtime step is revision 2's (which reports the exit status
too); only the verdict is the old one.
"""

from __future__ import annotations

from typing import Any, ClassVar

from rolloutd.evaluators import CHECK_ARTIFACT, EvaluationContext, EvaluationOutcome
from rolloutd.evaluators.humaneval import HumanEval


class HumanEvalR1(HumanEval):
    """HumanEval's verdict of revision 1: exit 0 in time is a pass."""

    name = "tests_humaneval_r1"
    version: ClassVar[str] = "r1-reproduced"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """1.0 when the check program exited 0 in time (revision 1's rule)."""
        check: Any = ctx.artifacts.get(CHECK_ARTIFACT)
        passed = (
            isinstance(check, dict) and check.get("exit_code") == 0 and not check.get("timed_out")
        )
        details = {} if passed else {"reason": "the check program did not exit 0"}
        return EvaluationOutcome(reward=1.0 if passed else 0.0, details=details)
