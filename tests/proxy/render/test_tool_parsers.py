"""Tool-call parsers: Qwen/Hermes blocks, malformed blocks, the lenient variant, streaming."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rolloutd.errors import ConfigError
from rolloutd.proxy.render.tool_parsers import (
    TOOL_PARSERS,
    get_tool_parser,
    parse_hermes,
    parse_hermes_lenient,
    streamable_prefix,
)

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_single_tool_call_has_openai_shape_and_no_content() -> None:
    parsed = parse_hermes(CALL)
    assert parsed.content is None
    [call] = parsed.tool_calls
    assert call["type"] == "function"
    assert call["id"].startswith("call_") and len(call["id"]) > 10
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_text_around_calls_is_content_and_calls_keep_order() -> None:
    second = CALL.replace("get_weather", "get_time").replace("Paris", "Tokyo")
    parsed = parse_hermes(f"Let me check.\n{CALL}\n{second}\n")
    assert parsed.content == "Let me check."
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["get_weather", "get_time"]
    assert len({c["id"] for c in parsed.tool_calls}) == 2


@pytest.mark.parametrize(
    "block",
    [
        '<tool_call>{"name": "f", "arguments": {"a": 1}</tool_call>',  # broken JSON
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["f"]</tool_call>',  # not an object
    ],
)
def test_malformed_block_stays_content(block: str) -> None:
    text = f"before {block} after"
    parsed = parse_hermes(text)
    assert parsed.tool_calls == []
    assert parsed.content == text
    assert parsed.num_unreadable == 1  # the model's doing: the completion records it


def test_readable_calls_and_plain_text_count_no_unreadable_call() -> None:
    assert parse_hermes(CALL).num_unreadable == 0
    assert parse_hermes("just text").num_unreadable == 0
    # a call begun and never closed (cut by max_tokens) could not be read either
    assert parse_hermes(f'{CALL}\n<tool_call>{{"name": "f"').num_unreadable == 1
    assert parse_hermes_lenient('<tool_call>{"nope"</tool_call>').num_unreadable == 1


def test_malformed_block_beside_valid_one_is_kept_in_content() -> None:
    bad = "<tool_call>{nope}</tool_call>"
    parsed = parse_hermes(f"{bad}\n{CALL}")
    assert parsed.content == bad
    assert len(parsed.tool_calls) == 1


def test_arguments_given_as_json_string_are_kept() -> None:
    parsed = parse_hermes('<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>')
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"x": 2}


def test_plain_text_is_untouched() -> None:
    assert parse_hermes("  just text\n").content == "  just text\n"
    assert parse_hermes("  just text\n").tool_calls == []


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": {"city": "Tokyo"}}',
        '```json\n{\n  "name": "get_weather",\n  "arguments": {"city": "Tokyo"}\n}\n```',
        '{"name": "get_weather", "arguments": {"city": "Tokyo"}',  # its last brace not sampled
    ],
)
def test_lenient_parser_reads_bare_json_calls(text: str) -> None:
    assert parse_hermes(text).tool_calls == []
    parsed = parse_hermes_lenient(text)
    assert parsed.content is None
    assert parsed.tool_calls[0]["function"]["name"] == "get_weather"
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"city": "Tokyo"}


def test_lenient_parser_leaves_other_json_as_content() -> None:
    for text in ('{"answer": 42}', '{"name": "f", "arguments": {"x": "a', '{"name": "f"'):
        assert parse_hermes_lenient(text).content == text
        assert parse_hermes_lenient(text).tool_calls == []


def test_registry() -> None:
    assert get_tool_parser("hermes").parse is parse_hermes
    assert {"hermes", "hermes_lenient", "none"} <= set(TOOL_PARSERS)
    with pytest.raises(ConfigError, match="unknown tool parser"):
        get_tool_parser("nope")


def test_streamable_prefix_never_leaks_a_tool_call() -> None:
    assert streamable_prefix("Hello <tool", "<tool_call>") == "Hello"
    assert streamable_prefix("Hi\n<tool_call>\n{", "<tool_call>") == "Hi"
    assert streamable_prefix("a < b", "<tool_call>") == "a < b"
    assert streamable_prefix("trailing  ", "<tool_call>") == "trailing"


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_streamed_content_is_a_prefix_of_the_final_content(prefix: str) -> None:
    text = prefix + "\n" + CALL
    parsed = parse_hermes(text)
    final = parsed.content or ""
    for end in range(len(text) + 1):
        streamed = streamable_prefix(text[:end], "<tool_call>")
        assert "<tool_call>" not in streamed
        if "<tool_call>" not in prefix:
            assert final.startswith(streamed.lstrip()) or not streamed.strip()
