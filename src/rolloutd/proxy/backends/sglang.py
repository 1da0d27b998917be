"""SGLang as a token-in/token-out backend (``POST /generate`` with ``input_ids``).

References: SGLang docs, "Native APIs" (https://docs.sglang.io/basic_usage/native_api.html)
and "Sampling Parameters" (https://docs.sglang.io/basic_usage/sampling_params.html):
request ``input_ids``, ``sampling_params`` (``max_new_tokens``, ``temperature``, ``top_p``,
``top_k`` with -1 disabling it, ``min_p``, ``sampling_seed``, ``skip_special_tokens``,
``no_stop_trim``), ``return_logprob: true``, ``stream``. Answer: ``text``, ``output_ids``
and ``meta_info`` with ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
``finish_reason`` (``{"type": "stop", "matched": <token id>}`` or ``{"type": "length"}``)
and ``output_token_logprobs`` as ``[logprob, token_id, text_or_null]`` per sampled token.
Streaming sends ``data: {...}`` events whose ``text`` and ``meta_info.output_token_logprobs``
are cumulative, then ``data: [DONE]``. The context window is ``max_total_num_tokens`` /
``context_length`` of ``GET /get_model_info`` (``context_length``).

Log-prob mode, read in SGLang's ``python/sglang/srt/layers/sampler.py`` (``Sampler.forward``):
the logprob of a sampled token is ``log(softmax(logits / temperature))``, taken before top-k
and top-p cut the distribution (no min-p: rolloutd sends ``min_p`` 0, which would renormalise
first), so ``temperature``; with ``SGLANG_RETURN_ORIGINAL_LOGPROB`` set on the server it is
the log-softmax before temperature (``raw``); a greedy request (temperature 0) gets the raw
log-softmax.

Routed experts (R3), read in SGLang's source at commit d4d0fc58371761
(``python/sglang/srt/layers/moe/routed_experts_capturer.py``): with the server flag
``--enable-return-routed-experts`` and ``return_routed_experts: true`` in the request,
``meta_info.routed_experts`` is base64 of the raw int32 expert ids of ``seqlen - 1`` tokens
(prompt plus sampled, less the last), flattened; its ``(num_hidden_layers,
num_experts_per_tok)`` come from the model's config (verl reshapes with them), so the backend
is told them (:attr:`SglangBackend.routed_experts_shape`).
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from rolloutd.errors import BackendError
from rolloutd.proxy.backends.base import (
    GenerateDelta,
    GenerateRequest,
    GenerateResult,
    reported_int,
)
from rolloutd.proxy.backends.http import (
    HttpBackend,
    post_json,
    sse_events,
)


def generate_body(
    request: GenerateRequest, *, stream: bool, routed_experts: bool = False
) -> dict[str, Any]:
    """The JSON body of ``POST /generate`` for ``request`` (``return_routed_experts`` when
    ``routed_experts``)."""
    sampling: dict[str, Any] = {
        "max_new_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k if request.top_k > 0 else -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }
    if request.seed is not None:
        sampling["sampling_seed"] = request.seed
    body = {
        "input_ids": request.prompt_value(),
        "sampling_params": sampling,
        "return_logprob": True,
        "stream": stream,
    }
    if routed_experts:
        body["return_routed_experts"] = True
    return body


def meta_routes(
    meta: dict[str, Any], num_tokens: int, shape: tuple[int, int] | None, where: str
) -> Any:
    """``meta_info.routed_experts`` as a ``(rows, layers, top_k)`` int32 array, or None.

    Args:
        meta: the answer's ``meta_info``.
        num_tokens: prompt plus sampled tokens (the rows are one fewer).
        shape: ``(num_layers, top_k)``; None: one row of ``layers x top_k`` ids per token,
            as ``(rows, 1, layers x top_k)``.
        where: for errors.

    Raises:
        BackendError: present but not base64 int32 ids of ``num_tokens - 1`` rows.
    """
    encoded = meta.get("routed_experts")
    if encoded is None:
        return None
    try:
        flat = np.frombuffer(base64.b64decode(encoded, validate=True), dtype=np.int32)
    except (binascii.Error, TypeError, ValueError) as e:
        raise BackendError(f"SGLang {where}: routed_experts is not base64 int32 ids") from e
    rows = num_tokens - 1
    if rows < 1 or flat.size % rows:
        raise BackendError(f"SGLang {where}: {flat.size} routed expert ids for {rows} tokens")
    width = flat.size // rows
    if shape is None:
        return flat.reshape(rows, 1, width)
    if shape[0] * shape[1] != width:
        raise BackendError(
            f"SGLang {where}: {width} expert ids per token, not {shape[0]} layers x {shape[1]}"
        )
    return flat.reshape(rows, *shape)


def token_logprobs(meta: dict[str, Any], where: str) -> tuple[list[int], list[float]]:
    """Sampled ids and logprobs from ``meta_info.output_token_logprobs``.

    Raises:
        BackendError: missing, or an entry that is not ``[logprob, token_id, ...]``.
    """
    entries = meta.get("output_token_logprobs")
    if not isinstance(entries, list):
        raise BackendError(
            f"SGLang {where}: no meta_info.output_token_logprobs (return_logprob was sent)"
        )
    ids, logprobs = [], []
    for entry in entries:
        if (
            not isinstance(entry, list | tuple)
            or len(entry) < 2
            or not isinstance(entry[0], int | float)
            or isinstance(entry[1], bool)
            or not isinstance(entry[1], int)
        ):
            raise BackendError(f"SGLang {where}: malformed output_token_logprobs entry")
        logprobs.append(float(entry[0]))
        ids.append(entry[1])
    return ids, logprobs


def _finish(meta: dict[str, Any], ids: list[int], where: str) -> tuple[str, bool]:
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind not in ("stop", "length"):
        raise BackendError(f"SGLang {where}: unexpected finish_reason {finish!r}")
    matched = finish.get("matched")  # type: ignore[union-attr]
    ended_by_eos = kind == "stop" and isinstance(matched, int) and bool(ids) and ids[-1] == matched
    return kind, ended_by_eos


class SglangBackend(HttpBackend):
    """An SGLang server reached over HTTP.

    Args:
        name: pool name.
        url: base URL, e.g. ``http://127.0.0.1:30000``.
        policy_version: version of the served weights.
        timeout_s: limit of one call, seconds.
        ctx_size: context window; None reads ``/get_model_info``.
        transport: httpx transport (tests).
        return_routed_experts: ask every call for its routed experts (R3); the server must
            run with ``--enable-return-routed-experts``.
        routed_experts_shape: ``(num_hidden_layers, num_experts_per_tok)`` of the served MoE
            model, to shape the flat ids; None: one row of ``layers x top_k`` ids per token.
        **kwargs: :class:`HttpBackend`'s (``headers``, ``logprob_mode``).
    """

    type = "sglang"
    kind_logprob_mode = "temperature"

    def __init__(
        self,
        name: str,
        url: str,
        *,
        return_routed_experts: bool = False,
        routed_experts_shape: tuple[int, int] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, url, **kwargs)
        self.return_routed_experts = return_routed_experts
        self.routed_experts_shape = routed_experts_shape

    def options(self) -> dict[str, Any]:
        """:meth:`Backend.options` and the routed-experts ones."""
        return {
            **super().options(),
            "return_routed_experts": self.return_routed_experts,
            "routed_experts_shape": self.routed_experts_shape,
        }

    async def context_size(self) -> int:
        """``context_length`` from ``GET /get_model_info`` (cached).

        Raises:
            BackendError: the call fails or has no ``context_length``.
        """
        return await self._cached_ctx_size(
            "/get_model_info", lambda body: body["context_length"], "context_length"
        )

    def _result(
        self,
        answer: dict[str, Any],
        where: str,
        first_token_s: float | None,
        num_prompt: int = 0,
    ) -> GenerateResult:
        meta = answer.get("meta_info")
        if not isinstance(meta, dict):
            raise BackendError(f"SGLang {where}: no meta_info")
        ids, logprobs = token_logprobs(meta, where)
        output_ids = answer.get("output_ids")
        if isinstance(output_ids, list) and output_ids and output_ids != ids:
            raise BackendError(f"SGLang {where}: output_ids differ from the logprob token ids")
        reason, ended_by_eos = _finish(meta, ids, where)
        return GenerateResult(
            response_ids=ids,
            response_logprobs=logprobs,
            text=str(answer.get("text") or ""),
            finish_reason=reason,
            ended_by_eos=ended_by_eos,  # type: ignore[arg-type]
            num_prompt_tokens=int(meta.get("prompt_tokens") or 0),
            num_cached_tokens=reported_int(meta.get("cached_tokens")),
            first_token_s=first_token_s,
            raw={"finish_reason": meta.get("finish_reason")},
            routed_experts=meta_routes(
                meta, num_prompt + len(ids), self.routed_experts_shape, where
            ),
        )

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample with one ``POST /generate``.

        Raises:
            BackendError: HTTP error or a malformed answer.
        """
        answer = await post_json(
            self,
            self.client,
            "/generate",
            generate_body(request, stream=False, routed_experts=self.return_routed_experts),
        )
        return self._result(answer, "response", None, len(request.prompt_ids))

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateDelta]:
        """Sample with ``stream: true``; cumulative events become deltas.

        Raises:
            BackendError: HTTP error, a malformed event, or a stream without a finish.
        """
        started, first_token_s = time.monotonic(), None
        num_ids, sent_text = 0, ""
        body = generate_body(request, stream=True, routed_experts=self.return_routed_experts)
        async for event in sse_events(self, self.client, "/generate", body):
            meta = event.get("meta_info") if isinstance(event.get("meta_info"), dict) else {}
            ids, logprobs = token_logprobs(meta, "stream event")
            text = str(event.get("text") or "")
            if len(ids) < num_ids or not text.startswith(sent_text):
                raise BackendError(f"backend {self.name}: stream events are not cumulative")
            if len(ids) > num_ids and first_token_s is None:
                first_token_s = time.monotonic() - started
            if len(ids) > num_ids or len(text) > len(sent_text):
                yield GenerateDelta(
                    response_ids=ids[num_ids:],
                    response_logprobs=logprobs[num_ids:],
                    text=text[len(sent_text) :],
                )
            num_ids, sent_text = len(ids), text
            if meta.get("finish_reason") is not None:
                yield GenerateDelta(
                    result=self._result(event, "stream", first_token_s, len(request.prompt_ids))
                )
                return
        raise BackendError(f"backend {self.name}: stream ended without a finish_reason")
