"""The session workflow's input, and the ids of a session's attempts."""

from __future__ import annotations

from pydantic import Field

from rolloutd.payload import Payload
from rolloutd.types import TaskRequest


def attempt_session_id(session_id: str, attempt: int) -> str:
    """The gateway session id of attempt ``attempt`` (1-based) of session ``session_id``:
    the session id itself, then ``{session_id}.attempt-{n}``."""
    return session_id if attempt == 1 else f"{session_id}.attempt-{attempt}"


class SessionInput(Payload):
    """Input of :class:`~rolloutd.workflows.session.workflow.RolloutSessionWorkflow`."""

    task: TaskRequest
    sample_index: int = Field(ge=0)
    session_id: str
    replay_from: list[str] = Field(
        default_factory=list,
        description="gateway session ids of the sample's earlier sessions (a replaced session's "
        "attempts), newest first: replayed from when ``task.resume`` is ``replay``",
    )
