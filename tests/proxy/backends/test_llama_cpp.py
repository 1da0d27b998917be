"""LlamaCppBackend against mocked llama-server answers: fields, garbage, HTTP errors, and the
tokens that end inside a character (no logprob sent, scored again)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from rolloutd.errors import BackendError, BackendUnavailableError, ContextLengthError
from rolloutd.proxy.backends.base import GenerateRequest
from rolloutd.proxy.backends.llama_cpp import STREAM_SLACK_TOKENS, LlamaCppBackend
from rolloutd.proxy.backends.llama_cpp_logprobs import incomplete_utf8_positions
from tests.proxy.support import sse_response

REQUEST = GenerateRequest(
    prompt_ids=[1, 2, 3], max_tokens=8, temperature=0.5, top_p=0.9, top_k=0, seed=7
)


def backend(handler: Callable[[httpx.Request], httpx.Response]) -> LlamaCppBackend:
    return LlamaCppBackend("b", "http://llama", transport=httpx.MockTransport(handler))


def prob(token_id: int, logprob: float) -> dict[str, Any]:
    return {"id": token_id, "token": "x", "bytes": [120], "logprob": logprob, "top_logprobs": []}


def answer(**fields: Any) -> dict[str, Any]:
    return {
        "content": "Hi",
        "tokens": [10, 11, 99],
        "completion_probabilities": [prob(10, -0.1), prob(11, -0.2), prob(99, -0.3)],
        "stop": True,
        "stop_type": "eos",
        "tokens_evaluated": 3,
        "timings": {"cache_n": 2},
    } | fields


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
    result = await backend(lambda r: httpx.Response(200, json=answer(stop_type="limit"))).generate(
        REQUEST
    )
    assert result.finish_reason == "length" and not result.ended_by_eos


@pytest.mark.parametrize(
    "response",
    [
        httpx.Response(200, content=b"<html>oops"),
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json=answer(tokens=[10, 11])),  # misaligned
        httpx.Response(200, json=answer(completion_probabilities=None)),
        httpx.Response(200, json=answer(tokens=[10, 12, 99])),  # probs of other tokens
        httpx.Response(200, json=answer(stop_type="banana")),
        httpx.Response(
            200,
            json=answer(completion_probabilities=[prob(10, -0.1), prob(11, "x"), prob(99, -0.3)]),
        ),  # type: ignore[arg-type]
    ],
)
async def test_garbage_is_a_backend_error(response: httpx.Response) -> None:
    with pytest.raises(BackendError):
        await backend(lambda r: response).generate(REQUEST)


async def test_http_errors() -> None:
    with pytest.raises(BackendError) as server_error:
        await backend(lambda r: httpx.Response(500, json={"error": {"message": "boom"}})).generate(
            REQUEST
        )
    assert server_error.value.retryable and "boom" in server_error.value.message
    with pytest.raises(BackendError) as client_error:
        await backend(lambda r: httpx.Response(400, json={"error": {"message": "bad"}})).generate(
            REQUEST
        )
    assert not client_error.value.retryable
    with pytest.raises(ContextLengthError):
        await backend(
            lambda r: httpx.Response(
                400, json={"error": {"message": "too long", "type": "exceed_context_size_error"}}
            )
        ).generate(REQUEST)
    with pytest.raises(BackendUnavailableError):
        await backend(
            lambda r: httpx.Response(503, json={"error": {"message": "loading"}})
        ).generate(REQUEST)

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(BackendUnavailableError):
        await backend(refused).generate(REQUEST)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(BackendError, match="timed out"):
        await backend(slow).generate(REQUEST)


async def test_stream_deltas_and_result() -> None:
    events = [
        {
            "content": "H",
            "tokens": [10],
            "completion_probabilities": [prob(10, -0.1)],
            "stop": False,
        },
        {
            "content": "i",
            "tokens": [11],
            "completion_probabilities": [prob(11, -0.2)],
            "stop": False,
        },
        {
            "content": "",
            "tokens": [99],
            "completion_probabilities": [prob(99, -0.3)],
            "stop": False,
        },
        {"content": "", "tokens": [], "stop": True, "stop_type": "eos", "tokens_evaluated": 3},
    ]
    deltas = [d async for d in backend(lambda r: sse_response(*events)).generate_stream(REQUEST)]
    assert [d.response_ids for d in deltas[:-1]] == [[10], [11], [99]]
    result = deltas[-1].result
    assert result is not None
    assert result.response_ids == [10, 11, 99] and result.text == "Hi"
    assert result.response_logprobs == [-0.1, -0.2, -0.3]
    assert result.first_token_s is not None


async def test_stream_without_final_event_is_an_error() -> None:
    event = {
        "content": "H",
        "tokens": [10],
        "completion_probabilities": [prob(10, -0.1)],
        "stop": False,
    }
    with pytest.raises(BackendError, match="final event"):
        async for _ in backend(lambda r: sse_response(event)).generate_stream(REQUEST):
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


# ----------------------------------------------------------- tokens ending inside a character

# "H", then 𝔫 (F0 9D 94 AB) sampled as two tokens: 11 ends inside the character, so llama-server
# sends no completion_probabilities entry (and no stream event) for it; 99 ends the turn
PIECES: dict[int, Any] = {10: "H", 11: [240, 157, 148], 12: [171], 99: "<|im_end|>"}


def test_incomplete_utf8_positions() -> None:
    pieces = [
        b"H",
        bytes([240, 157, 148]),
        bytes([171]),
        b"",
        bytes([0xE2]),
        bytes([0x9C]),
        bytes([0x93]),
        "é".encode()[:1],
    ]
    assert incomplete_utf8_positions(pieces) == [1, 4, 5, 7]
    assert incomplete_utf8_positions([]) == []


def scoring_backend(
    answer_body: dict[str, Any] | None = None,
    *,
    events: list[dict[str, Any]] | None = None,
    max_tokens: int = 8,
) -> tuple[LlamaCppBackend, GenerateRequest, list[dict[str, Any]]]:
    """A backend whose llama-server samples ``answer_body`` (or streams ``events``), tokenizes
    with :data:`PIECES`, and scores id 11 at -0.7 after ``REQUEST.prompt_ids + [10]``."""
    scoring: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/tokenize":
            content = body["content"]
            ids = content if isinstance(content, list) else {"𝔫": [11, 12]}[content]
            return httpx.Response(
                200, json={"tokens": [{"id": i, "piece": PIECES[i]} for i in ids]}
            )
        if body["prompt"] == REQUEST.prompt_ids:
            return (
                sse_response(*events)
                if events is not None
                else httpx.Response(200, json=answer_body)
            )
        scoring.append(body)
        assert body["prompt"] == [*REQUEST.prompt_ids, 10]
        top = [prob(11, -0.7), prob(13, -0.9)][: body["n_probs"]]
        return httpx.Response(
            200,
            json=answer(
                tokens=[0],
                stop_type="limit",
                completion_probabilities=[prob(0, -9.0) | {"top_logprobs": top}],
            ),
        )

    request = GenerateRequest(prompt_ids=REQUEST.prompt_ids, max_tokens=max_tokens)
    return backend(handler), request, scoring


async def test_missing_logprob_is_scored_again() -> None:
    b, request, scoring = scoring_backend(
        answer(
            content="H𝔫",
            tokens=[10, 11, 12, 99],
            completion_probabilities=[prob(10, -0.1), prob(12, -0.3), prob(99, -0.4)],
        )
    )
    result = await b.generate(request)
    assert result.response_ids == [10, 11, 12, 99]
    assert result.response_logprobs == [-0.1, -0.7, -0.3, -0.4]
    assert result.recomputed_logprob_positions == [1]
    assert len(scoring) == 1 and scoring[0]["n_predict"] == 1 and scoring[0]["n_probs"] >= 2
    assert scoring[0]["logit_bias"] and scoring[0]["stream"] is False


async def test_entries_that_do_not_follow_the_tokens_are_an_error() -> None:
    b, request, _ = scoring_backend(
        answer(  # 12 has no entry, though it ends a character
            tokens=[10, 11, 12, 99], completion_probabilities=[prob(10, -0.1), prob(99, -0.4)]
        )
    )
    with pytest.raises(BackendError, match="inside"):
        await b.generate(request)


def stream_events() -> list[dict[str, Any]]:
    def event(token_id: int, content: str, predicted: int, logprob: float) -> dict[str, Any]:
        return {
            "content": content,
            "tokens": [token_id],
            "tokens_predicted": predicted,
            "completion_probabilities": [prob(token_id, logprob)],
            "stop": False,
        }

    return [
        event(10, "H", 1, -0.1),
        event(12, "𝔫", 3, -0.3),
        event(99, "", 4, -0.4),
        {"content": "", "tokens": [], "tokens_predicted": 4, "stop": True, "stop_type": "eos"},
    ]


async def test_stream_left_out_token_is_found_and_scored() -> None:
    b, request, scoring = scoring_backend(events=stream_events())
    deltas = [d async for d in b.generate_stream(request)]
    assert [d.response_ids for d in deltas[:-1]] == [[10], [11, 12], [99]]
    assert math.isnan(deltas[1].response_logprobs[0])  # not sent: known with the result
    result = deltas[-1].result
    assert result is not None and result.text == "H𝔫"
    assert result.response_ids == [10, 11, 12, 99]
    assert result.response_logprobs == [-0.1, -0.7, -0.3, -0.4]
    assert result.recomputed_logprob_positions == [1] and len(scoring) == 1


async def test_stream_cut_inside_a_character_at_max_tokens() -> None:
    b, request, _ = scoring_backend(events=stream_events(), max_tokens=2)
    deltas = [d async for d in b.generate_stream(request)]
    result = deltas[-1].result
    assert result is not None and result.finish_reason == "length"
    assert result.response_ids == [10, 11] and result.response_logprobs == [-0.1, -0.7]
    assert result.recomputed_logprob_positions == [1]


async def test_stream_body_asks_for_slack_tokens() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return sse_response({"content": "", "tokens": [], "stop": True, "stop_type": "limit"})

    async for _ in backend(handler).generate_stream(REQUEST):
        pass
    assert bodies[0]["n_predict"] == REQUEST.max_tokens + STREAM_SLACK_TOKENS
