"""The durable backend pool through the admin routes, in-process (httpx.ASGITransport) over
fake llama.cpp backends (httpx.MockTransport): auth, add/remove/clear/list, least-assigned
assignment, moves off removed backends, pause/drain/resume with policy versions, durability
across gateways over one store, and request size limits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.store import CompletionLog
from rolloutd.trainer_client.admin import AdminError, BackendAdmin
from tests.proxy.support import (
    ADMIN_TOKEN,
    Backends,
    FakeLlamaCpp,
    asgi_client,
    chat,
    make_admin_gateway,
    openai_error,
    poll,
)

TOKEN = ADMIN_TOKEN
CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 16}


@pytest.fixture
def backends(fake_llama: FakeLlamaCpp) -> Backends:
    return Backends(fake_llama)


@pytest.fixture
async def gw(tmp_path: Path, tokenizer: Any, backends: Backends) -> AsyncIterator[Gateway]:
    gateway = make_admin_gateway(tmp_path / "store", tokenizer, backends)
    yield gateway
    await gateway.aclose()


@pytest.fixture
async def http(gw: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(gw) as c:
        yield c


@pytest.fixture
async def admin(gw: Gateway) -> AsyncIterator[BackendAdmin]:
    async with BackendAdmin(
        "http://gateway.test", TOKEN, transport=httpx.ASGITransport(app=gw.app)
    ) as a:
        yield a


def openai_error_message(response: httpx.Response, status: int) -> str:
    return str(openai_error(response, status)["message"])


# --------------------------------------------------------------------------- auth


async def test_admin_routes_need_the_admin_token(http: httpx.AsyncClient) -> None:
    assert "Bearer" in openai_error_message(await http.get("/admin/backends"), 401)
    wrong = await http.get("/admin/backends", headers={"Authorization": "Bearer nope"})
    assert openai_error_message(wrong, 401) == "invalid admin token"
    right = await http.get("/admin/backends", headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status_code == 200
    assert [b["name"] for b in right.json()["backends"]] == ["http://a"]


async def test_without_a_configured_token_admin_routes_are_disabled(
    tmp_path: Path, tokenizer: Any, backends: Backends
) -> None:
    gateway = make_admin_gateway(tmp_path / "s", tokenizer, backends, admin_token=None)
    transport = httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://g") as client:
        sent = await client.post(
            "/admin/backends",
            json={"url": "http://b"},
            headers={"Authorization": "Bearer anything"},
        )
        assert "ROLLOUTD_ADMIN_TOKEN" in openai_error_message(sent, 403)
        assert sent.json()["error"]["type"] == "permission_error"
        assert "no admin token configured" in openai_error_message(
            await client.get("/admin/backends"), 401
        )
    assert gateway.pool.names() == ["http://a"]
    await gateway.aclose()


async def test_bad_admin_input_is_a_4xx_in_openai_shape(http: httpx.AsyncClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    cases = [
        ("POST", "/admin/backends", {"url": "not a url"}, 400),
        ("POST", "/admin/backends", {"url": "http://b", "type": "tgi"}, 400),
        ("POST", "/admin/backends", {"url": "http://b", "policy_version": -1}, 400),
        ("POST", "/admin/backends", {"url": "http://b", "surprise": 1}, 400),
        ("POST", "/admin/policy_version", {}, 400),
        ("POST", "/admin/backends/pause", {"names": ["nope"]}, 404),
        ("DELETE", "/admin/backends/nope", None, 404),
        ("POST", "/admin/backends", {"url": "http://other", "name": "http://a"}, 409),
    ]
    for method, path, body, status in cases:
        response = await http.request(method, path, json=body, headers=auth)
        openai_error_message(response, status)
    not_json = await http.post("/admin/backends", content=b"{", headers=auth)
    openai_error_message(not_json, 400)


# --------------------------------------------------------------------------- the pool


async def test_add_list_policy_version_remove_clear(admin: BackendAdmin, gw: Gateway) -> None:
    added = await admin.add("http://b/", name="b", policy_version=3)
    assert added["name"] == "b" and added["url"] == "http://b" and added["policy_version"] == 3
    assert await admin.add("http://b", name="b") == added  # idempotent
    await admin.set_policy_version(5, names=["http://a"])
    listed = {b["name"]: b for b in await admin.list()}
    assert {n: b["policy_version"] for n, b in listed.items()} == {"http://a": 5, "b": 3}
    assert all(b["paused"] is False and b["num_in_flight"] == 0 for b in listed.values())
    assert await admin.remove("http://a") == {"removed": ["http://a"]}
    assert gw.pool.names() == ["b"]
    assert await admin.clear() == {"removed": ["b"]}
    assert await admin.list() == []
    with pytest.raises(AdminError) as raised:
        await admin.remove("b")
    assert raised.value.status_code == 404


async def test_new_sessions_go_to_the_least_assigned_backend(
    admin: BackendAdmin, gw: Gateway
) -> None:
    first = [(await gw.sessions.open_session(f"t/{i}", "t")).backend for i in range(2)]
    assert first == ["http://a", "http://a"]
    await admin.add("http://b", name="b")
    later = [(await gw.sessions.open_session(f"t/{i}", "t")).backend for i in range(2, 5)]
    assert later == ["b", "b", "http://a"]
    listed = {b["name"]: b["num_assigned"] for b in await admin.list()}
    assert listed == {"http://a": 3, "b": 2}


async def test_clear_and_add_moves_pinned_sessions_and_records_it(
    admin: BackendAdmin, gw: Gateway, http: httpx.AsyncClient, backends: Backends
) -> None:
    info = await gw.sessions.open_session("t/0", "t")
    first = await chat(http, info.session_key, "one")
    assert first.status_code == 200 and backends.hosts == ["a"]
    await admin.clear()
    await admin.add("http://b", name="b", policy_version=2)
    conversation = [
        {"role": "user", "content": "one"},
        first.json()["choices"][0]["message"],
        {"role": "user", "content": "two"},
    ]
    answer = await http.post(
        f"/s/{info.session_key}/v1/chat/completions", json={**CHAT, "messages": conversation}
    )
    assert answer.status_code == 200, answer.text
    assert backends.hosts == ["a", "b"]  # nothing reached the removed backend after clear
    completions = CompletionLog(gw.store, "t/0").read_all()
    assert [(c.backend, c.policy_version) for c in completions] == [("http://a", 0), ("b", 2)]
    session = await gw.sessions.get("t/0")
    assert session.state.backend == "b"
    [move] = session.state.backend_moves
    assert (move.moved_from, move.moved_to, move.at_index) == ("http://a", "b", 1)
    # the token chain survives the move: the second prompt extends the first call's tokens
    assert completions[1].extends == 0
    assert completions[1].prompt_ids[: len(completions[0].prompt_ids)] == completions[0].prompt_ids


async def test_pause_drains_in_flight_calls_and_holds_new_ones(
    admin: BackendAdmin, gw: Gateway, http: httpx.AsyncClient, backends: Backends
) -> None:
    a = await gw.sessions.open_session("t/0", "t")
    b = await gw.sessions.open_session("t/1", "t")
    backends.hold = asyncio.Event()
    in_flight = asyncio.create_task(chat(http, a.session_key))
    await poll(lambda: len(backends.hosts) == 1)
    pause = asyncio.create_task(admin.pause())
    await poll(lambda: gw.pool.describe()[0]["paused"])
    waiting = asyncio.create_task(chat(http, b.session_key))
    for _ in range(50):  # let the waiting call run as far as it can
        await asyncio.sleep(0)
    assert not pause.done() and not waiting.done() and len(backends.hosts) == 1
    backends.hold.set()  # the call in flight finishes: the drain completes
    assert (await in_flight).status_code == 200
    drained = await pause
    assert drained["drained"] is True and drained["num_in_flight"] == 0
    assert not waiting.done() and len(backends.hosts) == 1
    await admin.set_policy_version(7)
    await admin.resume()
    assert (await waiting).status_code == 200
    versions = [CompletionLog(gw.store, s).read_all()[0].policy_version for s in ("t/0", "t/1")]
    assert versions == [0, 7]


async def test_a_call_waits_for_a_backend_then_fails_with_503(
    tmp_path: Path, tokenizer: Any, backends: Backends
) -> None:
    gateway = make_admin_gateway(tmp_path / "s", tokenizer, backends, backend_wait_s=0.05)
    info = await gateway.sessions.open_session("t/0", "t")
    await gateway.pool.remove(None)
    transport = httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://g") as client:
        response = await chat(client, info.session_key)
    assert "no backend is registered" in openai_error_message(response, 503)
    assert backends.hosts == []
    await gateway.aclose()


async def test_the_pool_is_durable_across_gateways(
    tmp_path: Path, tokenizer: Any, backends: Backends, admin: BackendAdmin, gw: Gateway
) -> None:
    await admin.add("http://b", name="b", policy_version=4)
    await admin.remove("http://a")
    await admin.pause(names=["b"])
    # a second gateway over the same store, started with other settings, sees the pool
    second = make_admin_gateway(
        Path(gw.settings.store_url), tokenizer, backends, backend_url="http://c"
    )
    [entry] = second.pool.describe()
    assert (entry["name"], entry["url"], entry["policy_version"], entry["paused"]) == (
        "b",
        "http://b",
        4,
        True,
    )
    assert second.pool.get("b").policy_version == 4
    await second.aclose()


async def test_a_running_replica_follows_pool_changes_made_on_another(
    tmp_path: Path, tokenizer: Any, backends: Backends
) -> None:
    """Two gateways over one store, both running: clear-and-add and pause/resume done through
    the first reach the second's next call. ``pool_refresh_s`` is ~0 here, so the second
    looks at the store before every lease (1 s by default)."""
    store = tmp_path / "store"
    first = make_admin_gateway(store, tokenizer, backends)
    second = make_admin_gateway(store, tokenizer, backends, pool_refresh_s=1e-9)
    info = await second.sessions.open_session("t/0", "t")
    transport = httpx.ASGITransport(app=second.app, raise_app_exceptions=False)
    async with (
        BackendAdmin("http://first", TOKEN, transport=httpx.ASGITransport(app=first.app)) as admin,
        httpx.AsyncClient(transport=transport, base_url="http://second") as client,
    ):
        assert (await chat(client, info.session_key, "one")).status_code == 200
        await admin.clear()
        await admin.add("http://b", name="b", policy_version=3)
        assert (await chat(client, info.session_key, "two")).status_code == 200
        assert backends.hosts == ["a", "b"]  # the second replica dropped the removed backend
        await admin.pause()
        waiting = asyncio.create_task(chat(client, info.session_key, "three"))
        # the call reloaded the pool before its lease: once the second sees the pause, the
        # call is held by it
        await poll(lambda: second.pool.describe()[0]["paused"])
        assert not waiting.done() and len(backends.hosts) == 2
        await admin.resume()
        assert (await waiting).status_code == 200
    assert backends.hosts == ["a", "b", "b"]
    completions = CompletionLog(second.store, "t/0").read_all()
    assert [(c.backend, c.policy_version) for c in completions] == [
        ("http://a", 0),
        ("b", 3),
        ("b", 3),
    ]
    await first.aclose()
    await second.aclose()


async def test_an_unmanaged_pool_follows_the_settings(
    tmp_path: Path, tokenizer: Any, backends: Backends
) -> None:
    first = make_admin_gateway(tmp_path / "s", tokenizer, backends, backend_url="http://a")
    await first.aclose()
    second = make_admin_gateway(tmp_path / "s", tokenizer, backends, backend_url="http://c")
    assert second.pool.names() == ["http://c"]
    await second.aclose()


async def test_an_operator_states_a_backends_logprob_mode_and_routed_experts(
    tmp_path: Path,
    tokenizer: Any,
    backends: Backends,
    admin: BackendAdmin,
    gw: Gateway,
    http: httpx.AsyncClient,
) -> None:
    """The options an operator sets when adding a backend (a vLLM started with
    ``--logprob-mode processed_logprobs`` is stated ``processed``; an SGLang is asked for its
    routed experts) are in the admin list, stamped on the completions the backend samples,
    and kept in the stored pool; the settings state them for the backends they name."""
    on_a = await gw.sessions.open_session("t/0", "t")
    stated = await admin.add("http://b", name="b", logprob_mode="processed")
    assert stated["logprob_mode"] == "processed"
    on_b = await gw.sessions.open_session("t/1", "t")
    assert (on_a.backend, on_b.backend) == ("http://a", "b")
    for info in (on_a, on_b):
        assert (await chat(http, info.session_key)).status_code == 200
    modes = [CompletionLog(gw.store, s).read_all()[0].logprob_mode for s in ("t/0", "t/1")]
    assert modes == ["raw", "processed"]  # llama.cpp's own mode, then the operator's

    await admin.add("http://s", type="sglang", name="s", return_routed_experts=True)
    await admin.add("http://s2", type="sglang", name="s2", routed_experts_shape=(2, 4))
    listed = {b["name"]: b for b in await admin.list()}
    assert {n: b["logprob_mode"] for n, b in listed.items()} == {
        "http://a": "raw",
        "b": "processed",
        "s": "temperature",
        "s2": "temperature",
    }
    assert (listed["s"]["return_routed_experts"], listed["s2"]["routed_experts_shape"]) == (
        True,
        [2, 4],
    )
    # the same name with other options is another backend: refused, as another URL is
    with pytest.raises(AdminError) as raised:
        await admin.add("http://b", name="b")
    assert raised.value.status_code == 409
    # routed-experts options on a kind that takes none: refused, naming why
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for body in ({"return_routed_experts": True}, {"routed_experts_shape": [2, 4]}):
        refused = await http.post("/admin/backends", json={"url": "http://c", **body}, headers=auth)
        assert "sglang backend only" in openai_error_message(refused, 400)
    bad_shape = {"url": "http://c", "type": "sglang", "routed_experts_shape": [0, 4]}
    openai_error_message(await http.post("/admin/backends", json=bad_shape, headers=auth), 400)

    # a second gateway over the same store builds its clients with the stored options
    second = make_admin_gateway(Path(gw.settings.store_url), tokenizer, backends)
    assert second.pool.get("b").logprob_mode == "processed"
    routed = second.pool.get("s2")
    assert (routed.return_routed_experts, routed.routed_experts_shape) == (False, (2, 4))  # type: ignore[attr-defined]
    await second.aclose()

    from_settings = make_admin_gateway(
        tmp_path / "other", tokenizer, backends, backend_logprob_mode="temperature"
    )
    assert from_settings.pool.get("http://a").logprob_mode == "temperature"
    await from_settings.aclose()


# --------------------------------------------------------------------------- size limits


async def test_bodies_over_the_limit_get_413_in_each_dialect(
    tmp_path: Path, tokenizer: Any, backends: Backends
) -> None:
    gateway = make_admin_gateway(tmp_path / "s", tokenizer, backends, max_body_bytes=2048)
    info = await gateway.sessions.open_session("t/0", "t")
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 4096}]}
    base = f"/s/{info.session_key}"
    transport = httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://g") as client:
        openai = await client.post(f"{base}/v1/chat/completions", json=big)
        assert "2048 bytes" in openai_error_message(openai, 413)
        anthropic = await client.post(f"{base}/v1/messages", json=big)
        assert anthropic.status_code == 413
        assert anthropic.json()["error"]["type"] == "request_too_large"
        gemini = await client.post(f"{base}/v1beta/models/m:generateContent", json=big)
        assert gemini.status_code == 413 and gemini.json()["error"]["code"] == 413

        async def chunks() -> AsyncIterator[bytes]:  # no content-length: cut off while read
            for _ in range(10):
                yield b" " * 1024

        chunked = await client.post(f"{base}/v1/chat/completions", content=chunks())
        openai_error_message(chunked, 413)
        headers = await client.get("/health", headers={"x-big": "y" * 70_000})
        openai_error_message(headers, 431)
    assert backends.hosts == []
    await gateway.aclose()
