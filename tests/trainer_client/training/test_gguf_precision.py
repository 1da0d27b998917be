"""Why weight sync exports F32 by default: F16 rounds a small training update away.

SmolLM2-135M takes 3 Adam steps (lr 1e-5, as the closed-loop example) toward a reply to the
probe prompt, then the same weights are exported as F32 and as F16 and each is served by a real
llama-server. F32 keeps the engine at the trainer's logprobs (the compute floor, about 0.001
nats); F16 leaves it behind by the part of the update smaller than half an F16 ULP, 30-50x
more (0.038 and 0.074 nats measured on two prompts). The test pins both: a regression to F16
by default, or an export that loses the update, fails it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from rolloutd.trainer_client.training.gguf_export import export_gguf  # noqa: E402
from rolloutd.trainer_client.training.probe import probe  # noqa: E402
from tests.support.trainer_model import load_trainer_model  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "smollm2-135m"
#: mean |engine - trainer| on the probe, nats: F32 stays under it, F16 after training does not
F32_FLOOR = 0.005


@pytest.mark.timeout(900)
def test_f32_keeps_a_small_update_that_f16_rounds_away(tmp_path: Path) -> None:
    from rolloutd.engine.server import LlamaServer

    trainer = load_trainer_model(MODEL)
    files, model = trainer.files, trainer.model
    prompt = trainer.chat_ids("Describe the ocean in one word.")
    reply = trainer.tokenizer.encode(
        " Blue waves whisper secrets to the moonlit shore, endlessly.", add_special_tokens=False
    )
    ids = torch.tensor([prompt + reply])
    labels = torch.tensor([[-100] * len(prompt) + reply])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    for _ in range(3):
        loss = model(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    mismatch = {}
    for dtype in ("f32", "f16"):
        path = export_gguf(model.state_dict(), files.gguf, tmp_path / f"{dtype}.gguf", dtype=dtype)
        with LlamaServer(
            dataclasses.replace(files, gguf=path), parallel=1, ctx_size=1024, threads=2
        ) as engine:
            mismatch[dtype] = probe(model, engine.url, prompt, 32).mean_abs_diff
    print(
        f"\nprobe after 3 Adam steps: F32 {mismatch['f32']:.4f} nats, "
        f"F16 {mismatch['f16']:.4f} nats"
    )
    assert mismatch["f32"] < F32_FLOOR
    assert mismatch["f16"] > 5 * mismatch["f32"]
    # the default is the one that keeps the update
    assert export_gguf.__kwdefaults__["dtype"] == "f32"
