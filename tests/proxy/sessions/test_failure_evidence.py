"""What the gateway keeps about failed and unreadable calls for a session's failure cause:
every unrecovered backend error (not only the recent ones), recovery by a retried request,
and a tool call the parser could not read (docs/failures.md). In-process gateway, fake
llama.cpp."""

from __future__ import annotations

from typing import Any

import httpx

from rolloutd.activities.gateway import GatewayActivities
from rolloutd.activities.models import CloseSessionInput
from rolloutd.proxy.sessions.call_errors import MAX_RECORDED_ERRORS, CallError, call_waiting_at
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
