"""The judge pool's token quota: judge calls spend at most ``judge_tokens_per_minute`` tokens
(prompt and completion, as the backend counted them) per minute on one gateway, so judging
never takes the capacity of an engine it shares with the policy (the judge pool may be the
policy's engine under another model name).

A token bucket (the committed rate and burst of RFC 2697, section 2): it holds at most a
minute's tokens and refills at the rate. A call's size is known only when it answers, so a
call is admitted while the bucket holds any token and charged afterwards: one call may
overdraw it, and the calls after wait until the debt is refilled. A refused call is a 429
with ``Retry-After`` (:class:`rolloutd.errors.JudgeQuotaError`): the judge waits that long
and asks again, which is never a failure of the judge pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rolloutd.errors import JudgeQuotaError


class TokenQuota:
    """A bucket of ``tokens_per_minute`` tokens refilled continuously (module docstring).

    Args:
        tokens_per_minute: the rate, and the bucket's size.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, tokens_per_minute: int, clock: Callable[[], float] = time.monotonic):
        if tokens_per_minute <= 0:
            raise ValueError("tokens_per_minute must be positive")
        self.capacity = float(tokens_per_minute)
        self.rate = tokens_per_minute / 60.0
        self.clock = clock
        self.level = self.capacity
        self._at = clock()
        #: tokens charged, and calls refused, since the start
        self.num_charged = 0
        self.num_refused = 0

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self._at) * self.rate)
        self._at = now

    def admit(self) -> None:
        """Let a call through while the bucket holds a token.

        Raises:
            JudgeQuotaError: the bucket is empty or overdrawn; ``retry_after_s`` says when it
                holds a token again.
        """
        self._refill()
        if self.level > 0:
            return
        self.num_refused += 1
        wait = (1.0 - self.level) / self.rate
        raise JudgeQuotaError(
            f"the judge pool's token quota ({self.capacity:.0f} tokens a minute) is spent: "
            f"retry after {wait:.1f} s",
            retry_after_s=wait,
        )

    def charge(self, num_tokens: int) -> None:
        """Take a call's tokens, once it answered (the bucket may go below zero)."""
        self._refill()
        self.level -= max(0, num_tokens)
        self.num_charged += max(0, num_tokens)

    def describe(self) -> dict[str, float | int]:
        """The quota for the admin API: rate, tokens left now, charged and refused so far."""
        self._refill()
        return {
            "tokens_per_minute": int(self.capacity),
            "tokens_left": round(self.level, 1),
            "num_charged": self.num_charged,
            "num_refused": self.num_refused,
        }
