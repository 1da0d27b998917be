"""Tokens that end inside a UTF-8 character, against a real llama-server (Qwen2.5-Coder-0.5B).

llama-server sends no logprob for such a token (and no stream event at all). The greedy answer
to "Repeat exactly: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢" spells the Fraktur letters in 2 or 3 byte-level tokens each, so
every call below hits the case: the gateway answers 200, records every sampled id with a
logprob, and flags the positions it scored again.
"""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.store import CompletionLog
from rolloutd.types import Completion, SamplingParams

pytestmark = pytest.mark.engine


@pytest.fixture
def engine_tool_parser() -> str | None:
    """The model's own tool parser (no tool calls here)."""
    return None


MESSAGES = [{"role": "user", "content": "Repeat exactly: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"}]


async def call(
    gateway: Gateway, client: httpx.AsyncClient, session_id: str, stream: bool
) -> tuple[httpx.Response, Completion]:
    info = await gateway.sessions.open_session(
        session_id, "logprobs", sampling=SamplingParams(max_tokens=12, temperature=0.0)
    )
    response = await client.post(
        f"/s/{info.session_key}/v1/chat/completions", json={"messages": MESSAGES, "stream": stream}
    )
    [completion] = CompletionLog(gateway.store, session_id).read_all()
    return response, completion


def inside_a_character(tokenizer: Any, ids: list[int]) -> list[int]:
    """Positions whose prefix decodes to a cut-off character (the tokenizer's own view)."""
    return [k for k in range(len(ids)) if tokenizer.decode(ids[: k + 1]).endswith("\ufffd")]


def assert_every_logprob(completion: Completion, tokenizer: Any) -> None:
    assert len(completion.response_logprobs) == len(completion.response_ids) == 12
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in completion.response_logprobs)
    recomputed = completion.recomputed_logprob_positions
    assert recomputed and recomputed == inside_a_character(tokenizer, completion.response_ids)


async def test_non_streamed_answer_keeps_every_logprob(
    engine_gateway: Any, engine_client: Any, tokenizer: Any, recording_transport: Any
) -> None:
    gateway, client = engine_gateway, engine_client
    response, completion = await call(gateway, client, "lp/plain", stream=False)
    assert response.status_code == 200
    assert_every_logprob(completion, tokenizer)
    sampled = json.loads(recording_transport.exchanges[0][1])
    assert completion.response_ids == sampled["tokens"]
    # the entries llama-server sent are kept as sent; only the left-out positions are new
    sent = [p["logprob"] for p in sampled["completion_probabilities"]]
    kept = [
        lp
        for k, lp in enumerate(completion.response_logprobs)
        if k not in completion.recomputed_logprob_positions
    ]
    assert len(sent) < len(completion.response_ids) and kept == sent
    assert response.json()["choices"][0]["message"]["content"] == tokenizer.decode(
        completion.response_ids
    )


async def test_streamed_answer_keeps_every_token(
    engine_gateway: Any, engine_client: Any, tokenizer: Any
) -> None:
    gateway, client = engine_gateway, engine_client
    response, completion = await call(gateway, client, "lp/stream", stream=True)
    assert response.status_code == 200
    assert_every_logprob(completion, tokenizer)
    chunks = [
        json.loads(line[5:])
        for line in response.text.splitlines()
        if line.startswith("data:") and line.strip() != "data: [DONE]"
    ]
    streamed = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )
    # every id the stream left out is recorded: the ids spell the text the harness received
    assert tokenizer.decode(completion.response_ids).startswith(streamed) and "𝔫" in streamed
    assert completion.finish_reason == "length"
