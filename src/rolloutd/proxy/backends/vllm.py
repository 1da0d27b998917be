"""vLLM as a token-in/token-out backend (``POST /v1/completions`` with token prompts) and as a
``passthrough`` backend that returns token ids (``POST /v1/chat/completions`` with
``return_token_ids``).

References: vLLM docs, "OpenAI-Compatible Server", extra parameters of the Completions and
Chat APIs (https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html):
``prompt`` may be a list of token ids; ``return_token_ids: true`` adds
``choices[i].token_ids`` (sampled ids) and ``prompt_token_ids``; ``logprobs: 1`` adds
``choices[i].logprobs.token_logprobs`` (Completions) or ``logprobs.content[].logprob`` (Chat);
``return_tokens_as_token_ids: true`` writes ``logprobs.tokens`` as ``"token_id:{id}"``;
``top_k: -1`` disables top-k; ``skip_special_tokens: false`` keeps the end-of-turn token's
text. ``finish_reason`` is ``stop`` or ``length``; ``stop_reason`` is None when the model's
end-of-generation token stopped it (that token is the last of ``token_ids``). The context
window is ``max_model_len`` of ``GET /v1/models``.

Log-prob mode: vLLM's ``--logprobs-mode`` (``ModelConfig.logprobs_mode``, default
``raw_logprobs``: "the values before applying any logit processors", i.e. before temperature
and top-k/top-p), so ``raw`` unless the server was started otherwise.

Routed experts (R3), read in vLLM's source at commit 002032ee2b18
(``vllm/entrypoints/openai/completion/protocol.py``, ``CompletionResponseChoice``): with the
server flag ``--enable-return-routed-experts``, a non-streamed Completions choice carries
``routed_experts``, base64 of a NumPy ``.npy`` array of shape ``(num_tokens - 1, num_layers,
num_experts_per_tok)`` (uint8, uint16 or int32), ``num_tokens`` being prompt plus sampled
tokens; ``None`` when the flag is off. Stream chunks have no such field.

Prefix-cache counts on streams, read in vLLM's source at commit 030ea52effcb
(``vllm/entrypoints/openai/completion/serving.py``, ``completion_stream_generator``): with
``stream_options.include_usage`` the last chunk before ``[DONE]`` has ``choices: []`` and
``usage`` (``prompt_tokens``, ``completion_tokens``, and ``prompt_tokens_details.cached_tokens``
when the server runs ``--enable-prompt-tokens-details``), after the chunk with
``finish_reason``; a stream therefore yields its result when the stream ends.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from rolloutd.errors import BackendError
from rolloutd.proxy.backends.base import (
    ChatResult,
    GenerateDelta,
    GenerateRequest,
    GenerateResult,
    cached_tokens,
)
from rolloutd.proxy.backends.http import (
    float_list,
    int_list,
    post_json,
    sse_events,
)
from rolloutd.proxy.backends.openai_compat import OpenAIChatBackend
from rolloutd.routes import check_rows, decode

_TOKEN_ID = re.compile(r"token_id:(\d+)")


def completions_body(
    request: GenerateRequest, *, model: str | None, stream: bool
) -> dict[str, Any]:
    """The JSON body of ``POST /v1/completions`` for ``request``."""
    body: dict[str, Any] = {
        "prompt": request.prompt_value(),
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k if request.top_k > 0 else -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "logprobs": 1,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if request.seed is not None:
        body["seed"] = request.seed
    if model:
        body["model"] = model
    return body


def _choice(answer: dict[str, Any], where: str) -> dict[str, Any]:
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise BackendError(f"vLLM {where}: expected exactly one choice")
    return choices[0]


def choice_tokens(choice: dict[str, Any], where: str) -> tuple[list[int], list[float]]:
    """Sampled ids (``token_ids``, else ``logprobs.tokens`` as ``token_id:N``) and their
    logprobs (``logprobs.token_logprobs``) of one Completions choice or chunk.

    Raises:
        BackendError: missing or misaligned fields.
    """
    logprobs = choice.get("logprobs") or {}
    values = float_list(logprobs.get("token_logprobs") or [], where)
    ids = choice.get("token_ids")
    if ids is None:
        tokens = logprobs.get("tokens") or []
        matches = [_TOKEN_ID.fullmatch(t) if isinstance(t, str) else None for t in tokens]
        if any(m is None for m in matches):
            raise BackendError(f"vLLM {where}: no token_ids and tokens are not token_id:N")
        ids = [int(m.group(1)) for m in matches]  # type: ignore[union-attr]
    ids = int_list(ids, where)
    if len(ids) != len(values):
        raise BackendError(f"vLLM {where}: {len(ids)} token ids but {len(values)} logprobs")
    return ids, values


def choice_routes(choice: dict[str, Any], where: str) -> Any:
    """The choice's ``routed_experts`` as a ``(rows, layers, top_k)`` array, or None.

    Raises:
        BackendError: present but not base64 ``.npy`` of that shape.
    """
    encoded = choice.get("routed_experts")
    if encoded is None:
        return None
    try:
        return check_rows(decode(base64.b64decode(encoded, validate=True)), f"vLLM {where}")
    except (binascii.Error, TypeError, ValueError) as e:
        raise BackendError(f"vLLM {where}: routed_experts is not a base64 .npy array") from e


def _finish(choice: dict[str, Any], ids: list[int], where: str) -> tuple[str, bool]:
    reason = choice.get("finish_reason")
    if reason not in ("stop", "length"):
        raise BackendError(f"vLLM {where}: unexpected finish_reason {reason!r}")
    ended_by_eos = reason == "stop" and choice.get("stop_reason") is None and bool(ids)
    return reason, ended_by_eos


class VllmBackend(OpenAIChatBackend):
    """A vLLM OpenAI-compatible server: token prompts on ``/v1/completions`` (``tokens``
    capture) and chat with ``return_token_ids`` (``passthrough`` capture, trainable).

    Args: as :class:`OpenAIChatBackend`.
    """

    type = "vllm"
    kind_logprob_mode = "raw"

    async def context_size(self) -> int:
        """``max_model_len`` from ``GET /v1/models`` (cached).

        Raises:
            BackendError: the listing fails or has no ``max_model_len``.
        """

        def read(body: Any) -> Any:
            data = body["data"]
            entry = next((m for m in data if not self.model or m.get("id") == self.model), data[0])
            return entry["max_model_len"]

        return await self._cached_ctx_size("/v1/models", read, "max_model_len")

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample with one ``POST /v1/completions`` on the token prompt.

        Raises:
            BackendError: HTTP error or a malformed answer.
            rolloutd.errors.ContextLengthError: vLLM says the prompt is too long.
        """
        answer = await post_json(
            self,
            self.client,
            "/v1/completions",
            completions_body(request, model=self.model, stream=False),
        )
        choice = _choice(answer, "response")
        ids, logprobs = choice_tokens(choice, "response")
        reason, ended_by_eos = _finish(choice, ids, "response")
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
        return GenerateResult(
            response_ids=ids,
            response_logprobs=logprobs,
            text=str(choice.get("text") or ""),
            finish_reason=reason,
            ended_by_eos=ended_by_eos,  # type: ignore[arg-type]
            num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
            num_cached_tokens=cached_tokens(usage),
            raw={"stop_reason": choice.get("stop_reason")},
            routed_experts=choice_routes(choice, "response"),
        )

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateDelta]:
        """Sample with ``stream: true`` and ``stream_options.include_usage``: one delta per
        chunk, then the result once the stream ends, with the prompt and cached-token counts
        of the trailing usage chunk (None when the server sends none).

        Raises:
            BackendError: HTTP error, a malformed chunk, or no chunk with ``finish_reason``.
        """
        started, first_token_s = time.monotonic(), None
        ids: list[int] = []
        logprobs: list[float] = []
        texts: list[str] = []
        usage: dict[str, Any] = {}
        result: GenerateResult | None = None
        body = completions_body(request, model=self.model, stream=True)
        async for chunk in sse_events(self, self.client, "/v1/completions", body):
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            if not chunk.get("choices") or result is not None:
                continue  # the usage chunk (after the finish), or nothing past the finish
            choice = _choice(chunk, "stream chunk")
            new_ids, new_logprobs = choice_tokens(choice, "stream chunk")
            if new_ids and first_token_s is None:
                first_token_s = time.monotonic() - started
            ids += new_ids
            logprobs += new_logprobs
            texts.append(str(choice.get("text") or ""))
            if new_ids or texts[-1]:
                yield GenerateDelta(
                    response_ids=new_ids, response_logprobs=new_logprobs, text=texts[-1]
                )
            if choice.get("finish_reason") is not None:
                reason, ended_by_eos = _finish(choice, ids, "stream")
                result = GenerateResult(
                    response_ids=ids,
                    response_logprobs=logprobs,
                    text="".join(texts),
                    finish_reason=reason,
                    ended_by_eos=ended_by_eos,  # type: ignore[arg-type]
                    first_token_s=first_token_s,
                    raw={"stop_reason": choice.get("stop_reason")},
                )
        if result is None:
            raise BackendError(f"backend {self.name}: stream ended without a finish_reason")
        result.num_prompt_tokens = int(usage.get("prompt_tokens") or 0)
        result.num_cached_tokens = cached_tokens(usage)
        yield GenerateDelta(result=result)

    def chat_extras(self) -> dict[str, Any]:
        """``return_token_ids`` and ``logprobs``: the completion stays trainable."""
        return {"return_token_ids": True, "logprobs": True}

    def parse_chat(self, answer: dict[str, Any]) -> ChatResult:
        """:meth:`OpenAIChatBackend.parse_chat` plus ``prompt_token_ids``,
        ``choices[0].token_ids`` and ``choices[0].logprobs.content[].logprob``.

        Raises:
            BackendError: token ids and logprobs that do not align.
        """
        result = super().parse_chat(answer)
        choice = _choice(answer, "chat response")
        prompt_ids = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
        if prompt_ids is None or choice.get("token_ids") is None:
            return result  # an older vLLM without return_token_ids: untrainable
        content = (choice.get("logprobs") or {}).get("content") or []
        result.prompt_ids = int_list(prompt_ids, "chat response")
        result.response_ids = int_list(choice["token_ids"], "chat response")
        result.response_logprobs = float_list(
            [c.get("logprob") if isinstance(c, dict) else None for c in content], "chat response"
        )
        if len(result.response_ids) != len(result.response_logprobs):
            raise BackendError(
                f"backend {self.name}: {len(result.response_ids)} token ids "
                f"but {len(result.response_logprobs)} logprobs"
            )
        return result
