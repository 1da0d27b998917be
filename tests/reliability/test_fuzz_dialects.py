"""Generated malformed requests against every dialect route of the real gateway app (in
process, a scripted llama-server upstream): never a 500, never a crash, every error in the
dialect's own shape; and wrong or missing session keys are always refused.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rolloutd.cli import reliability
from rolloutd.proxy.http.server import Gateway
from rolloutd.settings import GatewaySettings
from tests.proxy.support import FAKE_URL, MODEL, FakeLlamaCpp

pytestmark = [pytest.mark.slow]

NUM_EXAMPLES = 1000

#: route (after ``/s/{key}``) and the fields a well-formed body of its dialect has.
DIALECTS: dict[str, tuple[str, list[str]]] = {
    "openai_chat": (
        "/v1/chat/completions",
        [
            "model",
            "messages",
            "max_tokens",
            "stream",
            "tools",
            "tool_choice",
            "temperature",
            "stop",
        ],
    ),
    "openai_responses": (
        "/v1/responses",
        [
            "model",
            "input",
            "instructions",
            "tools",
            "max_output_tokens",
            "stream",
            "previous_response_id",
        ],
    ),
    "anthropic": (
        "/v1/messages",
        [
            "model",
            "messages",
            "max_tokens",
            "system",
            "tools",
            "stream",
            "tool_choice",
            "stop_sequences",
        ],
    ),
    "gemini": (
        f"/v1beta/models/{MODEL}:generateContent",
        ["contents", "systemInstruction", "tools", "generationConfig", "toolConfig"],
    ),
}

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "content",
                    "type",
                    "text",
                    "parts",
                    "name",
                    "id",
                    "function",
                    "arguments",
                    "input",
                    "tool_use_id",
                    "x",
                ]
            )
            | st.text(max_size=8),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


def bodies(fields: list[str]) -> st.SearchStrategy[bytes]:
    """Malformed bodies: objects with the dialect's field names holding arbitrary JSON,
    arbitrary JSON documents, and bytes that are not JSON at all."""
    objects = st.dictionaries(
        st.sampled_from(fields) | st.text(max_size=8), json_values, max_size=6
    )
    return st.one_of(
        objects.map(lambda o: json.dumps(o).encode()),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=64),
    )


def in_shape(dialect: str, body: Any) -> bool:
    """Whether an error body has the dialect's error shape."""
    if not isinstance(body, dict):
        return False
    error = body.get("error")
    if dialect == "anthropic":
        return (
            body.get("type") == "error"
            and isinstance(error, dict)
            and isinstance(error.get("type"), str)
            and isinstance(error.get("message"), str)
        )
    if dialect == "gemini":
        return (
            isinstance(error, dict)
            and isinstance(error.get("code"), int)
            and isinstance(error.get("message"), str)
            and isinstance(error.get("status"), str)
        )
    return isinstance(error, dict) and isinstance(error.get("message"), str)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """A gateway app with one open session, its key, and a private event loop."""
    from rolloutd.engine.models import load_tokenizer

    loop = asyncio.new_event_loop()
    tokenizer = load_tokenizer(MODEL)
    fake = FakeLlamaCpp(tokenizer)
    store = tmp_path_factory.mktemp("fuzz") / "store"
    gateway = Gateway.from_settings(
        GatewaySettings(
            store_url=str(store), backend_url=FAKE_URL, gateway_public_url="http://gateway.test"
        ),
        tokenizer=tokenizer,
        transport=fake.transport,
    )
    info = loop.run_until_complete(gateway.sessions.open_session("fuzz/0", "fuzz"))
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=gateway.app), base_url="http://gateway.test", timeout=30
    )
    yield gateway, info.session_key, client, loop
    loop.run_until_complete(client.aclose())
    loop.run_until_complete(gateway.aclose())
    loop.close()


@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_malformed_requests_get_4xx_in_the_dialects_shape(rig, dialect: str):
    _, key, client, loop = rig
    path, fields = DIALECTS[dialect]
    seen = {"requests": 0, "status_500": 0, "wrong_shape": 0, "ok_200": 0}

    @settings(
        max_examples=NUM_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(body=bodies(fields))
    def one(body: bytes) -> None:
        response = loop.run_until_complete(
            client.post(
                f"/s/{key}{path}", content=body, headers={"content-type": "application/json"}
            )
        )
        seen["requests"] += 1
        if response.status_code >= 500:
            seen["status_500"] += 1
        if response.status_code == 200:
            seen["ok_200"] += 1  # a body that happens to be valid: answered, not an error
            return
        if not in_shape(dialect, response.json()):
            seen["wrong_shape"] += 1

    one()
    reliability.record(
        f"fuzz {dialect}",
        sessions="-",
        **{k: v for k, v in seen.items()},
        ok=seen["status_500"] == 0 and seen["wrong_shape"] == 0,
    )
    assert seen["requests"] >= NUM_EXAMPLES
    assert seen["status_500"] == 0, seen
    assert seen["wrong_shape"] == 0, seen


def test_wrong_or_missing_session_keys_are_refused(rig):
    _, key, client, loop = rig
    body = json.dumps(
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    refused = total = wrong_shape = 0
    for i in range(NUM_EXAMPLES):
        dialect = list(DIALECTS)[i % len(DIALECTS)]
        path = DIALECTS[dialect][0]
        kind = i % 4
        if kind == 0:  # a random key in the path
            url, headers = f"/s/{secrets.token_urlsafe(24)}{path}", {}
        elif kind == 1:  # the right key with one character changed
            bad = key[:-1] + ("A" if key[-1] != "A" else "B")
            url, headers = f"/s/{bad}{path}", {}
        elif kind == 2:  # no key at all, keyless route
            url, headers = path, {}
        else:  # a wrong API key header on the keyless route
            url = path
            headers = {
                "authorization": f"Bearer {secrets.token_urlsafe(16)}",
                "x-api-key": secrets.token_urlsafe(16),
            }
        response = loop.run_until_complete(
            client.post(url, content=body, headers={"content-type": "application/json", **headers})
        )
        total += 1
        refused += response.status_code == 401
        wrong_shape += not in_shape(dialect, response.json())
    reliability.record(
        "wrong or missing session keys",
        sessions="-",
        requests=total,
        refused=refused,
        wrong_shape=wrong_shape,
        ok=refused == total,
    )
    assert refused == total
    assert wrong_shape == 0
