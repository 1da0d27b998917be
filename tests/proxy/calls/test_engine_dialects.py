"""Each new dialect end to end against a real llama-server (Qwen2.5-Coder-0.5B): the app
in-process through httpx.ASGITransport, every llama-server exchange recorded raw, so the
completion log is checked against what the server actually sampled."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.store import CompletionLog
from tests.proxy.support import open_session

pytestmark = pytest.mark.engine

#: the sampling of every session here
SAMPLING: dict[str, Any] = {"max_tokens": 12, "temperature": 0.7, "seed": 1}


def assert_logged_as_sampled(
    gateway: Gateway, session_id: str, recording: Any, dialect: str
) -> None:
    logged = CompletionLog(gateway.store, session_id).read_all()
    assert len(logged) == len(recording.exchanges) >= 2
    for i, completion in enumerate(logged):
        ids, logprobs, prompt = recording.sampled(i)
        assert completion.dialect == dialect
        # a token ending inside a character has no logprob from llama-server (and no id in a
        # stream): the gateway scored it again and flagged it
        sent = [
            k
            for k in range(len(completion.response_ids))
            if k not in completion.recomputed_logprob_positions
        ]
        assert completion.prompt_ids == prompt
        assert completion.response_ids == ids or [completion.response_ids[k] for k in sent] == ids
        assert [completion.response_logprobs[k] for k in sent] == logprobs
    assert logged[1].extends == 0  # the second call continued the first: exact token chain
    assert (
        logged[1].prompt_ids[: len(logged[0].prompt_ids) + len(logged[0].response_ids)]
        == logged[0].prompt_ids + logged[0].response_ids
    )


async def test_responses_two_turns_streamed(
    engine_gateway: Any, engine_client: Any, recording_transport: Any
) -> None:
    gateway, client = engine_gateway, engine_client
    info = await open_session(gateway, "resp/0", **SAMPLING)
    url = f"/s/{info.session_key}/v1/responses"
    first = (await client.post(url, json={"instructions": "Be brief.", "input": "Say hi."})).json()
    said = first["output"][-1]["content"][0]["text"]
    streamed = await client.post(
        url,
        json={
            "instructions": "Be brief.",
            "stream": True,
            "input": [
                {"role": "user", "content": "Say hi."},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": said}],
                },
                {"role": "user", "content": "Again."},
            ],
        },
    )
    assert streamed.status_code == 200
    assert (
        '"type":"response.completed"' in streamed.text
        or '"type":"response.incomplete"' in streamed.text
    )
    assert_logged_as_sampled(gateway, "resp/0", recording_transport, "openai_responses")


async def test_anthropic_two_turns_streamed(
    engine_gateway: Any, engine_client: Any, recording_transport: Any
) -> None:
    gateway, client = engine_gateway, engine_client
    info = await open_session(gateway, "anth/0", **SAMPLING)
    url = f"/s/{info.session_key}/v1/messages"
    first = (
        await client.post(
            url,
            json={
                "max_tokens": 12,
                "system": "Be brief.",
                "messages": [{"role": "user", "content": "Say hi."}],
            },
        )
    ).json()
    streamed = await client.post(
        url,
        json={
            "max_tokens": 12,
            "system": "Be brief.",
            "stream": True,
            "messages": [
                {"role": "user", "content": "Say hi."},
                {"role": "assistant", "content": first["content"]},
                {"role": "user", "content": "Again."},
            ],
        },
    )
    assert streamed.status_code == 200
    assert streamed.text.rstrip().endswith('data: {"type":"message_stop"}')
    assert_logged_as_sampled(gateway, "anth/0", recording_transport, "anthropic")


async def test_gemini_two_turns_streamed(
    engine_gateway: Any, engine_client: Any, recording_transport: Any
) -> None:
    gateway, client = engine_gateway, engine_client
    info = await open_session(gateway, "gem/0", **SAMPLING)
    base = f"/s/{info.session_key}/v1beta/models/qwen"
    user = {"role": "user", "parts": [{"text": "Say hi."}]}
    first = (
        await client.post(
            f"{base}:generateContent",
            json={"systemInstruction": {"parts": [{"text": "Be brief."}]}, "contents": [user]},
        )
    ).json()
    streamed = await client.post(
        f"{base}:streamGenerateContent?alt=sse",
        json={
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "contents": [
                user,
                first["candidates"][0]["content"],
                {"role": "user", "parts": [{"text": "Again."}]},
            ],
        },
    )
    assert streamed.status_code == 200
    chunks = [json.loads(b.removeprefix("data: ")) for b in streamed.text.split("\n\n")[:-1]]
    assert chunks[-1]["candidates"][0]["finishReason"] in ("STOP", "MAX_TOKENS")
    assert_logged_as_sampled(gateway, "gem/0", recording_transport, "gemini")
