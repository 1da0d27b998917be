"""Whose fault a failure is: the infrastructure's or the task's.

A reward measures the policy, never the infrastructure (docs/failures.md). Every place that
meets an upstream failure (a backend's answer or dropped connection at the gateway, a failed
model call in a session's record, a callback receiver's answer) asks this module whether the
infrastructure failed (the gateway, a backend, a receiver, the network between them: retried,
or the session replaced) or the task did (its task, its policy or its harness: final, never
retried, never replaced). The rules are written here once; change them here.

- An HTTP answer's status (:func:`status_fault`): a 5xx is the server's fault; any other
  status is an answer about the request, the task's (RFC 9110, section 15: 4xx "the client
  seems to have erred", 5xx "the server is aware that it has erred").
- A callback receiver's status (:func:`receiver_status_fault`): as above, and a receiver that
  says "not now" (408 Request Timeout, 409 Conflict, 425 Too Early, 429 Too Many Requests:
  RFC 9110 section 15.5, RFC 8470, RFC 6585) is busy, not refusing: tried again.
- No answer at all (:func:`transport_fault`: a refused or dropped connection, a timeout): the
  infrastructure's.
- A model call the gateway failed (:func:`exception_fault` for the exception as raised,
  :func:`call_fault` for the record a session keeps of it): a backend error
  (:class:`~rolloutd.errors.BackendError` and its subclasses), an unexpected exception in
  the gateway (a 500) and any other 5xx are the infrastructure's. The gateway's refusals
  caused by the task or the policy (a body over the limit, 413; a conversation over the
  context, :class:`~rolloutd.errors.ContextLengthError`; a concurrency bound,
  :class:`~rolloutd.errors.BackendSaturatedError` and
  :class:`~rolloutd.errors.TooManyCallsError` in :data:`TASK_REFUSAL_TYPES`) are the task's.
  A 4xx the gateway makes for its own reasons (its own configuration cannot serve the call,
  :class:`~rolloutd.errors.ConfigError`; it lost the session,
  :class:`~rolloutd.errors.SessionLostError`: :data:`GATEWAY_ERROR_TYPES`) is the
  infrastructure's whatever its status.
- An activity's refusal of what the task asked (:func:`refusal_fault`): a sandbox host
  refusing a task outside its sandbox policy (:class:`~rolloutd.errors.PolicyError`, in
  :data:`TASK_ACTIVITY_REFUSAL_TYPES`) is the task's: never retried, never replaced, and not
  counted as a sandbox failure.
"""

from __future__ import annotations

import enum

from rolloutd.errors import BackendError, RolloutdError


class Fault(enum.StrEnum):
    """Who a failure is charged to.

    ``infrastructure``: the gateway, a backend, a receiver or the network: retried, and a
    session it ends is replaced. ``task``: the task, the policy or the harness: final.
    """

    INFRASTRUCTURE = "infrastructure"
    TASK = "task"

    @property
    def retryable(self) -> bool:
        """Whether work that failed so may succeed when repeated: the infrastructure's."""
        return self is Fault.INFRASTRUCTURE


#: error classes (by name: a session's record keeps the name) of a model call that got no
#: usable answer from its backend
BACKEND_ERROR_TYPES = frozenset({"BackendError", "BackendUnavailableError"})

#: error classes (by name) of the gateway's refusals that the task or the policy caused,
#: whatever their status: a concurrency bound (503) says the task asks for more than its share
TASK_REFUSAL_TYPES = frozenset({"BackendSaturatedError", "TooManyCallsError"})

#: error classes (by name) of the gateway's answers for its own reasons, whatever their
#: status (a 4xx among them): its configuration cannot serve the call (a chat template, a
#: parser, a backend type), or it lost the session
GATEWAY_ERROR_TYPES = frozenset({"ConfigError", "SessionLostError"})

#: error types (``ApplicationError.type``: the class name) of an activity's refusal that the
#: task caused: the sandbox host's policy check refused what the task asked
TASK_ACTIVITY_REFUSAL_TYPES = frozenset({"PolicyError"})

#: statuses of a receiver that is busy rather than refusing: 408 Request Timeout, 409
#: Conflict, 425 Too Early, 429 Too Many Requests
BUSY_STATUSES = frozenset({408, 409, 425, 429})


def status_fault(status_code: int) -> Fault:
    """The fault an HTTP error answer shows: a 5xx is the infrastructure's, any other
    status the task's (the request was refused as it is).

    Args:
        status_code: the answer's HTTP status, >= 400.
    """
    return Fault.INFRASTRUCTURE if status_code >= 500 else Fault.TASK


def receiver_status_fault(status_code: int) -> Fault:
    """The fault a receiver's HTTP error answer shows (a session result's callback): as
    :func:`status_fault`, and a busy receiver (:data:`BUSY_STATUSES`) is the
    infrastructure's: the same body may be taken later.

    Args:
        status_code: the answer's HTTP status, >= 400.
    """
    if status_code in BUSY_STATUSES:
        return Fault.INFRASTRUCTURE
    return status_fault(status_code)


def transport_fault(error: BaseException) -> Fault:
    """The fault of a request that got no answer (a refused or dropped connection, a
    timeout, an answer that is not HTTP): always the infrastructure's.

    Args:
        error: the transport's exception (``httpx.TransportError`` and the like).
    """
    del error  # every transport failure is the infrastructure's; the argument names which
    return Fault.INFRASTRUCTURE


def call_fault(error_type: str, status_code: int) -> Fault:
    """The fault of a failed model call as a session records it (its error's class name and
    the status the harness got).

    Args:
        error_type: the error's class name (``BackendError``, ``ContextLengthError``, ...).
        status_code: the HTTP status the harness got, or would have got in a stream.
    """
    if error_type in TASK_REFUSAL_TYPES:
        return Fault.TASK
    if error_type in BACKEND_ERROR_TYPES or error_type in GATEWAY_ERROR_TYPES:
        return Fault.INFRASTRUCTURE
    return status_fault(status_code)


def exception_fault(error: BaseException) -> Fault:
    """The fault of a failed model call as raised in the gateway: a backend error, or any
    error the harness gets as a 5xx (an unexpected exception is a 500), is the
    infrastructure's; see :func:`call_fault` for the same rule on a session's record.

    Args:
        error: what the call failed with.
    """
    if isinstance(error, BackendError):
        return Fault.INFRASTRUCTURE
    if not isinstance(error, RolloutdError):
        return Fault.INFRASTRUCTURE
    return call_fault(type(error).__name__, error.status_code)


def refusal_fault(error_type: str | None) -> Fault | None:
    """The fault of an activity's failure when it is a refusal the task caused (a sandbox
    host's policy refusal): :attr:`Fault.TASK`; None for any other error (its own rules
    decide).

    Args:
        error_type: the activity error's type (``ApplicationError.type``), or None.
    """
    return Fault.TASK if error_type in TASK_ACTIVITY_REFUSAL_TYPES else None
