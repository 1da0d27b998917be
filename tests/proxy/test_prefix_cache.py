"""Prefix-cache figures per completion, per session and per backend.

The engine test runs a real llama-server (Qwen2.5-Coder-0.5B, 2 slots): a multi-turn session
whose turns resend the conversation is served from the slot's cache after turn 1, and its
control, a session of unrelated prompts, is served only the chat template's shared head.
vLLM's and OpenAI's ``usage.prompt_tokens_details`` and SGLang's ``meta_info.cached_tokens``
are read from fixtures of their documented shapes (no GPU engine runs here).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from rolloutd.proxy.backends.base import GenerateRequest, cached_tokens
from rolloutd.proxy.backends.openai_compat import OpenAIChatBackend
from rolloutd.proxy.backends.vllm import VllmBackend
from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.recorder import reusable_prefix
from rolloutd.proxy.sessions.state import prefix_cache_usage
from rolloutd.store import CompletionLog
from rolloutd.types import Completion, SamplingParams

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


def counter(name: str, backend: str) -> float:
    return REGISTRY.get_sample_value(f"rolloutd_gateway_{name}_total", {"backend": backend}) or 0.0


@pytest.mark.engine
async def test_multi_turn_session_hits_the_cache_and_unrelated_prompts_do_not(
    engine_gateway: Gateway, engine_client: httpx.AsyncClient, tokenizer: Any
) -> None:
    backend = engine_gateway.pool.names()[0]
    before = {
        n: counter(n, backend) for n in ("cache_prompt_tokens", "cached_tokens", "reusable_tokens")
    }
    sampling = SamplingParams(temperature=0.0, max_tokens=12)

    async def run(session_id: str, turns: list[str], *, resend: bool) -> list[Completion]:
        info = await engine_gateway.sessions.open_session(
            session_id, session_id.split("/")[0], sampling=sampling
        )
        messages: list[dict[str, Any]] = []
        for text in turns:
            turn = {"role": "user", "content": text}
            messages = [*messages, turn] if resend else [turn]
            answer = await engine_client.post(
                f"/s/{info.session_key}/v1/chat/completions",
                json={"model": "m", "messages": messages},
            )
            assert answer.status_code == 200, answer.text
            messages.append(answer.json()["choices"][0]["message"])
        await engine_gateway.sessions.close_session(session_id)
        return CompletionLog(engine_gateway.store, session_id).read_all()

    turns = [
        "Name a prime number between 10 and 20.",
        "Now name one between 20 and 30.",
        "And one between 30 and 40?",
    ]
    chat = await run("cache-chat/0", turns, resend=True)
    # every turn reported; after turn 1, the slot held the previous sequence: llama.cpp
    # served all of it but the last sampled token (never fed to the model)
    assert all(c.num_cached_tokens is not None for c in chat)
    for previous, turn in zip(chat, chat[1:], strict=False):
        reusable = reusable_prefix(turn, previous)
        assert reusable == len(previous.prompt_ids) + len(previous.response_ids)
        assert reusable - 1 <= turn.num_cached_tokens <= reusable
        assert turn.num_prompt_tokens == len(turn.prompt_ids)
    state = (await engine_gateway.sessions.get("cache-chat/0")).state
    assert state.prefix_cache is not None and state.prefix_cache.num_completions == 3
    assert state.prefix_cache.hit_rate > 0.5

    # control: unrelated one-turn prompts share only the chat template's head with what
    # the slots hold, and are served no more than that
    control = await run(
        "cache-control/0",
        ["Spell the word banana backwards.", "What colour is a ripe lemon?", "Count to three."],
        resend=False,
    )
    earlier = [c.prompt_ids for c in chat + control]
    for turn in control:
        shared = max(
            (_common(turn.prompt_ids, p) for p in earlier if p is not turn.prompt_ids), default=0
        )
        assert turn.num_cached_tokens <= shared < len(turn.prompt_ids)
    ctrl = (await engine_gateway.sessions.get("cache-control/0")).state.prefix_cache
    assert ctrl is not None and ctrl.num_completions == 3

    # the backend's counters moved by exactly the recorded figures
    logged = chat + control
    assert counter("cache_prompt_tokens", backend) - before["cache_prompt_tokens"] == sum(
        c.num_prompt_tokens for c in logged
    )
    assert counter("cached_tokens", backend) - before["cached_tokens"] == sum(
        c.num_cached_tokens for c in logged
    )
    reusable_total = sum(reusable_prefix(t, p) for p, t in zip(chat, chat[1:], strict=False))
    reusable_total += sum(reusable_prefix(t, p) for p, t in zip(control, control[1:], strict=False))
    assert counter("reusable_tokens", backend) - before["reusable_tokens"] == reusable_total


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
