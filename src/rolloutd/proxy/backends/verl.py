"""verl's own rollout servers as a backend: token ids to verl's server manager and back.

With the verl bridge (``rolloutd.trainer_client.bridges.verl``) verl keeps owning inference
and weights: its agent-loop worker serves a small HTTP endpoint in front of its
``LLMServerClient`` (the server manager: load balancing, sticky sessions, its vLLM or SGLang
replicas), and the gateway calls it as this backend, so every completion a harness asks for
is sampled by verl's servers with the weights verl synced to them.

Wire (both ends rolloutd's): ``POST /generate`` with ``{"prompt_ids": [int], "request_id":
str, "sampling_params": {"max_tokens", "temperature", "top_p", "top_k", "seed",
"logprobs"}}``; answer ``{"token_ids": [int], "log_probs": [float], "text": str,
"ended_by_eos": bool, "finish_reason": "stop" | "length", "stop_reason": str | null}``
(``token_ids`` and ``log_probs`` are verl's ``TokenOutput``'s; ``text`` is decoded by verl's
tokenizer). ``GET /context_size`` answers ``{"context_size": int}``.
"""

from __future__ import annotations

import uuid
from typing import Any

from rolloutd.errors import BackendError
from rolloutd.proxy.backends.base import GenerateRequest, GenerateResult
from rolloutd.proxy.backends.http import (
    HttpBackend,
    float_list,
    int_list,
    post_json,
)


def generate_body(request: GenerateRequest, request_id: str) -> dict[str, Any]:
    """The JSON body of ``POST /generate`` for ``request``."""
    return {
        "request_id": request_id,
        "prompt_ids": request.prompt_value(),
        "sampling_params": {
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k if request.top_k > 0 else -1,
            "seed": request.seed,
            "logprobs": True,
        },
    }


class VerlBackend(HttpBackend):
    """verl's server manager behind the bridge's endpoint, reached over HTTP.

    Args:
        name: pool name.
        url: the endpoint's base URL (``ServerManagerEndpoint.url`` in verl's worker).
        policy_version: version of the served weights (verl's ``global_steps``).
        timeout_s: limit of one call, seconds.
        ctx_size: context window; None asks ``GET /context_size``.
        transport: httpx transport (tests).
    """

    type = "verl"

    async def context_size(self) -> int:
        """``context_size`` from ``GET /context_size`` (cached).

        Raises:
            BackendError: the call fails or answers no integer.
        """
        return await self._cached_ctx_size(
            "/context_size", lambda body: body["context_size"], "integer"
        )

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample with one ``POST /generate`` (verl's ``LLMServerClient.generate``).

        Raises:
            BackendError: HTTP error, or an answer without aligned ids and logprobs.
        """
        answer = await post_json(
            self, self.client, "/generate", generate_body(request, uuid.uuid4().hex)
        )
        ids = int_list(answer.get("token_ids"), f"backend {self.name}: token_ids")
        logprobs = float_list(answer.get("log_probs"), f"backend {self.name}: log_probs")
        if len(ids) != len(logprobs):
            raise BackendError(
                f"backend {self.name}: {len(ids)} token ids but {len(logprobs)} logprobs "
                "(verl's rollout server must return logprobs)"
            )
        finish = answer.get("finish_reason")
        if finish not in ("stop", "length"):
            raise BackendError(f"backend {self.name}: unexpected finish_reason {finish!r}")
        return GenerateResult(
            response_ids=ids,
            response_logprobs=logprobs,
            text=str(answer.get("text") or ""),
            finish_reason=finish,
            ended_by_eos=bool(answer.get("ended_by_eos")),
            num_prompt_tokens=len(request.prompt_ids),
            raw={"stop_reason": answer.get("stop_reason")},
        )
