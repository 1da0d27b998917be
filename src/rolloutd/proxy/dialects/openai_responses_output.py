"""OpenAI Responses: the ``response`` object of an answer and its output items (reasoning,
message, function calls), in one piece and as the stream's encoder builds them.

Reference: OpenAI API reference, "Responses", the response object
https://platform.openai.com/docs/api-reference/responses/object
"""

from __future__ import annotations

from typing import Any

from rolloutd.proxy.core.call_types import (
    InternalRequest,
    InternalResponse,
    StreamStart,
    Usage,
    id_suffix,
)


def answer_ids(response_id: str) -> tuple[str, str, str]:
    """The ``resp_``, ``msg_`` and ``rs_`` ids of an answer (stable on replay)."""
    suffix = id_suffix(response_id)
    return f"resp_{suffix}", f"msg_{suffix}", f"rs_{suffix}"


def wire_id(response: InternalResponse) -> str:
    """The ``resp_...`` id of an answer (stable: derived from the session and index)."""
    return answer_ids(response.id)[0]


def reasoning_item(rs_id: str, text: str) -> dict[str, Any]:
    """A ``reasoning`` output item with ``text`` as its one summary part."""
    return {"type": "reasoning", "id": rs_id, "summary": [{"type": "summary_text", "text": text}]}


def message_item(msg_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """An assistant ``message`` output item with ``text`` as its one ``output_text`` part."""
    return {
        "type": "message",
        "id": msg_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call_item(response_id: str, i: int, call: dict[str, Any]) -> dict[str, Any]:
    """The ``function_call`` output item of the ``i``-th tool call of an answer."""
    return {
        "type": "function_call",
        "id": f"fc_{id_suffix(response_id)}_{i}",
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": "completed",
    }


def has_message(response: InternalResponse) -> bool:
    """Whether an answer has a message item: content, or nothing else."""
    return bool(response.content) or not response.tool_calls


def output_items(response: InternalResponse) -> list[dict[str, Any]]:
    """The ``output`` items of an answer: reasoning, message, function calls, in that order.

    A message item is present when there is content, or when there is nothing else.
    """
    _, msg_id, rs_id = answer_ids(response.id)
    items = []
    if response.reasoning is not None:
        items.append(reasoning_item(rs_id, response.reasoning))
    if has_message(response):
        items.append(message_item(msg_id, response.content or ""))
    items += [call_item(response.id, i, c) for i, c in enumerate(response.tool_calls)]
    return items


def response_object(
    response: InternalResponse | None,
    start: StreamStart,
    request: InternalRequest,
    *,
    status: str,
    output: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ``response`` object of an answer (``response`` None: not finished yet, no usage)
    with ``status`` and ``output`` as given; the request's echoed fields from its body."""
    body = request.body
    usage = None
    if response is not None:
        usage = {
            "input_tokens": response.usage.prompt_tokens,
            # the SDK's types require both counts (openai 3.57, strict validation)
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": response.usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": response.usage.total_tokens,
        }
    return {
        "id": answer_ids(start.id)[0],
        "object": "response",
        "created_at": start.created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": start.model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "store": False,
        "text": {"format": {"type": "text"}},
        "usage": usage,
        "metadata": {},
    }


def response_json(response: InternalResponse, request: InternalRequest) -> dict[str, Any]:
    """The ``response`` object of a non-streamed answer (status ``incomplete`` when cut by
    ``max_output_tokens``)."""
    start = StreamStart(id=response.id, created=response.created, model=response.model)
    status = "incomplete" if response.finish_reason == "length" else "completed"
    return response_object(response, start, request, status=status, output=output_items(response))


def response_to_internal(body: dict[str, Any]) -> InternalResponse:
    """A ``response`` object back to the internal answer (round-trip tests)."""
    content, reasoning, calls = None, None, []
    for item in body["output"]:
        if item["type"] == "message":
            content = "".join(p["text"] for p in item["content"])
        elif item["type"] == "reasoning":
            reasoning = "".join(p["text"] for p in item["summary"])
        elif item["type"] == "function_call":
            calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            )
    if body["status"] == "incomplete":
        finish = "length"
    else:
        finish = "tool_calls" if calls else "stop"
    usage = body["usage"]
    return InternalResponse(
        id=body["id"],
        created=body["created_at"],
        model=body["model"],
        text=content or "",
        content=content if content or not calls else None,
        reasoning=reasoning,
        tool_calls=calls,
        finish_reason=finish,  # type: ignore[arg-type]
        usage=Usage(prompt_tokens=usage["input_tokens"], completion_tokens=usage["output_tokens"]),
    )
