"""An unexpected exception inside the gateway (a bug, not a ``RolloutdError``) is answered in
the dialect's own error shape, counted in the session's state, and logged once with the
session id, in all four dialects, streamed or not, whether it is raised inside the
generation pipeline or while the app renders the answer.

Error shapes: https://platform.openai.com/docs/guides/error-codes ,
https://platform.openai.com/docs/api-reference/responses-streaming/error ,
https://docs.anthropic.com/en/api/errors , https://ai.google.dev/api/generate-content .
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import structlog

from rolloutd.proxy.dialects import anthropic, gemini, openai_chat, openai_responses
from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.state import unrecovered_errors
from rolloutd.store import CompletionLog
from rolloutd.types import SamplingParams

DIALECTS = {
    "chat": openai_chat,
    "responses": openai_responses,
    "anthropic": anthropic,
    "gemini": gemini,
}
MESSAGE = "internal error: AttributeError"


def call(key: str, dialect: str, stream: bool) -> tuple[str, dict[str, Any]]:
    """(path, body) of a one-message call in ``dialect``."""
    if dialect == "chat":
        return f"/s/{key}/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
        }
    if dialect == "responses":
        return f"/s/{key}/v1/responses", {"input": "hi", "stream": stream}
    if dialect == "anthropic":
        return f"/s/{key}/v1/messages", {
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
        }
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return f"/s/{key}/v1beta/models/qwen:{action}", {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}]
    }


def error_of(dialect: str, response: httpx.Response, stream: bool) -> dict[str, Any]:
    """The error object the harness got, checked against the dialect's shape."""
    if not stream:
        assert response.status_code == 500, response.text
        body = response.json()
        if dialect == "anthropic":
            assert body["type"] == "error" and body["error"]["type"] == "api_error"
        elif dialect == "gemini":
            assert body["error"]["code"] == 500 and body["error"]["status"] == "INTERNAL"
        else:
            assert set(body["error"]) == {"message", "type", "param", "code"}
        return body["error"]
    assert response.status_code == 200  # the stream had begun: the error is its last event
    frames = [
        json.loads(line.removeprefix("data: "))
        for line in response.text.split("\n")
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    if dialect == "responses":
        assert frames[-2]["type"] == "error" and frames[-1]["type"] == "response.failed"
        return frames[-2]
    if dialect == "anthropic":
        assert frames[-1]["type"] == "error" and frames[-1]["error"]["type"] == "api_error"
    elif dialect == "gemini":
        assert frames[-1]["error"]["status"] == "INTERNAL"
    return frames[-1]["error"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("where", ["pipeline", "render"])
@pytest.mark.parametrize("dialect", list(DIALECTS))
async def test_an_unexpected_exception_is_answered_in_the_dialect_counted_and_logged_once(
    gateway: Gateway,
    client: httpx.AsyncClient,
    monkeypatch: pytest.MonkeyPatch,
    dialect: str,
    where: str,
    stream: bool,
) -> None:
    info = await gateway.sessions.open_session("t/0", "t", sampling=SamplingParams(max_tokens=8))

    def bug(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError("'module' object has no attribute 'raw'")

    if where == "pipeline":  # recording the completion, after the stream began
        monkeypatch.setattr(gateway.service.recorder, "record", bug)
    elif stream:
        monkeypatch.setattr(DIALECTS[dialect].Encoder, "encode", bug)
    else:
        monkeypatch.setattr(DIALECTS[dialect], "response_json", bug)
    path, body = call(info.session_key, dialect, stream)
    with structlog.testing.capture_logs() as logs:
        response = await client.post(path, json=body)

    assert error_of(dialect, response, stream)["message"] == MESSAGE
    session = await gateway.sessions.get("t/0")
    assert session.state.num_errors == 1
    [recorded] = session.state.errors
    assert (recorded.error_type, recorded.status_code, recorded.stream) == (
        "AttributeError",
        500,
        stream,
    )
    assert recorded.request_hash and recorded.num_messages == 1
    failures = [e for e in logs if e["log_level"] in ("warning", "error", "critical")]
    assert [e["event"] for e in failures] == ["call_failed"], failures
    assert failures[0]["session_id"] == "t/0" and failures[0]["exc_info"]
    if where == "pipeline":
        assert CompletionLog(gateway.store, "t/0").read_all() == []


async def test_a_failed_call_is_recovered_by_a_later_completion_of_its_request(
    gateway: Gateway, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness retried the failed request (same body), or asked the same conversation
    again (equal messages, another body): the failure is made good. A conversation that goes
    on past the failure without its answer (a placeholder turn), a failure nothing followed,
    and a later call of another conversation do not make it good."""
    record = gateway.service.recorder.record
    failing = {"left": 0}

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if failing["left"]:
            failing["left"] -= 1
            raise AttributeError("a bug")
        return await record(*args, **kwargs)

    monkeypatch.setattr(gateway.service.recorder, "record", flaky)
    first = [{"role": "user", "content": "hi"}]
    later = [*first, {"role": "assistant", "content": "?"}, {"role": "user", "content": "go"}]
    for session_id, bodies in [
        ("t/0", [first, first]),
        ("t/1", [first, later]),
        ("t/2", [first]),
        ("t/3", [[{"role": "user", "content": "x"}], first]),
        ("t/4", [first, {"messages": first, "temperature": 0.5}]),
    ]:
        info = await gateway.sessions.open_session(
            session_id, "t", sampling=SamplingParams(max_tokens=8)
        )
        failing["left"] = 1
        for body in bodies:
            await client.post(
                f"/s/{info.session_key}/v1/chat/completions",
                json=body if isinstance(body, dict) else {"messages": body},
            )
        await gateway.sessions.close_session(session_id)
    unrecovered = {}
    for session_id in ("t/0", "t/1", "t/2", "t/3", "t/4"):
        session = await gateway.sessions.get(session_id)
        assert session.state.num_errors == 1
        unrecovered[session_id] = len(unrecovered_errors(session.state, session.completions))
        # the session's own index agrees with a fresh read of the log
        assert len(unrecovered_errors(session.state, session.recovery)) == unrecovered[session_id]
    # t/1: it went on with a placeholder answer; t/3: the later completion answered
    # another conversation
    assert unrecovered == {"t/0": 0, "t/1": 1, "t/2": 1, "t/3": 1, "t/4": 0}
