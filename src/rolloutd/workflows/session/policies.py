"""The terms on which a session workflow calls its activities: timeouts, heartbeats and retry
policies, in one place (docs/sessions.md gives each phase's budget and retry policy; the
per-phase budgets themselves are the task's ``phases``). Constants only: workflow code."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

#: heartbeats of provision, collect, teardown and evaluate (they heartbeat every second).
HEARTBEAT = timedelta(seconds=10)
#: heartbeats of the harness run: a dead sandbox worker is noticed within this time.
#: (the SDK sends heartbeats at most every 0.8 x this, so cancellation also lands within it).
#: 10 s, not less: a busy host running many harnesses misses 5 s beats while alive
#: (docs/measurements.md).
HARNESS_HEARTBEAT = timedelta(seconds=10)
#: a host-pinned activity not picked up by then: the host is gone (the session may restart).
HOST_QUEUE_START = timedelta(seconds=60)
#: infrastructure activities (open, provision, teardown, close, build) retry on these terms.
INFRA_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
)
#: one try only: the harness is not retried blindly (a retry would start from a dirty
#: runtime), and a check that fails is an answer, not an infrastructure error
NO_RETRY = RetryPolicy(maximum_attempts=1)
#: all teardown attempts on a host already known lost (else 3 x ``phases.teardown_s``).
LOST_HOST_TEARDOWN = timedelta(seconds=15)
#: one close attempt (it waits for a call in flight, which a slow backend may hold for
#: minutes), and all attempts on the gateway host serving the session.
CLOSE_TIMEOUT = timedelta(seconds=300)
PINNED_CLOSE = timedelta(seconds=600)


def seconds(s: float) -> timedelta:
    """A budget in seconds (a task's ``phases``) as the ``timedelta`` Temporal takes."""
    return timedelta(seconds=s)
