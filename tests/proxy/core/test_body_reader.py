"""BodyReader (rolloutd.proxy.core.fastjson): a session's bodies read incrementally give exactly
what ``json.loads`` gives (values, types, key order, errors), whatever the previous body was."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rolloutd.proxy.core.fastjson import BodyReader, loads

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
messages = st.dictionaries(
    st.sampled_from(["role", "content", "tool_calls", "name", "x"]), values, min_size=1, max_size=4
)
items = st.one_of(messages, messages, values)  # mostly objects, sometimes any value


def exact(value: Any) -> Any:
    """Type-exact form of a JSON value (1, 1.0 and true differ; key order counts)."""
    if isinstance(value, dict):
        return ("dict", [(exact(k), exact(v)) for k, v in value.items()])
    if isinstance(value, list):
        return ("list", [exact(v) for v in value])
    return (type(value).__name__, repr(value))


def same_as_json_loads(reader: BodyReader, data: bytes) -> None:
    try:
        expected: Any = ("ok", exact(json.loads(data)))
    except (ValueError, RecursionError) as e:
        expected = ("error", type(e), str(e))
    try:
        got: Any = ("ok", exact(reader.loads(data)))
    except (ValueError, RecursionError) as e:
        got = ("error", type(e), str(e))
    assert got == expected, data


@st.composite
def bodies(draw: Any) -> list[bytes]:
    """A session's bodies: a conversation that grows, is edited or cut, sent with fields
    before and after it, in one of several serialisations (changing now and then)."""
    field = draw(st.sampled_from(["messages", "contents", "input"]))
    head = draw(
        st.dictionaries(st.sampled_from(["model", "system", "tools", field]), values, max_size=2)
    )
    tail = draw(
        st.dictionaries(
            st.sampled_from(["stream", "tools", "max_tokens", field]), values, max_size=2
        )
    )
    conversation: list[Any] = []
    styles = [{}, {"separators": (",", ":")}, {"indent": 1}, {"ensure_ascii": False}]
    style = draw(st.sampled_from(styles))
    out = []
    for _ in range(draw(st.integers(1, 6))):
        action = draw(st.sampled_from(["grow", "grow", "grow", "edit", "cut", "style"]))
        if action == "grow":
            conversation += draw(st.lists(items, min_size=1, max_size=3))
        elif action == "edit" and conversation:
            conversation[draw(st.integers(0, len(conversation) - 1))] = draw(items)
        elif action == "cut":
            del conversation[draw(st.integers(0, len(conversation))) :]
        else:
            style = draw(st.sampled_from(styles))
        conv_value = conversation if draw(st.integers(0, 9)) else draw(values)
        text = json.dumps(
            {
                **head,
                field: list(conv_value) if isinstance(conv_value, list) else conv_value,
                **tail,
            },
            **style,
        )
        if draw(st.integers(0, 9)) == 0:  # raw text variants: duplicates, garbage, cuts
            text = draw(
                st.sampled_from(
                    [
                        text[:-1] + f', "{field}": []}}' if text.endswith("}") else text,
                        text[: draw(st.integers(0, len(text)))],
                        text + " x",
                        " \n" + text + "\t",
                        text.replace("}", "}}", 1),
                    ]
                )
            )
        out.append(text.encode())
    return out


@settings(max_examples=400, deadline=None)
@given(bodies())
def test_incremental_reads_are_json_loads(session: list[bytes]) -> None:
    reader = BodyReader()
    read = []
    for data in session:
        same_as_json_loads(reader, data)
        with contextlib.suppress(ValueError):
            read.append((data, exact(reader.loads(data))))
    for data, value in read:  # reading later bodies changed none read before
        assert exact(json.loads(data)) == value


def test_a_growing_conversation_reuses_the_messages_it_resends() -> None:
    """Turn 3's body parses only its new messages: the resent ones are turn 2's objects."""
    reader = BodyReader()
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    first = reader.loads(json.dumps({"model": "m", "messages": conversation}).encode())
    conversation += [
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Sum 2 and 3"},
    ]
    second = reader.loads(
        json.dumps({"model": "m", "messages": conversation, "stream": True}).encode()
    )
    assert second == {"model": "m", "messages": conversation, "stream": True}
    assert all(a is b for a, b in zip(first["messages"], second["messages"], strict=False))
    assert second["messages"] is not first["messages"]  # a new list: the first is unchanged
    assert len(first["messages"]) == 2
    # a fresh conversation with the same system prompt keeps only that message
    third = reader.loads(
        json.dumps(
            {"model": "m", "messages": [conversation[0], {"role": "user", "content": "Other"}]}
        ).encode()
    )
    assert third["messages"][0] is first["messages"][0]
    assert third["messages"][1] == {"role": "user", "content": "Other"}


def test_a_number_is_not_reused_where_its_text_goes_on() -> None:
    """``[1`` then ``[12``: the same text up to the item, but another value."""
    reader = BodyReader()
    assert reader.loads(b'{"messages": [{"a": 1}, 1]}')["messages"] == [{"a": 1}, 1]
    assert reader.loads(b'{"messages": [{"a": 1}, 12]}')["messages"] == [{"a": 1}, 12]
    reader = BodyReader()
    reader.loads(b'{"messages": [{"a": 1}, 1, {"b": 2}]}')
    assert reader.loads(b'{"messages": [{"a": 1}, 12, {"b": 2}]}')["messages"] == [
        {"a": 1},
        12,
        {"b": 2},
    ]


def test_errors_are_those_of_loads() -> None:
    reader = BodyReader()
    reader.loads(b'{"messages": [{"role": "user", "content": "x"}]}')
    for data in (
        b'{"messages": [{"role": "user", "content": "x"}, ',
        b"\xff\xfe{}",
        b'{"messages": [{"role": "user", "content": "x"}]} []',
        b"",
    ):
        with pytest.raises(ValueError) as expected:
            loads(data)
        with pytest.raises(ValueError) as got:
            reader.loads(data)
        assert (type(got.value), str(got.value)) == (type(expected.value), str(expected.value))


def test_an_edited_message_is_read_again() -> None:
    """Messages after the first that differs are parsed from the new text, even when the
    edit keeps every length (a harness that rewrites an old tool result)."""
    reader = BodyReader()
    conversation = [{"role": "user", "content": c} for c in ("aaaa", "bbbb", "cccc", "dddd")]
    reader.loads(json.dumps({"messages": conversation}).encode())
    for edited in range(4):
        changed = [dict(m) for m in conversation]
        changed[edited]["content"] = "zzzz"
        body = json.dumps({"messages": changed + [{"role": "user", "content": "e"}]})
        assert reader.loads(body.encode()) == json.loads(body)
        reader.loads(json.dumps({"messages": conversation}).encode())
