"""The per-session request memo (a call's cost must not grow with the conversation): a
memoised parse and retry hash give exactly what
the plain ones give, over random conversation growth, edits and retries.

Properties: for any sequence of requests of one session (append messages, resend the same
request, edit or drop earlier messages, change fields around ``messages``, send an invalid
message), ``parse(body, memo=memo)`` equals ``parse(body)`` (or raises the same error), and
``memo.request_hash(body)`` equals
:func:`rolloutd.proxy.core.request_identity.request_hash`. And
:func:`rolloutd.proxy.core.fastjson.dumps` writes what the standard library writes.
"""

from __future__ import annotations

import copy
import json
from types import ModuleType
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rolloutd.errors import InvalidRequestError
from rolloutd.proxy.core import fastjson
from rolloutd.proxy.core.fastjson import BodyReader
from rolloutd.proxy.core.request_identity import RequestMemo, request_hash
from rolloutd.proxy.dialects import anthropic, gemini, openai_chat, openai_responses

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=8)
names = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True)
# 1, 1.0 and True are == in Python but not in JSON: a memo comparing with == would reuse a
# translation whose arguments were serialised from another type
scalars = st.sampled_from([0, 1, 1.0, True, False, None, -0.0, 0.0]) | text
arguments = st.dictionaries(names, scalars | st.lists(scalars, max_size=2), max_size=2)


@st.composite
def chat_messages(draw: Any, index: int) -> dict[str, Any]:
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))
    message: dict[str, Any] = {"role": role}
    content = draw(
        st.one_of(
            text,
            st.none(),
            st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2),
        )
    )
    if content is not None or draw(st.booleans()):
        message["content"] = content
    if role == "assistant" and draw(st.booleans()):
        message["tool_calls"] = [
            {
                "id": f"call_{index}_{j}",
                "type": "function",
                "function": {
                    "name": draw(names),
                    "arguments": draw(arguments | arguments.map(json.dumps)),
                },
            }
            for j in range(draw(st.integers(1, 2)))
        ]
        if draw(st.booleans()):
            message["reasoning_content"] = draw(text)
    if role == "tool":
        message["tool_call_id"] = f"call_{index}"
    if draw(st.booleans()):
        message["name"] = draw(names)
    if draw(st.integers(0, 9)) == 0:
        message["x_extra"] = draw(scalars)
    if draw(st.integers(0, 19)) == 0:  # invalid: a wrong role, or an image part
        message.update(
            draw(
                st.sampled_from(
                    [
                        {"role": "robot"},
                        {"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]},
                    ]
                )
            )
        )
    return message


@st.composite
def anthropic_messages(draw: Any, index: int) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "assistant", "system"]))
    if draw(st.booleans()):
        return {"role": role, "content": draw(text)}
    blocks: list[dict[str, Any]] = [{"type": "text", "text": draw(text)}]
    if role == "assistant" and draw(st.booleans()):
        blocks.append(
            {
                "type": "tool_use",
                "id": f"toolu_{index}",
                "name": draw(names),
                "input": draw(arguments),
            }
        )
        if draw(st.booleans()):
            blocks.insert(0, {"type": "thinking", "thinking": draw(text)})
    if role == "user" and draw(st.booleans()):
        blocks.insert(
            0,
            {
                "type": "tool_result",
                "tool_use_id": f"toolu_{index - 1}",
                "content": draw(
                    text
                    | st.lists(
                        st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2
                    )
                ),
            },
        )
    if draw(st.integers(0, 19)) == 0:  # invalid: an unsupported block
        blocks.append({"type": "server_thing"})
    return {"role": role, "content": blocks}


@st.composite
def responses_items(draw: Any, index: int) -> dict[str, Any]:
    kind = draw(
        st.sampled_from(
            [
                "message",
                "message",
                "reasoning",
                "function_call",
                "function_call_output",
                "custom_tool_call",
            ]
        )
    )
    if kind == "message":
        item: dict[str, Any] = {
            "role": draw(st.sampled_from(["user", "assistant", "developer", "system"])),
            "content": draw(
                text
                | st.lists(
                    st.fixed_dictionaries({"type": st.just("input_text"), "text": text}), max_size=2
                )
            ),
        }
        if draw(st.booleans()):
            item["type"] = "message"
    elif kind == "reasoning":
        item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": draw(text)}]}
    elif kind == "function_call":
        item = {
            "type": "function_call",
            "call_id": f"call_{index}",
            "name": draw(names),
            "arguments": json.dumps(draw(arguments)),
        }
    elif kind == "custom_tool_call":
        item = {
            "type": "custom_tool_call",
            "call_id": f"call_{index}",
            "name": draw(names),
            "input": draw(text),
        }
    else:
        item = {
            "type": "function_call_output",
            "call_id": f"call_{index - 1}",
            "output": draw(text),
        }
    if draw(st.integers(0, 19)) == 0:  # invalid: an unknown item type
        item["type"] = "web_search_call"
    return item


@st.composite
def gemini_contents(draw: Any, index: int) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "model", "function", None]))
    parts: list[dict[str, Any]] = [{"text": draw(text)}]
    if role == "model":
        if draw(st.booleans()):
            parts.insert(0, {"text": draw(text), "thought": True})
        for j in range(draw(st.integers(0, 2))):
            call = {"name": draw(names), "args": draw(arguments)}
            if draw(st.booleans()):
                call["id"] = f"call_{index}_{j}"
            parts.append({draw(st.sampled_from(["functionCall", "function_call"])): call})
    elif draw(st.booleans()):
        response = {"name": draw(names), "response": draw(arguments)}
        if draw(st.booleans()):
            response["id"] = f"call_{index - 1}_0"
        parts.insert(0, {"functionResponse": response})
    content: dict[str, Any] = {"parts": parts}
    if role is not None:
        content["role"] = role
    if draw(st.integers(0, 19)) == 0:  # invalid: an unsupported part
        parts.append({"executableCode": {}})
    return content


@st.composite
def growth(
    draw: Any, message: Any, other_fields: Any, conversation: str = "messages"
) -> list[dict[str, Any]]:
    """The bodies of one session's calls: each appends, resends, edits or truncates."""
    bodies: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = [draw(message(0))]
    fields = draw(other_fields)
    for step in range(draw(st.integers(1, 8))):
        action = draw(
            st.sampled_from(["append", "append", "append", "same", "edit", "truncate", "fields"])
        )
        if action == "append":
            messages += [draw(message(len(messages) + k)) for k in range(draw(st.integers(1, 3)))]
        elif action == "edit":
            messages[draw(st.integers(0, len(messages) - 1))] = draw(message(step))
        elif action == "truncate" and len(messages) > 1:
            messages = messages[: draw(st.integers(1, len(messages) - 1))]
        elif action == "fields":
            fields = draw(other_fields)
        # each call's body is a new JSON value, as read from the wire
        bodies.append(copy.deepcopy({**fields, conversation: messages}))
    return bodies


chat_fields = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={
        "max_tokens": st.sampled_from([1, 16, 0]),  # 0 is invalid
        "temperature": st.sampled_from([0.5, 1, True]),
        "stream": st.booleans(),
        "aaa": scalars,
        "zzz": scalars,
        "tools": st.just([{"type": "function", "function": {"name": "f"}}]),
    },
)
anthropic_fields = st.fixed_dictionaries(
    {"max_tokens": st.sampled_from([16, 0])},
    optional={
        "system": st.sampled_from(
            ["be brief", "", [{"type": "text", "text": "hi"}], [{"type": "image"}]]
        ),
        "model": st.just("claude"),
        "stream": st.booleans(),
        "aaa": scalars,
    },
)

responses_fields = st.fixed_dictionaries(
    {"model": st.just("m")},
    optional={
        "instructions": st.sampled_from(["be brief", "", 1]),  # 1 is invalid
        "max_output_tokens": st.sampled_from([16, 0]),
        "stream": st.booleans(),
        "aaa": scalars,
        "tools": st.just([{"type": "function", "name": "f"}]),
    },
)
gemini_fields = st.fixed_dictionaries(
    {},
    optional={
        "systemInstruction": st.sampled_from(
            [
                {"parts": [{"text": "be brief"}]},
                {"parts": [{"text": 1}]},
                {"parts": [{"text": True}]},
                {"parts": []},
            ]
        ),
        "system_instruction": st.just({"parts": [{"text": "snake"}]}),
        "generationConfig": st.sampled_from([{"temperature": 0.5}, {"candidateCount": 2}]),
        "aaa": scalars,
    },
)


def _outcome(
    dialect: ModuleType,
    body: dict[str, Any],
    memo: RequestMemo | None,
    made: list[tuple[Any, Any]] | None = None,
) -> tuple[str, Any]:
    try:
        request = dialect.parse(body, memo=memo) if memo is not None else dialect.parse(body)
    except InvalidRequestError as e:
        return "error", (type(e).__name__, e.message, getattr(e, "param", None))
    dump = request.model_dump(mode="json")
    if made is not None:
        made.append((request, dump))
    return "ok", dump


def _assert_memo_equals_plain(
    dialect: ModuleType,
    body: dict[str, Any],
    memo: RequestMemo,
    made: list[tuple[Any, Any]] | None = None,
) -> None:
    """The memoised parse (and hash, when it parses) of ``body`` equals the plain one."""
    plain = _outcome(dialect, copy.deepcopy(body), None)
    assert _outcome(dialect, body, memo, made) == plain
    if plain[0] == "ok":
        assert memo.request_hash(body, dialect.DIALECT) == request_hash(body, dialect.DIALECT)


def every_dialect_and_wire(test: Any) -> Any:
    """``test`` for each dialect (its message and field strategies, its conversation's key)
    and each wire (``copies``, ``body_reader``)."""
    test = pytest.mark.parametrize("wire", ["copies", "body_reader"])(test)
    return pytest.mark.parametrize(
        ("dialect", "message", "fields", "conversation"),
        [
            (openai_chat, chat_messages, chat_fields, "messages"),
            (anthropic, anthropic_messages, anthropic_fields, "messages"),
            (openai_responses, responses_items, responses_fields, "input"),
            (gemini, gemini_contents, gemini_fields, "contents"),
        ],
        ids=["openai_chat", "anthropic", "openai_responses", "gemini"],
    )(test)


@every_dialect_and_wire
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_memoised_parse_and_hash_equal_the_plain_ones(
    dialect: ModuleType, message: Any, fields: Any, conversation: str, wire: str, data: Any
) -> None:
    """``copies``: each body is new objects (the memo compares fingerprints);
    ``body_reader``: each body is read as the gateway reads it, sharing the objects of what
    it resends with the last body (the memo compares objects)."""
    bodies = data.draw(growth(message, fields, conversation))
    reader = BodyReader()
    memo = RequestMemo(reader=reader) if wire == "body_reader" else RequestMemo()
    made: list[tuple[Any, Any]] = []
    read: list[tuple[bytes, Any]] = []
    for body in bodies:
        if wire == "body_reader":
            data_ = json.dumps(body).encode()
            body = reader.loads(data_)
            read.append((data_, body))
        _assert_memo_equals_plain(dialect, body, memo, made)
    # later calls did not change what earlier ones returned (they are recorded as returned)
    assert [request.model_dump(mode="json") for request, _ in made] == [d for _, d in made]
    # nor the bodies they read (the reader and the memo share their objects)
    assert all(repr(body) == repr(json.loads(data_)) for data_, body in read)


@every_dialect_and_wire
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_interleaved_conversations_give_the_plain_results(
    dialect: ModuleType, message: Any, fields: Any, conversation: str, wire: str, data: Any
) -> None:
    """Sub-agents of one session alternate between up to five conversations (one more than
    the memo keeps): every memoised parse and hash still equals the plain one."""
    streams = [
        data.draw(growth(message, fields, conversation))
        for _ in range(data.draw(st.integers(2, 5)))
    ]
    order = data.draw(st.permutations([i for i, bodies in enumerate(streams) for _ in bodies]))
    reader = BodyReader()
    memo = RequestMemo(reader=reader) if wire == "body_reader" else RequestMemo()
    for i in order:
        body = streams[i].pop(0)
        if wire == "body_reader":
            body = reader.loads(json.dumps(body).encode())
        _assert_memo_equals_plain(dialect, body, memo)


def test_a_resent_message_of_another_json_type_is_translated_again() -> None:
    memo = RequestMemo()
    first = {
        "messages": [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c",
                        "type": "function",
                        "function": {"name": "f", "arguments": {"a": 1}},
                    }
                ],
            }
        ]
    }
    second = copy.deepcopy(first)
    second["messages"][0]["tool_calls"][0]["function"]["arguments"] = {"a": True}
    second["messages"].append({"role": "tool", "tool_call_id": "c", "content": "ok"})
    openai_chat.parse(first, memo=memo)
    assert memo.request_hash(first) == request_hash(first)
    request = openai_chat.parse(second, memo=memo)
    assert request.messages[0]["tool_calls"][0]["function"]["arguments"] == '{"a": true}'
    assert memo.request_hash(second) == request_hash(second) != request_hash(first)


@pytest.mark.parametrize(
    ("dialect", "volatile"),
    [
        ("anthropic", {"metadata": {"user_id": "user_1_account__session_9", "tag": "x"}}),
        ("openai_responses", {"prompt_cache_key": "019a-conversation"}),
        ("openai_chat", {"prompt_cache_key": "k2"}),
    ],
)
def test_a_request_s_identity_leaves_out_its_dialect_s_volatile_fields(
    dialect: str, volatile: dict[str, Any]
) -> None:
    """The identity (the retry rule's, and a replay's key) is the canonical body with
    ``stream``, minus a few per-process fields of the dialect; never messages or sampling."""
    base = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "metadata": {"user_id": "user_0", "tag": "x"},
        "prompt_cache_key": "k1",
    }
    other = {**copy.deepcopy(base), **volatile}
    before = copy.deepcopy(other)
    assert request_hash(other, dialect) == request_hash(base, dialect)
    assert RequestMemo().request_hash(other, dialect) == request_hash(base, dialect)
    assert other == before  # the body itself is untouched
    assert request_hash(other) != request_hash(base)  # the whole body tells them apart
    for change in (
        {"stream": True},
        {"temperature": 0.5},
        {"metadata": {"user_id": "u", "tag": "y"}},
        {"messages": [{"role": "user", "content": "ho"}]},
    ):
        assert request_hash({**base, **change}, dialect) != request_hash(base, dialect)


def test_codex_s_per_process_ids_are_out_of_a_responses_request_s_identity() -> None:
    """Codex sends per-process ids in ``client_metadata`` and on each message and tool output
    item it builds (seen in benchmarks/replay_coverage.py: a second process of the same task
    differed only there); the ids of items the gateway answered with, an item reference's id
    and every item's content count."""

    def body(process: str, call_id: str = "fc_1", text: str = "run it") -> dict[str, Any]:
        return {
            "model": "m",
            "stream": True,
            "prompt_cache_key": process,
            "client_metadata": {"session_id": process, "turn_id": process + "-t"},
            "input": [
                {
                    "type": "message",
                    "role": "developer",
                    "id": f"msg_{process}_0",
                    "content": [{"type": "input_text", "text": "be brief"}],
                },
                {"role": "user", "id": f"msg_{process}_1", "content": text},
                {
                    "type": "function_call",
                    "id": call_id,
                    "call_id": "call_1",
                    "name": "shell",
                    "arguments": "{}",
                },
                {
                    "type": "function_call_output",
                    "id": f"fco_{process}",
                    "call_id": "call_1",
                    "output": "ok",
                },
                {"type": "item_reference", "id": "rs_1"},
            ],
        }

    first, second = body("p1"), body("p2")
    before = copy.deepcopy(second)
    assert request_hash(first, "openai_responses") == request_hash(second, "openai_responses")
    assert RequestMemo().request_hash(second, "openai_responses") == request_hash(
        first, "openai_responses"
    )
    assert second == before  # the body itself is untouched
    assert request_hash(first) != request_hash(second)
    referenced = body("p2")
    referenced["input"][-1]["id"] = "rs_2"
    for other in (body("p2", call_id="fc_2"), body("p2", text="run that"), referenced):
        assert request_hash(other, "openai_responses") != request_hash(first, "openai_responses")


def test_an_error_in_a_new_message_names_its_index_in_the_body() -> None:
    memo = RequestMemo()
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    anthropic.parse(body, memo=memo)
    grown = copy.deepcopy(body)
    grown["messages"] += [
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "server_thing"}]},
    ]
    with pytest.raises(InvalidRequestError) as error:
        anthropic.parse(grown, memo=memo)
    assert error.value.param == "messages.2.content.0.type"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | text
    | st.floats(allow_nan=True, allow_infinity=True),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values)
@example(value=[1, {"a": [None, float("inf")]}])  # an infinity beside a None, deep down
@example(value={"content": None, "x": -float("inf")})
@example(value=[None, float("nan")])
@example(value=(1, [2.5, None]))
@example(value=(None, {"a": float("nan")}))  # a tuple (orjson writes it as a list)
def test_fast_json_writes_the_standard_librarys_values_and_errors(value: Any) -> None:
    try:
        expected = json.dumps(
            value, ensure_ascii=False, separators=(",", ":"), allow_nan=False
        ).encode()
    except ValueError:
        with pytest.raises(ValueError):
            fastjson.dumps(value)
        return
    assert repr(json.loads(fastjson.dumps(value))) == repr(json.loads(expected))


def test_gemini_memo_tells_the_order_of_both_system_instruction_spellings() -> None:
    """With both ``systemInstruction`` and ``system_instruction``, the later one in the body
    wins validation; swapping their order must not reuse the earlier translation (found by
    the property test above)."""
    brief, snake = {"parts": [{"text": "be brief"}]}, {"parts": [{"text": "snake"}]}
    contents = [{"role": "user", "parts": [{"text": "hi"}]}]
    memo = RequestMemo()
    for body in (
        {"systemInstruction": brief, "system_instruction": snake, "contents": contents},
        {"system_instruction": snake, "systemInstruction": brief, "contents": contents},
    ):
        plain = gemini.parse(copy.deepcopy(body))
        assert gemini.parse(body, memo=memo).messages == plain.messages


_JSON_TEXT_SPICE = st.sampled_from(
    [
        "NaN",
        "-Infinity",
        '"\\ud800"',
        '"\\ud83d\\ude00"',
        "18446744073709551616",
        "-9223372036854775809",
        "1e400",
        "-0",
        "1.0",
        "[1,]",
        '{"a":1,"a":2}',
        "\ufeff{}",
        "\xff",
        "",
        "tru",
        " [ 1 , 2 ] ",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    data=st.one_of(
        json_values.map(lambda v: json.dumps(v, ensure_ascii=False).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.lists(_JSON_TEXT_SPICE, max_size=3).map(
            lambda parts: ("[" + ",".join(parts) + "]").encode("utf-8", "surrogatepass")
        ),
        _JSON_TEXT_SPICE.map(lambda part: part.encode("utf-8", "surrogatepass")),
        st.binary(max_size=12),
    )
)
def test_fast_json_reads_the_standard_librarys_values_and_errors(data: bytes) -> None:
    """Request bodies are read through orjson when it would read them exactly as
    :func:`json.loads` does (integers beyond 64 bits, NaN, lone surrogates and bad bytes go to
    the standard library): the same values, types included, and the same errors."""
    try:
        expected = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        with pytest.raises(type(e)):
            fastjson.loads(data)
        return
    assert repr(fastjson.loads(data)) == repr(expected)


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["continue", "continue-older", "continue-a-copy", "fresh", "same"]),
            st.lists(st.one_of(st.integers(0, 200_000), st.integers(2**63, 2**70)), max_size=12),
        ),
        max_size=14,
    )
)
def test_list_json_writes_what_dumps_writes(steps: list[tuple[str, list[int]]]) -> None:
    """A session's prompts, each continuing the last one written, an older one, a copy of
    the last (not the list written: it cannot be trusted to match the text held), or none:
    every text is the standard library's."""
    writer = fastjson.ListJson()
    written: list[list[int]] = []
    for kind, new in steps:
        base: list[int] | None = None
        if kind == "continue" and written:
            base = written[-1]
        elif kind == "continue-older" and written:
            base = written[0]
        elif kind == "continue-a-copy" and written:
            base = list(written[-1])
        elif kind == "same" and written:
            base, new = written[-1], []
        items = [*(base or ()), *new]
        text = writer.dumps(items, base)
        assert text == json.dumps(items, separators=(",", ":")).encode()
        written.append(items)
