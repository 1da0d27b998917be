"""TRL's own GRPOTrainer on CPU, its rollouts from rolloutd, weights synced to the engine after
every step.

What runs (everything on this machine, everything stopped by its id at the end):

- the stack of ``examples/grpo_loop.py`` (:func:`grpo_loop.local_stack`): a Temporal dev
  server, the four fleets in this process, llama-server on SmolLM2-135M-Instruct from an F32
  GGUF the trainer wrote from its own weights (engine and trainer start equal), the engine's
  control server;
- ``trl.GRPOTrainer`` (TRL's loss, its AdamW, its advantages) with
  ``rollout_func=rolloutd.trainer_client.bridges.trl.RolloutFunc``: each run of G equal
  prompts becomes one rolloutd task of G sessions; each session is the ``shell`` harness in a
  **bwrap** sandbox running ``ask.py`` (one chat call through the gateway), scored by the
  evaluator ``grpo_loop_reply_reward`` (``grpo_loop:ReplyReward``, registered by name with
  the fleets: 1 / words of the reply, base rate about 0.3);
- after each optimizer step, :class:`~rolloutd.trainer_client.bridges.trl_sync.EngineSyncCallback`:
  GGUF export, weight sync (pause, engine reload, ``policy_version = step``, resume), probe;
  then the held-out reward (categories never trained on, fixed seeds, straight from the
  engine, ``grpo_loop.held_out_reward``).

Prints one line per step and writes the metrics (``--metrics``, JSON) after every step. TRL
logs to the team's tracker (``--tracker``, its ``report_to``: TensorBoard by default under
``--log-dir``/trl, ``wandb`` offline unless ``WANDB_MODE`` says otherwise, ``mlflow``,
``none``) with the bridge's rollout statistics beside its own series; the held-out reward and
the probe go to the same tracker under ``--log-dir``/example. Run::

    nice -n 10 python examples/trl_grpo.py --metrics docs/trl_grpo.json

Needs the ``engine``, ``train`` and ``trl`` extras (``scripts/setup_trainers.sh``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from grpo_loop import (  # noqa: E402 - the example folder is on the path first
    ASK_PY,
    CATEGORIES,
    REWARD_EVALUATOR,
    add_common_args,
    held_out_reward,
    local_stack,
    open_tracker,
    probe_prompt_ids,
    prompt_of,
    quiet_and_seed,
    summary,
    trainer_scalars,
    write_record,
)

from rolloutd.processes import end_process  # noqa: E402


def task_rows(max_tokens: int) -> list[dict]:
    """The dataset: one row per training category; the row names the task."""
    return [
        {
            "prompt": prompt_of(category),
            "harness": {"type": "shell", "command": "python3 ask.py {instruction}"},
            "runtime": {"type": "bwrap", "files": {"ask.py": ASK_PY}},
            "evaluator": {"type": REWARD_EVALUATOR, "command": "cat reply.txt"},
            "sampling": {"temperature": 1.0, "max_tokens": max_tokens},
        }
        for category in CATEGORIES
    ]


async def main(args: argparse.Namespace) -> int:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rolloutd.engine.models import load_tokenizer, pull_model
    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient
    from rolloutd.trainer_client.admin import BackendAdmin
    from rolloutd.trainer_client.bridges.common import LoopRunner
    from rolloutd.trainer_client.bridges.trl import RolloutFunc, rolloutd_reward
    from rolloutd.trainer_client.bridges.trl_sync import EngineSyncCallback
    from rolloutd.trainer_client.training.gguf_export import export_gguf
    from rolloutd.trainer_client.training.probe import probe
    from rolloutd.trainer_client.training.weight_sync import GatewayEngineLoader, WeightSync

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    # TRL's report_to: TensorBoard's and W&B's folders under --log-dir, W&B offline
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(Path(args.log_dir) / "trl"))
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_DIR", args.log_dir)
    quiet_and_seed(args.seed, args.threads)
    files = pull_model(args.model)
    tokenizer = load_tokenizer(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    loaded = AutoModelForCausalLM.from_pretrained(
        str(files.folder), gguf_file=files.gguf.name, torch_dtype=torch.float32
    )
    # transformers de-quantizes a GGUF into dense fp32 tensors but flags the model as
    # quantized, which its Trainer refuses to fine-tune: the same weights in a plain model
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded
    home = Path(args.home or tempfile.mkdtemp(prefix="rolloutd-trl-grpo-"))
    weights = home / "weights"
    policy = export_gguf(model.state_dict(), files.gguf, weights / "policy-0.gguf")
    probe_ids = probe_prompt_ids(tokenizer)
    rows: list[dict] = []
    token = secrets.token_urlsafe(16)
    write = lambda line: print(line, flush=True)  # noqa: E731

    def held_out(url: str) -> tuple[float, float]:
        return held_out_reward(url, tokenizer, args.eval_samples, args.max_tokens, args.seed)

    async with local_stack(home, args.model, policy, token, args.engine_threads) as stack:
        temporal_client, store_url, engine, gateway_url = stack
        client = RolloutClient(temporal_client, BlobStore(store_url))
        admin = BackendAdmin(gateway_url, token)
        run = LoopRunner(asyncio.get_running_loop())
        sync = WeightSync(admin, [GatewayEngineLoader(admin, timeout_s=300)])
        rollout = RolloutFunc(
            client, run, task_rows(args.max_tokens), task_prefix=f"trl-{uuid.uuid4().hex[:6]}"
        )
        mean, sem = await asyncio.to_thread(held_out, engine.url)
        step0 = await asyncio.to_thread(probe, model, engine.url, probe_ids)
        rows.append(
            {
                "step": 0,
                "policy_version": 0,
                "held_out_reward": mean,
                "held_out_sem": sem,
                "probe_mismatch": step0.mean_abs_diff,
            }
        )
        write(f"step 0: held_out_reward={mean:.3f} probe_mismatch={step0.mean_abs_diff:.4f}")
        example = open_tracker(args, "trl-grpo-example", Path(args.log_dir) / "example")
        example.log(trainer_scalars(rows[0]), step=0)
        report(rows, args)

        class Clock(TrainerCallback):
            """Step begin and the end of TRL's step (rollout + loss + optimizer)."""

            began = ended = 0.0

            def on_step_begin(self, *a, **k):
                Clock.began = time.monotonic()

            def on_step_end(self, *a, **k):
                Clock.ended = time.monotonic()

        def on_sync(step: int, sync_s: float, result) -> None:
            mean, sem = (None, None)
            if step % args.eval_every == 0 or step == args.steps:
                mean, sem = held_out(engine.url)
            rollout_s = rollout.last["rollout_s"]
            batch = rollout.last["rewards"]
            row = {
                "step": step,
                "policy_version": engine.policy_version,
                # every group masked (failed sessions): nothing scored this step
                "mean_reward": statistics.fmean(batch) if batch else math.nan,
                "groups_masked": rollout.last["masked"],
                "held_out_reward": mean,
                "held_out_sem": sem,
                "probe_mismatch": result.mean_abs_diff,
                "probe_max": result.max_abs_diff,
                "rollout_s": rollout_s,
                "train_s": Clock.ended - Clock.began - rollout_s,
                "sync_s": sync_s,
                "step_s": time.monotonic() - Clock.began,
            }
            rows.append(row)
            example.log(trainer_scalars(row), step=step)
            held = "" if mean is None else f"held_out_reward={mean:.3f} "
            write(
                f"step {step}: mean_reward={row['mean_reward']:.3f} {held}"
                f"probe_mismatch={row['probe_mismatch']:.4f} "
                f"policy_version={row['policy_version']} masked={row['groups_masked']} "
                f"rollout_s={rollout_s:.0f} train_s={row['train_s']:.0f} "
                f"sync_s={sync_s:.1f} step_s={row['step_s']:.0f}"
            )
            report(rows, args, rollout.stats.as_dict())

        config = GRPOConfig(
            output_dir=str(home / "trl"),
            use_cpu=True,
            # fp32 as the engine's F32 GGUF: TRL's default bf16 autocasts every forward of the
            # prepared model (the probe's too: 0.05-0.11 nats engine vs trainer after a sync)
            bf16=False,
            per_device_train_batch_size=args.groups_per_step * args.num_samples,
            gradient_accumulation_steps=1,
            num_generations=args.num_samples,
            max_steps=args.steps,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            beta=0.0,
            logging_steps=1,
            save_strategy="no",
            report_to=args.tracker,
            seed=args.seed,
            dataloader_num_workers=0,
            max_completion_length=args.max_tokens,
        )
        dataset = Dataset.from_list([{"prompt": prompt_of(c)} for c in CATEGORIES])
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[rolloutd_reward],
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=rollout,
            callbacks=[
                Clock(),
                EngineSyncCallback(
                    sync,
                    run,
                    files.gguf,
                    weights,
                    engine_url=engine.url,
                    probe_ids=probe_ids,
                    on_sync=on_sync,
                ),
            ],
        )
        try:
            await asyncio.to_thread(trainer.train)
        finally:
            example.close()
            await admin.aclose()
    stats = report(rows, args, rollout.stats.as_dict(), trainer.state.log_history)
    write("summary: " + " ".join(f"{k}={v:.4f}" for k, v in stats.items()))
    write("bridge: " + json.dumps(rollout.stats.as_dict()))
    return 0 if len(rows) == args.steps + 1 else 1


def report(
    rows: list[dict],
    args: argparse.Namespace,
    bridge: dict | None = None,
    trl_log: list[dict] | None = None,
) -> dict:
    """Write the metrics JSON as it stands; returns the summary."""
    stats = summary(rows)
    timed = [r for r in rows if r.get("rollout_s") is not None]
    for name in ("rollout_s", "train_s", "sync_s", "step_s"):
        stats[f"{name}_mean"] = statistics.fmean(r[name] for r in timed) if timed else 0.0
    write_record(rows, args, stats, bridge=bridge, trl_log=trl_log)
    return stats


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, "trl_grpo", "G, TRL's num_generations")
    return parser.parse_args(argv)


if __name__ == "__main__":
    code = asyncio.run(main(parse_args()))
    end_process(code)  # past temporalio's exit-time abort (sdk-python#300)
    sys.exit(code)
