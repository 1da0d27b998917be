"""The closed loop on CPU with a real llama-server: rollout through the gateway, an optimizer
step in PyTorch, GGUF export, weight sync, and again.

After each sync the engine's greedy logprobs of a probe prompt equal the trainer's within
``TOLERANCE`` (the F32 export's floor: about 0.001 nats mean on SmolLM2-135M), and the next
completion carries the step's policy version. The engine here is a separate llama-server on
SmolLM2-135M (the one test that reloads weights has its own engine); the gateway runs in-process.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.settings import GatewaySettings
from rolloutd.store import CompletionLog
from rolloutd.trainer_client.admin import BackendAdmin
from rolloutd.types import SamplingParams

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from rolloutd.trainer_client.training.gguf_export import export_gguf  # noqa: E402
from rolloutd.trainer_client.training.probe import probe  # noqa: E402
from rolloutd.trainer_client.training.weight_sync import EngineLoader, WeightSync  # noqa: E402
from tests.support.trainer_model import load_trainer_model  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "smollm2-135m"
TOKEN = "admin-secret"
#: mean |engine - trainer| after a sync, nats: 10x and more the F32 floor measured here
#: (about 0.001); one optimizer step below moves the probe by more (checked before each sync)
TOLERANCE = 0.03
NUM_STEPS = 2
#: short answers: the session's sampling wins over the request's (policy "override")
SAMPLING = SamplingParams(max_tokens=12, temperature=1.0)


@pytest.mark.timeout(900)
async def test_each_sync_serves_the_trainers_weights_and_version(tmp_path: Path) -> None:

    trainer = load_trainer_model(MODEL)
    files, tokenizer, model = trainer.files, trainer.tokenizer, trainer.model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    probe_ids = trainer.chat_ids("Name three colours.")

    engine = trainer.start_engine(tmp_path)
    gateway = Gateway.from_settings(
        GatewaySettings(
            store_url=str(tmp_path / "store"),
            backend_url=engine.url,
            model=MODEL,
            gateway_public_url="http://gateway.test",
            admin_token=TOKEN,
        ),
        tokenizer=tokenizer,
    )
    transport = httpx.ASGITransport(app=gateway.app)
    try:
        async with (
            BackendAdmin("http://gateway.test", TOKEN, transport=transport) as admin,
            httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http,
        ):
            sync = WeightSync(admin, [EngineLoader(engine, timeout_s=180)])
            assert probe(model, engine.url, probe_ids).mean_abs_diff < TOLERANCE
            for step in range(1, NUM_STEPS + 1):
                # rollout on the current policy, through the gateway
                info = await gateway.sessions.open_session(
                    f"loop/{step}", "loop", sampling=SAMPLING
                )
                answer = await http.post(
                    f"/s/{info.session_key}/v1/chat/completions",
                    json={
                        "model": MODEL,
                        "max_tokens": 12,
                        "temperature": 1.0,
                        "messages": [{"role": "user", "content": "Say something short."}],
                    },
                )
                assert answer.status_code == 200, answer.text
                [completion] = CompletionLog(gateway.store, f"loop/{step}").read_all()
                assert completion.policy_version == step - 1
                # one optimizer step: raise the likelihood of the sampled response
                ids = torch.tensor([completion.prompt_ids + completion.response_ids])
                logits = model(ids).logits[0, len(completion.prompt_ids) - 1 : -1]
                logp = torch.log_softmax(logits, -1).gather(
                    1, torch.tensor(completion.response_ids)[:, None]
                )
                optimizer.zero_grad()
                (-logp.mean()).backward()
                optimizer.step()
                # the engine still serves the old weights: the step is visible to the probe
                stale = probe(model, engine.url, probe_ids)
                assert stale.mean_abs_diff > TOLERANCE, stale
                path = export_gguf(model.state_dict(), files.gguf, tmp_path / f"p{step}.gguf")
                await sync.update(path, policy_version=step)

                synced = probe(model, engine.url, probe_ids)
                assert synced.mean_abs_diff < TOLERANCE, synced
                assert engine.policy_version == step
                print(
                    f"step {step}: probe mean_abs_diff stale={stale.mean_abs_diff:.4f} "
                    f"synced={synced.mean_abs_diff:.4f} max={synced.max_abs_diff:.4f}"
                )
            # a completion after the last sync carries its version
            info = await gateway.sessions.open_session("loop/after", "loop", sampling=SAMPLING)
            answer = await http.post(
                f"/s/{info.session_key}/v1/chat/completions",
                json={
                    "model": MODEL,
                    "max_tokens": 4,
                    "messages": [{"role": "user", "content": "Hi"}],
                },
            )
            assert answer.status_code == 200, answer.text
            [last] = CompletionLog(gateway.store, "loop/after").read_all()
            assert last.policy_version == NUM_STEPS
    finally:
        await gateway.aclose()
        engine.stop()
