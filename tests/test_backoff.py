"""``rolloutd.backoff``: the delays grow and stop at the cap; ``retry_async`` retries only the
errors it is told to, within its time, and reports each retry and the give-up."""

from __future__ import annotations

import time

import pytest

from rolloutd.backoff import Backoff, retry_async


def test_delays_double_up_to_the_cap() -> None:
    backoff = Backoff(initial_s=1.0, max_s=30.0)
    assert [backoff.delay_s(n) for n in range(0, 8)] == [1, 1, 2, 4, 8, 16, 30, 30]
    assert backoff.delay_s(10**6) == 30.0
    assert Backoff(initial_s=2.0, max_s=2.0, factor=1.0).delay_s(50) == 2.0


@pytest.mark.parametrize("args", [(0.0, 1.0), (2.0, 1.0), (1.0, 2.0, 0.5)])
def test_a_backoff_that_cannot_work_is_refused(args: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(*args)


async def test_retry_async_retries_until_it_works_and_reports_each_retry() -> None:
    attempts: list[float] = []
    retries: list[tuple[int, str]] = []

    async def flaky() -> str:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise ConnectionError(f"refused {len(attempts)}")
        return "up"

    result = await retry_async(
        flaky,
        retry_on=(ConnectionError,),
        backoff=Backoff(initial_s=0.05, max_s=0.1),
        timeout_s=10,
        on_retry=lambda n, left_s, e: retries.append((n, str(e))),
    )
    assert result == "up"
    assert retries == [(1, "refused 1"), (2, "refused 2")]
    assert attempts[2] - attempts[1] >= 0.1 - 0.01  # the second wait doubled


async def test_retry_async_gives_up_with_the_last_error_once_the_time_is_spent() -> None:
    gave_up: list[tuple[int, str]] = []
    calls = 0

    async def refused() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError(f"refused {calls}")

    started = time.monotonic()
    with pytest.raises(ConnectionError, match="refused"):
        await retry_async(
            refused,
            retry_on=(ConnectionError,),
            backoff=Backoff(initial_s=0.05, max_s=0.1),
            timeout_s=0.5,
            on_give_up=lambda n, e: gave_up.append((n, str(e))),
        )
    assert 0.5 <= time.monotonic() - started < 5
    assert gave_up == [(calls, f"refused {calls}")] and calls >= 3


async def test_retry_async_raises_other_errors_at_once() -> None:
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config"):
        await retry_async(
            broken, retry_on=(ConnectionError,), backoff=Backoff(0.05, 0.1), timeout_s=10
        )
    assert calls == 1
