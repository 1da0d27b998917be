"""What the gateway keeps about failed and unreadable calls for a session's failure cause:
every unrecovered backend error (not only the recent ones), recovery by a retried request,
and a tool call the parser could not read (docs/failures.md). In-process gateway, fake
llama.cpp."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from rolloutd.activities.gateway import GatewayActivities
from rolloutd.activities.models import CloseSessionInput
from rolloutd.proxy.sessions import call_errors
from rolloutd.proxy.sessions.call_errors import (
    MAX_RECORDED_ERRORS,
    CallError,
    RecoveryIndex,
    call_waiting_at,
    conversation_hash,
    still_open,
)
from rolloutd.types import Completion, Timings

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def body(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


async def test_every_unrecovered_backend_error_is_kept_and_a_retry_recovers_one(
    gateway, client: httpx.AsyncClient, fake_llama
) -> None:
    info = await gateway.sessions.open_session("fail/0", "fail")
    url = f"/s/{info.session_key}/v1/chat/completions"
    answer = fake_llama.transport.handler
    fake_llama.transport.handler = lambda request: (
        httpx.Response(500, json={"error": {"code": 500, "message": "engine down"}})
        if request.url.path == "/completion"
        else answer(request)
    )
    num_failed = MAX_RECORDED_ERRORS + 5
    for n in range(num_failed):
        assert (await client.post(url, json=body(f"question {n}"))).status_code >= 500
    fake_llama.transport.handler = answer
    # the harness retries its first failed request: that one is recovered, no other
    assert (await client.post(url, json=body("question 0"))).status_code == 200
    closed = await GatewayActivities(gateway, "h").close_session(
        CloseSessionInput(session_id="fail/0")
    )
    assert closed.num_errors == num_failed and closed.num_completions == 1
    assert closed.num_unrecovered_errors == num_failed - 1
    assert closed.first_unrecovered_error is not None
    assert "question" not in closed.first_unrecovered_error  # no prompt text, a hash
    assert "request " in closed.first_unrecovered_error


async def test_a_tool_call_the_parser_cannot_read_is_recorded(
    gateway, client: httpx.AsyncClient, fake_llama
) -> None:
    info = await gateway.sessions.open_session("badtool/0", "badtool")
    url = f"/s/{info.session_key}/v1/chat/completions"
    fake_llama.answers = [
        '<tool_call>{"name": "get_weather", "arguments": {</tool_call>',
        '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',
    ]
    for n in range(2):
        assert (await client.post(url, json=body(f"weather {n}", tools=TOOLS))).status_code == 200
    session = await gateway.sessions.get("badtool/0")
    assert [c.tool_call_parse_failed for c in session.completions] == [True, False]
    assert all(c.response_ids for c in session.completions)  # its tokens stay
    closed = await GatewayActivities(gateway, "h").close_session(
        CloseSessionInput(session_id="badtool/0")
    )
    assert closed.num_invalid_tool_calls == 1


def test_a_call_spanning_the_run_deadline_was_waiting_on_the_backend() -> None:
    """The run budget ran out at t=100: a completion, a failed call or a call cut off whose
    time spans that moment was waiting on the backend; ones before or after were not."""

    def completion(start: float, duration: float) -> Completion:
        return Completion(
            session_id="s",
            index=0,
            request_hash="h",
            timings=Timings(started_at=start, duration_s=duration),
        )

    def error(end: float, duration: float) -> CallError:
        return CallError(
            at_index=0,
            at=end,
            error_type="BackendError",
            message="x",
            status_code=502,
            backend="b",
            duration_s=duration,
        )

    done = [completion(90.0, 5.0)]
    assert not call_waiting_at(100.0, done, [])
    assert call_waiting_at(100.0, [*done, completion(97.0, 6.0)], [])
    assert call_waiting_at(100.0, done, [error(104.0, 5.0)])
    assert not call_waiting_at(100.0, done, [error(99.0, 5.0)])
    assert call_waiting_at(100.0, done, [], [(98.0, 100.5)])


def _turns(n: int) -> list[dict[str, Any]]:
    """A conversation of ``n`` messages, alternating user and assistant."""
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(n)
    ]


def _completion(index: int, messages: list[dict[str, Any]]) -> Completion:
    return Completion(
        session_id="s", index=index, request_hash=f"r{len(messages)}", messages=messages
    )


def _failed(at_index: int, messages: list[dict[str, Any]]) -> CallError:
    return CallError(
        at_index=at_index,
        at=0.0,
        error_type="BackendError",
        message="reset",
        status_code=502,
        backend="b",
        duration_s=0.1,
        request_hash=f"failed-{len(messages)}",
        num_messages=len(messages),
        conversation_hash=conversation_hash(messages),
    )


def test_only_the_same_conversation_recovers_a_failed_call() -> None:
    """A completion of the failed request's messages (another body: other sampling
    parameters) recovers it; a longer conversation that goes on past the failure with a
    placeholder answer does not, nor does one recorded before the failure. The index reads
    completions appended to the session's list after it was made."""
    completions = [_completion(0, _turns(1))]
    recovery = RecoveryIndex(completions)
    failed = _failed(1, _turns(3))
    assert not recovery.recovered(failed)
    placeholder = [*_turns(3), {"role": "assistant", "content": "(no answer)"}, *_turns(1)]
    completions.append(_completion(1, placeholder))
    assert not recovery.recovered(failed)
    completions.append(_completion(2, _turns(3)))
    assert recovery.recovered(failed)
    # one recorded before the failure does not count
    assert not RecoveryIndex(completions).recovered(_failed(3, _turns(3)))


def test_a_sessions_failed_calls_hash_each_completion_at_most_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1,000 completions and 20 failed calls, each asked about after every later failure
    (what recording a failure does): each completion's conversation is hashed at most once,
    where the rule before hashed every later completion's prefix per failure."""
    hashed = {"n": 0}
    real = call_errors.conversation_hash

    def counting(messages: list[dict[str, Any]]) -> str:
        hashed["n"] += 1
        return real(messages)

    # each failed request asked a question the next completions never ask again (the
    # conversation went on without its answer); its length is that of a later completion's
    failures = [
        _failed(j, [*_turns(2 * j), {"role": "user", "content": "lost"}])
        for j in (50 * k + 10 for k in range(20))
    ]
    monkeypatch.setattr(call_errors, "conversation_hash", counting)
    completions: list[Completion] = []
    recovery = RecoveryIndex(completions)
    open_errors: list[CallError] = []
    for index in range(1_000):
        completions.append(_completion(index, _turns(2 * index + 1)))
        for failed in failures:
            if failed.at_index == index + 1:
                open_errors = still_open(open_errors, failed, recovery)
    assert len(open_errors) == 20  # every conversation went on past its failure
    assert hashed["n"] <= len(completions)
