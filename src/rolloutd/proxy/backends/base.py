"""The backend contract: token ids in, sampled token ids and their logprobs out.

Every inference server the gateway drives in ``tokens`` capture mode (llama.cpp today; vLLM
``/v1/completions`` and SGLang ``/generate`` later) implements :class:`Backend`. Clients run
without retries: Temporal owns retries (docs/failures.md).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rolloutd.proxy.core import fastjson
from rolloutd.types import LogprobMode


def reported_int(value: Any) -> int | None:
    """A count an engine reported (``timings.cache_n``, ``meta_info.cached_tokens``) as an
    int, or None when it is absent or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def cached_tokens(usage: Any) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` of an OpenAI-shaped answer: prompt tokens
    served from the engine's prefix cache (OpenAI's ``CompletionUsage``; vLLM's
    ``UsageInfo``/``PromptTokenUsageInfo``, sent when the server runs
    ``--enable-prompt-tokens-details``; llama-server's ``/v1/chat/completions``), or None
    when the answer does not say."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    return reported_int(details.get("cached_tokens")) if isinstance(details, dict) else None


@dataclass(frozen=True)
class GenerateRequest:
    """One sampling call.

    Attributes:
        prompt_ids: list[int], length P: the prompt.
        max_tokens: sampled tokens at most (>= 1).
        temperature: softmax temperature; 0 samples greedily.
        top_p: nucleus mass in (0, 1]; 1 disables it.
        top_k: top-k cut-off; 0 disables it.
        seed: sampling seed, or None for a random one.
        prompt_json: ``prompt_ids`` as JSON text (``fastjson.dumps(prompt_ids)``) when the
            caller has it (a session writes its token chain once: ``fastjson.ListJson``),
            else None.
    """

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    prompt_json: bytes | None = None

    def prompt_value(self) -> Any:
        """The prompt as a value of a backend's JSON body, serialised at once: ``prompt_json``
        written as is (``fastjson.raw``), else ``prompt_ids`` (not copied: thousands of
        ids)."""
        if self.prompt_json is not None:
            return fastjson.raw(self.prompt_json)
        return self.prompt_ids


@dataclass
class GenerateResult:
    """What the backend sampled.

    Invariant: ``len(response_ids) == len(response_logprobs)``; ``response_ids`` are in
    sampling order and include the end-of-generation token when one was sampled
    (``ended_by_eos``).

    Attributes:
        response_ids: list[int], length R: sampled token ids.
        response_logprobs: list[float], length R: the backend's logprob of each sampled token.
        text: the backend's detokenised text (end-of-generation token not included).
        finish_reason: ``stop`` (end-of-generation token) or ``length`` (``max_tokens``).
        ended_by_eos: the last of ``response_ids`` is an end-of-generation token.
        num_prompt_tokens: prompt tokens the backend reports it received.
        num_cached_tokens: prompt tokens served from its prefix cache, or None when the
            backend did not report it.
        first_token_s: seconds from the request to the first sampled token (streaming), or None.
        raw: backend-specific extras (stop type, timings) kept for debugging.
        recomputed_logprob_positions: positions in ``response_ids`` whose logprob the backend
            did not report with the sample and computed again from the same context (not
            always bit-identical to the sampled one); sorted, usually empty.
        routed_experts: ``numpy.ndarray`` of shape ``(P + R - 1, num_layers, top_k)``: the
            experts each token of prompt and response was routed to (R3), when the backend
            returned them (vLLM, SGLang); else None.
    """

    response_ids: list[int]
    response_logprobs: list[float]
    text: str
    finish_reason: Literal["stop", "length"]
    ended_by_eos: bool
    num_prompt_tokens: int = 0
    num_cached_tokens: int | None = None
    first_token_s: float | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    recomputed_logprob_positions: list[int] = field(default_factory=list)
    routed_experts: Any = None


@dataclass
class GenerateDelta:
    """One streamed step: new tokens and text, or the final result.

    Attributes:
        response_ids: list[int]: tokens sampled in this step.
        response_logprobs: list[float], same length: their logprobs; NaN for a token whose
            logprob the backend did not send with it (the result holds the recomputed value).
        text: text of this step (may be empty while a multi-byte character is incomplete).
        result: set on the last delta only: the whole :class:`GenerateResult`.
    """

    response_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    text: str = ""
    result: GenerateResult | None = None


class Backend(abc.ABC):
    """An inference server that samples from token-id prompts.

    Args:
        name: stable name of the backend in the pool (sessions are pinned by name).
        url: base URL.
        policy_version: version of the weights it serves; stamped on every completion.
        logprob_mode: what this server's logprobs are when the operator says so
            (``BackendSpec.logprob_mode``: a vLLM started with ``--logprobs-mode
            processed_logprobs``); None: its kind's (:attr:`kind_logprob_mode`).
    """

    type: ClassVar[str] = "abstract"
    #: what this kind's logprobs are (:data:`rolloutd.types.LogprobMode`), from its own source
    #: at the version docs/backends.md names
    kind_logprob_mode: ClassVar[LogprobMode] = "unknown"

    def __init__(
        self,
        name: str,
        url: str,
        *,
        policy_version: int = 0,
        logprob_mode: LogprobMode | None = None,
    ) -> None:
        self.name = name
        self.url = url.rstrip("/")
        self.policy_version = policy_version
        #: the operator's statement of the mode, or None (the kind's)
        self.declared_logprob_mode = logprob_mode
        #: what this server's logprobs are: stamped on every completion it samples
        self.logprob_mode: LogprobMode = logprob_mode or self.kind_logprob_mode

    @abc.abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample a response to ``request.prompt_ids``.

        Raises:
            rolloutd.errors.BackendError: the backend failed or answered garbage.
            rolloutd.errors.BackendUnavailableError: it cannot be reached.
        """

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateDelta]:
        """Sample a response as a stream of deltas; the last one carries the result.

        The default samples in one call and yields one delta: backends that stream override it.
        The concatenated deltas equal ``result.response_ids`` / ``response_logprobs``.
        """
        result = await self.generate(request)
        yield GenerateDelta(
            response_ids=list(result.response_ids),
            response_logprobs=list(result.response_logprobs),
            text=result.text,
        )
        yield GenerateDelta(result=result)

    @abc.abstractmethod
    async def context_size(self) -> int:
        """Context window of one sequence, in tokens (prompt plus response)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release the client's connections (nothing by default)."""

    def describe(self) -> dict[str, Any]:
        """Name, type, URL, policy version and log-prob mode (for logs and admin routes)."""
        return {
            "name": self.name,
            "type": self.type,
            "url": self.url,
            "policy_version": self.policy_version,
            "logprob_mode": self.logprob_mode,
        }

    def options(self) -> dict[str, Any]:
        """The operator's options of this backend, as ``BackendSpec`` fields
        (``logprob_mode``: None when it is its kind's)."""
        return {"logprob_mode": self.declared_logprob_mode}


@dataclass
class ChatResult:
    """What a backend that renders the chat itself answered (``passthrough`` capture mode).

    Invariant: ``len(response_ids) == len(response_logprobs)``; both are empty when the backend
    does not return token ids (a plain OpenAI-compatible API): the completion is then
    recorded as untrainable.

    Attributes:
        message: the assistant message: ``content``, ``tool_calls``, ``reasoning_content``.
        finish_reason: ``stop``, ``length`` or ``tool_calls``.
        prompt_ids: list[int], length P: the prompt as the backend tokenised it, or empty.
        response_ids: list[int], length R: sampled ids, or empty.
        response_logprobs: list[float], length R: their logprobs, or empty.
        num_prompt_tokens: prompt tokens reported in ``usage``.
        num_completion_tokens: completion tokens reported in ``usage``.
        num_cached_tokens: prompt tokens served from its prefix cache
            (``usage.prompt_tokens_details.cached_tokens``), or None when not reported.
    """

    message: dict[str, Any]
    finish_reason: Literal["stop", "length", "tool_calls"]
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_completion_tokens: int = 0
    num_cached_tokens: int | None = None

    @property
    def trainable(self) -> bool:
        """Token ids of prompt and response and a logprob per sampled token are known."""
        return (
            bool(self.prompt_ids)
            and bool(self.response_ids)
            and len(self.response_ids) == len(self.response_logprobs)
        )


@dataclass
class ChatDelta:
    """One streamed step of a chat backend (``passthrough``): new text, or the final result.

    Attributes:
        content: new answer text (may be empty: the first chunk says only that the answer
            started).
        reasoning: new reasoning text.
        result: set on the last delta only: the whole :class:`ChatResult`, the same one the
            non-streamed call would have returned for the same answer.
    """

    content: str = ""
    reasoning: str = ""
    result: ChatResult | None = None
