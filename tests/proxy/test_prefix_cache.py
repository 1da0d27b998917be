"""Prefix-cache figures per completion, per session and per backend.

vLLM's and OpenAI's ``usage.prompt_tokens_details`` and SGLang's ``meta_info.cached_tokens``
are read from fixtures of their documented shapes (no GPU engine runs here).
"""

from __future__ import annotations

from typing import Any

import httpx

from rolloutd.proxy.backends.base import GenerateRequest, cached_tokens
from rolloutd.proxy.backends.openai_compat import OpenAIChatBackend
from rolloutd.proxy.backends.vllm import VllmBackend
from rolloutd.proxy.sessions.recorder import reusable_prefix
from rolloutd.proxy.sessions.state import prefix_cache_usage
from rolloutd.types import Completion

REQUEST = GenerateRequest(prompt_ids=[1, 2, 3], max_tokens=4)


def completion(index: int, prompt: list[int], response: list[int], **fields: Any) -> Completion:
    return Completion(
        session_id="t/0",
        index=index,
        prompt_ids=prompt,
        response_ids=response,
        response_logprobs=[-0.1] * len(response),
        backend=fields.pop("backend", "a"),
        **fields,
    )


def test_cached_tokens_reads_openai_usage() -> None:
    assert cached_tokens({"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 7}}) == 7
    assert cached_tokens({"prompt_tokens_details": {"cached_tokens": 0}}) == 0
    # vLLM leaves the details out unless --enable-prompt-tokens-details: not reported, not 0
    assert cached_tokens({"prompt_tokens": 9}) is None
    assert cached_tokens({"prompt_tokens_details": None}) is None
    assert cached_tokens(None) is None


async def test_vllm_completion_usage_cached_tokens() -> None:
    """vLLM's ``/v1/completions`` answer (``UsageInfo`` with ``PromptTokenUsageInfo``, as
    ``serving_completion.py`` sets it under ``--enable-prompt-tokens-details``)."""
    answer = {
        "choices": [
            {
                "index": 0,
                "text": "ab",
                "token_ids": [5, 6],
                "logprobs": {"token_logprobs": [-0.5, -0.25], "tokens": ["a", "b"]},
                "finish_reason": "length",
            }
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "total_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 2},
        },
    }
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json=answer))
    result = await VllmBackend("v", "http://vllm", transport=transport).generate(REQUEST)
    assert (result.num_prompt_tokens, result.num_cached_tokens) == (3, 2)
    del answer["usage"]["prompt_tokens_details"]
    result = await VllmBackend("v", "http://vllm", transport=transport).generate(REQUEST)
    assert result.num_cached_tokens is None


async def test_openai_chat_usage_cached_tokens() -> None:
    """An OpenAI Chat answer's ``usage.prompt_tokens_details.cached_tokens`` (OpenAI's
    ``CompletionUsage``; llama-server's ``/v1/chat/completions`` sends it too)."""
    answer = {
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": 40,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 32},
        },
    }
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json=answer))
    backend = OpenAIChatBackend("o", "http://openai", transport=transport)
    result = await backend.chat({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert (result.num_prompt_tokens, result.num_cached_tokens) == (40, 32)


def test_reusable_prefix() -> None:
    base = completion(0, [1, 2, 3], [4, 5])
    # extends its base: the whole base sequence is in the cache
    assert reusable_prefix(completion(1, [1, 2, 3, 4, 5, 6], [7], extends=0), base) == 5
    # a fresh render: the shared leading tokens
    assert reusable_prefix(completion(1, [1, 2, 9, 9], [7]), base) == 2
    assert reusable_prefix(completion(1, [1, 2, 3, 4], [7]), base) == 4
    # another backend, or a replayed base, left nothing in this backend's cache
    assert reusable_prefix(completion(1, [1, 2, 3, 4, 5], [7], backend="b"), base) == 0
    replayed = completion(0, [1, 2, 3], [4, 5], replayed_from="t/1#0")
    assert reusable_prefix(completion(1, [1, 2, 3, 4, 5], [7]), replayed) == 0
    assert reusable_prefix(completion(0, [1, 2], [7]), None) == 0


def test_prefix_cache_usage_counts_reported_completions_only() -> None:
    usage = prefix_cache_usage(
        [
            completion(0, [1, 2, 3, 4], [5], num_prompt_tokens=4, num_cached_tokens=0),
            completion(1, [1] * 8, [5], num_prompt_tokens=8, num_cached_tokens=6),
            completion(2, [1] * 8, [5], num_prompt_tokens=8),  # not reported
        ]
    )
    assert (usage.num_completions, usage.num_prompt_tokens, usage.num_cached_tokens) == (2, 12, 6)
    assert usage.hit_rate == 0.5
    assert prefix_cache_usage([]).hit_rate is None
