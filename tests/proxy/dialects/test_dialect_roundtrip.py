"""Property tests of every dialect's translators (pure functions, no app).

For each dialect: internal request -> dialect body -> internal request is lossless on the
fields the dialect carries; internal answer -> dialect JSON -> internal answer likewise; and a
streamed answer (any split of its text into deltas) carries the same content as the
non-streamed one.

Wire shapes: OpenAI Chat https://platform.openai.com/docs/api-reference/chat ;
OpenAI Responses https://platform.openai.com/docs/api-reference/responses and
https://platform.openai.com/docs/api-reference/responses-streaming ;
Anthropic https://docs.anthropic.com/en/api/messages and
https://docs.anthropic.com/en/docs/build-with-claude/streaming ;
Gemini https://ai.google.dev/api/generate-content .
"""

from __future__ import annotations

import itertools
import json
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rolloutd.proxy.core.call_types import (
    InternalRequest,
    InternalResponse,
    SamplingOverrides,
    StreamContent,
    StreamEnd,
    StreamReasoning,
    StreamStart,
    Usage,
)
from rolloutd.proxy.dialects import anthropic, gemini, openai_chat, openai_responses

DIALECTS = [openai_chat, openai_responses, anthropic, gemini]

text = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=12
)
names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
arguments = st.dictionaries(names, st.integers(-5, 5) | text | st.booleans(), max_size=3)


@st.composite
def tool_calls(draw: Any, prefix: str) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{prefix}_{j}",
            "type": "function",
            "function": {"name": draw(names), "arguments": json.dumps(draw(arguments))},
        }
        for j in range(draw(st.integers(0, 2)))
    ]


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(text)})
    for turn in range(draw(st.integers(1, 3))):
        messages.append({"role": "user", "content": draw(text)})
        calls = draw(tool_calls(str(turn)))
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": draw(st.none() | text) if calls else draw(text),
        }
        if draw(st.booleans()):
            assistant["reasoning_content"] = draw(text)
        if calls:
            assistant["tool_calls"] = calls
        messages.append(assistant)
        messages += [
            {
                "role": "tool",
                "tool_call_id": c["id"],
                "name": c["function"]["name"],
                "content": draw(text),
            }
            for c in calls
        ]
    messages.append({"role": "user", "content": draw(text)})
    return messages


tools = st.lists(
    st.builds(
        lambda name, description, props: {
            "type": "function",
            "function": {
                "name": name,
                **({"description": description} if description else {}),
                "parameters": {
                    "type": "object",
                    "properties": {p: {"type": "string"} for p in props},
                },
            },
        },
        names,
        st.none() | text,
        st.lists(names, max_size=2),
    ),
    max_size=2,
    unique_by=lambda t: t["function"]["name"],
)


@st.composite
def requests(draw: Any) -> InternalRequest:
    return InternalRequest(
        messages=draw(conversations()),
        tools=draw(tools),
        stream=draw(st.booleans()),
        sampling=SamplingOverrides(
            temperature=draw(st.none() | st.sampled_from([0.0, 0.25, 0.7, 1.0])),
            top_p=draw(st.none() | st.sampled_from([0.5, 0.95, 1.0])),
            max_tokens=draw(st.integers(1, 4096)),
        ),
    )


@st.composite
def responses(draw: Any) -> InternalResponse:
    calls = draw(tool_calls("r"))
    content = draw(st.none() | text) if calls else draw(st.just("") | text)
    finish = "tool_calls" if calls else draw(st.sampled_from(["stop", "length"]))
    return InternalResponse(
        id="chatcmpl-" + draw(st.from_regex(r"[0-9a-f]{24}", fullmatch=True)),
        created=1,
        model="m",
        text=content or "",
        content=content,
        tool_calls=calls,
        reasoning=draw(st.none() | text),
        finish_reason=finish,
        usage=Usage(
            prompt_tokens=draw(st.integers(0, 99)), completion_tokens=draw(st.integers(0, 99))
        ),
    )


def normal_messages(messages: list[dict[str, Any]], dialect: ModuleType) -> list[Any]:
    """Messages as the dialect carries them: arguments compared as objects; a tool message's
    name only where the dialect has one (Chat, Gemini)."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": json.loads(c["function"]["arguments"]),
                }
                for c in m["tool_calls"]
            ]
        if m["role"] == "tool" and dialect in (openai_responses, anthropic):
            m.pop("name", None)
        out.append(m)
    return out


def parse(dialect: ModuleType, body: dict[str, Any], stream: bool) -> InternalRequest:
    if dialect is gemini:
        return gemini.parse(body, model="m", stream=stream)
    return dialect.parse(body)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.DIALECT)
@settings(max_examples=150, deadline=None)
@given(request=requests())
def test_request_round_trip_is_lossless(dialect: ModuleType, request: InternalRequest) -> None:
    body = json.loads(json.dumps(dialect.request_from_internal(request)))
    back = parse(dialect, body, request.stream)
    assert back.dialect == dialect.DIALECT
    assert normal_messages(back.messages, dialect) == normal_messages(request.messages, dialect)
    assert back.tools == request.tools
    assert back.sampling == request.sampling
    assert back.stream == request.stream
    assert back.body == body


def answer_fields(response: InternalResponse) -> dict[str, Any]:
    return {
        "content": response.content,
        "reasoning": response.reasoning,
        "finish_reason": response.finish_reason,
        "usage": response.usage,
        "tool_calls": [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in response.tool_calls
        ],
    }


def carried(response: InternalResponse) -> dict[str, Any]:
    return answer_fields(response)


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.DIALECT)
@settings(max_examples=150, deadline=None)
@given(response=responses())
def test_response_round_trip_is_lossless(dialect: ModuleType, response: InternalResponse) -> None:
    request = InternalRequest(dialect=dialect.DIALECT, messages=[{"role": "user", "content": "x"}])
    body = json.loads(json.dumps(dialect.response_json(response, request)))
    assert answer_fields(dialect.response_to_internal(body)) == carried(response)


def split(value: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(value) + 1) for c in cuts} | {0, len(value)})
    return [value[a:b] for a, b in itertools.pairwise(points) if value[a:b]]


def parse_sse(raw: bytes, dialect: ModuleType) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE stream; a named event's ``event:`` must match its type."""
    events = []
    for block in raw.decode().split("\n\n")[:-1]:
        lines = block.split("\n")
        data = lines[-1].removeprefix("data: ")
        if data == "[DONE]":
            continue
        payload = json.loads(data)
        if lines[0].startswith("event: "):
            assert lines[0] == f"event: {payload['type']}"
        else:
            assert dialect in (openai_chat, gemini), block
        events.append(payload)
    return events


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.DIALECT)
@settings(max_examples=150, deadline=None)
@given(response=responses(), cuts=st.lists(st.integers(0, 50), max_size=4), tail=st.integers(0, 50))
def test_streamed_answer_equals_the_plain_one(
    dialect: ModuleType, response: InternalResponse, cuts: list[int], tail: int
) -> None:
    request = InternalRequest(
        dialect=dialect.DIALECT,
        messages=[{"role": "user", "content": "x"}],
        stream=True,
        include_usage=True,
    )
    start = StreamStart(id=response.id, created=response.created, model=response.model)
    reasoning, content = response.reasoning or "", response.content or ""
    r_cut, c_cut = tail % (len(reasoning) + 1), tail % (len(content) + 1)
    events: list[Any] = [start]
    events += [StreamReasoning(p) for p in split(reasoning[:r_cut], cuts)]
    events += [StreamContent(p) for p in split(content[:c_cut], cuts)]
    events.append(
        StreamEnd(response=response, content_tail=content[c_cut:], reasoning_tail=reasoning[r_cut:])
    )
    encoder = dialect.encoder(start, request)
    raw = b"".join(b"".join(encoder.encode(e)) for e in events) + b"".join(encoder.close())
    streamed = dialect.collect_stream(parse_sse(raw, dialect))
    plain = dialect.response_to_internal(
        json.loads(json.dumps(dialect.response_json(response, request)))
    )
    assert answer_fields(streamed) == answer_fields(plain)


def test_gemini_json_array_stream_is_one_json_array() -> None:
    """Without ``alt=sse`` streamGenerateContent answers a JSON array of responses
    (https://ai.google.dev/api/generate-content#method:-models.streamgeneratecontent)."""
    response = InternalResponse(
        id="chatcmpl-ab",
        created=1,
        model="m",
        text="hi",
        content="hi",
        finish_reason="stop",
        usage=Usage(prompt_tokens=1, completion_tokens=1),
    )
    start = StreamStart(id=response.id, created=1, model="m")
    request = InternalRequest(messages=[{"role": "user", "content": "x"}], stream=True)
    encoder = gemini.encoder(start, request, sse=False)
    raw = b"".join(
        b"".join(encoder.encode(e)) for e in [start, StreamContent("h"), StreamEnd(response, "i")]
    ) + b"".join(encoder.close())
    chunks = json.loads(raw)
    assert gemini.collect_stream(chunks).content == "hi"
