"""A trainer in another process reloads the local engine through the gateway's admin API.

``POST /admin/engine/load`` on the gateway -> the engine control server (real HTTP on a
loopback port, :mod:`rolloutd.engine.control`) -> ``LlamaServer.load_model``: a real
llama-server on SmolLM2-135M restarts on an F16 GGUF the trainer wrote after an optimizer
step. The trainer's side is :class:`GatewayEngineLoader` inside :class:`WeightSync`, so the
test also checks that the engine's probe logprobs equal the trainer's after the sync (within
``TOLERANCE``) and that the next completion carries the new policy version. The gateway runs
in-process (ASGI); the control hop is real HTTP. A last test runs ``LocalStack`` (what
``rolloutd up`` runs), whose gateway is its own process, and reloads its engine the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.engine.control import EngineControlServer
from rolloutd.engine.models import load_tokenizer
from rolloutd.proxy.http.server import Gateway
from rolloutd.settings import GatewaySettings
from rolloutd.store import CompletionLog
from rolloutd.trainer_client.admin import AdminError, BackendAdmin
from rolloutd.trainer_client.training.weight_sync import (
    GatewayEngineLoader,
    WeightSync,
    WeightSyncError,
)
from rolloutd.types import SamplingParams
from tests.proxy.support import MODEL as PROXY_MODEL

MODEL = "smollm2-135m"
TOKEN = "admin-secret"
#: mean |engine - trainer| after a sync, nats (the F16 floor is about 0.002 here)
TOLERANCE = 0.03


def _gateway(store: Path, tokenizer: Any, **settings: Any) -> Gateway:
    return Gateway.from_settings(
        GatewaySettings(
            store_url=str(store),
            model=MODEL,
            gateway_public_url="http://gateway.test",
            admin_token=TOKEN,
            **settings,
        ),
        tokenizer=tokenizer,
    )


async def test_a_gateway_without_a_local_engine_refuses_the_load(tmp_path: Path) -> None:
    # any tokenizer: no call reaches a backend
    gateway = _gateway(tmp_path / "store", load_tokenizer(PROXY_MODEL), backend_url="http://a")
    transport = httpx.ASGITransport(app=gateway.app)
    try:
        async with BackendAdmin("http://gateway.test", TOKEN, transport=transport) as admin:
            with pytest.raises(AdminError) as refused:
                await admin.load_engine(str(tmp_path / "x.gguf"), 1)
            assert refused.value.status_code == 409
            assert "no local engine" in str(refused.value)
        async with BackendAdmin("http://gateway.test", "wrong", transport=transport) as bad:
            with pytest.raises(AdminError) as denied:
                await bad.load_engine(str(tmp_path / "x.gguf"), 1)
            assert denied.value.status_code == 401
    finally:
        await gateway.aclose()


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(1800)  # under load 30 here: 10 min to load the model, 80 s per export
async def test_the_gateway_reloads_the_local_engine_on_the_trainers_gguf(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from rolloutd.trainer_client.training.gguf_export import export_gguf
    from rolloutd.trainer_client.training.probe import probe
    from tests.support.trainer_model import load_trainer_model

    trainer = load_trainer_model(MODEL)
    files, tokenizer, model = trainer.files, trainer.tokenizer, trainer.model
    probe_ids = trainer.chat_ids("Name three colours.")
    engine = trainer.start_engine(tmp_path)
    control = EngineControlServer(engine).start()
    gateway = _gateway(
        tmp_path / "store",
        tokenizer,
        backend_url=engine.url,
        engine_control_url=control.url,
        engine_control_token=control.token,
    )
    transport = httpx.ASGITransport(app=gateway.app)
    try:
        async with (
            BackendAdmin("http://gateway.test", TOKEN, transport=transport) as admin,
            httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http,
        ):
            # one optimizer step: raise the likelihood of a fixed answer
            ids = torch.tensor([probe_ids + tokenizer.encode("Red, green, blue.")])
            logits = model(ids).logits[0, len(probe_ids) - 1 : -1]
            logp = torch.log_softmax(logits, -1).gather(1, ids[0, len(probe_ids) :, None])
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
            (-logp.mean()).backward()
            optimizer.step()
            stale = probe(model, engine.url, probe_ids)
            assert stale.mean_abs_diff > TOLERANCE, stale  # the step is visible to the probe
            path = export_gguf(model.state_dict(), files.gguf, tmp_path / "policy-1.gguf")

            sync = WeightSync(admin, [GatewayEngineLoader(admin, timeout_s=180)])
            await sync.update(path, policy_version=1)

            synced = probe(model, engine.url, probe_ids)
            assert synced.mean_abs_diff < TOLERANCE, synced
            assert engine.policy_version == 1
            assert engine.files.gguf == path
            state = httpx.get(
                f"{control.url}/engine", headers={"Authorization": f"Bearer {control.token}"}
            ).json()
            assert state == {"model_file": str(path), "policy_version": 1}
            info = await gateway.sessions.open_session(
                "control/after", "control", sampling=SamplingParams(max_tokens=4)
            )
            answer = await http.post(
                f"/s/{info.session_key}/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
            )
            assert answer.status_code == 200, answer.text
            [last] = CompletionLog(gateway.store, "control/after").read_all()
            assert last.policy_version == 1
            print(
                f"probe mean_abs_diff stale={stale.mean_abs_diff:.4f} "
                f"synced={synced.mean_abs_diff:.4f}"
            )

            # refusals pass through with their status; the engine keeps serving version 1
            loader = GatewayEngineLoader(admin, timeout_s=60)
            with pytest.raises(WeightSyncError, match="400"):
                await loader.load(tmp_path / "missing.gguf", 2)
            with pytest.raises(WeightSyncError, match="409"):
                await loader.load(path, 0)
            wrong = httpx.post(
                f"{control.url}/engine/load",
                json={"model_file": str(path), "policy_version": 2},
                headers={"Authorization": "Bearer wrong"},
            )
            assert wrong.status_code == 401
            assert engine.policy_version == 1
            assert probe(model, engine.url, probe_ids).mean_abs_diff < TOLERANCE
    finally:
        await gateway.aclose()
        control.stop()
        engine.stop()


@pytest.mark.engine
@pytest.mark.temporal
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_rolloutd_up_serves_the_load_route_for_its_own_engine(
    tmp_path: Path, monkeypatch
) -> None:
    """``LocalStack`` (what ``rolloutd up`` runs): its gateway is another process, started with
    the control server's URL and token; the trainer here reloads the stack's engine through it, with
    the admin token the stack generated (docs/decisions.md, "An admin token by default": none was
    configured). The supervisor owns the new file and version and does not count the reload as a
    crash. The GGUF is a copy of the catalog file: what is checked is which file is served."""
    import asyncio
    import os
    import shutil
    import tempfile

    from rolloutd.engine.models import pull_model
    from rolloutd.settings import admin_token_file, find_admin_token
    from rolloutd.stack import free_port, read_state
    from rolloutd.stack.local import LocalStack

    monkeypatch.delenv("ROLLOUTD_ADMIN_TOKEN", raising=False)

    files = pull_model(MODEL)
    # short and outside pytest's basetemp (runtimes hold AF_UNIX sockets; see the
    # reliability tests)
    home = Path(tempfile.mkdtemp(prefix="rolloutd-ctl-"))
    new_file = tmp_path / "policy-1.gguf"
    shutil.copyfile(files.gguf, new_file)
    stack = LocalStack(
        home=home,
        model=MODEL,
        fleets=("gateway",),
        supervise=True,
        temporal_port=free_port(),
        ui_port=free_port(),
        gateway_port=free_port(),
        engine_port=free_port(),
        engine_parallel=1,
        engine_ctx_size=2048,
        extra_env={"ROLLOUTD_LOG_JSON": "false", "ROLLOUTD_HOST_ID": f"ctl-{os.getpid()}"},
    )
    try:
        await asyncio.to_thread(stack.start)
        assert stack.engine_control is not None and stack.engine is not None
        token = find_admin_token(home)
        assert token is not None and token == stack.admin_token
        assert admin_token_file(home).stat().st_mode & 0o777 == 0o600
        async with BackendAdmin(stack.gateway_url, "wrong") as refused:
            with pytest.raises(AdminError) as info:
                await refused.list()
            assert info.value.status_code == 401
        async with BackendAdmin(stack.gateway_url, token) as admin:
            sync = WeightSync(admin, [GatewayEngineLoader(admin, timeout_s=180)])
            await sync.update(new_file, policy_version=1)
            [backend] = await admin.list()
            assert backend["policy_version"] == 1 and not backend["paused"]
        assert (stack.model_file, stack.policy_version) == (new_file, 1)
        assert httpx.get(f"{stack.engine.url}/health").status_code == 200
        state = read_state(home)
        assert state is not None and state.engine is not None
        assert (state.engine.model_file, state.engine.policy_version) == (str(new_file), 1)
        engine_child = next(c for c in state.children if c.name == "engine")
        assert engine_child.restarts == 0  # a deliberate reload is not a crash
        assert "policy-1.gguf" in " ".join(stack.engine.command())
    finally:
        await asyncio.to_thread(stack.stop)
        shutil.rmtree(home, ignore_errors=True)
