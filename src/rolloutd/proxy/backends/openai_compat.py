"""Any OpenAI-compatible Chat Completions API as a ``passthrough`` backend (text only).

The backend renders the chat template itself, so the gateway cannot know the prompt tokens
unless the backend returns them; a plain OpenAI-compatible API does not, and its completions
are recorded with ``trainable: false`` (the ``passthrough`` capture mode). vLLM returns them
(:class:`rolloutd.proxy.backends.vllm.VllmBackend`).

Request: the harness's conversation as a Chat Completions body (OpenAI API reference,
https://platform.openai.com/docs/api-reference/chat/create) with the session's resolved
sampling values and ``stream: false``, or ``stream: true`` with ``stream_options.include_usage``
when the harness streams: chunks (https://platform.openai.com/docs/api-reference/chat-streaming)
are forwarded as they arrive and assembled into the ``chat.completion`` object the
non-streamed call answers (content and reasoning joined, tool calls merged by ``index``,
vLLM's ``token_ids`` and ``logprobs.content`` concatenated), which is parsed by the same
:meth:`OpenAIChatBackend.parse_chat`: both paths record the same completion.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx

from rolloutd.errors import BackendError, ConfigError
from rolloutd.proxy.backends.base import (
    ChatDelta,
    ChatResult,
    GenerateRequest,
    GenerateResult,
    cached_tokens,
)
from rolloutd.proxy.backends.http import HttpBackend, post_json, sse_events
from rolloutd.types import LogprobMode

_FINISH = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "eos": "stop",
    "end_turn": "stop",
}


class OpenAIChatBackend(HttpBackend):
    """An OpenAI-compatible ``/v1/chat/completions`` endpoint.

    Args:
        name: pool name.
        url: base URL without ``/v1`` (``http://host:8000``).
        policy_version: version of the served weights.
        timeout_s: limit of one call, seconds.
        api_key: sent as ``Authorization: Bearer`` when set.
        model: model name sent upstream; None keeps the harness's.
        ctx_size: context window (only used to bound ``max_tokens`` when known).
        transport: httpx transport (tests).
        logprob_mode: the operator's statement of the server's log-prob mode (None: the
            kind's).
    """

    type = "openai"

    def __init__(
        self,
        name: str,
        url: str,
        *,
        policy_version: int = 0,
        timeout_s: float = 600.0,
        api_key: str | None = None,
        model: str | None = None,
        ctx_size: int | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        logprob_mode: LogprobMode | None = None,
    ) -> None:
        super().__init__(
            name,
            url,
            policy_version=policy_version,
            timeout_s=timeout_s,
            ctx_size=ctx_size,
            transport=transport,
            headers={"Authorization": f"Bearer {api_key}"} if api_key else None,
            logprob_mode=logprob_mode,
        )
        self.model = model

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Not available: this backend takes no token prompts.

        Raises:
            ConfigError: always; open the session with ``capture_mode="passthrough"``.
        """
        raise ConfigError(
            f"backend {self.name} ({self.type}) takes no token prompts: use "
            "capture_mode 'passthrough'"
        )

    async def context_size(self) -> int:
        """The configured context window (1,000,000 when unknown: the API bounds itself)."""
        return self._ctx_size or 1_000_000

    def chat_extras(self) -> dict[str, Any]:
        """Extra request fields of this backend (none for a plain OpenAI API)."""
        return {}

    async def chat(self, body: dict[str, Any]) -> ChatResult:
        """One non-streamed Chat Completions call.

        Args:
            body: a Chat Completions body (messages, tools, sampling values).

        Raises:
            BackendError: transport failure, error status, or a malformed answer.
        """
        upstream = {**body, **self.chat_extras(), "stream": False}
        upstream.pop("stream_options", None)
        if self.model:
            upstream["model"] = self.model
        answer = await post_json(self, self.client, "/v1/chat/completions", upstream)
        return self.parse_chat(answer)

    async def chat_stream(self, body: dict[str, Any]) -> AsyncIterator[ChatDelta]:
        """One streamed Chat Completions call: a delta per chunk (the first one at once, so
        the caller can start its answer), then the :class:`ChatResult` of the assembled
        answer (module docstring).

        Args:
            body: a Chat Completions body (messages, tools, sampling values).

        Raises:
            BackendError: transport failure, error status, a malformed chunk, or a stream
                that ends without a ``finish_reason``.
        """
        upstream = {
            **body,
            **self.chat_extras(),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.model:
            upstream["model"] = self.model
        content: list[str] = []
        reasoning: list[str] = []
        tool_calls: dict[int, dict[str, Any]] = {}
        token_ids: list[Any] | None = None
        logprobs: list[Any] = []
        finish: Any = None
        usage: dict[str, Any] = {}
        prompt_ids: Any = None
        first = True
        async for chunk in sse_events(self, self.client, "/v1/chat/completions", upstream):
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            if chunk.get("prompt_token_ids") is not None:
                prompt_ids = chunk["prompt_token_ids"]
            choices = chunk.get("choices") or []
            if (
                not isinstance(choices, list)
                or len(choices) > 1
                or (choices and not isinstance(choices[0], dict))
            ):
                raise BackendError(f"backend {self.name}: expected one choice per chunk")
            text, thought = "", ""
            if choices:
                choice = choices[0]
                if choice.get("prompt_token_ids") is not None:
                    prompt_ids = choice["prompt_token_ids"]
                delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
                text = delta.get("content") or ""
                thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
                if not isinstance(text, str) or not isinstance(thought, str):
                    raise BackendError(f"backend {self.name}: chunk text is not a string")
                content.append(text)
                reasoning.append(thought)
                for call in delta.get("tool_calls") or []:
                    _merge_tool_call(tool_calls, call, self.name)
                if choice.get("token_ids") is not None:
                    if not isinstance(choice["token_ids"], list):
                        raise BackendError(f"backend {self.name}: chunk token_ids not a list")
                    token_ids = [*(token_ids or []), *choice["token_ids"]]
                chunk_logprobs = (choice.get("logprobs") or {}).get("content")
                if isinstance(chunk_logprobs, list):
                    logprobs += chunk_logprobs
                if choice.get("finish_reason") is not None:
                    finish = choice["finish_reason"]
            if first or text or thought:
                first = False
                yield ChatDelta(content=text, reasoning=thought)
        if finish is None:
            raise BackendError(f"backend {self.name}: stream ended without a finish_reason")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(content) if any(content) else None,
        }
        if any(reasoning):
            message["reasoning_content"] = "".join(reasoning)
        if tool_calls:
            message["tool_calls"] = [tool_calls[i] for i in sorted(tool_calls)]
        choice = {"index": 0, "message": message, "finish_reason": finish}
        if token_ids is not None:
            choice["token_ids"] = token_ids
        if logprobs:
            choice["logprobs"] = {"content": logprobs}
        answer: dict[str, Any] = {"object": "chat.completion", "choices": [choice], "usage": usage}
        if prompt_ids is not None:
            answer["prompt_token_ids"] = prompt_ids
        yield ChatDelta(result=self.parse_chat(answer))

    def parse_chat(self, answer: dict[str, Any]) -> ChatResult:
        """The :class:`ChatResult` of a ``chat.completion`` object.

        Raises:
            BackendError: no single choice with a message.
        """
        choices = answer.get("choices")
        if (
            not isinstance(choices, list)
            or len(choices) != 1
            or not isinstance(choices[0].get("message"), dict)
        ):
            raise BackendError(f"backend {self.name}: expected one choice with a message")
        choice = choices[0]
        raw = choice["message"]
        message: dict[str, Any] = {"role": "assistant", "content": raw.get("content")}
        reasoning = raw.get("reasoning_content") or raw.get("reasoning")
        if isinstance(reasoning, str):
            message["reasoning_content"] = reasoning
        if raw.get("tool_calls"):
            message["tool_calls"] = raw["tool_calls"]
        finish = _FINISH.get(str(choice.get("finish_reason")), "stop")
        if message.get("tool_calls"):
            finish = "tool_calls"
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
        return ChatResult(
            message=message,
            finish_reason=finish,  # type: ignore[arg-type]
            num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
            num_completion_tokens=int(usage.get("completion_tokens") or 0),
            num_cached_tokens=cached_tokens(usage),
        )


def _merge_tool_call(calls: dict[int, dict[str, Any]], part: Any, backend: str) -> None:
    """Merge one streamed tool-call fragment into ``calls`` (by its ``index``): the id, type
    and name arrive once, the arguments in pieces.

    Raises:
        BackendError: a fragment that is not an object.
    """
    if not isinstance(part, dict):
        raise BackendError(f"backend {backend}: a streamed tool call is not an object")
    index = part.get("index", len(calls))
    call = calls.setdefault(
        index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    )
    if part.get("id"):
        call["id"] = part["id"]
    if part.get("type"):
        call["type"] = part["type"]
    function = part.get("function") if isinstance(part.get("function"), dict) else {}
    if function.get("name"):
        call["function"]["name"] += str(function["name"])
    if function.get("arguments"):
        call["function"]["arguments"] += str(function["arguments"])
