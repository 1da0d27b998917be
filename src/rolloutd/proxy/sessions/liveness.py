"""Whether a session's model calls stand unanswered, and the gateway's verdict on it.

A session's calls stand unanswered from the first failure of a call with a backend-kind
error (``BackendError``, ``BackendUnavailableError``, any 5xx:
:func:`rolloutd.fault.exception_fault`, docs/failures.md) since the last answered call (from
the failure, not the call's start: time queued on a saturated
engine before it died is not time the engine was dead), or from the moment a call still in flight
got its backend,
whichever is earlier; a call in flight counts only while its backend does not answer a probe
(a saturated engine answers: its calls queue, it is not dead; a call waiting for a backend
paused by a weight update is not waiting on a dead one). A call answered since ends it: the backend
answers. When they have
stood unanswered for ``backend_dead_after_s`` (a gateway setting, default 60 s), the
gateway's verdict on the session is ``backend``: the sandbox's run-harness activity asks for
it at each heartbeat and stops the harness, so the session ends with failure kind
``backend`` within that time and one heartbeat, instead of waiting out its run budget (a
harness that, like Qwen Code, carries on after failed calls would otherwise run to its end
or its budget on a dead engine). Kept in the gateway's memory: a restarted gateway starts
the clock again.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from rolloutd.fault import Fault, exception_fault

_tokens = itertools.count()


class BackendVerdict(BaseModel):
    """``GET /s/{key}/rolloutd/verdict``: what the gateway concludes about a session.

    Attributes:
        verdict: ``backend`` when its calls have stood unanswered for ``dead_after_s``;
            None otherwise.
        unanswered_s: how long they have stood unanswered (seconds), None while answered.
        dead_after_s: the gateway's ``backend_dead_after_s``.
        message: why, in words (with the last backend-kind error).
    """

    verdict: str | None = None
    unanswered_s: float | None = Field(default=None, ge=0)
    dead_after_s: float = Field(gt=0)
    message: str | None = None


@dataclass
class Liveness:
    """The calls of one session as they stand (in memory).

    Attributes:
        waiting: token -> (Unix time it got its backend, None before; the call's task) of
            each call in flight.
        failing_since: Unix time of the first backend-kind failure since the last answered
            call, None when none failed since.
        last_error: the last backend-kind error, in words.
    """

    waiting: dict[int, tuple[float | None, asyncio.Task[object] | None]] = field(
        default_factory=dict
    )
    failing_since: float | None = None
    last_error: str | None = None
    #: token -> why: the calls a ``backend`` verdict cancelled (:meth:`ended_by_verdict`)
    verdict_ended: dict[int, str] = field(default_factory=dict)

    def started(self) -> int:
        """A call began; returns its token."""
        token = next(_tokens)
        self.waiting[token] = (None, asyncio.current_task())
        return token

    def leased(self, token: int) -> None:
        """The call got its backend: from now it waits on it."""
        if token in self.waiting:
            self.waiting[token] = (time.time(), self.waiting[token][1])

    def answered(self, token: int) -> None:
        """The call got its answer: the session's calls no longer stand unanswered."""
        self.waiting.pop(token, None)
        self.failing_since = self.last_error = None

    def failed(self, token: int, error: BaseException) -> None:
        """The call failed; a backend-kind failure starts (or continues) the unanswered
        stretch."""
        self.waiting.pop(token, None)
        if exception_fault(error) is Fault.INFRASTRUCTURE:
            self.last_error = f"{type(error).__name__}: {error}"[:300]
            if self.failing_since is None:
                self.failing_since = time.time()

    def ended_by_verdict(self, token: int) -> str | None:
        """Why the call ``token`` was cancelled by a ``backend`` verdict, or None (it was
        cancelled otherwise: its harness went away). Asked once: the entry is dropped."""
        return self.verdict_ended.pop(token, None)

    def cut(self, token: int) -> None:
        """The call was cut off (its harness went away): neither answered nor failed."""
        self.waiting.pop(token, None)

    def waited(self, seconds: float) -> bool:
        """Whether a call in flight has waited on its backend for ``seconds``."""
        now = time.time()
        return any(
            start is not None and now - start >= seconds for start, _ in self.waiting.values()
        )

    def unanswered_since(self, *, count_waiting: bool = True) -> float | None:
        """Unix time from which the session's calls stand unanswered, or None; calls in
        flight count only with ``count_waiting``."""
        starts = [
            start for start, _ in self.waiting.values() if start is not None and count_waiting
        ]
        if self.failing_since is not None:
            starts.append(self.failing_since)
        return min(starts) if starts else None

    def verdict(self, dead_after_s: float, *, backend_answers: bool = False) -> BackendVerdict:
        """The gateway's verdict now; a ``backend`` verdict also cancels the calls that have
        waited ``dead_after_s`` themselves (the session is ending: its close must not wait
        for them up to the backend's timeout).

        Args:
            dead_after_s: the gateway's ``backend_dead_after_s``, seconds.
            backend_answers: the session's backend answered a probe just now: its calls in
                flight are queued on a saturated engine, not unanswered.
        """
        since = self.unanswered_since(count_waiting=not backend_answers)
        now = time.time()
        if since is None:
            return BackendVerdict(dead_after_s=dead_after_s)
        unanswered_s = max(0.0, now - since)
        if unanswered_s < dead_after_s:
            return BackendVerdict(unanswered_s=round(unanswered_s, 1), dead_after_s=dead_after_s)
        why = self.last_error or "a call waited on a backend that does not answer"
        for token, (start, task) in list(self.waiting.items()):
            if task is not None and start is not None and now - start >= dead_after_s:
                self.verdict_ended[token] = (
                    f"the backend did not answer this call for {now - start:.0f} s "
                    f"(limit {dead_after_s:g} s): the gateway's verdict ended it"
                )
                task.cancel()
        return BackendVerdict(
            verdict="backend",
            unanswered_s=round(unanswered_s, 1),
            dead_after_s=dead_after_s,
            message=f"the session's model calls stood unanswered for "
            f"{unanswered_s:.0f} s (limit {dead_after_s:g} s); last: {why}",
        )
