"""The session workflow's input, and the ids of a session's attempts."""

from __future__ import annotations

from pydantic import Field, model_validator

from rolloutd.payload import Payload
from rolloutd.types import TaskRequest


def attempt_session_id(session_id: str, attempt: int) -> str:
    """The gateway session id of attempt ``attempt`` (1-based) of session ``session_id``:
    the session id itself, then ``{session_id}.attempt-{n}``."""
    return session_id if attempt == 1 else f"{session_id}.attempt-{attempt}"


class SessionInput(Payload):
    """Input of :class:`~rolloutd.workflows.session.workflow.RolloutSessionWorkflow`."""

    task: TaskRequest | None = Field(
        default=None,
        description="the task's request; None when it is stored once (``task_key``): a large "
        "request is not copied into every session's input",
    )
    task_key: str | None = Field(
        default=None,
        description="blob store key of the stored request (``store_task_request``); the "
        "session reads it first",
    )
    sample_index: int = Field(ge=0)
    session_id: str
    replay_from: list[str] = Field(
        default_factory=list,
        description="gateway session ids of the sample's earlier sessions (a replaced session's "
        "attempts), newest first: replayed from when ``task.resume`` is ``replay``",
    )

    tenant_quota: bool | None = Field(
        default=None,
        description="whether the task's tenant had a quota when the task started its "
        "sessions (False: the session asks its tenant for no slot); None: the session asks",
    )

    @model_validator(mode="after")
    def _one_request(self) -> SessionInput:
        if (self.task is None) == (self.task_key is None):
            raise ValueError("a session takes its task's request or the key of the stored one")
        return self
