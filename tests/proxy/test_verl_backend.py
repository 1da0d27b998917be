"""The gateway's ``verl`` backend kind (rolloutd.proxy.backends.verl): token ids to the verl
bridge's endpoint in front of verl's server manager, verl's ``TokenOutput`` back. Both ends of
this wire are rolloutd's; the endpoint is an ``httpx.MockTransport`` double answering its
documented shape (the real endpoint runs in tests/trainer_client/bridges/test_bridge_verl.py,
which needs verl's environment)."""

from __future__ import annotations

import json

import httpx
import pytest


async def test_verl_backend_kind_forwards_tokens_to_the_endpoint():
    """The gateway's ``verl`` backend posts token ids to the bridge's endpoint and reads
    verl's TokenOutput back (the wire both ends of rolloutd share); a reply without
    aligned logprobs is refused."""
    from rolloutd.errors import BackendError
    from rolloutd.proxy.backends.base import GenerateRequest
    from rolloutd.proxy.backends.pool import make_backend

    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/context_size":
            return httpx.Response(200, json={"context_size": 4096})
        body = json.loads(request.content)
        seen.append(body)
        ids = [7, 8, 2]
        logprobs = [-0.1, -0.2] + ([-0.3] if body["prompt_ids"] != [9] else [])
        return httpx.Response(
            200,
            json={
                "token_ids": ids,
                "log_probs": logprobs,
                "text": "hi",
                "ended_by_eos": True,
                "finish_reason": "stop",
                "stop_reason": "completed",
            },
        )

    backend = make_backend(
        "verl", "b0", "http://verl.invalid", transport=httpx.MockTransport(handler)
    )
    try:
        assert backend.type == "verl"
        assert await backend.context_size() == 4096
        result = await backend.generate(
            GenerateRequest(prompt_ids=[1, 2, 3], max_tokens=5, temperature=0.5)
        )
        assert result.response_ids == [7, 8, 2]
        assert result.response_logprobs == [-0.1, -0.2, -0.3]
        assert result.ended_by_eos and result.finish_reason == "stop"
        assert seen[0]["prompt_ids"] == [1, 2, 3]
        assert seen[0]["sampling_params"]["max_tokens"] == 5
        assert seen[0]["sampling_params"]["logprobs"] is True
        with pytest.raises(BackendError, match="logprobs"):
            await backend.generate(GenerateRequest(prompt_ids=[9], max_tokens=5))
    finally:
        await backend.aclose()
