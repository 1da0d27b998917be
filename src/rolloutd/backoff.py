"""Capped exponential backoff, the one retry rule outside workflows.

Workflow code retries through Temporal's ``RetryPolicy`` on its activities (same shape:
initial interval, coefficient, maximum interval; docs.temporal.io, "Retry Policies"). Code
outside workflows that must wait between tries (the embedded stack's restarts, a worker's
first Temporal connect, the gateway's probes of an unhealthy backend) uses :class:`Backoff`,
and :func:`retry_async` where the whole loop is "call until it works or the time is spent".
The delay rule is systemd's ``RestartSec``/``RestartMaxDelaySec`` (systemd.service(5)), the
capped exponential backoff without jitter of AWS's "Exponential Backoff And Jitter" (2015).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delays that grow by ``factor`` from ``initial_s`` and stop growing at ``max_s``.

    Attributes:
        initial_s: the delay before the first retry, s (> 0).
        max_s: the cap, s (>= ``initial_s``).
        factor: the growth per retry (>= 1; 1 keeps the delay constant).
    """

    initial_s: float
    max_s: float
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s or self.factor < 1:
            raise ValueError(f"a backoff needs 0 < initial_s <= max_s and factor >= 1: {self}")

    def delay_s(self, retry: int) -> float:
        """The delay before retry number ``retry`` (1-based) of a run of failures:
        ``min(max_s, initial_s * factor ** (retry - 1))``; ``retry`` below 1 counts as 1."""
        exponent = max(0, retry - 1)
        if self.factor > 1 and exponent > 1000:  # the cap was reached long before
            return self.max_s
        return min(self.max_s, self.initial_s * self.factor**exponent)


async def retry_async(
    call: Callable[[], Awaitable[T]],
    *,
    retry_on: tuple[type[BaseException], ...],
    backoff: Backoff,
    timeout_s: float,
    on_retry: Callable[[int, float, BaseException], None] | None = None,
    on_give_up: Callable[[int, BaseException], None] | None = None,
) -> T:
    """Await ``call()`` until it returns, waiting ``backoff`` between failures, for at most
    ``timeout_s`` in all.

    Args:
        call: makes one attempt.
        retry_on: the errors worth another attempt; any other error is raised at once.
        backoff: the delays between attempts (each cut to the time left).
        timeout_s: the bound on the whole retry, s; the last attempt may start just before it.
        on_retry: called before each wait with (attempt number, seconds left, error).
        on_give_up: called once the time is spent with (attempts made, last error).

    Returns:
        What the first successful attempt returned.

    Raises:
        BaseException: the last attempt's error (one of ``retry_on``) once ``timeout_s`` is
            spent, or any other error of an attempt at once.
    """
    deadline = time.monotonic() + timeout_s
    attempt = 1
    while True:
        try:
            return await call()
        except retry_on as e:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                if on_give_up is not None:
                    on_give_up(attempt, e)
                raise
            if on_retry is not None:
                on_retry(attempt, left_s, e)
            await asyncio.sleep(min(backoff.delay_s(attempt), left_s))
            attempt += 1
