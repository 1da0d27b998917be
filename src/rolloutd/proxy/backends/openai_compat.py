"""Any OpenAI-compatible Chat Completions API as a ``passthrough`` backend (text only).

The backend renders the chat template itself, so the gateway cannot know the prompt tokens
unless the backend returns them; a plain OpenAI-compatible API does not, and its completions
are recorded with ``trainable: false`` (DESIGN.md, capture modes). vLLM returns them
(:class:`rolloutd.proxy.backends.vllm.VllmBackend`).

Request: the harness's conversation as a Chat Completions body (OpenAI API reference,
https://platform.openai.com/docs/api-reference/chat/create) with the session's resolved
sampling values and ``stream: false``.
"""

from __future__ import annotations

from typing import Any

import httpx

from rolloutd.errors import BackendError, ConfigError
from rolloutd.proxy.backends.base import (
    Backend,
    ChatResult,
    GenerateRequest,
    GenerateResult,
)
from rolloutd.proxy.backends.http import new_client, post_json

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls",
           "function_call": "tool_calls", "eos": "stop", "end_turn": "stop"}


class OpenAIChatBackend(Backend):
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
    """

    type = "openai"

    def __init__(self, name: str, url: str, *, policy_version: int = 0,
                 timeout_s: float = 600.0, api_key: str | None = None, model: str | None = None,
                 ctx_size: int | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(name, url, policy_version=policy_version)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.client = new_client(self.url, timeout_s, transport, headers)
        self.model = model
        self._ctx_size = ctx_size

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.client.aclose()

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Not available: this backend takes no token prompts.

        Raises:
            ConfigError: always; open the session with ``capture_mode="passthrough"``.
        """
        raise ConfigError(f"backend {self.name} ({self.type}) takes no token prompts: use "
                          "capture_mode 'passthrough'")

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

    def parse_chat(self, answer: dict[str, Any]) -> ChatResult:
        """The :class:`ChatResult` of a ``chat.completion`` object.

        Raises:
            BackendError: no single choice with a message.
        """
        choices = answer.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 \
                or not isinstance(choices[0].get("message"), dict):
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
        return ChatResult(message=message, finish_reason=finish,  # type: ignore[arg-type]
                          num_prompt_tokens=int(usage.get("prompt_tokens") or 0),
                          num_completion_tokens=int(usage.get("completion_tokens") or 0))
