"""What a strict official SDK rejects, checked fast: the SDKs of tests/proxy/http/sdk_clients.py
against a gateway on a real socket whose backend is the scripted llama.cpp of support.py (no
engine). Each test pins one wire shape a strict client needs: tool calls answered plainly and
streamed, the token-count routes, the Gemini API's ``v1`` path, and errors in each provider's
own shape raised as the SDK's typed exception.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from tests.proxy.http.sdk_clients import (
    Served,
    gemini_client,
    served_gateway,
    strict_anthropic,
    strict_gemini,
    strict_openai,
)
from tests.proxy.support import FAKE_URL, FakeLlamaCpp

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
async def served(tmp_path: Path, tokenizer: Any, fake_llama: FakeLlamaCpp) -> AsyncIterator[Served]:
    fake_llama.answers = [TOOL_CALL]
    async with served_gateway(
        tmp_path / "store", FAKE_URL, tokenizer, transport=fake_llama.transport
    ) as s:
        yield s


async def test_openai_chat_tool_calls_plain_and_streamed(served: Served) -> None:
    client = strict_openai(await served.open("chat/0", max_tokens=64))
    tools: Any = [
        {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
    ]
    plain = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather?"}], tools=tools
    )
    assert plain.choices[0].finish_reason == "tool_calls"
    call = plain.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    stream = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Weather now?"}], tools=tools, stream=True
    )
    chunks = [c async for c in stream]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_openai_responses_tool_calls_text_and_input_tokens(
    served: Served, fake_llama: FakeLlamaCpp
) -> None:
    """The usage's ``cache_write_tokens``, the ``logprobs`` of ``output_text.done`` and the
    ``/responses/input_tokens`` route: what openai 3.57 strict rejected before."""
    client = strict_openai(await served.open("resp/0", max_tokens=64))
    tools: Any = [
        {"type": "function", "name": "get_weather", "parameters": PARAMETERS, "strict": False}
    ]
    called = await client.responses.create(model="m", input="Weather?", tools=tools)
    assert called.output[-1].type == "function_call" and called.usage is not None
    async with client.responses.stream(model="m", input="Weather now?", tools=tools) as stream:
        assert [e async for e in stream][-1].type == "response.completed"
    fake_llama.answers = ["Sunny."]
    async with client.responses.stream(model="m", input="And tomorrow?") as stream:
        kinds = [e.type async for e in stream]
    assert "response.output_text.done" in kinds and kinds[-1] == "response.completed"
    counted = await client.responses.input_tokens.count(model="m", input="Weather?", tools=tools)
    assert counted.object == "response.input_tokens" and counted.input_tokens > 10


async def test_anthropic_tool_use_plain_streamed_and_beta(served: Served) -> None:
    client = strict_anthropic(await served.open("anth/0", max_tokens=64))
    tools: Any = [{"name": "get_weather", "input_schema": PARAMETERS}]
    plain = await client.messages.create(
        model="m", max_tokens=64, tools=tools, messages=[{"role": "user", "content": "Weather?"}]
    )
    assert plain.stop_reason == "tool_use" and plain.content[-1].type == "tool_use"
    async with client.beta.messages.stream(
        model="m",
        max_tokens=64,
        tools=tools,
        betas=["fine-grained-tool-streaming-2025-05-14"],
        messages=[{"role": "user", "content": "Weather now?"}],
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use"


@pytest.mark.parametrize("api_version", ["v1beta", "v1"])
async def test_google_genai_function_call_and_count_on_each_version(
    served: Served, api_version: str
) -> None:
    """google-genai calls ``/v1/models/...`` by default: the gateway served only ``v1beta``."""
    models = gemini_client(
        await served.open(f"gem-{api_version}/0", max_tokens=64), api_version
    ).aio.models
    tool = genai_types.Tool(
        function_declarations=[
            genai_types.FunctionDeclaration(name="get_weather", parameters_json_schema=PARAMETERS)
        ]
    )
    config = genai_types.GenerateContentConfig(tools=[tool])
    plain = await models.generate_content(model="g", contents="Weather?", config=config)
    assert plain.function_calls and plain.function_calls[0].args == {"city": "Paris"}
    chunks = [
        c
        async for c in await models.generate_content_stream(
            model="g", contents="Weather now?", config=config
        )
    ]
    assert any(c.function_calls for c in chunks)
    counted = await models.count_tokens(model="g", contents="Weather?")
    assert counted.total_tokens and counted.total_tokens > 3
    assert strict_gemini(served.recorder) >= 3


async def test_openai_errors_are_typed(served: Served) -> None:
    info = await served.open("oai-err/0")
    client = strict_openai(info)
    with pytest.raises(openai.BadRequestError, match="role") as bad:
        await client.chat.completions.create(
            model="m", messages=[{"role": "nobody", "content": "x"}]
        )  # type: ignore[misc]
    assert bad.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="m", input=[{"type": "nothing"}])  # type: ignore[list-item]
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(
            base_url=info.openai_base_url.replace(info.session_key, "no"),
            api_key="unused",
            max_retries=0,
        ).models.list()


async def test_anthropic_errors_are_typed(served: Served) -> None:
    client = strict_anthropic(await served.open("anth-err/0"))
    with pytest.raises(anthropic.BadRequestError, match="role") as bad:
        await client.messages.create(
            model="m", max_tokens=8, messages=[{"role": "nobody", "content": "x"}]
        )  # type: ignore[typeddict-item]
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


async def test_google_genai_errors_are_typed(served: Served) -> None:
    models = gemini_client(await served.open("gem-err/0"), "v1").aio.models
    with pytest.raises(genai_errors.ClientError) as bad:
        await models.generate_content(
            model="g",
            contents=[genai_types.Content(role="nobody", parts=[genai_types.Part(text="x")])],
        )
    assert bad.value.code == 400 and bad.value.status == "INVALID_ARGUMENT"
    assert "role" in (bad.value.message or "")


async def test_openai_models_and_an_unknown_model(served: Served) -> None:
    info = await served.open("oai-models/0")
    client = strict_openai(info)
    assert [m.id async for m in client.models.list()] == [info.model]
    assert (await client.models.retrieve(info.model)).id == info.model
    with pytest.raises(openai.NotFoundError, match="not found") as missing:
        await client.models.retrieve("gpt-nothing")
    assert missing.value.code == "not_found"


async def test_anthropic_models_and_an_unknown_model(served: Served) -> None:
    """Anthropic's ``/v1/models`` answered OpenAI's list, which its strict client rejects."""
    info = await served.open("anth-models/0")
    client = strict_anthropic(info)
    assert [m.id async for m in client.models.list()] == [info.model]
    assert (await client.models.retrieve(info.model)).display_name == info.model
    with pytest.raises(anthropic.NotFoundError, match="not found") as missing:
        await client.models.retrieve("claude-nothing")
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


@pytest.mark.parametrize("api_version", ["v1beta", "v1"])
async def test_google_genai_models_and_an_unknown_model(served: Served, api_version: str) -> None:
    info = await served.open(f"gem-models-{api_version}/0")
    models = gemini_client(info, api_version).aio.models
    assert (await models.get(model=info.model)).name == f"models/{info.model}"
    assert [m.name async for m in await models.list()] == [f"models/{info.model}"]
    with pytest.raises(genai_errors.ClientError, match="not found") as missing:
        await models.get(model="gemini-nothing")
    assert missing.value.code == 404 and missing.value.status == "NOT_FOUND"


async def test_a_stream_the_backend_cuts_fails_typed_in_each_sdk(
    tmp_path: Path, tokenizer: Any, fake_llama: FakeLlamaCpp
) -> None:
    """A backend stream that ends without its final event, after a token: each SDK raises its
    typed error, or (Responses) yields ``error`` and a ``response.failed`` its strict types
    accept; before, ``response.error.code`` was a code the API does not enumerate."""

    def cut(request: httpx.Request) -> httpx.Response:
        answer = fake_llama.handle(request)
        if request.url.path != "/completion" or not json.loads(request.content).get("stream"):
            return answer
        first_event = answer.content.split(b"\n\n")[0] + b"\n\n"
        return httpx.Response(200, content=first_event, headers=answer.headers)

    async with served_gateway(
        tmp_path / "store", FAKE_URL, tokenizer, transport=httpx.MockTransport(cut)
    ) as served:
        info = await served.open("cut/0")
        client = strict_openai(info)
        with pytest.raises(openai.APIError, match="final event"):
            async for _ in await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "a"}], stream=True
            ):
                pass
        async with client.responses.stream(model="m", input="b") as stream:
            kinds = [e.type async for e in stream]
        assert kinds[-2:] == ["error", "response.failed"]
        with pytest.raises(anthropic.APIStatusError, match="final event"):
            async with strict_anthropic(info).messages.stream(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "c"}]
            ) as s:
                await s.get_final_message()
        with pytest.raises(genai_errors.ServerError, match="final event"):
            async for _ in await gemini_client(info, "v1").aio.models.generate_content_stream(
                model="g", contents="d"
            ):
                pass
