"""TRL bridge, the training side: :class:`EngineSyncCallback`, a transformers
``TrainerCallback`` that writes a TRL trainer's weights to rolloutd's engine after every
optimizer step (tested against ``trl`` 1.16.0 in examples/trl_grpo.py's run).

Apart from :mod:`rolloutd.trainer_client.bridges.trl` (the rollout function) because it
imports transformers, gguf and torch (through the GGUF export and the probe): the rollout
function's module imports with rolloutd's client install alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from rolloutd.trainer_client.training.gguf_export import export_gguf
from rolloutd.trainer_client.training.probe import ProbeResult, probe
from rolloutd.trainer_client.training.weight_sync import WeightSync

__all__ = ["EngineSyncCallback"]


class EngineSyncCallback(TrainerCallback):
    """After every optimizer step: the trainer's weights to the engine, then a probe.

    ``on_step_end``: export the model's fp32 weights as a GGUF (the catalog model's GGUF as
    template, :func:`~rolloutd.trainer_client.training.gguf_export.export_gguf`), run
    :meth:`WeightSync.update` (pause, engine reload, ``policy_version = global_step``,
    resume) and compare the engine's logprobs with the trainer's on a probe prompt
    (:func:`~rolloutd.trainer_client.training.probe.probe`). Rollouts of the next step then
    sample the new weights. transformers' ``TrainerCallback`` API.

    Args:
        sync: the weight sync (admin client and the engine's loader).
        run: runs ``sync``'s coroutines from the trainer's thread.
        template: the catalog model's GGUF (metadata, tokenizer).
        out_dir: where the GGUFs go (the previous one is deleted after each sync).
        engine_url: llama-server's URL for the probe (None: no probe).
        probe_ids: the probe prompt, list[int].
        on_sync: called with ``(step, sync_s, probe_result)`` after each sync.

    Attributes:
        rows: one dict per step: ``step``, ``export_s``, ``sync_s``, ``probe_mismatch``,
            ``probe_max``.
    """

    def __init__(
        self,
        sync: WeightSync,
        run: Callable[[Any], Any],
        template: str | Path,
        out_dir: str | Path,
        *,
        engine_url: str | None = None,
        probe_ids: Sequence[int] = (),
        on_sync: Callable[[int, float, ProbeResult | None], None] | None = None,
    ) -> None:
        self.sync = sync
        self.run = run
        self.template = Path(template)
        self.out_dir = Path(out_dir)
        self.engine_url = engine_url
        self.probe_ids = list(probe_ids)
        self.on_sync = on_sync
        self.rows: list[dict[str, Any]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Sync the weights of ``kwargs["model"]`` as policy version ``state.global_step``."""
        model = kwargs["model"]
        step = int(state.global_step)
        t0 = time.monotonic()
        path = export_gguf(model.state_dict(), self.template, self.out_dir / f"policy-{step}.gguf")
        export_s = time.monotonic() - t0
        sync_s = self.run(self.sync.update(path, policy_version=step))
        for old in self.out_dir.glob("policy-*.gguf"):
            if old != path:
                old.unlink(missing_ok=True)
        result = None
        if self.engine_url and self.probe_ids:
            was_training = model.training
            model.eval()
            result = probe(model, self.engine_url, self.probe_ids)
            model.train(was_training)
        self.rows.append(
            {
                "step": step,
                "export_s": export_s,
                "sync_s": sync_s,
                "probe_mismatch": None if result is None else result.mean_abs_diff,
                "probe_max": None if result is None else result.max_abs_diff,
            }
        )
        if self.on_sync is not None:
            self.on_sync(step, sync_s, result)
