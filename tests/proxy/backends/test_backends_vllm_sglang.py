"""vLLM, SGLang and plain OpenAI-compatible backends against their documented request and
response shapes (httpx.MockTransport), and the gateway's passthrough capture mode.

Shapes:
- vLLM, "OpenAI-Compatible Server", extra parameters (``return_token_ids``,
  ``return_tokens_as_token_ids``, token-id prompts):
  https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html
- SGLang, "Native APIs" (``/generate`` with ``input_ids``, ``return_logprob``,
  ``meta_info.output_token_logprobs``): https://docs.sglang.io/basic_usage/native_api.html and
  "Sampling Parameters": https://docs.sglang.io/basic_usage/sampling_params.html
- OpenAI Chat Completions: https://platform.openai.com/docs/api-reference/chat/object
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.errors import BackendError, ContextLengthError
from rolloutd.proxy.backends.base import GenerateRequest
from rolloutd.proxy.backends.openai_compat import OpenAIChatBackend
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.sglang import SglangBackend
from rolloutd.proxy.backends.vllm import VllmBackend
from rolloutd.proxy.http.server import Gateway
from rolloutd.settings import GatewaySettings
from rolloutd.store import CompletionLog
from tests.proxy.support import sse_response

EOS = 151645
REQUEST = GenerateRequest(prompt_ids=[1, 2, 3], max_tokens=8, temperature=0.7, seed=3)


def mock(handler: Any) -> tuple[httpx.MockTransport, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(
            {"path": request.url.path, **(json.loads(request.content) if request.content else {})}
        )
        return handler(request)

    return httpx.MockTransport(record), seen


# --------------------------------------------------------------------------- vLLM


def vllm_completion(**choice: Any) -> dict[str, Any]:
    """A ``text_completion`` as vLLM answers it with return_token_ids and logprobs=1."""
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "text": "Hi",
                "finish_reason": "stop",
                "stop_reason": None,
                "prompt_token_ids": [1, 2, 3],
                "token_ids": [13048, EOS],
                "logprobs": {
                    "tokens": ["token_id:13048", f"token_id:{EOS}"],
                    "token_logprobs": [-0.5, -0.01],
                    "top_logprobs": None,
                    "text_offset": [0, 2],
                },
                **choice,
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


async def test_vllm_token_prompt_request_and_result() -> None:
    transport, seen = mock(lambda r: httpx.Response(200, json=vllm_completion()))
    backend = VllmBackend("v", "http://vllm", model="m", transport=transport)
    result = await backend.generate(REQUEST)
    body = seen[0]
    assert body["path"] == "/v1/completions"
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 8 and body["model"] == "m"
    assert body["return_token_ids"] is True and body["logprobs"] == 1
    assert body["top_k"] == -1 and body["seed"] == 3 and body["skip_special_tokens"] is False
    assert result.response_ids == [13048, EOS] and result.response_logprobs == [-0.5, -0.01]
    assert result.ended_by_eos and result.finish_reason == "stop"


async def test_vllm_ids_from_token_id_strings_and_stop_string_is_not_eos() -> None:
    answer = vllm_completion(token_ids=None, stop_reason="###", finish_reason="stop")
    transport, _ = mock(lambda r: httpx.Response(200, json=answer))
    result = await VllmBackend("v", "http://vllm", transport=transport).generate(REQUEST)
    assert result.response_ids == [13048, EOS] and not result.ended_by_eos


@pytest.mark.parametrize(
    "answer",
    [vllm_completion(token_ids=[1]), vllm_completion(finish_reason="abort"), {"choices": []}],
)
async def test_vllm_malformed_answers_are_backend_errors(answer: dict[str, Any]) -> None:
    transport, _ = mock(lambda r: httpx.Response(200, json=answer))
    with pytest.raises(BackendError):
        await VllmBackend("v", "http://vllm", transport=transport).generate(REQUEST)


async def test_vllm_context_errors_and_model_len() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(
                200,
                json={
                    "object": "list",
                    "data": [{"id": "m", "object": "model", "max_model_len": 32768}],
                },
            )
        return httpx.Response(
            400,
            json={
                "object": "error",
                "type": "BadRequestError",
                "message": "This model's maximum context length is 32768 tokens.",
                "code": 400,
            },
        )

    backend = VllmBackend("v", "http://vllm", model="m", transport=httpx.MockTransport(handle))
    assert await backend.context_size() == 32768
    with pytest.raises(ContextLengthError):
        await backend.generate(REQUEST)


async def test_vllm_stream_deltas_match_the_result() -> None:
    """A stream as vLLM's ``completion_stream_generator`` writes it (commit 030ea52effcb,
    ``vllm/entrypoints/openai/completion/serving.py``): token chunks, the finish chunk, then,
    because the request asks ``stream_options.include_usage``, a chunk with ``choices: []`` and
    the usage (``prompt_tokens_details`` with ``--enable-prompt-tokens-details``), then
    ``[DONE]``. A test double (httpx.MockTransport): vLLM needs a GPU this machine lacks."""
    chunks = [
        {
            "choices": [
                {
                    "index": 0,
                    "text": "H",
                    "token_ids": [39],
                    "logprobs": {"token_logprobs": [-0.1], "tokens": ["token_id:39"]},
                    "finish_reason": None,
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "text": "i",
                    "token_ids": [72, EOS],
                    "logprobs": {
                        "token_logprobs": [-0.2, -0.3],
                        "tokens": ["token_id:72", f"token_id:{EOS}"],
                    },
                    "finish_reason": "stop",
                    "stop_reason": None,
                }
            ]
        },
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": "m",
            "choices": [],
            "usage": {
                "prompt_tokens": 3,
                "total_tokens": 6,
                "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 2},
            },
        },
        "[DONE]",
    ]
    transport, seen = mock(lambda r: sse_response(*chunks))
    deltas = [
        d
        async for d in VllmBackend("v", "http://vllm", transport=transport).generate_stream(REQUEST)
    ]
    assert seen[0]["stream"] is True
    assert seen[0]["stream_options"] == {"include_usage": True}
    assert [d.response_ids for d in deltas[:-1]] == [[39], [72, EOS]]
    result = deltas[-1].result
    assert result is not None and result.response_ids == [39, 72, EOS]
    assert result.response_logprobs == [-0.1, -0.2, -0.3] and result.ended_by_eos
    assert result.num_prompt_tokens == 3 and result.num_cached_tokens == 2
    # control: a server without the usage chunk (an older vLLM) reports no count
    transport, _ = mock(lambda r: sse_response(chunks[0], chunks[1], "[DONE]"))
    deltas = [
        d
        async for d in VllmBackend("v", "http://vllm", transport=transport).generate_stream(REQUEST)
    ]
    result = deltas[-1].result
    assert result is not None and result.response_ids == [39, 72, EOS]
    assert result.num_cached_tokens is None


async def test_vllm_chat_passthrough_keeps_token_ids() -> None:
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "prompt_token_ids": [5, 6],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi", "reasoning_content": None},
                "finish_reason": "stop",
                "token_ids": [13048, EOS],
                "logprobs": {
                    "content": [{"token": "Hi", "logprob": -0.4}, {"token": "", "logprob": -0.01}]
                },
            }
        ],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
    }
    transport, seen = mock(lambda r: httpx.Response(200, json=answer))
    result = await VllmBackend("v", "http://vllm", transport=transport).chat(
        {"messages": [{"role": "user", "content": "x"}], "stream": True}
    )
    assert seen[0]["path"] == "/v1/chat/completions" and seen[0]["return_token_ids"] is True
    assert seen[0]["stream"] is False and seen[0]["logprobs"] is True
    assert result.trainable and result.prompt_ids == [5, 6]
    assert result.response_ids == [13048, EOS] and result.response_logprobs == [-0.4, -0.01]


# --------------------------------------------------------------------------- SGLang


def sglang_answer(**meta: Any) -> dict[str, Any]:
    """A ``/generate`` answer with return_logprob (SGLang native API)."""
    return {
        "text": "Hi",
        "output_ids": [13048, EOS],
        "meta_info": {
            "id": "x",
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "cached_tokens": 1,
            "finish_reason": {"type": "stop", "matched": EOS},
            "output_token_logprobs": [[-0.5, 13048, None], [-0.01, EOS, None]],
            **meta,
        },
    }


async def test_sglang_request_and_result() -> None:
    transport, seen = mock(lambda r: httpx.Response(200, json=sglang_answer()))
    result = await SglangBackend("s", "http://sglang", transport=transport).generate(REQUEST)
    body = seen[0]
    assert body["path"] == "/generate" and body["input_ids"] == [1, 2, 3]
    assert body["return_logprob"] is True and body["stream"] is False
    assert body["sampling_params"]["max_new_tokens"] == 8
    assert body["sampling_params"]["top_k"] == -1
    assert body["sampling_params"]["sampling_seed"] == 3
    assert result.response_ids == [13048, EOS] and result.response_logprobs == [-0.5, -0.01]
    assert result.ended_by_eos and result.num_cached_tokens == 1


async def test_sglang_length_and_malformed() -> None:
    transport, _ = mock(
        lambda r: httpx.Response(
            200, json=sglang_answer(finish_reason={"type": "length", "length": 2})
        )
    )
    result = await SglangBackend("s", "http://s", transport=transport).generate(REQUEST)
    assert result.finish_reason == "length" and not result.ended_by_eos
    transport, _ = mock(
        lambda r: httpx.Response(200, json=sglang_answer(output_token_logprobs=[[-0.5]]))
    )
    with pytest.raises(BackendError):
        await SglangBackend("s", "http://s", transport=transport).generate(REQUEST)


async def test_sglang_cumulative_stream_becomes_deltas() -> None:
    first = {
        "text": "H",
        "meta_info": {"finish_reason": None, "output_token_logprobs": [[-0.1, 39, None]]},
    }
    last = {
        "text": "Hi",
        "output_ids": [39, 72, EOS],
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": EOS},
            "prompt_tokens": 3,
            "output_token_logprobs": [[-0.1, 39, None], [-0.2, 72, None], [-0.3, EOS, None]],
        },
    }
    transport, _ = mock(lambda r: sse_response(first, last, "[DONE]"))
    deltas = [
        d
        async for d in SglangBackend("s", "http://s", transport=transport).generate_stream(REQUEST)
    ]
    assert [d.response_ids for d in deltas[:-1]] == [[39], [72, EOS]]
    assert "".join(d.text for d in deltas[:-1]) == "Hi"
    assert deltas[-1].result is not None and deltas[-1].result.response_ids == [39, 72, EOS]


# --------------------------------------------------------------------------- passthrough


async def test_openai_passthrough_session_records_untrainable_completions(
    tmp_path: Path, tokenizer: Any
) -> None:
    answer = {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10},
    }
    transport, seen = mock(lambda r: httpx.Response(200, json=answer))
    settings = GatewaySettings(
        store_url=str(tmp_path / "store"), gateway_public_url="http://gateway.test"
    )
    gateway = Gateway.from_settings(settings, tokenizer=tokenizer)
    gateway.pool = BackendPool(
        [OpenAIChatBackend("api", "http://api", api_key="sk", transport=transport)]
    )
    gateway.sessions.pool = gateway.service.pool = gateway.pool
    info = await gateway.sessions.open_session("p/0", "p", capture_mode="passthrough")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gateway.app), base_url="http://gateway.test"
    ) as client:
        response = await client.post(
            f"/s/{info.session_key}/v1/messages",
            json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        )
    assert response.status_code == 200, response.text
    assert response.json()["content"] == [{"type": "text", "text": "Hi"}]
    assert seen[0]["messages"] == [{"role": "user", "content": "x"}]
    completion = CompletionLog(gateway.store, "p/0").read_all()[0]
    assert completion.trainable is False and completion.response_ids == []
    assert completion.capture_mode.value == "passthrough" and completion.backend == "api"
    await gateway.aclose()


# ------------------------------------------------------------------ streamed passthrough

CHAT_PIECES = ["Let me ", "check ", "the weather."]
TOOLS_ONE = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def vllm_chat_answer() -> dict[str, Any]:
    """A vLLM ``chat.completion`` with return_token_ids, logprobs and a tool call."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "m",
        "prompt_token_ids": [5, 6, 7],
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "".join(CHAT_PIECES),
                    "reasoning_content": "hmm",
                    "tool_calls": [CALL],
                },
                "token_ids": [11, 12, 13, 14, EOS],
                "logprobs": {
                    "content": [{"token": "", "logprob": -0.1 * (i + 1)} for i in range(5)]
                },
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
    }


def vllm_chat_chunks() -> list[dict[str, Any]]:
    """The same answer as vLLM streams it: role, reasoning, content pieces, tool call
    fragments, finish, usage."""

    def chunk(delta: dict[str, Any], ids: list[int], **extra: Any) -> dict[str, Any]:
        lps = [{"token": "", "logprob": -0.1 * (i + 1)} for i in ids]
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "finish_reason": None,
                    "token_ids": [[11, 12, 13, 14, EOS][i] for i in ids],
                    "logprobs": {"content": lps} if lps else None,
                    **extra,
                }
            ],
        }

    first = chunk({"role": "assistant", "content": ""}, [])
    first["prompt_token_ids"] = [5, 6, 7]
    return [
        first,
        chunk({"reasoning_content": "hmm"}, [0]),
        *[chunk({"content": piece}, [i + 1]) for i, piece in enumerate(CHAT_PIECES)],
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            },
            [],
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}, []),
        chunk(
            {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
            [4],
            finish_reason="tool_calls",
        ),
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8},
        },
    ]


async def test_streamed_passthrough_forwards_chunks_and_records_the_same_completion(
    tmp_path: Path, tokenizer: Any
) -> None:
    """A streaming harness on a streaming vLLM: each content chunk reaches the harness before
    the backend sends the next one (the backend waits for it), and the completion recorded is
    the one a non-streamed call records."""
    from rolloutd.proxy.http.server import serve

    forwarded = asyncio.Event()

    async def chunks() -> AsyncIterator[bytes]:
        for event in vllm_chat_chunks():
            yield f"data: {json.dumps(event)}\n\n".encode()
            if event["choices"] and event["choices"][0]["delta"].get("content") == "Let me ":
                # the rest of the answer is sampled only once the first piece was forwarded
                await asyncio.wait_for(forwarded.wait(), 30)
        yield b"data: [DONE]\n\n"

    def handle(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["stream"]:
            return httpx.Response(
                200, content=chunks(), headers={"content-type": "text/event-stream"}
            )
        return httpx.Response(200, json=vllm_chat_answer())

    transport, seen = mock(handle)
    gateway = Gateway.from_settings(
        GatewaySettings(store_url=str(tmp_path / "store"), gateway_port=0), tokenizer=tokenizer
    )
    gateway.pool = BackendPool([VllmBackend("v", "http://vllm", transport=transport)])
    gateway.sessions.pool = gateway.service.pool = gateway.pool
    handle_ = await serve(gateway, "127.0.0.1", 0)
    try:
        infos = [
            await gateway.sessions.open_session(f"p/{i}", "p", capture_mode="passthrough")
            for i in range(2)
        ]
        request = {
            "model": "m",
            "max_tokens": 16,
            "tools": TOOLS_ONE,
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
        }
        pieces: list[str] = []
        async with httpx.AsyncClient(base_url=handle_.url, timeout=60) as client:
            plain = await client.post(
                f"/s/{infos[0].session_key}/v1/chat/completions", json=request
            )
            async with client.stream(
                "POST",
                f"/s/{infos[1].session_key}/v1/chat/completions",
                json={**request, "stream": True},
            ) as response:
                assert response.status_code == 200
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    delta = (
                        json.loads(line[6:])["choices"][0]["delta"]
                        if json.loads(line[6:])["choices"]
                        else {}
                    )
                    if delta.get("content"):
                        pieces.append(delta["content"])
                        forwarded.set()
                    if delta.get("tool_calls"):
                        pieces.append(json.dumps(delta["tool_calls"]))
        assert plain.status_code == 200, plain.text
        assert pieces[:3] == CHAT_PIECES and "get_weather" in pieces[3]
        assert [s["stream"] for s in seen] == [False, True]
        [one] = CompletionLog(gateway.store, "p/0").read_all()
        [streamed] = CompletionLog(gateway.store, "p/1").read_all()
        assert streamed.trainable and streamed.response_ids == [11, 12, 13, 14, EOS]
        differ = {"session_id", "request", "request_hash", "timings", "response_id"}
        assert streamed.model_dump(exclude=differ) == one.model_dump(exclude=differ)
        assert streamed.request == {**one.request, "stream": True}
    finally:
        await handle_.shutdown()
        await gateway.aclose()
