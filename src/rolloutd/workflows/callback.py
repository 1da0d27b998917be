"""``CallbackWorkflow``: POST one session's result to its task's ``callback_url``.

A task starts one per ended session, after it stored the session's result (the task's
``status`` query answers it), as a detached child (``task/{task_id}/{index}/callback``,
parent-close policy ABANDON): the task ends when its sessions end, whatever the receiver does.
Temporal retries the POST (the activity's ``RetryPolicy``: 1 s, 2 s, ... at most 60 s) within a
total time of ``TaskRequest.callback_timeout_s``, queue time included; a final 4xx ends the
retries at once. The query ``state`` answers a :class:`~rolloutd.types.CallbackStatus`
(``pending`` while the POST is retried; once it ended: attempts, last error), which the trainer
client and the REST facade show in the task's status. Deterministic code only.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import Field

    from rolloutd import task_queues
    from rolloutd.activities.models import PostCallbackInput, PostCallbackOutput
    from rolloutd.activities.names import POST_CALLBACK
    from rolloutd.payload import Payload
    from rolloutd.types import CallbackStatus, SessionResult

#: one POST's limit (the eval fleet's HTTP client gives up at 30 s).
ATTEMPT_TIMEOUT_S = 60.0
#: Temporal retries the POST: 1 s, doubled each time, at most 60 s, until the total time is
#: spent (the activity's schedule-to-close timeout); a non-retryable error (a final 4xx)
#: ends the retries at once.
RETRY_POLICY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
)
#: the query answering the callback's :class:`CallbackStatus`.
STATE_QUERY = "state"


def callback_workflow_id(task_workflow_id: str, sample_index: int) -> str:
    """Workflow id of one session's callback."""
    return f"{task_workflow_id}/{sample_index}/callback"


class CallbackInput(Payload):
    """One session's result for a task's callback URL, and the total time to deliver it."""

    url: str
    session: SessionResult
    timeout_s: float = 300.0
    secret: str | None = Field(default=None, repr=False, description="the task's callback secret")


@workflow.defn
class CallbackWorkflow:
    """Deliver one session's result; see the module docstring."""

    def __init__(self) -> None:
        self._state: CallbackStatus | None = None

    @workflow.query(name=STATE_QUERY)
    def state(self) -> CallbackStatus | None:
        """The callback's status (None before the workflow's first task ran)."""
        return self._state

    @workflow.run
    async def run(self, input: CallbackInput) -> CallbackStatus:
        """POST until delivered, refused, or ``input.timeout_s`` is spent."""
        state = self._state = CallbackStatus(session_id=input.session.session_id)
        try:
            out: PostCallbackOutput = await workflow.execute_activity(
                POST_CALLBACK,
                PostCallbackInput(url=input.url, session=input.session, secret=input.secret),
                result_type=PostCallbackOutput,
                task_queue=task_queues.EVAL,
                # queue time counts: no eval worker must not hold the callback past it
                schedule_to_close_timeout=timedelta(seconds=max(input.timeout_s, 1.0)),
                start_to_close_timeout=timedelta(
                    seconds=min(ATTEMPT_TIMEOUT_S, max(input.timeout_s, 1.0))
                ),
                retry_policy=RETRY_POLICY,
            )
        except ActivityError as e:
            last = _last_application_error(e)
            state.status = "failed"
            state.error = str(last or e.cause or e)
            state.attempts = _attempt_of(last)
            workflow.logger.warning(
                "callback for %s failed after %d attempts: %s",
                state.session_id,
                state.attempts,
                state.error,
            )
            return state
        state.status, state.status_code, state.attempts = "delivered", out.status_code, out.attempt
        return state


def _last_application_error(error: BaseException) -> ApplicationError | None:
    """The last attempt's own error: the first ``ApplicationError`` down the cause chain (a
    timeout of the whole retry carries it as its cause)."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ApplicationError):
            return cause
        cause = cause.__cause__ or getattr(cause, "cause", None)
    return None


def _attempt_of(error: ApplicationError | None) -> int:
    """The attempt number ``post_callback`` put in its error's details (1 when unknown: an
    attempt cut off by the total timeout raised nothing of its own)."""
    if error is not None and error.details and isinstance(error.details[0], int):
        return error.details[0]
    return 1
