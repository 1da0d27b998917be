"""The gateway's internal request and response: what every dialect translates to and from.

Dialects (OpenAI Chat and Responses, Anthropic Messages, Gemini generateContent) are pure
translations between their wire models and these models, so the generation pipeline, the token
chain and the recorder see one shape only. Messages and tools use the OpenAI chat shape because
that is what Hugging Face chat templates expect.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

FinishReason = Literal["stop", "length", "tool_calls"]


class SamplingOverrides(BaseModel):
    """Sampling values the harness sent; None where it did not send one.

    Whether they win over the task's :class:`rolloutd.types.SamplingParams` is decided by the
    task's ``policy`` (see :func:`rolloutd.proxy.calls.sampling.resolve_sampling`).
    """

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0.0, le=5.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)


class InternalRequest(BaseModel):
    """One chat request after dialect translation.

    Attributes:
        dialect: the wire dialect it came from (``openai_chat``, ``openai_responses``,
            ``anthropic``, ``gemini``); recorded on the completion.
        model: the model name the harness asked for (informational; the session decides).
        messages: the conversation in OpenAI chat shape: ``role`` in system/user/assistant/tool,
            ``content`` a string, assistant ``tool_calls`` with ``function.arguments`` as a JSON
            string and optional ``reasoning_content`` (thinking the harness echoes back), tool
            messages with ``tool_call_id``.
        tools: OpenAI tool definitions (``{"type": "function", "function": {...}}``).
        sampling: the harness's own sampling values.
        stream: answer as a stream of chunks.
        include_usage: streaming only: send a final usage chunk (OpenAI ``stream_options``).
        body: the raw request body as parsed JSON; hashed to detect retries and recorded.
    """

    model_config = ConfigDict(extra="forbid")

    dialect: str = "openai_chat"
    model: str | None = None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    sampling: SamplingOverrides = Field(default_factory=SamplingOverrides)
    stream: bool = False
    include_usage: bool = False
    body: dict[str, Any] = Field(default_factory=dict)

    @field_validator("messages", mode="plain")
    @classmethod
    def _messages(cls, value: Any) -> list[dict[str, Any]]:
        # checked, not copied: copying every message of a long conversation on every call
        # made the call's cost grow with the conversation, which it must not; nothing modifies
        # them
        if not isinstance(value, list) or not all(map(isinstance, value, repeat(dict))):
            raise ValueError("messages must be a list of objects")
        return value


class Usage(BaseModel):
    """Token counts of one completion."""

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)

    @property
    def total_tokens(self) -> int:
        """``prompt_tokens + completion_tokens``."""
        return self.prompt_tokens + self.completion_tokens


class InternalResponse(BaseModel):
    """One answer before dialect translation.

    Attributes:
        id: the answer's id, chosen when the call starts and recorded with the completion
            (``Completion.response_id``), so an answer given again from the log is identical
            to the first one.
        created: Unix time (s) the completion started.
        model: the model name shown to the harness.
        text: the sampled text (end-of-turn token excluded).
        content: the assistant's text with reasoning and tool-call blocks removed; None when
            only tool calls.
        reasoning: the reasoning text (``<think>...</think>``), when a reasoning parser is set
            and found some; None otherwise.
        tool_calls: OpenAI tool calls (``id``, ``type``, ``function.name``,
            ``function.arguments`` as a JSON string).
        finish_reason: ``stop``, ``length`` or ``tool_calls``.
        usage: token counts.
        completion_index: index of the completion that holds this answer in the session's
            log (None until it is recorded); the gateway tells the session whether the answer
            reached the harness (:meth:`rolloutd.proxy.sessions.session.Session.settle`).
    """

    model_config = ConfigDict(extra="forbid")

    id: str
    created: int
    model: str
    text: str
    content: str | None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: FinishReason
    usage: Usage
    reasoning: str | None = None
    completion_index: int | None = None

    def message(self) -> dict[str, Any]:
        """The answer as an OpenAI assistant message (what is recorded as ``response_message``).

        Returns:
            ``{"role": "assistant", "content": ..., "tool_calls": [...],
            "reasoning_content": ...}``; ``tool_calls`` and ``reasoning_content`` only when
            there are some.
        """
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


# --------------------------------------------------------------------------- streaming


@dataclass
class StreamStart:
    """First event of a stream: the sampler answered; chunks can start.

    ``prompt_tokens``: the prompt's length in tokens when known before sampling ends (tokens
    mode, a retry answered from the log); None in passthrough, where the backend tells it
    only at the end.
    """

    id: str
    created: int
    model: str
    prompt_tokens: int | None = None


@dataclass
class StreamContent:
    """New content text, safe to show (never part of a tool call)."""

    text: str


@dataclass
class StreamReasoning:
    """New reasoning text (inside ``<think>``), safe to show."""

    text: str


@dataclass
class StreamEnd:
    """Last event: the recorded answer, and the content and reasoning not streamed yet."""

    response: InternalResponse
    content_tail: str
    reasoning_tail: str = ""


StreamEvent = StreamStart | StreamReasoning | StreamContent | StreamEnd


def id_suffix(response_id: str) -> str:
    """The unique part of an internal answer id (``chatcmpl-<hex>`` -> ``<hex>``), so each
    dialect can prefix it its own way (``resp_``, ``msg_``) and stay stable on replay."""
    return response_id.split("-", 1)[-1]


def chat_body(request: InternalRequest) -> dict[str, Any]:
    """The OpenAI Chat Completions body that carries ``request``: the internal shape is the
    chat shape, so this is what a passthrough backend is sent and what
    :func:`rolloutd.proxy.dialects.openai_chat.parse` reads back (OpenAI API reference,
    "Create chat completion")."""
    body: dict[str, Any] = {
        "model": request.model or "",
        "messages": request.messages,
        "stream": request.stream,
    }
    if request.tools:
        body["tools"] = request.tools
    for name, value in (
        ("temperature", request.sampling.temperature),
        ("top_p", request.sampling.top_p),
        ("max_tokens", request.sampling.max_tokens),
    ):
        if value is not None:
            body[name] = value
    if request.include_usage:
        body["stream_options"] = {"include_usage": True}
    return body
