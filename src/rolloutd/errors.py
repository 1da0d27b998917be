"""The error tree. Every error says whether Temporal should retry the work that raised it.

Activities convert errors with :func:`to_application_error` at their boundary, the one place
where upstream failures become retryable or non-retryable ``ApplicationError``s.
"""

from __future__ import annotations

from temporalio.exceptions import ApplicationError


class RolloutdError(Exception):
    """Base of every rolloutd error.

    Attributes:
        retryable: whether repeating the same work may succeed.
        status_code: HTTP status used when the error reaches a gateway client.
    """

    retryable: bool = False
    status_code: int = 500
    error_type: str = "server_error"

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable


class ConfigError(RolloutdError):
    """A setting or spec is invalid; the message names the dotted path."""

    status_code = 400
    error_type = "invalid_request_error"


class InvalidRequestError(RolloutdError):
    """A client request is malformed (gateway: rendered in the caller's dialect as 400)."""

    status_code = 400
    error_type = "invalid_request_error"


class RequestFieldError(InvalidRequestError):
    """A request field is invalid; ``param`` names its dotted path (OpenAI's ``param``)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ConflictError(InvalidRequestError):
    """The request conflicts with the current state (a backend name taken by another URL)."""

    status_code = 409


class RequestTooLargeError(InvalidRequestError):
    """The request body exceeds ``settings.max_body_bytes``."""

    status_code = 413


class HeadersTooLargeError(InvalidRequestError):
    """The request's headers exceed ``settings.max_header_bytes``."""

    status_code = 431


class AuthenticationError(RolloutdError):
    """No session key, a wrong key, or a key of a closed session."""

    status_code = 401
    error_type = "authentication_error"


class PermissionDeniedError(RolloutdError):
    """Authenticated, or not needing to be, but not allowed (admin routes disabled)."""

    status_code = 403
    error_type = "permission_error"


class NotFoundError(RolloutdError):
    """A session, backend or blob does not exist."""

    status_code = 404
    error_type = "not_found_error"


class SessionClosedError(RolloutdError):
    """The session's completion log is sealed; no call is accepted any more."""

    status_code = 409
    error_type = "invalid_request_error"


class SessionLostError(RolloutdError):
    """The gateway issued this session's key but no longer has the session (its state is not
    in the store): the gateway's fault, not the harness's (``rolloutd.fault``)."""

    status_code = 404
    error_type = "not_found_error"


class TooManyCallsError(RolloutdError):
    """A session has its bound of model calls in flight (``max_calls_per_session``): a
    refusal the task caused, never retried by rolloutd (RFC 6585, 429 Too Many Requests)."""

    status_code = 429
    error_type = "rate_limit_error"


class JudgeQuotaError(RolloutdError):
    """The judge pool's token quota is spent for now (``judge_tokens_per_minute``): 429 with
    ``Retry-After`` (RFC 9110, section 10.2.3). A judge waits and asks again; it is never a
    failure of the judge pool (:mod:`rolloutd.proxy.backends.quota`).

    Args:
        message: what is spent and for how long.
        retry_after_s: seconds until the quota admits a call again.
    """

    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ContextLengthError(InvalidRequestError):
    """The prompt leaves no room for a single sampled token."""


class BackendError(RolloutdError):
    """An inference backend failed or answered garbage. Retryable unless it said 4xx."""

    retryable = True
    status_code = 502
    error_type = "api_error"


class BackendUnavailableError(BackendError):
    """No backend is registered, or every backend is paused or unreachable."""

    status_code = 503


class BackendSaturatedError(RolloutdError):
    """Every backend holds its bound of open sessions (``max_sessions_per_slot`` x slots): a
    new session waits before it provisions (docs/tenancy.md). Not retried by Temporal: the
    session workflow waits on its own timer, charged to no phase budget."""

    status_code = 503


class RuntimeStartError(RolloutdError):
    """A runtime could not be provisioned (infrastructure error, retryable)."""

    retryable = True


class PolicyError(ConfigError):
    """A task asks for isolation its sandbox fleet's policy does not allow (a runtime type,
    a network, an image, an upload source; :mod:`rolloutd.sandbox_policy`). A refusal caused
    by the task: never retried."""


class ExecServerError(RolloutdError):
    """The bwrap runtime's exec server (the sandbox's pid 1, which forks every command in it)
    could not start a command, or is gone (the sandbox died)."""


class NoSandboxWorkerError(RolloutdError):
    """No sandbox worker polled the sandbox queue for ``phases.provision_wait_s`` while a
    session's provisioning waited in it: the fleet is dead, not busy (a new attempt would
    wait in the same queue)."""


class RuntimeNotFoundError(RolloutdError):
    """The runtime is not on this host (the host restarted); the session must start afresh."""


class HostDrainingError(RolloutdError):
    """The sandbox host is draining (its worker got SIGTERM or SIGINT): a harness run it held
    is handed back and its runtime torn down, and the session treats this as a lost host
    (a new attempt on another host, replaying the recorded calls; docs/decisions.md, "One drain"). A
    provisioning is retried on another host."""

    retryable = True


class ArtifactTooLargeError(RolloutdError):
    """An artifact file is larger than its limit (``max_artifact_bytes``): the task's, not
    retryable (a new attempt would write it again)."""

    status_code = 413


class PathRefusedError(RolloutdError):
    """The worker refused a path of a runtime when it opened it: a symbolic link (or a file
    where a folder belongs) on its way, something other than a regular file at its end, or a
    permission the runtime's own processes set. What a session left in its runtime: the
    policy's doing, never retried (rolloutd.sandbox.runtimes.beneath).

    Attributes:
        path: the runtime path refused ("" when not known).
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class HarnessError(RolloutdError):
    """A harness could not be configured or started."""


class EvaluatorError(RolloutdError):
    """An evaluator is unknown or failed to score."""


class JudgeUnavailableError(EvaluatorError):
    """The judge pool gave no answer (refused, timed out, 5xx): the infrastructure's, retried;
    never a reward."""

    retryable = True


class JudgeParseError(EvaluatorError):
    """A judge's answer does not follow the rubric's output schema."""


class BuilderError(RolloutdError):
    """A completion log cannot be turned into a trajectory (for example, no end-of-turn token)."""


class FleetRegistryError(RolloutdError):
    """The fleet registry (what the fleets can run) did not answer, so a task cannot be checked
    before it starts; retry, or submit without the check."""

    retryable = True


class FleetUnavailableError(RolloutdError):
    """A fleet that waiting work needs is dead: no worker has polled its task queue for a
    minute (``workflows``, ``sandbox``, ``gateway``, ``eval``), or no healthy backend serves
    the policy (``engine``). Raised to the caller that waits (``rolloutd submit``, a trainer
    in ``take_batch``); the workflows keep running and complete once the fleet is back, so
    waiting again is right.

    Attributes:
        fleet: the dead fleet's name.
        unavailable_s: how long it has been dead, seconds, when known.
    """

    retryable = True
    status_code = 503

    def __init__(self, fleet: str, message: str, *, unavailable_s: float | None = None) -> None:
        super().__init__(f"fleet {fleet!r} is unavailable: {message}")
        self.fleet = fleet
        self.unavailable_s = unavailable_s


class StackError(RolloutdError):
    """The embedded stack (``rolloutd up``) cannot run: a child keeps exiting (its restart limit
    is reached), does not start, or another stack already runs on the same home."""


def to_application_error(error: BaseException) -> ApplicationError:
    """Convert any error raised in an activity into Temporal's ``ApplicationError``.

    Args:
        error: the exception caught at the activity boundary.

    Returns:
        An ``ApplicationError`` whose ``type`` is the error's class name and whose
        ``non_retryable`` follows :attr:`RolloutdError.retryable`; unknown errors are retryable.
    """
    if isinstance(error, ApplicationError):
        return error
    if isinstance(error, RolloutdError):
        return ApplicationError(
            error.message, type=type(error).__name__, non_retryable=not error.retryable
        )
    return ApplicationError(f"{type(error).__name__}: {error}", type=type(error).__name__)
