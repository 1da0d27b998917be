"""LlamaCppBackend against mocked llama-server answers: fields, garbage, HTTP errors."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from rolloutd.errors import BackendError, BackendUnavailableError, ContextLengthError
from rolloutd.proxy.backends.base import GenerateRequest
from rolloutd.proxy.backends.llama_cpp import LlamaCppBackend

REQUEST = GenerateRequest(prompt_ids=[1, 2, 3], max_tokens=8, temperature=0.5, top_p=0.9,
                          top_k=0, seed=7)


def backend(handler: Callable[[httpx.Request], httpx.Response]) -> LlamaCppBackend:
    return LlamaCppBackend("b", "http://llama", transport=httpx.MockTransport(handler))


def prob(token_id: int, logprob: float) -> dict[str, Any]:
    return {"id": token_id, "token": "x", "bytes": [120], "logprob": logprob, "top_logprobs": []}


def answer(**fields: Any) -> dict[str, Any]:
    return {"content": "Hi", "tokens": [10, 11, 99],
            "completion_probabilities": [prob(10, -0.1), prob(11, -0.2), prob(99, -0.3)],
            "stop": True, "stop_type": "eos", "tokens_evaluated": 3,
            "timings": {"cache_n": 2}} | fields


async def test_request_body_and_parsed_result() -> None:
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json=answer())

    result = await backend(handler).generate(REQUEST)
    body = seen[0]
    assert body["prompt"] == [1, 2, 3] and body["n_predict"] == 8
    assert (body["temperature"], body["top_p"], body["top_k"], body["seed"]) == (0.5, 0.9, 0, 7)
    assert body["n_probs"] == 1 and body["return_tokens"] is True
    assert body["cache_prompt"] is True and body["stream"] is False and body["min_p"] == 0.0
    assert result.response_ids == [10, 11, 99]
    assert result.response_logprobs == [-0.1, -0.2, -0.3]
    assert result.finish_reason == "stop" and result.ended_by_eos
    assert (result.num_prompt_tokens, result.num_cached_tokens) == (3, 2)


async def test_limit_is_length() -> None:
    result = await backend(lambda r: httpx.Response(200, json=answer(stop_type="limit"))
                           ).generate(REQUEST)
    assert result.finish_reason == "length" and not result.ended_by_eos


@pytest.mark.parametrize("response", [
    httpx.Response(200, content=b"<html>oops"),
    httpx.Response(200, json=[1, 2]),
    httpx.Response(200, json=answer(tokens=[10, 11])),  # misaligned
    httpx.Response(200, json=answer(completion_probabilities=None)),
    httpx.Response(200, json=answer(tokens=[10, 12, 99])),  # probs of other tokens
    httpx.Response(200, json=answer(stop_type="banana")),
    httpx.Response(200, json=answer(completion_probabilities=[
        prob(10, -0.1), prob(11, "x"), prob(99, -0.3)])),  # type: ignore[arg-type]
])
async def test_garbage_is_a_backend_error(response: httpx.Response) -> None:
    with pytest.raises(BackendError):
        await backend(lambda r: response).generate(REQUEST)


async def test_http_errors() -> None:
    with pytest.raises(BackendError) as server_error:
        await backend(lambda r: httpx.Response(500, json={"error": {"message": "boom"}})
                      ).generate(REQUEST)
    assert server_error.value.retryable and "boom" in server_error.value.message
    with pytest.raises(BackendError) as client_error:
        await backend(lambda r: httpx.Response(400, json={"error": {"message": "bad"}})
                      ).generate(REQUEST)
    assert not client_error.value.retryable
    with pytest.raises(ContextLengthError):
        await backend(lambda r: httpx.Response(400, json={"error": {
            "message": "too long", "type": "exceed_context_size_error"}})).generate(REQUEST)
    with pytest.raises(BackendUnavailableError):
        await backend(lambda r: httpx.Response(503, json={"error": {"message": "loading"}})
                      ).generate(REQUEST)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(BackendUnavailableError):
        await backend(refused).generate(REQUEST)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(BackendError, match="timed out"):
        await backend(slow).generate(REQUEST)


def sse(*events: dict[str, Any]) -> httpx.Response:
    data = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
    return httpx.Response(200, content=data.encode(),
                          headers={"content-type": "text/event-stream"})


async def test_stream_deltas_and_result() -> None:
    events = [
        {"content": "H", "tokens": [10], "completion_probabilities": [prob(10, -0.1)],
         "stop": False},
        {"content": "i", "tokens": [11], "completion_probabilities": [prob(11, -0.2)],
         "stop": False},
        {"content": "", "tokens": [99], "completion_probabilities": [prob(99, -0.3)],
         "stop": False},
        {"content": "", "tokens": [], "stop": True, "stop_type": "eos", "tokens_evaluated": 3},
    ]
    deltas = [d async for d in backend(lambda r: sse(*events)).generate_stream(REQUEST)]
    assert [d.response_ids for d in deltas[:-1]] == [[10], [11], [99]]
    result = deltas[-1].result
    assert result is not None
    assert result.response_ids == [10, 11, 99] and result.text == "Hi"
    assert result.response_logprobs == [-0.1, -0.2, -0.3]
    assert result.first_token_s is not None


async def test_stream_without_final_event_is_an_error() -> None:
    event = {"content": "H", "tokens": [10], "completion_probabilities": [prob(10, -0.1)],
             "stop": False}
    with pytest.raises(BackendError, match="final event"):
        async for _ in backend(lambda r: sse(event)).generate_stream(REQUEST):
            pass


async def test_context_size_from_props() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(200, json={"default_generation_settings": {"n_ctx": 4096}})

    b = backend(handler)
    assert await b.context_size() == 4096
    assert await b.context_size() == 4096
    assert calls == ["/props"]
