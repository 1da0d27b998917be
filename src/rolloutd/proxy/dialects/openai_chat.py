"""OpenAI Chat Completions: wire models, translation to and from the internal shapes, errors.

Reference: OpenAI API reference, "Chat Completions" (request, response, chunk objects) and
"Error codes"; vLLM ``entrypoints/openai/protocol.py`` for the fields clients send in practice.

Wire models accept unknown fields (``extra="allow"``). Fields handled knowingly:

- kept: ``model``, ``messages``, ``tools``, ``temperature``, ``top_p``, ``max_tokens`` /
  ``max_completion_tokens``, ``stream``, ``stream_options.include_usage``; the whole body is
  recorded and hashed;
- refused (400): ``n`` other than 1; content parts other than text;
- ignored: ``tool_choice``, ``parallel_tool_calls``, ``stop``, ``seed``, ``logprobs``,
  penalties and any other field (the task's sampling parameters decide; stop strings would cut
  sampled tokens off the trace).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rolloutd.errors import (
    AuthenticationError,
    BackendError,
    BackendUnavailableError,
    ContextLengthError,
    NotFoundError,
    RequestFieldError,
    RolloutdError,
)
from rolloutd.proxy.core.call_types import (
    InternalRequest,
    InternalResponse,
    SamplingOverrides,
    StreamContent,
    StreamEvent,
    StreamReasoning,
    StreamStart,
    Usage,
    chat_body,
)
from rolloutd.proxy.core.request_identity import RequestMemo, validate_new_items
from rolloutd.proxy.dialects.common import error_path, sse_data, validate
from rolloutd.proxy.render.messages import content_text

__all__ = ["RequestFieldError", "error_path"]

DIALECT = "openai_chat"


# --------------------------------------------------------------------------- wire models


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Wire):
    """``tool_calls[].function``: ``arguments`` is a JSON string (objects are accepted)."""

    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Wire):
    """An assistant message's tool call."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Wire):
    """One message of ``messages``."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Any] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(_Wire):
    """``tools[].function``."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDefinition(_Wire):
    """One entry of ``tools``."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class StreamOptions(_Wire):
    """``stream_options``."""

    include_usage: bool = False


class ChatCompletionRequest(_Wire):
    """``POST /v1/chat/completions`` body."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDefinition] | None = None
    tool_choice: Any = None
    temperature: float | None = Field(default=None, ge=0.0, le=5.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n


class ResponseMessage(_Wire):
    """``choices[].message`` (``reasoning_content`` as vLLM's reasoning parsers send it)."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class Choice(_Wire):
    """``choices[]`` of a response."""

    index: int = 0
    message: ResponseMessage
    finish_reason: str
    logprobs: None = None


class UsageInfo(_Wire):
    """``usage``."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionResponse(_Wire):
    """The ``chat.completion`` object."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: UsageInfo


class ChunkChoice(_Wire):
    """``choices[]`` of a chunk."""

    index: int = 0
    delta: dict[str, Any]
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(_Wire):
    """The ``chat.completion.chunk`` object."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageInfo | None = None


# --------------------------------------------------------------------------- translation


def parse_request(body: Any) -> ChatCompletionRequest:
    """Validate a parsed JSON body.

    Raises:
        RequestFieldError: the body is not an object, or a field is invalid (``param`` names
            the first invalid field).
    """
    return validate(ChatCompletionRequest, body)


def parse(body: Any, *, memo: RequestMemo | None = None) -> InternalRequest:
    """Validate and translate a parsed JSON body.

    Pure without ``memo``. With the session's ``memo``, the messages the session's last call
    sent (the same JSON values, at the start of ``messages``) are not validated and translated
    again: their translation is reused, and the result is the one without ``memo`` (a call's
    cost must not grow with the conversation).

    Raises:
        InvalidRequestError: invalid fields or a content part that is not text.
    """
    if memo is None:
        return to_internal(parse_request(body), body)
    raw = body.get("messages") if isinstance(body, dict) else None
    known, known_messages, _ = memo.known_prefix(DIALECT, None, raw)
    wire: ChatCompletionRequest | None = None
    if known:
        wire, start = validate_new_items(body, "messages", known, parse_request)
        if wire is not None:
            messages = [
                *known_messages,
                *(_message_to_internal(m) for m in wire.messages[known - start :]),
            ]
    if wire is None:
        wire = parse_request(body)
        messages = [_message_to_internal(m) for m in wire.messages]
    request = to_internal(wire, body, messages=messages)
    memo.remember(DIALECT, None, raw, messages)
    return request


def _message_to_internal(message: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": content_text(message.content)}
    if message.role == "assistant" and message.content is None and message.tool_calls:
        out["content"] = None
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": call.function.arguments
                    if isinstance(call.function.arguments, str)
                    else json.dumps(call.function.arguments, ensure_ascii=False),
                },
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    reasoning = (message.model_extra or {}).get("reasoning_content")
    if message.role == "assistant" and isinstance(reasoning, str):
        out["reasoning_content"] = reasoning
    return out


def to_internal(
    request: ChatCompletionRequest,
    body: dict[str, Any],
    *,
    messages: list[dict[str, Any]] | None = None,
) -> InternalRequest:
    """Translate a validated request (pure).

    Args:
        request: the validated wire request.
        body: the raw JSON body (recorded and hashed as sent).
        messages: the translation of ``body``'s messages when the caller has it already
            (:func:`parse` with a memo); default: ``request.messages`` translated.

    Raises:
        InvalidRequestError: a content part is not text.
    """
    return InternalRequest(
        dialect=DIALECT,
        model=request.model,
        messages=messages
        if messages is not None
        else [_message_to_internal(m) for m in request.messages],
        tools=[t.model_dump(exclude_none=True) for t in request.tools or []],
        sampling=SamplingOverrides(
            temperature=request.temperature,
            top_p=request.top_p,
            max_tokens=request.max_completion_tokens or request.max_tokens,
        ),
        stream=request.stream,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        body=body,
    )


def _usage(response: InternalResponse) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=response.usage.prompt_tokens,
        completion_tokens=response.usage.completion_tokens,
        total_tokens=response.usage.total_tokens,
    )


def from_internal(response: InternalResponse) -> ChatCompletionResponse:
    """Translate an answer to the ``chat.completion`` object (pure)."""
    return ChatCompletionResponse(
        id=response.id,
        created=response.created,
        model=response.model,
        choices=[
            Choice(
                message=ResponseMessage(
                    content=response.content,
                    reasoning_content=response.reasoning,
                    tool_calls=response.tool_calls or None,
                ),
                finish_reason=response.finish_reason,
            )
        ],
        usage=_usage(response),
    )


def response_json(
    response: InternalResponse, request: InternalRequest | None = None
) -> dict[str, Any]:
    """The ``chat.completion`` JSON of an answer: ``message.tool_calls`` and
    ``message.reasoning_content`` only when present."""
    body = from_internal(response).model_dump(mode="json")
    for choice in body["choices"]:
        for key in ("tool_calls", "reasoning_content"):
            if choice["message"].get(key) is None:
                choice["message"].pop(key, None)
    return body


def request_from_internal(request: InternalRequest) -> dict[str, Any]:
    """The Chat Completions body that carries ``request`` (the inverse of :func:`parse`;
    property tests use it): :func:`rolloutd.proxy.core.call_types.chat_body`, which
    passthrough backends are sent."""
    return chat_body(request)


def response_to_internal(body: dict[str, Any]) -> InternalResponse:
    """A ``chat.completion`` JSON back to the internal answer (round-trip tests; passthrough).

    Raises:
        InvalidRequestError: the object is not a chat completion.
    """
    response = validate(ChatCompletionResponse, body)
    if len(response.choices) != 1:
        raise RequestFieldError("a chat completion with exactly one choice is expected")
    choice = response.choices[0]
    return InternalResponse(
        id=response.id,
        created=response.created,
        model=response.model,
        text=choice.message.content or "",
        content=choice.message.content,
        reasoning=choice.message.reasoning_content,
        tool_calls=choice.message.tool_calls or [],
        finish_reason=choice.finish_reason,  # type: ignore[arg-type]
        usage=Usage(
            prompt_tokens=response.usage.prompt_tokens,
            completion_tokens=response.usage.completion_tokens,
        ),
    )


class ChunkStream:
    """Turns the events of one answer into ``chat.completion.chunk`` objects (pure).

    Args:
        start: the stream's first event (id, created, model of every chunk).
        include_usage: send the final usage chunk (``stream_options.include_usage``).
    """

    def __init__(self, start: StreamStart, *, include_usage: bool) -> None:
        self.start = start
        self.include_usage = include_usage

    def _chunk(
        self, delta: dict[str, Any], finish_reason: str | None = None
    ) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.start.id,
            created=self.start.created,
            model=self.start.model,
            choices=[ChunkChoice(delta=delta, finish_reason=finish_reason)],
        )

    def chunks(self, event: StreamEvent) -> list[ChatCompletionChunk]:
        """The chunks of ``event``.

        :class:`StreamStart` gives the role chunk; :class:`StreamContent` a content delta;
        :class:`StreamEnd` the content not streamed yet, the tool calls (each whole, with its
        ``index``), the chunk with ``finish_reason``, and the usage chunk when asked for.
        """
        if isinstance(event, StreamStart):
            return [self._chunk({"role": "assistant", "content": ""})]
        if isinstance(event, StreamContent):
            return [self._chunk({"content": event.text})] if event.text else []
        if isinstance(event, StreamReasoning):
            return [self._chunk({"reasoning_content": event.text})] if event.text else []
        response = event.response
        out = []
        if event.reasoning_tail:
            out.append(self._chunk({"reasoning_content": event.reasoning_tail}))
        if event.content_tail:
            out.append(self._chunk({"content": event.content_tail}))
        if response.tool_calls:
            out.append(
                self._chunk(
                    {
                        "tool_calls": [
                            {"index": i, **call} for i, call in enumerate(response.tool_calls)
                        ]
                    }
                )
            )
        out.append(self._chunk({}, response.finish_reason))
        if self.include_usage:
            out.append(
                ChatCompletionChunk(
                    id=self.start.id,
                    created=self.start.created,
                    model=self.start.model,
                    choices=[],
                    usage=_usage(response),
                )
            )
        return out


class Encoder:
    """SSE bytes of one answer: ``data: {chunk}`` per chunk, then ``data: [DONE]``."""

    def __init__(self, start: StreamStart, request: InternalRequest) -> None:
        self.chunks = ChunkStream(start, include_usage=request.include_usage)

    def encode(self, event: StreamEvent) -> list[bytes]:
        """Bytes of the chunks of ``event``."""
        return [sse_data(chunk) for chunk in self.chunks.chunks(event)]

    def close(self) -> list[bytes]:
        """``data: [DONE]``."""
        return [sse_data("[DONE]")]

    def error(self, error: RolloutdError) -> list[bytes]:
        """An OpenAI error object as the last event."""
        return [sse_data(error_body(error)[1])]


def encoder(start: StreamStart, request: InternalRequest) -> Encoder:
    """The stream encoder of one answer."""
    return Encoder(start, request)


def collect_stream(events: list[dict[str, Any]]) -> InternalResponse:
    """Rebuild the answer from parsed ``chat.completion.chunk`` objects (tests, passthrough).

    Args:
        events: the chunks in order, ``[DONE]`` excluded.
    """
    first = events[0]
    content, reasoning, calls, finish, usage = (
        "",
        "",
        [],
        "stop",
        Usage(prompt_tokens=0, completion_tokens=0),
    )
    for chunk in events:
        if chunk.get("usage"):
            usage = Usage(
                prompt_tokens=chunk["usage"]["prompt_tokens"],
                completion_tokens=chunk["usage"]["completion_tokens"],
            )
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                calls.append({k: v for k, v in call.items() if k != "index"})
            finish = choice.get("finish_reason") or finish
    return InternalResponse(
        id=first["id"],
        created=first["created"],
        model=first["model"],
        text=content,
        content=content or (None if calls else ""),
        reasoning=reasoning or None,
        tool_calls=calls,
        finish_reason=finish,
        usage=usage,
    )  # type: ignore[arg-type]


def model_json(model: str) -> dict[str, Any]:
    """``GET /v1/models/{model}``: the OpenAI ``Model`` object."""
    return {"id": model, "object": "model", "created": 0, "owned_by": "rolloutd"}


def models_list(model: str) -> dict[str, Any]:
    """``GET /v1/models``: the one model a session serves."""
    return {"object": "list", "data": [model_json(model)]}


# --------------------------------------------------------------------------- errors


def _code(error: RolloutdError) -> str | None:
    if isinstance(error, ContextLengthError):
        return "context_length_exceeded"
    if isinstance(error, AuthenticationError):
        return "invalid_api_key"
    if isinstance(error, NotFoundError):
        return "not_found"
    if isinstance(error, BackendUnavailableError):
        return "backend_unavailable"
    if isinstance(error, BackendError):
        return "backend_error"
    return None


def error_body(error: RolloutdError) -> tuple[int, dict[str, Any]]:
    """The HTTP status and OpenAI error object of ``error``.

    Returns:
        ``(status, {"error": {"message", "type", "param", "code"}})``.
    """
    return error.status_code, {
        "error": {
            "message": error.message,
            "type": error.error_type,
            "param": getattr(error, "param", None),
            "code": _code(error),
        }
    }


def sse(payload: BaseModel | dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: {json}\\n\\n`` (or ``data: [DONE]\\n\\n``)."""
    return sse_data(payload)
