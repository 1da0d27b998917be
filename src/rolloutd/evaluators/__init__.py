"""Evaluators: score sessions (docs/architecture.md, "One session, step by step", step 10).

``get_evaluator(spec).evaluate(ctx)`` resolves ``spec.type`` as a registry name
(``session_completed``, ``test_on_output``, ``swebench``, ``humaneval``,
``math_answer``, ``harbor``) or an import path ``package.module:attr``, where
``attr`` is an :class:`Evaluator` subclass (called with the spec), a factory ``attr(spec)``
returning an object with ``async evaluate(ctx)``, or such an object itself.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any, Protocol

from rolloutd.errors import EvaluatorError
from rolloutd.evaluators.base import (
    CHECK_ARTIFACT,
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
)
from rolloutd.evaluators.builtins import SessionCompleted, TestOnOutput
from rolloutd.evaluators.harbor import HarborVerifier
from rolloutd.evaluators.humaneval import HumanEval
from rolloutd.evaluators.math_answer import MathAnswer
from rolloutd.evaluators.swebench import Swebench
from rolloutd.types import EvaluatorSpec

if TYPE_CHECKING:
    from rolloutd.sandbox.runtimes.base import Runtime

__all__ = [
    "CHECK_ARTIFACT",
    "EVALUATORS",
    "EvaluationContext",
    "EvaluationOutcome",
    "Evaluator",
    "SupportsEvaluate",
    "get_evaluator",
    "import_evaluator",
    "run_check",
]


class SupportsEvaluate(Protocol):
    """Anything with ``async evaluate(ctx) -> EvaluationOutcome``."""

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome: ...


#: registry name -> evaluator class.
EVALUATORS: dict[str, type[Evaluator]] = {
    SessionCompleted.name: SessionCompleted,
    TestOnOutput.name: TestOnOutput,
    Swebench.name: Swebench,
    HumanEval.name: HumanEval,
    MathAnswer.name: MathAnswer,
    HarborVerifier.name: HarborVerifier,
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
        raise EvaluatorError(
            f"evaluator.type={spec.type!r} is unknown; use one of "
            f"{', '.join(EVALUATORS)} or an import path 'module:attr'"
        )
    target = import_evaluator(spec.type)
    if inspect.isclass(target) or (callable(target) and not hasattr(target, "evaluate")):
        target = target(spec)
    if not inspect.iscoroutinefunction(getattr(target, "evaluate", None)):
        raise EvaluatorError(f"evaluator.type={spec.type!r} has no async evaluate(ctx) method")
    return target


def import_evaluator(path: str) -> Any:
    """The object an evaluator import path ``package.module:attr`` names, not yet called.

    Args:
        path: ``module:attr``; ``attr`` may be dotted.

    Returns:
        An :class:`Evaluator` subclass, a factory, or an object with ``async evaluate(ctx)``.

    Raises:
        EvaluatorError: the module does not import, the attribute is missing, or what it names
            can be neither called nor awaited as an evaluator.
    """
    module_name, _, attr = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    # an import runs the module's code: whatever it raises means "does not import"
    except Exception as exc:  # noqa: BLE001 - boundary: foreign module code
        raise EvaluatorError(
            f"evaluator.type={path!r} does not import: {type(exc).__name__}: {exc}"
        ) from exc
    if not (callable(target) or inspect.iscoroutinefunction(getattr(target, "evaluate", None))):
        raise EvaluatorError(
            f"evaluator.type={path!r} is neither an evaluator class, a "
            "factory, nor an object with async evaluate(ctx)"
        )
    return target


async def run_check(runtime: Runtime, spec: EvaluatorSpec) -> dict[str, Any] | None:
    """The evaluator's in-runtime step: the ``check`` artifact, or None when it has none.

    An evaluator with ``async collect(runtime) -> dict`` (e.g. ``swebench``) runs that;
    otherwise ``spec.command`` runs through ``sh -c`` in the workdir, limited to
    ``spec.timeout_s``.

    Returns:
        ``{"exit_code", "stdout", "stderr", "timed_out", ...}`` or None.
    """
    evaluator = get_evaluator(spec)
    collect = getattr(evaluator, "collect", None)
    if collect is not None:
        return await collect(runtime)
    if not spec.command:
        return None
    result = await runtime.exec(
        ["sh", "-c", spec.command], cwd=runtime.workdir, timeout_s=spec.timeout_s
    )
    return result.model_dump(include={"exit_code", "stdout", "stderr", "timed_out"})
