"""The closed RL loop on CPU: GRPO through rolloutd's buffer, weight sync after every step.

What runs (everything on this machine, everything stopped by its id at the end):

- a Temporal dev server, the four fleets in this process (gateway in ``tokens`` capture mode,
  admin API on), llama-server serving SmolLM2-135M-Instruct from an F16 GGUF that the
  trainer wrote from its own weights at step 0 (so the engine and the trainer start equal),
  and the engine's control server (:mod:`rolloutd.engine.control`, as ``rolloutd up`` runs it);
- a ``RolloutBufferWorkflow`` fed with prompts of one task family ("Name a {category}. Reply
  with one word only."); each session is the ``shell`` harness running
  ``ask.py`` (one chat call through the gateway) in a bwrap sandbox, and the evaluator
  ``grpo_loop_reply_reward`` (registered by name with the fleets, from ``grpo_loop:ReplyReward``;
  run by the eval fleet) gives the reply partial credit (:func:`reward_of`).
  Groups of ``--num-samples``; groups whose samples all scored the same are dropped (DAPO).
  With ``--tasks SOURCE`` the buffer runs that task set instead, read as ``rolloutd eval
  SOURCE`` reads it (:func:`task_pool`), each task with its own harness and evaluator
  (docs/first_run.md: ``examples/one_word.jsonl``), and there is no held-out evaluation;
- the trainer, per step: ``take`` a batch, GRPO update (DeepSeekMath arXiv 2402.03300 group
  advantages, PPO-clip ratio against the rollout's logprobs, DAPO token-level mean over
  ``loss_mask``), ``ack``, export the fp32 weights as an F16 GGUF, weight sync (gateway
  pause/drain -> ``POST /admin/engine/load`` -> ``policy_version`` -> resume;
  :mod:`rolloutd.trainer_client.training.weight_sync`), move the buffer's version (staleness bound),
  probe the engine's logprobs against the trainer's on the same tokens, and every
  ``--eval-every`` steps score held-out prompts (categories never trained on, several samples
  each, fixed seeds, straight from the engine).

It prints one line per step::

    step 1: loss=... mean_reward=... trainable_fraction=... [held_out_reward=...]
      rollout_mismatch=... on_policy_mismatch=... probe_mismatch=... policy_version=1
      sampled_versions=0 groups=... train_s=... sync_s=... step_s=...

writes the metrics (JSON, ``--metrics``) after every step, and logs each batch's rollout
statistics with the trainer's own figures (loss, mismatches, held-out reward) to the team's
tracker (``--tracker``: TensorBoard by default, under ``--log-dir``; ``wandb`` offline unless
``WANDB_MODE`` says otherwise; ``mlflow``; ``none``):
:class:`rolloutd.trainer_client.tracking.RolloutTracker`. ``tensorboard --logdir runs`` shows
the curves.

Run: ``python examples/grpo_loop.py --metrics docs/grpo_loop.json``
(12 steps by default; here 8 steps took 47 minutes on 2 cores under load 10-32, steps of
73-429 s), or ``--steps 2`` to try it. Needs the
``engine`` and ``train`` extras.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rolloutd.evaluators import (
    CHECK_ARTIFACT,
    EvaluationContext,
    EvaluationOutcome,
    Evaluator,
)
from rolloutd.processes import end_process

ASK_PY = r"""
import json, os, sys, urllib.request
body = {"model": "m", "messages": [{"role": "user", "content": sys.argv[1]}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json",
             "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(request, timeout=600))
open("reply.txt", "w").write(reply["choices"][0]["message"]["content"] or "")
"""

#: the task family: name one thing of a category in one word. The reward gives partial
#: credit, 1 / the number of words, so a group's samples differ and GRPO has a gradient from
#: the first step; SmolLM2-135M-Instruct's base rate is about 0.3 at 8 tokens (0.300 on 32
#: samples; the strict one-word rule: 0.125), measured before choosing it (docs/rl_loop.md).
#: A stricter family (a comma-separated list of three, partial credit) scored 0.10.
CATEGORIES = [
    "fruit",
    "colour",
    "animal",
    "country",
    "city",
    "vegetable",
    "tree",
    "metal",
    "flower",
    "bird",
    "fish",
    "sport",
    "instrument",
    "planet",
    "drink",
    "tool",
    "insect",
    "river",
    "language",
    "dessert",
    "vehicle",
    "mountain",
    "gem",
    "spice",
]
HELD_OUT = ["month", "ocean", "dog breed", "cheese", "dance", "weapon", "shape", "fabric"]
WORD = re.compile(r"[A-Za-z]+")


def prompt_of(category: str) -> str:
    """The instruction of one prompt."""
    return f"Name a {category}. Reply with one word only."


def reward_of(reply: str) -> float:
    """Partial credit in [0, 1]: ``1 / n`` for a reply of ``n`` words (runs of letters), 0.0
    for a reply without one. "Plum." 1.0; "A plum" 0.5; an 8-token sentence cut off at the
    token limit about 0.15."""
    num_words = len(WORD.findall(reply))
    return 1.0 / num_words if num_words else 0.0


#: the evaluator's name in the fleets' registry: the operator (here, this script's fleets)
#: registers it; a task names it, never an import path
REWARD_EVALUATOR = "grpo_loop_reply_reward"


class ReplyReward(Evaluator):
    """The family's evaluator (registered as :data:`REWARD_EVALUATOR`, from
    ``grpo_loop:ReplyReward``): :func:`reward_of` of the reply, which the task's check command
    (``cat reply.txt``) printed in the runtime."""

    name = "grpo_loop_reply_reward"

    async def evaluate(self, ctx: EvaluationContext) -> EvaluationOutcome:
        """Score the ``check`` artifact's stdout; 0.0 when the check failed or is missing."""
        check = ctx.artifacts.get(CHECK_ARTIFACT)
        if not isinstance(check, dict) or check.get("exit_code") != 0:
            return EvaluationOutcome(reward=0.0, details={"reason": "no reply", "check": check})
        reply = str(check.get("stdout") or "")
        return EvaluationOutcome(reward=reward_of(reply), details={"reply": reply[:200]})


def make_task(index: int, category: str, suffix: str, max_tokens: int) -> dict:
    """A task: one chat call, scored by :class:`ReplyReward` on the eval fleet."""
    return {
        "task_id": f"w{index}-{suffix}",
        "instruction": prompt_of(category),
        "harness": {"type": "shell", "command": "python3 ask.py {instruction}"},
        "runtime": {"type": "bwrap", "files": {"ask.py": ASK_PY}},
        "evaluator": {"type": REWARD_EVALUATOR, "command": "cat reply.txt"},
        "sampling": {"temperature": 1.0, "max_tokens": max_tokens},
    }


def grpo_update(
    model, optimizer, batch, client, clip_eps: float, policy_version: int
) -> dict[str, float]:
    """One GRPO update on a batch; returns loss, mean reward, logprob mismatches, the
    trainable fraction of tokens (``loss_mask == 1`` over prompt + response tokens).

    Per trace of session i in group g: ``A_i = (r_i - mean(r_g)) / (std(r_g) + eps)``,
    ``ratio_t = exp(logp_t - rollout_logp_t)``, loss ``-min(ratio_t A_i, clip(ratio_t, 1 ± eps)
    A_i)`` averaged over all trainable tokens of the batch (``loss_mask == 1``; DAPO
    token-level mean). The mismatch is mean |logp_t - rollout_logp_t| on trainable tokens
    before the update: trainer vs the engine that sampled them; ``on_policy_mismatch`` takes
    only the traces the engine sampled at the trainer's own ``policy_version`` (the
    engine-vs-trainer figure; the rest is staleness, bounded by ``max_staleness``).
    """
    import torch

    from rolloutd.trainer_client.training import group_advantages, scored_sessions

    token_losses, mismatches, on_policy, rewards = [], [], [], []
    num_trainable = num_tokens = 0
    versions: set[int] = set()
    for buffered in batch.groups:
        sessions = scored_sessions(buffered.group)
        group_rewards = [float(s.reward) for s in sessions]
        rewards += group_rewards
        for session, advantage in zip(sessions, group_advantages(group_rewards)):
            if not session.trajectory_ref:
                continue
            for trace in client.trajectory(session).traces:
                num_tokens += len(trace.prompt_ids) + len(trace.response_ids)
                num_trainable += sum(trace.loss_mask)
                if not trace.response_ids or not any(trace.loss_mask):
                    continue
                ids = torch.tensor([trace.prompt_ids + trace.response_ids])
                logits = model(ids).logits[0, len(trace.prompt_ids) - 1 : -1].float()
                logp = torch.log_softmax(logits, dim=-1).gather(
                    1, torch.tensor(trace.response_ids)[:, None]
                )[:, 0]
                loss_mask = torch.tensor(trace.loss_mask, dtype=torch.bool)
                rollout_logp = torch.tensor(trace.response_logprobs)
                mismatches.append((logp.detach() - rollout_logp)[loss_mask].abs())
                versions.update(trace.policy_versions)
                if set(trace.policy_versions) == {policy_version}:
                    on_policy.append(mismatches[-1])
                ratio = torch.exp(logp[loss_mask] - rollout_logp[loss_mask])
                surrogate = torch.minimum(
                    ratio * advantage, ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantage
                )
                token_losses.append(-surrogate)
    loss = torch.cat(token_losses).mean() if token_losses else torch.tensor(0.0)
    optimizer.zero_grad()
    if token_losses:
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return {
        "loss": float(loss.detach()),
        "mean_reward": sum(rewards) / max(len(rewards), 1),
        "rollout_mismatch": float(torch.cat(mismatches).mean()) if mismatches else math.nan,
        "on_policy_mismatch": float(torch.cat(on_policy).mean()) if on_policy else math.nan,
        "num_groups": len(batch.groups),
        "trainable_fraction": num_trainable / max(num_tokens, 1),
        "sampled_versions": sorted(versions),
    }


def task_pool(source: str, num_rows: int | None, num_tasks: int, run: str) -> list:
    """``num_tasks`` tasks from ``source``, read as ``rolloutd eval SOURCE -n num_rows`` reads
    it (:func:`rolloutd.cli.eval_sources.plan`: a task file, a Harbor folder, SWE-bench
    rows, HumanEval, an eval config), each task with its own harness, runtime and evaluator;
    the rows in turn, each copy its own task id (``{run}-{row key}-{copy}``).

    Raises:
        rolloutd.errors.ConfigError: the source or a row is refused (named).
    """
    from rolloutd.cli.eval_sources import Overrides, plan
    from rolloutd.errors import ConfigError

    rows = plan(source, run, Overrides(num_rows=num_rows)).tasks
    if not rows:
        raise ConfigError(f"{source}: no tasks")
    return [
        rows[i % len(rows)].model_copy(update={"task_id": f"{rows[i % len(rows)].task_id}-{i}"})
        for i in range(num_tasks)
    ]


def held_out_reward(
    engine_url: str, tokenizer, num_samples: int, max_tokens: int, seed: int
) -> tuple[float, float]:
    """Reward of ``num_samples`` sampled replies (temperature 1) to each held-out prompt,
    straight from the engine (the policy as served, no training data).

    Returns:
        ``(mean, standard error of the mean)`` over the ``len(HELD_OUT) * num_samples``
        replies. The seeds are the same at every evaluation, so the change between two
        evaluations is the policy's, not a new draw of prompts.
    """
    import httpx

    def one(i: int, j: int) -> float:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt_of(HELD_OUT[i])}],
            add_generation_prompt=True,
            tokenize=False,
        )
        answer = httpx.post(
            f"{engine_url}/completion",
            json={
                "prompt": tokenizer.encode(text, add_special_tokens=False),
                "n_predict": max_tokens,
                "temperature": 1.0,
                "seed": seed + 100 * i + j,
                "cache_prompt": False,
            },
            timeout=600,
        ).json()
        return reward_of(answer["content"])

    # as many calls at once as the engine has slots
    with ThreadPoolExecutor(4) as pool:
        rewards = list(
            pool.map(
                lambda ij: one(*ij),
                [(i, j) for i in range(len(HELD_OUT)) for j in range(num_samples)],
            )
        )
    sem = statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else 0.0
    return statistics.fmean(rewards), sem


@contextlib.asynccontextmanager
async def local_stack(
    home: Path, model_name: str, model_file: Path, admin_token: str, threads: int
):
    """Temporal dev server + llama-server on ``model_file`` + the four fleets in-process."""
    from rolloutd.engine.control import EngineControlServer
    from rolloutd.engine.models import pull_model
    from rolloutd.engine.server import LlamaServer
    from rolloutd.settings import EvalSettings, GatewaySettings, SandboxSettings
    from rolloutd.stack import TemporalDevServer, free_port
    from rolloutd.workers import connect, run_fleet

    temporal = await asyncio.to_thread(TemporalDevServer(headless=True).start)
    engine = control = None
    try:
        files = dataclasses.replace(pull_model(model_name), gguf=model_file)
        engine = await asyncio.to_thread(
            LlamaServer(
                files, parallel=4, ctx_size=4096, threads=threads, log_path=home / "engine.log"
            ).start
        )
        # the engine's control server, as `rolloutd up` runs it: the trainer reloads the
        # engine through the gateway's POST /admin/engine/load
        control = EngineControlServer(engine).start()
        common = {
            "temporal_address": temporal.address,
            "store_url": str(home / "store"),
            "host_id": "grpo-loop",
            "log_json": False,
            "log_level": "warning",
            "evaluators": {REWARD_EVALUATOR: "grpo_loop:ReplyReward"},
        }
        gateway = GatewaySettings(
            **common,
            gateway_port=free_port(),
            backend_url=engine.url,
            model=model_name,
            admin_token=admin_token,
            engine_control_url=control.url,
            engine_control_token=control.token,
        )
        client = await connect(gateway)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(run_fleet("gateway", client, gateway))
            # a short root, whatever --home is: each bwrap runtime's gateway socket lives
            # under it, and a unix socket's path has at most 108 bytes (unix(7))
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="grpo-rt-"))
            await stack.enter_async_context(
                run_fleet("sandbox", client, SandboxSettings(**common, runtime_root=root))
            )
            await stack.enter_async_context(run_fleet("eval", client, EvalSettings(**common)))
            await stack.enter_async_context(run_fleet("workflows", client, gateway))
            yield client, common["store_url"], engine, f"http://127.0.0.1:{gateway.gateway_port}"
    finally:
        if control is not None:
            control.stop()
        if engine is not None:
            engine.stop()
        temporal.stop()


def summary(rows: list[dict]) -> dict[str, float]:
    """First vs last three held-out evaluations and their noise; the probe mismatch.

    ``held_out_step_to_step_sd`` is the standard deviation of the change between consecutive
    evaluations (how much the curve jitters); ``held_out_sem_mean`` the mean standard error
    of one evaluation (sampling noise at ``--eval-samples``). ``probe_first3`` / ``probe_last3``
    are the mean probe mismatch after the first and last three syncs (growth would show).
    """
    evals = [r["held_out_reward"] for r in rows if r.get("held_out_reward") is not None]
    sems = [r["held_out_sem"] for r in rows if r.get("held_out_sem") is not None]
    probes = [r["probe_mismatch"] for r in rows]
    synced = probes[1:]
    first, last = evals[:3], evals[-3:]
    diffs = [b - a for a, b in zip(evals, evals[1:])]
    return {
        "held_out_sem_mean": statistics.fmean(sems) if sems else math.nan,
        "probe_step0": probes[0] if probes else math.nan,
        "probe_first3": statistics.fmean(synced[:3]) if synced else math.nan,
        "probe_last3": statistics.fmean(synced[-3:]) if synced else math.nan,
        "held_out_first3": statistics.fmean(first) if first else math.nan,
        "held_out_last3": statistics.fmean(last) if last else math.nan,
        "held_out_step_to_step_sd": statistics.stdev(diffs) if len(diffs) > 1 else math.nan,
        "held_out_first3_sd": statistics.stdev(first) if len(first) > 1 else math.nan,
        "held_out_last3_sd": statistics.stdev(last) if len(last) > 1 else math.nan,
        "probe_mismatch_min": min(probes, default=math.nan),
        "probe_mismatch_max": max(probes, default=math.nan),
    }


def quiet_and_seed(seed: int, threads: int) -> None:
    """Warnings only from rolloutd and transformers, no progress bars; torch seeded and held to
    ``threads`` threads (both examples' trainer setup)."""
    import logging

    import structlog
    import torch
    from transformers.utils import logging as hf_logging

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    torch.set_num_threads(threads)


def probe_prompt_ids(tokenizer) -> list[int]:
    """The probe prompt (a held-out category, chat template applied), list[int]."""
    return tokenizer.encode(
        tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt_of("ocean")}],
            add_generation_prompt=True,
            tokenize=False,
        ),
        add_special_tokens=False,
    )


def write_record(rows: list[dict], args: argparse.Namespace, stats: dict, **extra: object) -> None:
    """Write ``--metrics`` (args, rows, summary and ``extra``, JSON) as they stand, when asked
    for."""
    if args.metrics:
        Path(args.metrics).parent.mkdir(parents=True, exist_ok=True)
        Path(args.metrics).write_text(
            json.dumps({"args": vars(args), "rows": rows, "summary": stats, **extra}, indent=1)
        )


def open_tracker(args: argparse.Namespace, name: str, log_dir: Path | None = None):
    """The run's tracker (``--tracker``, under ``log_dir``, default ``--log-dir``): a W&B run
    is offline unless ``WANDB_MODE`` says otherwise."""
    from rolloutd.trainer_client.tracking import RolloutTracker

    os.environ.setdefault("WANDB_MODE", "offline")
    return RolloutTracker(
        [] if args.tracker == "none" else [args.tracker],
        log_dir=log_dir or Path(args.log_dir),
        project="rolloutd-examples",
        run_name=name,
        config=vars(args),
    )


#: the per-step figures that go to the tracker beside the rollout statistics
TRAINER_SERIES = (
    "loss",
    "held_out_reward",
    "rollout_mismatch",
    "on_policy_mismatch",
    "probe_mismatch",
    "train_s",
    "sync_s",
    "step_s",
)


def trainer_scalars(row: dict) -> dict[str, float]:
    """A step's own figures as tracker scalars (``train/...``), those it has."""
    return {
        f"train/{k}": float(row[k]) for k in TRAINER_SERIES if isinstance(row.get(k), int | float)
    }


def add_common_args(parser: argparse.ArgumentParser, name: str, num_samples_help: str) -> None:
    """The options both examples take (``name``: the example's, for the ``--log-dir``
    default)."""
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--groups-per-step", type=int, default=3)
    parser.add_argument("--num-samples", type=int, default=4, help=num_samples_help)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--eval-samples", type=int, default=4, help="samples per held-out prompt")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=1, help="trainer threads")
    # one thread: on a shared, oversubscribed CPU llama.cpp's threads wait on each other at
    # every barrier (measured here under load 18: 8 s per token with 2 threads)
    parser.add_argument("--engine-threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--home", default=None, help="state folder (default: a temp folder)")
    parser.add_argument(
        "--tracker",
        default="tensorboard",
        choices=["tensorboard", "wandb", "mlflow", "none"],
        help="where the per-step statistics go (rolloutd.trainer_client.tracking)",
    )
    parser.add_argument("--log-dir", default=f"runs/{name}", help="the tracker's folder")
    parser.add_argument("--metrics", default=None, help="JSON of every step's metrics")


async def main(args: argparse.Namespace) -> int:

    import torch
    from transformers import AutoModelForCausalLM

    from rolloutd.engine.models import load_tokenizer, pull_model
    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import BufferExhaustedError, RolloutClient
    from rolloutd.trainer_client.admin import BackendAdmin
    from rolloutd.trainer_client.training.gguf_export import export_gguf
    from rolloutd.trainer_client.training.probe import probe
    from rolloutd.trainer_client.training.weight_sync import GatewayEngineLoader, WeightSync

    quiet_and_seed(args.seed, args.threads)
    rng = random.Random(args.seed)
    files = pull_model(args.model)
    tokenizer = load_tokenizer(args.model)
    model = AutoModelForCausalLM.from_pretrained(
        str(files.folder), gguf_file=files.gguf.name, torch_dtype=torch.float32
    )
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    home = Path(args.home or tempfile.mkdtemp(prefix="rolloutd-grpo-loop-"))
    weights = home / "weights"
    policy = export_gguf(model.state_dict(), files.gguf, weights / "policy-0.gguf")
    probe_ids = probe_prompt_ids(tokenizer)
    write: Callable[[str], None] = lambda line: print(line, flush=True)  # noqa: E731

    suffix = uuid.uuid4().hex[:6]
    token = secrets.token_urlsafe(16)
    rows: list[dict] = []
    failed = False
    stack = local_stack(home, args.model, policy, token, args.engine_threads)
    async with stack as (temporal_client, store_url, engine, gateway_url):
        client = RolloutClient(temporal_client, BlobStore(store_url))
        admin = BackendAdmin(gateway_url, token)
        sync = WeightSync(admin, [GatewayEngineLoader(admin, timeout_s=300)])
        buffer = await client.create_buffer(
            {
                "buffer_id": f"grpo-loop-{suffix}",
                "num_in_flight": args.in_flight,
                "num_samples": args.num_samples,
                "max_staleness": args.max_staleness,
                "lease_s": 1800,
            }
        )
        # zero-variance groups are dropped, so push several times what the steps take
        num_tasks = (args.steps + 2) * args.groups_per_step * args.task_pool_factor + args.in_flight
        await buffer.push(
            task_pool(args.tasks, args.num_rows, num_tasks, f"grpo-loop-{suffix}")
            if args.tasks
            else [
                make_task(i, rng.choice(CATEGORIES), suffix, args.max_tokens)
                for i in range(num_tasks)
            ]
        )

        def held_out() -> tuple[float, float]:
            return held_out_reward(
                engine.url, tokenizer, args.eval_samples, args.max_tokens, args.seed
            )

        row = {
            "step": 0,
            "policy_version": 0,
            "probe_mismatch": probe(model, engine.url, probe_ids).mean_abs_diff,
            "held_out_reward": None,
            "held_out_sem": None,
        }
        held = ""
        if not args.tasks:
            row["held_out_reward"], row["held_out_sem"] = await asyncio.to_thread(held_out)
            held = f"held_out_reward={row['held_out_reward']:.3f} "
            held += f"held_out_sem={row['held_out_sem']:.3f} "
        rows.append(row)
        write(f"step 0: {held}probe_mismatch={row['probe_mismatch']:.4f} policy_version=0")
        report(rows, args)
        tracker = open_tracker(args, f"grpo-loop-{suffix}")
        tracker.log(trainer_scalars(row), step=0)
        try:
            for step in range(1, args.steps + 1):
                t0 = time.monotonic()
                try:
                    batch = await buffer.take(args.groups_per_step, timeout_s=args.take_timeout_s)
                    rollout_s = time.monotonic() - t0
                except BufferExhaustedError as e:
                    # every group left scored all-equal (the reward saturated) and the buffer
                    # dropped it (DAPO): no signal is left to train on
                    write(f"step {step}: no informative batch ({e}); stopping")
                    break
                except TimeoutError as e:
                    stats = await buffer.stats()
                    write(
                        f"step {step}: FAILED: no batch ({e}); buffer: "
                        f"{len(stats.running)} running, {stats.num_pending} pending, "
                        f"{stats.state_counters}"
                    )
                    failed = True
                    break
                metrics = await asyncio.to_thread(
                    grpo_update, model, optimizer, batch, client, args.clip_eps, step - 1
                )
                await buffer.ack(batch.batch_id)
                t_train = time.monotonic()
                path = await asyncio.to_thread(
                    export_gguf, model.state_dict(), files.gguf, weights / f"policy-{step}.gguf"
                )
                sync_s = await sync.update(path, policy_version=step)
                await buffer.set_policy_version(step)
                (weights / f"policy-{step - 1}.gguf").unlink(missing_ok=True)
                result = await asyncio.to_thread(probe, model, engine.url, probe_ids)
                row = {
                    "step": step,
                    "policy_version": engine.policy_version,
                    **metrics,
                    "probe_mismatch": result.mean_abs_diff,
                    "probe_max": result.max_abs_diff,
                    "sync_s": sync_s,
                    "held_out_reward": None,
                    "held_out_sem": None,
                }
                if not args.tasks and (step % args.eval_every == 0 or step == args.steps):
                    row["held_out_reward"], row["held_out_sem"] = await asyncio.to_thread(held_out)
                row["step_s"] = time.monotonic() - t0
                rows.append(row)
                # the batch's rollout statistics (what the buffer dropped since the last step
                # included) beside the trainer's own figures, one step each
                tracker.log_batch(
                    batch,
                    step=step,
                    buffer_stats=await buffer.stats(),
                    rollout_wall_s=rollout_s,
                    samples=4,
                    extra=trainer_scalars(row),
                )
                held = (
                    ""
                    if row["held_out_reward"] is None
                    else f"held_out_reward={row['held_out_reward']:.3f} "
                )
                write(
                    f"step {step}: loss={metrics['loss']:.4f} "
                    f"mean_reward={metrics['mean_reward']:.3f} "
                    f"trainable_fraction={metrics['trainable_fraction']:.3f} {held}"
                    f"rollout_mismatch={metrics['rollout_mismatch']:.4f} "
                    f"on_policy_mismatch={metrics['on_policy_mismatch']:.4f} "
                    f"probe_mismatch={result.mean_abs_diff:.4f} "
                    f"policy_version={row['policy_version']} "
                    f"sampled_versions={','.join(map(str, metrics['sampled_versions']))} "
                    f"groups={metrics['num_groups']} "
                    f"train_s={t_train - t0:.0f} sync_s={sync_s:.1f} "
                    f"step_s={row['step_s']:.0f}"
                )
                report(rows, args)
        finally:
            tracker.close()
            await buffer.close()
            await admin.aclose()
    stats = report(rows, args)
    # a figure the run did not measure (no held-out evaluation) is left out, not printed nan
    write("summary: " + " ".join(f"{k}={v:.4f}" for k, v in stats.items() if not math.isnan(v)))
    if args.tracker != "none":
        write(f"{args.tracker}: {args.log_dir}")
    return 1 if failed else 0


def report(rows: list[dict], args: argparse.Namespace) -> dict[str, float]:
    """Write the metrics JSON as it stands (after every step, so a run cut short still leaves
    its record); returns the summary."""
    stats = summary(rows)
    write_record(rows, args, stats)
    return stats


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, "grpo_loop", "G, samples per task")
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=2,
        help="drop groups started more than this many versions ago",
    )
    parser.add_argument("--clip-eps", type=float, default=0.2)
    parser.add_argument("--take-timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--tasks",
        default=None,
        help="train on this task set, read as `rolloutd eval SOURCE` reads it (a task file, "
        "Harbor, SWE-bench, HumanEval, an eval config; each task its own harness and "
        "evaluator; no held-out reward); None: the example's own family",
    )
    parser.add_argument(
        "-n", "--num-rows", type=int, default=None, help="with --tasks: only the first N rows"
    )
    parser.add_argument(
        "--task-pool-factor", type=int, default=6, help="tasks pushed per group the steps take"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    code = asyncio.run(main(parse_args()))
    end_process(code)  # past temporalio's exit-time abort (sdk-python#300)
    sys.exit(code)
