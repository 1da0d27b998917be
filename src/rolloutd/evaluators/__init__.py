"""Evaluators: score sessions (DESIGN.md, evaluators).

``get_evaluator(spec).evaluate(ctx)`` resolves ``spec.type`` as a registry name
(``session_completed``, ``test_on_output``) or an import path ``package.module:attr``, where
``attr`` is an :class:`Evaluator` subclass (called with the spec), a factory ``attr(spec)``
returning an object with ``async evaluate(ctx)``, or such an object itself.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Protocol

from rolloutd.errors import EvaluatorError
from rolloutd.evaluators.base import (
    CHECK_ARTIFACT,
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
)
from rolloutd.evaluators.builtins import SessionCompleted, TestOnOutput
from rolloutd.types import EvaluatorSpec

__all__ = ["CHECK_ARTIFACT", "EVALUATORS", "EvaluationContext", "EvaluationOutcome",
           "Evaluator", "SupportsEvaluate", "get_evaluator"]


class SupportsEvaluate(Protocol):
    """Anything with ``async evaluate(ctx) -> EvaluationOutcome``."""

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome: ...


#: registry name -> evaluator class.
EVALUATORS: dict[str, type[Evaluator]] = {
    SessionCompleted.name: SessionCompleted,
    TestOnOutput.name: TestOnOutput,
}


def get_evaluator(spec: EvaluatorSpec) -> SupportsEvaluate:
    """The evaluator ``spec.type`` names.

    Args:
        spec: the task's evaluator spec.

    Returns:
        An object with ``async evaluate(ctx: EvaluationContext) -> EvaluationOutcome``.

    Raises:
        EvaluatorError: an unknown name, an import path that does not import, or an attribute
            that is not an evaluator.
    """
    if spec.type in EVALUATORS:
        return EVALUATORS[spec.type](spec)
    if ":" not in spec.type:
        raise EvaluatorError(f"evaluator.type={spec.type!r} is unknown; use one of "
                             f"{', '.join(EVALUATORS)} or an import path 'module:attr'")
    module_name, _, attr = spec.type.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise EvaluatorError(f"evaluator.type={spec.type!r} does not import: {exc}") from exc
    if inspect.isclass(target) or (callable(target) and not hasattr(target, "evaluate")):
        target = target(spec)
    if not inspect.iscoroutinefunction(getattr(target, "evaluate", None)):
        raise EvaluatorError(
            f"evaluator.type={spec.type!r} has no async evaluate(ctx) method"
        )
    return target
