"""Evaluators: score sessions (docs/architecture.md, "One session, step by step", step 10).

``get_evaluator(spec).evaluate(ctx)`` resolves ``spec.type`` as a name in the registry, never as
an import path a request names (a task is not trusted to pick code to run on the eval fleet:
docs/security.md). The registry holds, in this order of precedence:

1. the built-ins (``session_completed``, ``test_on_output``, ``swebench``, ``humaneval``,
   ``math_answer``, ``harbor``, ``llm_judge``: its judging runs on the judge queue,
   :mod:`rolloutd.evaluators.judge`);
2. the operator's registrations (:func:`register_evaluators`, from ``ROLLOUTD_EVALUATORS``:
   ``{"name": "package.module:attr"}``, read by every worker at start);
3. the entry points of the group ``rolloutd.evaluators`` of installed distributions
   (``[project.entry-points."rolloutd.evaluators"] my_reward = "my_pkg.rewards:MyReward"``,
   Python packaging's entry points specification).

What a name points at is an :class:`Evaluator` subclass (called with the spec), a factory
``attr(spec)`` returning an object with ``async evaluate(ctx)``, or such an object itself.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol

from rolloutd.errors import EvaluatorError
from rolloutd.evaluators.base import (
    CHECK_ARTIFACT,
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
    evaluator_version,
)
from rolloutd.evaluators.builtins import SessionCompleted, TestOnOutput
from rolloutd.evaluators.harbor import HarborVerifier
from rolloutd.evaluators.humaneval import HumanEval
from rolloutd.evaluators.judge import LlmJudge
from rolloutd.evaluators.math_answer import MathAnswer
from rolloutd.evaluators.swebench import Swebench
from rolloutd.final_state import FinalStateParts
from rolloutd.types import EvaluatorSpec

if TYPE_CHECKING:
    from rolloutd.sandbox.runtimes.base import Runtime

__all__ = [
    "CHECK_ARTIFACT",
    "CHECK_ENV",
    "ENTRY_POINT_GROUP",
    "EVALUATORS",
    "EvaluationContext",
    "EvaluationOutcome",
    "Evaluator",
    "SupportsEvaluate",
    "evaluator_names",
    "evaluator_version",
    "final_state_parts",
    "get_evaluator",
    "import_evaluator",
    "register_evaluators",
    "run_check",
]

#: the entry-point group installed distributions register evaluators under.
ENTRY_POINT_GROUP = "rolloutd.evaluators"

#: the environment a check command runs with on top of the runtime's: no Python user
#: site-packages (the runtime's HOME is the agent's: a ``.pth`` or ``usercustomize.py`` there
#: would run in every interpreter the check starts; Python's ``site`` documentation), and no
#: git hooks or fsmonitor command from a repository's own configuration (git-config(1):
#: ``core.hooksPath``, ``core.fsmonitor``; ``GIT_CONFIG_COUNT`` overrides the files)
CHECK_ENV = {
    "PYTHONNOUSERSITE": "1",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.hooksPath",
    "GIT_CONFIG_VALUE_0": "/dev/null",
    "GIT_CONFIG_KEY_1": "core.fsmonitor",
    "GIT_CONFIG_VALUE_1": "false",
}


class SupportsEvaluate(Protocol):
    """Anything with ``async evaluate(ctx) -> EvaluationOutcome``."""

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome: ...


#: registry name -> evaluator class: the built-ins.
EVALUATORS: dict[str, type[Evaluator]] = {
    SessionCompleted.name: SessionCompleted,
    TestOnOutput.name: TestOnOutput,
    Swebench.name: Swebench,
    HumanEval.name: HumanEval,
    MathAnswer.name: MathAnswer,
    HarborVerifier.name: HarborVerifier,
    LlmJudge.name: LlmJudge,
}

#: registry name -> import path: the operator's registrations (:func:`register_evaluators`).
_REGISTERED: dict[str, str] = {}


def register_evaluators(paths: dict[str, str]) -> None:
    """Add the operator's evaluators to this process's registry (a worker calls it at start
    with ``CommonSettings.evaluators``; registering a name again replaces it).

    Args:
        paths: registry name -> ``package.module:attr``, imported when first used.

    Raises:
        EvaluatorError: a name of a built-in, or a path without ``:``.
    """
    for name, path in paths.items():
        if name in EVALUATORS:
            raise EvaluatorError(f"evaluator {name!r} is a built-in; register another name")
        if ":" not in path:
            raise EvaluatorError(f"evaluator {name!r}: {path!r} is not 'package.module:attr'")
    _REGISTERED.update(paths)


def _entry_points() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def evaluator_names() -> list[str]:
    """Every name this process's registry resolves (built-ins, registrations, entry points),
    sorted; eval hosts publish it with their capabilities."""
    return sorted({*EVALUATORS, *_REGISTERED, *_entry_points()})


def get_evaluator(spec: EvaluatorSpec) -> SupportsEvaluate:
    """The evaluator ``spec.type`` names in the registry.

    Args:
        spec: the task's evaluator spec.

    Returns:
        An object with ``async evaluate(ctx: EvaluationContext) -> EvaluationOutcome``.

    Raises:
        EvaluatorError: a name not in the registry, a registration that does not import, or
            an attribute that is not an evaluator.
    """
    if spec.type in EVALUATORS:
        return EVALUATORS[spec.type](spec)
    if spec.type in _REGISTERED:
        target = import_evaluator(_REGISTERED[spec.type])
    elif (ep := _entry_points().get(spec.type)) is not None:
        try:
            target = ep.load()
        # loading runs the distribution's module code: whatever it raises means "broken"
        except Exception as exc:  # noqa: BLE001 - boundary: foreign module code
            raise EvaluatorError(
                f"evaluator {spec.type!r} (entry point {ep.value}) does not load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    else:
        raise EvaluatorError(
            f"evaluator.type={spec.type!r} is not in the registry; use one of "
            f"{', '.join(evaluator_names())}"
        )
    if inspect.isclass(target) or (callable(target) and not hasattr(target, "evaluate")):
        target = target(spec)
    if not inspect.iscoroutinefunction(getattr(target, "evaluate", None)):
        raise EvaluatorError(f"evaluator.type={spec.type!r} has no async evaluate(ctx) method")
    return target


def import_evaluator(path: str) -> Any:
    """The object an operator's registration ``package.module:attr`` names, not yet called.

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
            f"evaluator {path!r} does not import: {type(exc).__name__}: {exc}"
        ) from exc
    if not (callable(target) or inspect.iscoroutinefunction(getattr(target, "evaluate", None))):
        raise EvaluatorError(
            f"evaluator {path!r} is neither an evaluator class, a "
            "factory, nor an object with async evaluate(ctx)"
        )
    return target


def final_state_parts(spec: EvaluatorSpec) -> FinalStateParts:
    """What of a session's final state its evaluator needs to score it again
    (:mod:`rolloutd.final_state`): ``patch`` for a check in a fresh runtime (it sees nothing
    else of the session), else the evaluator's own choice (its ``final_state()``), else the
    whole workdir (an evaluator this host's registry does not hold, one without the method).

    Raises:
        EvaluatorError: the evaluator's params are malformed.
    """
    if spec.runtime == "fresh":
        return FinalStateParts(kind="patch")
    if spec.type in evaluator_names():
        choose = getattr(get_evaluator(spec), "final_state", None)
        if callable(choose):
            return choose()
    return FinalStateParts()


async def run_check(runtime: Runtime, spec: EvaluatorSpec) -> dict[str, Any] | None:
    """The evaluator's in-runtime step: the ``check`` artifact, or None when it has none.

    An evaluator with ``async collect(runtime) -> dict`` (e.g. ``swebench``) runs that;
    otherwise ``spec.command`` runs through ``sh -c`` in the workdir with :data:`CHECK_ENV`,
    limited to ``spec.timeout_s``. An evaluator this host's registry does not hold (one the operator
    registered on the eval fleet only) has its command as its in-runtime step.

    Returns:
        ``{"exit_code", "stdout", "stderr", "timed_out", ...}`` or None.
    """
    collect = None
    if spec.type in evaluator_names():
        collect = getattr(get_evaluator(spec), "collect", None)
    if collect is not None:
        return await collect(runtime)
    if not spec.command:
        return None
    result = await runtime.exec(
        ["sh", "-c", spec.command], env=CHECK_ENV, cwd=runtime.workdir, timeout_s=spec.timeout_s
    )
    return result.model_dump(include={"exit_code", "stdout", "stderr", "timed_out"})
