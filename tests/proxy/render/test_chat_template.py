"""Chat template rendering and the token chain, with the real Qwen2.5 tokenizer."""

from __future__ import annotations

from typing import Any

import jinja2
import jinja2.sandbox
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rolloutd.errors import InvalidRequestError
from rolloutd.proxy.render.chat_template import ChatTemplate
from rolloutd.proxy.render.jinja_sandbox import DictFirstSandbox
from rolloutd.proxy.render.messages import (
    ExtensionIndex,
    canonical_json,
    message_signature,
    template_messages,
)
from rolloutd.types import Completion

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def completion(
    template: ChatTemplate,
    messages: list[dict[str, Any]],
    answer: dict[str, Any],
    response_ids: list[int],
    *,
    index: int = 0,
    tools: list[Any] | None = None,
    prompt_ids: list[int] | None = None,
) -> Completion:
    tools = TOOLS if tools is None else tools
    return Completion(
        session_id="t/0",
        index=index,
        messages=messages,
        tools=tools,
        prompt_ids=prompt_ids if prompt_ids is not None else template.render(messages, tools),
        response_ids=response_ids,
        response_logprobs=[-0.5] * len(response_ids),
        response_message=answer,
        end_of_turn_sampled=bool(response_ids) and response_ids[-1] == template.end_of_turn_id,
    )


def test_end_of_turn_comes_from_the_template(template: ChatTemplate, tokenizer: Any) -> None:
    assert template.end_of_turn_text == "<|im_end|>"
    assert template.end_of_turn_id == tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645
    assert template.trailer == "\n"


def test_fresh_render_is_the_tokenizer_template(template: ChatTemplate, tokenizer: Any) -> None:
    text = tokenizer.apply_chat_template(
        [SYSTEM, USER], tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert template.render([SYSTEM, USER], TOOLS) == tokenizer.encode(
        text, add_special_tokens=False
    )
    assert template.decode(template.render([SYSTEM, USER], TOOLS)).endswith(
        "<|im_start|>assistant\n"
    )


def test_chain_of_a_text_answer_equals_the_fresh_render(template: ChatTemplate) -> None:
    first = [SYSTEM, USER]
    sampled = template.encode("It is sunny.") + [template.end_of_turn_id]
    c0 = completion(template, first, {"role": "assistant", "content": "It is sunny."}, sampled)
    second = first + [
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "Thanks!"},
    ]
    plan = template.build_prompt(second, TOOLS, [c0])
    assert plan.extends == 0
    assert plan.prompt_ids[: len(c0.prompt_ids) + len(sampled)] == c0.prompt_ids + sampled
    assert plan.prompt_ids == template.render(second, TOOLS)
    assert plan.num_new_tokens == len(plan.prompt_ids) - len(c0.prompt_ids) - len(sampled)


def test_chain_of_a_tool_call_with_echoed_ids_and_arguments(template: ChatTemplate) -> None:
    sampled = template.encode(CALL_TEXT) + [template.end_of_turn_id]
    ours = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_ours",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    c0 = completion(template, [USER], ours, sampled)
    echoed = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_ours",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{ "city":"Paris" }'},
            }
        ],
    }
    second = [USER, echoed, {"role": "tool", "tool_call_id": "call_ours", "content": "sunny"}]
    plan = template.build_prompt(second, TOOLS, [c0])
    assert plan.extends == 0
    assert plan.prompt_ids == template.render(second, TOOLS)
    assert "<tool_response>\nsunny\n</tool_response>" in template.decode(plan.prompt_ids)


def test_end_of_turn_is_inserted_when_not_sampled(template: ChatTemplate) -> None:
    truncated = template.encode("It is sun")  # finish_reason length: no <|im_end|>
    c0 = completion(template, [USER], {"role": "assistant", "content": "It is sun"}, truncated)
    second = [
        USER,
        {"role": "assistant", "content": "It is sun"},
        {"role": "user", "content": "Go on."},
    ]
    plan = template.build_prompt(second, TOOLS, [c0])
    at = len(c0.prompt_ids) + len(truncated)
    assert plan.extends == 0
    assert plan.prompt_ids[:at] == c0.prompt_ids + truncated
    assert plan.prompt_ids[at] == template.end_of_turn_id
    assert plan.prompt_ids == template.render(second, TOOLS)


def test_chain_keeps_sampled_tokens_where_they_differ(template: ChatTemplate) -> None:
    text = "It is sunny."
    # the model may sample a tokenization the tokenizer would never produce: one per character
    sampled = [t for ch in text for t in template.encode(ch)] + [template.end_of_turn_id]
    assert sampled[:-1] != template.encode(text)
    c0 = completion(template, [USER], {"role": "assistant", "content": text}, sampled)
    second = [USER, {"role": "assistant", "content": text}, {"role": "user", "content": "Ok"}]
    plan = template.build_prompt(second, TOOLS, [c0])
    fresh = template.render(second, TOOLS)
    assert plan.prompt_ids != fresh
    head, answer_len = len(c0.prompt_ids), len(sampled)
    assert plan.prompt_ids[: head + answer_len] == c0.prompt_ids + sampled
    fresh_answer_len = len(template.encode(text)) + 1
    assert plan.prompt_ids[head + answer_len :] == fresh[head + fresh_answer_len :]
    assert template.decode(plan.prompt_ids) == template.decode(fresh)


@pytest.mark.parametrize("change", ["earlier_message", "answer", "tools"])
def test_a_request_that_does_not_continue_is_rendered_fresh(
    template: ChatTemplate, change: str
) -> None:
    sampled = template.encode("Sunny.") + [template.end_of_turn_id]
    c0 = completion(template, [SYSTEM, USER], {"role": "assistant", "content": "Sunny."}, sampled)
    messages = [
        SYSTEM,
        USER,
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "And tomorrow?"},
    ]
    tools = TOOLS
    if change == "earlier_message":
        messages[1] = {"role": "user", "content": "What is the weather in Rome?"}
    elif change == "answer":
        messages[2] = {"role": "assistant", "content": "Rainy."}
    else:
        tools = []
    plan = template.build_prompt(messages, tools, [c0])
    assert plan.extends is None
    assert plan.prompt_ids == template.render(messages, tools)


def test_the_longest_continued_conversation_wins(template: ChatTemplate) -> None:
    a0 = template.encode("One.") + [template.end_of_turn_id]
    c0 = completion(template, [USER], {"role": "assistant", "content": "One."}, a0)
    m1 = [USER, {"role": "assistant", "content": "One."}, {"role": "user", "content": "Two?"}]
    p1 = template.build_prompt(m1, TOOLS, [c0]).prompt_ids
    a1 = template.encode("Two.") + [template.end_of_turn_id]
    c1 = completion(
        template, m1, {"role": "assistant", "content": "Two."}, a1, index=1, prompt_ids=p1
    )
    m2 = m1 + [{"role": "assistant", "content": "Two."}, {"role": "user", "content": "Three?"}]
    plan = template.build_prompt(m2, TOOLS, [c0, c1])
    assert plan.extends == 1
    assert plan.prompt_ids[: len(p1) + len(a1)] == p1 + a1
    # a branch back from the first answer still continues completion 0
    branch = [USER, {"role": "assistant", "content": "One."}, {"role": "user", "content": "X"}]
    assert template.build_prompt(branch, TOOLS, [c0, c1]).extends == 0


def test_message_signature_normalises_echoes() -> None:
    ours = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "f", "arguments": '{"b": 1, "a": [1, 2]}'},
            }
        ],
    }
    echoed = {
        "role": "assistant",
        "content": "  ",
        "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2], "b": 1}}}
        ],
    }
    assert message_signature(ours) == message_signature(echoed)
    assert message_signature(
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    ) == message_signature({"role": "user", "content": "hi "})
    assert message_signature({"role": "user", "content": "hi"}) != message_signature(
        {"role": "assistant", "content": "hi"}
    )


def test_non_text_content_is_refused(template: ChatTemplate) -> None:
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    with pytest.raises(InvalidRequestError, match="image_url"):
        template.render([image])


_TEXT = st.text(
    alphabet=st.characters(whitelist_categories=("L", "N", "P", "Zs")), min_size=1, max_size=40
).filter(lambda s: s.strip() == s)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(user=_TEXT, answer=_TEXT, follow_up=_TEXT)
def test_chain_property(template: ChatTemplate, user: str, answer: str, follow_up: str) -> None:
    """For any texts: the chain continues the previous prompt and answer token for token, and
    decodes to the same text as a fresh render (both decoded: the tokenizer normalises NFC)."""
    first = [{"role": "user", "content": user}]
    sampled = template.encode(answer) + [template.end_of_turn_id]
    c0 = completion(template, first, {"role": "assistant", "content": answer}, sampled)
    second = first + [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": follow_up},
    ]
    plan = template.build_prompt(second, TOOLS, [c0])
    assert plan.extends == 0
    assert plan.prompt_ids[: len(c0.prompt_ids) + len(sampled)] == c0.prompt_ids + sampled
    assert template.decode(plan.prompt_ids) == template.decode(template.render(second, TOOLS))


# ---------------------------------------------------------------- incremental rendering

_WORD = st.text(
    alphabet=st.characters(whitelist_categories=("L", "N", "P", "Zs")), min_size=0, max_size=12
)


@st.composite
def _conversations(draw: Any) -> list[dict[str, Any]]:
    """Agent conversations: optional system message, user turns, assistant answers with or
    without tool calls, the tool results of each call, sometimes a late system message."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_WORD)})
    messages.append({"role": "user", "content": draw(_WORD)})
    for turn in range(draw(st.integers(1, 6))):
        num_calls = draw(st.integers(0, 2))
        calls = [
            {
                "id": f"call_{turn}_{i}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": f'{{"city": "{draw(_WORD)}"}}'},
            }
            for i in range(num_calls)
        ]
        answer: dict[str, Any] = {"role": "assistant", "content": draw(_WORD)}
        if calls:
            answer["tool_calls"] = calls
        messages.append(answer)
        for call in calls:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": draw(_WORD)})
        follow = draw(st.sampled_from(["user", "user", "none", "system_user"]))
        if follow == "system_user":
            messages.append({"role": "system", "content": draw(_WORD)})
        if follow != "none" or not calls:
            messages.append({"role": "user", "content": draw(_WORD)})
    return messages


@pytest.fixture(scope="module", params=["qwen2.5-coder-0.5b", "smollm2-135m"])
def template_pair(request: Any) -> tuple[ChatTemplate, ChatTemplate]:
    from rolloutd.engine.models import load_tokenizer

    tokenizer = load_tokenizer(request.param)
    return ChatTemplate(tokenizer), ChatTemplate(tokenizer, incremental=False)


def test_both_templates_allow_incremental_rendering(
    template_pair: tuple[ChatTemplate, ChatTemplate],
) -> None:
    incremental, full = template_pair
    assert incremental.incremental and not full.incremental


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(conversation=_conversations(), with_tools=st.booleans(), data=st.data())
def test_incremental_render_equals_full_render(
    template_pair: tuple[ChatTemplate, ChatTemplate],
    conversation: list[dict[str, Any]],
    with_tools: bool,
    data: Any,
) -> None:
    """For any conversation continued after any assistant turn: the prompt built by rendering
    only the new messages is the prompt built from full renders, token for token."""
    incremental, full = template_pair
    tools = TOOLS if with_tools else []
    turns = [
        k
        for k, m in enumerate(conversation)
        if m["role"] == "assistant" and k < len(conversation) - 1
    ]
    k = data.draw(st.sampled_from(turns))
    answer = conversation[k]
    sampled = full.encode("sampled") + [full.end_of_turn_id]
    earlier = completion(full, conversation[:k], answer, sampled, tools=tools)
    plan = incremental.build_prompt(conversation, tools, [earlier])
    assert plan == full.build_prompt(conversation, tools, [earlier])
    assert plan.extends == 0


def _linear_find_extended(
    messages: list[dict[str, Any]], tools: list[Any], completions: list[Completion]
) -> Completion | None:
    """The rule of ``find_extended`` as a scan of the whole log (the specification the index
    must answer like): the longest continued conversation wins, then the latest."""
    best: Completion | None = None
    for c in completions:
        k = len(c.messages)
        if k >= len(messages) or not c.response_ids or c.finish_reason == "error":
            continue
        if canonical_json(c.tools) != canonical_json(tools):
            continue
        if [message_signature(m) for m in messages[: k + 1]] != [
            message_signature(m) for m in [*c.messages, c.response_message]
        ]:
            continue
        if best is None or k >= len(best.messages):
            best = c
    return best


_TURN = st.sampled_from(
    [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b "},
        {"role": "assistant", "content": "x"},
        {"role": "assistant", "content": "y"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"q": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
)
_ANSWER = st.sampled_from(
    [
        {"role": "assistant", "content": "x"},
        {"role": "assistant", "content": " y"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"q": 1}}}],
        },
    ]
)
_LOGGED = st.tuples(
    st.lists(_TURN, min_size=1, max_size=5),
    _ANSWER,
    st.sampled_from([[], TOOLS]),
    st.booleans(),
    st.sampled_from(["stop", "error"]),
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    logged=st.lists(_LOGGED, max_size=12),
    request=st.lists(_TURN, min_size=1, max_size=8),
    cut=st.integers(0, 11),
    request_tools=st.sampled_from([[], TOOLS]),
)
def test_indexed_find_extended_answers_like_a_scan_of_the_log(
    template: ChatTemplate,
    logged: list[Any],
    request: list[dict[str, Any]],
    cut: int,
    request_tools: list[Any],
) -> None:
    """For any session log and request: the :class:`ExtensionIndex` lookup picks the very
    completion a scan of the whole log picks. Requests are drawn both at random and as a
    logged conversation with its answer and more turns (so matches are frequent)."""
    completions = [
        Completion(
            session_id="t/0",
            index=i,
            messages=messages,
            tools=tools,
            prompt_ids=[1, 2],
            response_ids=[3] if sampled else [],
            response_logprobs=[-0.1] if sampled else [],
            response_message=answer,
            finish_reason=finish,
        )
        for i, (messages, answer, tools, sampled, finish) in enumerate(logged)
    ]
    if completions and cut < len(completions):
        base = completions[cut]
        request = [*base.messages, base.response_message, *request]
        request_tools = base.tools
    index = ExtensionIndex()
    for c in completions:
        index.add(c)
    expected = _linear_find_extended(request, request_tools, completions)
    assert template.find_extended(request, request_tools, index) is expected
    assert template.find_extended(request, request_tools, completions) is expected


_PIECES = st.sampled_from(
    [
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "\n",
        " ",
        "  ",
        "a",
        "Hello",
        "é",
        "日本",
        "\t",
        "def f():",
        "<|endoftext|>",
        "ğŸ",
        "<|im_start|>system\nBe brief.<|im_end|>\n",
        " <|im_start|>",
        "<|im_start|> ",
        "<|im_start|>user\n",
        "<|im_start|><|im_start|>",
    ]
)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(max_size=120) | st.lists(_PIECES, max_size=30).map("".join))
def test_encode_is_the_tokenizers_encode(template: ChatTemplate, tokenizer: Any, text: str) -> None:
    """The gateway encodes through the Rust tokenizer directly and turn by turn, with the
    turns it has seen from a cache (faster); for any text, with special tokens, whitespace
    runs and any Unicode, the ids are transformers' own, whether its turns are cached or
    not."""
    assert template._backend is not None and template.turn_start == "<|im_start|>"
    expected = tokenizer.encode(text, add_special_tokens=False)
    assert template.encode(text) == expected
    assert template.encode(text) == expected  # its turns cached now


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    conversation=_conversations(),
    with_tools=st.booleans(),
    generation_prompt=st.booleans(),
    extras=st.lists(
        st.tuples(
            st.integers(0, 40),
            st.sampled_from(
                ["name", "reasoning_content", "thinking", "reasoning", "tool_calls", "refusal"]
            ),
            st.none() | _WORD,
        ),
        max_size=4,
    ),
)
def test_direct_render_is_apply_chat_template(
    template_pair: tuple[ChatTemplate, ChatTemplate],
    conversation: list[dict[str, Any]],
    with_tools: bool,
    generation_prompt: bool,
    extras: list[tuple[int, str, Any]],
) -> None:
    """The compiled template rendered directly (both models pass the start probe) gives
    ``apply_chat_template``'s text, keys set to None and reasoning fields included."""
    template, _ = template_pair
    assert template._direct is not None
    for at, key, value in extras:
        message = conversation[at % len(conversation)]
        if key != "tool_calls" or value is None:
            message[key] = value
    tools = TOOLS if with_tools else None
    expected = template.tokenizer.apply_chat_template(
        template_messages(conversation),
        tools=tools,
        add_generation_prompt=generation_prompt,
        tokenize=False,
    )
    assert (
        template.render_text(conversation, tools, add_generation_prompt=generation_prompt)
        == expected
    )


class _Attrs(dict):  # a dict subclass: the sandbox's own lookup applies
    pass


@settings(max_examples=200, deadline=None)
@given(
    names=st.lists(
        st.sampled_from(
            [
                "role",
                "content",
                "items",
                "get",
                "keys",
                "pop",
                "update",
                "__class__",
                "__len__",
                "_private",
                "missing",
                "mro",
                "copy",
            ]
        )
        | _WORD,
        min_size=1,
        max_size=6,
    ),
    present=st.lists(
        st.sampled_from(["role", "content", "items", "get", "pop", "__class__", "missing", "x"])
        | _WORD,
        max_size=5,
    ),
    subclass=st.booleans(),
)
def test_the_dict_first_sandbox_looks_up_as_the_sandbox_does(
    names: list[str], present: list[str], subclass: bool
) -> None:
    """``message.<name>`` in the gateway's sandbox gives what transformers' sandbox gives
    (an item, a safe method, undefined, or the same security error), for dict keys that are
    also dict attribute names, missing keys and private names."""
    source = "".join(
        f"[{{{{ m.{n} is defined }}}}|{{{{ m.{n} if m.{n} is string else (m.{n} is callable) }}}}]"
        for n in names
        if n.isidentifier()
    )
    message = {name: f"v-{name}" for name in present}
    value = _Attrs(message) if subclass else message
    reference = jinja2.sandbox.ImmutableSandboxedEnvironment()
    lean = reference.overlay()
    lean.__class__ = DictFirstSandbox

    def render(env: Any) -> str:
        try:
            return env.from_string(source).render(m=value)
        except jinja2.exceptions.SecurityError as e:
            return f"SecurityError: {e}"

    assert render(lean) == render(reference)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_decode_is_the_tokenizers_decode(
    template_pair: tuple[ChatTemplate, ChatTemplate], data: st.DataObject
) -> None:
    """The gateway decodes sampled ids through the Rust tokenizer directly (both models pass
    its start probe); any ids, special tokens and byte pieces cut mid-character included,
    give transformers' text."""
    template, _ = template_pair
    assert template._decoder is not None
    size = len(template.tokenizer)
    specials = [template.tokenizer.convert_tokens_to_ids(t) for t in template._special_tokens()]
    ids = data.draw(st.lists(st.integers(0, size - 1) | st.sampled_from(specials), max_size=40))
    assert template.decode(ids) == template.tokenizer.decode(ids, skip_special_tokens=False)
