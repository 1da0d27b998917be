"""The evaluator contract: an :class:`EvaluationContext` in, an :class:`EvaluationOutcome` out.

The sandbox runs ``EvaluatorSpec.command`` in the session's runtime after the harness and
stores its result as the artifact ``check``::

    {"exit_code": int, "stdout": str, "stderr": str, "timed_out": bool}
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

import rolloutd
from rolloutd.final_state import FinalStateParts
from rolloutd.types import EvaluatorSpec, SessionStatus, TamperReport

#: the artifact holding the check command's result.
CHECK_ARTIFACT = "check"


class EvaluationContext(BaseModel):
    """What an evaluator sees of a finished session.

    Attributes:
        task_id, session_id: the session's ids.
        status: how the session ended.
        harness_exit_code: the harness's exit code; None when it never exited by itself
            (killed at timeout or cancellation, or never started).
        num_completions: model calls recorded in the completion log.
        num_traces: traces in the built trajectory (length of ``trace_rewards``).
        artifacts: name -> JSON value collected from the runtime (``check``: see module doc).
        spec: the task's evaluator spec.
    """

    model_config = ConfigDict(extra="forbid")

    task_id: str
    session_id: str
    status: SessionStatus
    harness_exit_code: int | None = None
    num_completions: int = Field(default=0, ge=0)
    num_traces: int = Field(default=0, ge=0)
    artifacts: dict[str, Any] = Field(default_factory=dict)
    spec: EvaluatorSpec = Field(default_factory=EvaluatorSpec)


class EvaluationOutcome(BaseModel):
    """An evaluator's verdict.

    Attributes:
        reward: the session's outcome reward; None when only per-trace rewards are given.
        trace_rewards: list[float], length ``num_traces``: one reward per trace, or None.
        details: why (JSON-serialisable; reasons, parsed answers, test counts); a
            ``"reason"`` string becomes the evaluation record's reason.
        tamper: the paths the session changed that the verifier must not trust; a report with
            findings scores the session 0.0 whatever ``reward`` says (the policy's doing: the
            session keeps ``failure = None``). None: the evaluator does not examine changes.
    """

    model_config = ConfigDict(extra="forbid")

    reward: float | None = None
    trace_rewards: list[float] | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    tamper: TamperReport | None = None

    @model_validator(mode="after")
    def _some_reward(self) -> EvaluationOutcome:
        if self.reward is None and self.trace_rewards is None:
            raise ValueError("an evaluation outcome needs reward or trace_rewards")
        return self


class Evaluator(abc.ABC):
    """Scores sessions. Instances are created per spec by the registry and may be reused.

    Args:
        spec: the task's evaluator spec (``params`` carries evaluator-specific settings).
    """

    name: ClassVar[str] = "abstract"
    #: the built-in's own revision: raised whenever what it scores changes (a fixed hole), so
    #: an evaluation record tells a score of the old verifier from one of the new
    revision: ClassVar[int] = 1

    def __init__(self, spec: EvaluatorSpec) -> None:
        self.spec = spec

    def final_state(self) -> FinalStateParts:
        """What of a session's final state this evaluator needs to score it again without
        sampling (``rolloutd reverify``; stored when the task asks): by default the whole
        workdir and, on a container runtime, the container's changes outside it. An evaluator
        that reads only an answer file narrows it to that file."""
        return FinalStateParts()

    def revision_detail(self) -> str:
        """What besides ``revision`` decides this instance's scores (a judge's rubric), for
        its version; empty for most evaluators."""
        return ""

    @abc.abstractmethod
    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """Score one session.

        Raises:
            EvaluatorError: the session cannot be scored by this evaluator.
        """


def evaluator_version(evaluator: object) -> str:
    """The version an evaluation record carries for ``evaluator``.

    A built-in (an :class:`Evaluator` subclass of this package) is rolloutd's version plus its
    own ``revision`` (``0.1.0+r2``) and its :meth:`~Evaluator.revision_detail` (a judge's
    rubric: ``0.1.0+r1.docstring.v1.2f39eeb74d84``); another evaluator's is its ``version``
    attribute (or its class's) when it has one, else ``""``.
    """
    if isinstance(evaluator, Evaluator) and type(evaluator).__module__.startswith(
        "rolloutd.evaluators."
    ):
        detail = evaluator.revision_detail()
        return f"{rolloutd.__version__}+r{type(evaluator).revision}" + (
            f".{detail}" if detail else ""
        )
    version = getattr(evaluator, "version", None)
    return str(version) if isinstance(version, str | int | float) else ""
