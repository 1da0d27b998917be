"""SessionManager: keys, durable state, restart, close, pinning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.errors import AuthenticationError, ConfigError, NotFoundError, SessionClosedError
from rolloutd.proxy.backends.llama_cpp import LlamaCppBackend
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.specs import backend_urls
from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.manager import SessionManager
from rolloutd.proxy.sessions.state import (
    SessionState,
    hash_session_key,
    session_key_index,
    session_state_key,
)
from rolloutd.settings import GatewaySettings
from rolloutd.store import BlobStore
from rolloutd.types import SamplingParams
from tests.proxy.support import FAKE_URL, FakeLlamaCpp


async def test_open_persists_state_and_returns_base_urls(gateway: Gateway) -> None:
    info = await gateway.sessions.open_session(
        "mytask/3", "mytask", sampling=SamplingParams(temperature=0.5)
    )
    key = info.session_key
    assert len(key) >= 32
    assert info.openai_base_url == f"http://gateway.test/s/{key}/v1"
    assert info.anthropic_base_url == info.gemini_base_url == f"http://gateway.test/s/{key}"
    assert info.backend == "http://fake-llama"
    state = gateway.store.get_json(session_state_key("mytask/3"))
    assert state["session_id"] == "mytask/3" and state["sampling"]["temperature"] == 0.5
    assert gateway.store.get_json(session_key_index(key)) == {"session_id": "mytask/3"}
    assert key not in session_key_index(key)
    # only verification is needed: the store holds the key's hash, nowhere the key
    assert state["session_key_sha256"] == hash_session_key(key)
    stored = [p.read_text() for p in Path(gateway.store.url).rglob("*") if p.is_file()]
    assert stored and not any(key in text for text in stored)


async def test_a_state_written_with_a_clear_key_is_read_as_its_hash() -> None:
    state = SessionState.model_validate(
        {
            "session_id": "t/0",
            "task_id": "t",
            "model": "m",
            "backend": "b",
            "session_key": "old-key",
        }
    )
    assert state.session_key_sha256 == hash_session_key("old-key")
    assert "old-key" not in state.model_dump_json()


async def test_a_retried_open_rekeys_and_closed_sessions_stay_closed(gateway: Gateway) -> None:
    first = await gateway.sessions.open_session("t/0", "t")
    again = await gateway.sessions.open_session("t/0", "t")
    assert again.session_key != first.session_key
    assert again.model_copy(
        update={
            "session_key": "",
            "openai_base_url": "",
            "anthropic_base_url": "",
            "gemini_base_url": "",
        }
    ) == first.model_copy(
        update={
            "session_key": "",
            "openai_base_url": "",
            "anthropic_base_url": "",
            "gemini_base_url": "",
        }
    )
    assert (await gateway.sessions.lookup(again.session_key)).session_id == "t/0"
    with pytest.raises(AuthenticationError):  # the earlier attempt's key reached no one
        await gateway.sessions.lookup(first.session_key)
    fresh = SessionManager(
        BlobStore(gateway.store.url), gateway.pool, public_url="http://other", default_model="m"
    )
    with pytest.raises(AuthenticationError):
        await fresh.lookup(first.session_key)
    assert (await fresh.lookup(again.session_key)).session_id == "t/0"
    assert await gateway.sessions.close_session("t/0") == 0
    assert await gateway.sessions.close_session("t/0") == 0
    with pytest.raises(SessionClosedError):
        await gateway.sessions.open_session("t/0", "t")


async def test_a_new_manager_serves_sessions_from_the_store(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    info = await gateway.sessions.open_session("t/1", "t")
    response = await client.post(
        f"/s/{info.session_key}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200
    restarted = SessionManager(
        BlobStore(gateway.store.url), gateway.pool, public_url="http://other", default_model="m"
    )
    session = await restarted.lookup(info.session_key)
    assert session.session_id == "t/1"
    assert [c.index for c in session.completions] == [0]
    assert session.by_hash == {session.completions[0].request_hash: [0]}
    # a restart may have cut its answer: its delivery is unknown, so the same request again
    # is a retry of it
    assert (
        session.find_retry(session.completions[0].request_hash, marked=False)
        is session.completions[0]
    )
    assert await restarted.close_session("t/1") == 1
    again = SessionManager(
        BlobStore(gateway.store.url), gateway.pool, public_url="http://other", default_model="m"
    )
    with pytest.raises(AuthenticationError, match="closed"):
        (await again.lookup(info.session_key)).ensure_open()


async def test_unknown_keys_and_sessions(gateway: Gateway) -> None:
    with pytest.raises(AuthenticationError):
        await gateway.sessions.lookup(None)
    with pytest.raises(AuthenticationError):
        await gateway.sessions.lookup("not-a-key")
    with pytest.raises(NotFoundError):
        await gateway.sessions.close_session("nope/0")


async def test_sessions_go_to_the_least_assigned_backend(tmp_path: Path) -> None:
    pool = BackendPool([LlamaCppBackend("a", "http://a"), LlamaCppBackend("b", "http://b")])
    manager = SessionManager(
        BlobStore(str(tmp_path)), pool, public_url="http://g", default_model="m"
    )
    backends = [(await manager.open_session(f"t/{i}", "t")).backend for i in range(3)]
    assert backends == ["a", "b", "a"]
    await manager.close_session("t/1")
    assert (await manager.open_session("t/3", "t")).backend == "b"
    await pool.aclose()


def test_backend_urls_setting() -> None:
    assert backend_urls(None) == []
    assert backend_urls("http://a:1/, http://b:2") == ["http://a:1", "http://b:2"]


async def test_passthrough_on_a_token_backend_is_refused_per_call(gateway: Gateway) -> None:
    info = await gateway.sessions.open_session("t/9", "t", capture_mode="passthrough")
    session = await gateway.sessions.lookup(info.session_key)
    from rolloutd.proxy.dialects import openai_chat

    request = openai_chat.parse({"messages": [{"role": "user", "content": "x"}]})
    with pytest.raises(ConfigError, match="passthrough"):
        await gateway.service.complete(session, request)


async def test_a_copy_another_gateway_took_over_gives_its_backend_place_back(
    tmp_path: Path,
) -> None:
    # two gateways on one store, each with its own pool of the same backend
    pools = [BackendPool([LlamaCppBackend("a", "http://a")]) for _ in range(2)]
    first, second = (
        SessionManager(BlobStore(str(tmp_path)), pool, public_url="http://g", default_model="m")
        for pool in pools
    )
    await first.open_session("t/0", "t")  # its answer was lost: the open timed out
    await first.open_session("t/1", "t")  # served here to the end
    await first.open_session("t/2", "t")  # re-opened elsewhere, then sealed there
    await second.open_session("t/0", "t")  # the retried open, on the other gateway
    await second.open_session("t/2", "t")
    await second.close_session("t/2")
    assert pools[0].num_assigned("a") == 3 and pools[1].num_assigned("a") == 1
    # a copy in use is never asked about
    assert await first.drop_superseded(idle_s=3600) == []
    assert sorted(await first.drop_superseded(idle_s=0)) == ["t/0", "t/2"]
    assert pools[0].num_assigned("a") == 1
    assert first.counts() == {"in_memory": 1, "open": 1, "keys": 1}
    # the gateway serving its sessions keeps them, and so does the first for t/1
    assert await second.drop_superseded(idle_s=0) == []
    assert await first.drop_superseded(idle_s=0) == []
    assert second.counts()["open"] == 1
    for pool in pools:
        await pool.aclose()


async def test_sessions_open_in_the_gateways_capture_mode(
    tmp_path: Path, tokenizer: Any, fake_llama: FakeLlamaCpp
) -> None:
    """``ROLLOUTD_CAPTURE_MODE`` is the mode of every session the gateway opens without one
    (an engine that takes no token prompts: `rolloutd up --engine-kind openai`); a mode the
    opener names still wins. Control: the default gateway opens ``tokens`` sessions."""
    settings = GatewaySettings(store_url=str(tmp_path / "store"), backend_url=FAKE_URL)
    for mode, expected in (("tokens", "tokens"), ("passthrough", "passthrough")):
        gw = Gateway.from_settings(
            settings.model_copy(update={"capture_mode": mode}),
            tokenizer=tokenizer,
            transport=fake_llama.transport,
        )
        info = await gw.sessions.open_session(f"m-{mode}/0", f"m-{mode}")
        session = await gw.sessions.lookup(info.session_key)
        assert session.state.capture_mode.value == expected
        named = await gw.sessions.open_session(f"n-{mode}/0", f"n-{mode}", capture_mode="tokens")
        assert (await gw.sessions.lookup(named.session_key)).state.capture_mode.value == "tokens"
        await gw.aclose()
