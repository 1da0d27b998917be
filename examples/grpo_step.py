"""A real GRPO trainer loop on CPU over rolloutd's durable buffer.

What runs (everything on this machine, everything stopped by its id at the end):

- a Temporal dev server, llama-server serving SmolLM2-135M-Instruct (Q4_1 GGUF), and the four
  fleets in this process (gateway in ``tokens`` capture mode);
- a ``RolloutBufferWorkflow`` fed with yes/no questions; each session is the ``shell`` harness
  running ``ask.py`` in a ``local`` runtime: one chat call through the gateway, reply saved;
  ``test_on_output`` scores 1.0 when the reply holds the right word. Groups of ``num_samples``;
  all-equal groups are dropped by the buffer (DAPO);
- the trainer: the same model loaded in PyTorch from the same GGUF (transformers dequantizes
  it; needs ``accelerate``), per step: ``take`` a batch, load each session's trajectory, compute
  the policy's logprobs of every response token, report the mean absolute difference to the
  rollout's ``response_logprobs`` on trainable tokens, compute the GRPO loss (DeepSeekMath
  arXiv 2402.03300 group advantages; PPO-clip ratio against the rollout logprobs; DAPO
  token-level mean over ``loss_mask``), take an AdamW step, ``ack`` the batch, move the policy
  version.

The new weights are not pushed back to llama-server here, so from step 2 on the rollouts are
off-policy by the number of steps taken; the buffer's ``max_staleness`` bounds that, and the
reported mismatch shows it. ``examples/grpo_loop.py`` is the closed loop (weight sync per step).

Run: ``python examples/grpo_step.py --steps 2``. Output, one line per step::

    step 1: loss=... mean_reward=... trainable_fraction=... logprob_mismatch=... step_s=...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

ASK_PY = r'''
import json, os, sys, urllib.request
body = {"model": "m", "max_tokens": 8, "temperature": 1.0,
        "messages": [{"role": "user", "content": sys.argv[1]}]}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Content-Type": "application/json",
             "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
reply = json.load(urllib.request.urlopen(request, timeout=120))
open("reply.txt", "w").write(reply["choices"][0]["message"]["content"] or "")
'''

QUESTIONS = [
    ("Is the sky blue on a clear day? Answer yes or no.", "yes"),
    ("Is fire cold? Answer yes or no.", "no"),
    ("Do fish live in water? Answer yes or no.", "yes"),
    ("Is 2 larger than 5? Answer yes or no.", "no"),
    ("Is snow white? Answer yes or no.", "yes"),
    ("Can a cat fly? Answer yes or no.", "no"),
    ("Is the sun hot? Answer yes or no.", "yes"),
    ("Is ice hot? Answer yes or no.", "no"),
]


def make_task(index: int, question: str, answer: str, suffix: str) -> dict:
    """A task: one chat call, scored by whether the reply holds ``answer``."""
    return {
        "task_id": f"yn{index}-{suffix}",
        "instruction": question,
        "harness": {"type": "shell", "command": "python3 ask.py {instruction}"},
        "runtime": {"type": "local", "files": {"ask.py": ASK_PY}},
        "evaluator": {"type": "test_on_output", "command": f"grep -qiw {answer} reply.txt"},
        "sampling": {"temperature": 1.0, "max_tokens": 8},
        "metadata": {"answer": answer},
    }


def grpo_step(model, optimizer, batch, client, clip_eps: float) -> dict[str, float]:
    """One GRPO update on a batch; returns loss, mean reward, trainable fraction, mismatch.

    Per trace of session i in group g: ``A_i = (r_i - mean(r_g)) / (std(r_g) + eps)``
    (:func:`rolloutd.trainer_client.group_advantages`), ``ratio_t = exp(logp_t - rollout_logp_t)``,
    loss ``-min(ratio_t A_i, clip(ratio_t, 1 ± eps) A_i)`` averaged over all trainable tokens
    of the batch (``loss_mask == 1``).
    """
    import torch

    from rolloutd.trainer_client import group_advantages, scored_sessions

    token_losses, mismatches = [], []
    num_trainable = num_tokens = 0
    rewards: list[float] = []
    for buffered in batch.groups:
        # a session that failed for infrastructure has no reward the policy earned: it is
        # left out of the group's baseline and of the update, never scored 0.0
        sessions = scored_sessions(buffered.group)
        group_rewards = [float(s.reward) for s in sessions]
        rewards += group_rewards
        for session, advantage in zip(sessions, group_advantages(group_rewards)):
            if not session.trajectory_ref:
                continue
            for trace in client.trajectory(session).traces:
                if not trace.response_ids:
                    continue
                ids = torch.tensor([trace.prompt_ids + trace.response_ids])
                num_prompt = len(trace.prompt_ids)
                logits = model(ids).logits[0, num_prompt - 1:-1].float()
                logp = torch.log_softmax(logits, dim=-1).gather(
                    1, torch.tensor(trace.response_ids)[:, None])[:, 0]
                loss_mask = torch.tensor(trace.loss_mask, dtype=torch.bool)
                rollout_logp = torch.tensor(trace.response_logprobs)
                num_trainable += int(loss_mask.sum())
                num_tokens += ids.shape[1]
                if not loss_mask.any():
                    continue
                mismatches.append((logp.detach() - rollout_logp)[loss_mask].abs())
                ratio = torch.exp(logp[loss_mask] - rollout_logp[loss_mask])
                surrogate = torch.minimum(ratio * advantage,
                                          ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantage)
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
        "trainable_fraction": num_trainable / max(num_tokens, 1),
        "logprob_mismatch": float(torch.cat(mismatches).mean()) if mismatches else float("nan"),
        "num_groups": len(batch.groups),
        "num_trainable_tokens": num_trainable,
    }


@contextlib.asynccontextmanager
async def local_stack(home: Path, model_name: str):
    """Temporal dev server + llama-server + the four fleets in this process."""
    from rolloutd.engine.server import LlamaServer
    from rolloutd.settings import EvalSettings, GatewaySettings, SandboxSettings
    from rolloutd.stack import TemporalDevServer, free_port
    from rolloutd.workers import connect, run_fleet

    temporal = await asyncio.to_thread(TemporalDevServer(headless=True).start)
    engine = None
    try:
        engine = await asyncio.to_thread(
            LlamaServer(model_name, parallel=4, ctx_size=8192,
                        log_path=home / "engine.log").start)
        common = {"temporal_address": temporal.address, "store_url": str(home / "store"),
                  "host_id": "grpo-example", "log_json": False, "log_level": "warning"}
        gateway = GatewaySettings(**common, gateway_port=free_port(), backend_url=engine.url,
                                  model=model_name)
        client = await connect(gateway)
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(run_fleet("gateway", client, gateway))
            await stack.enter_async_context(run_fleet(
                "sandbox", client, SandboxSettings(**common, runtime_root=str(home / "rt"))))
            await stack.enter_async_context(run_fleet("eval", client, EvalSettings(**common)))
            await stack.enter_async_context(run_fleet("workflows", client, gateway))
            yield client, common["store_url"]
    finally:
        if engine is not None:
            engine.stop()
        temporal.stop()


async def main(args: argparse.Namespace) -> int:
    import logging

    import structlog
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from rolloutd.engine.models import pull_model
    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    torch.set_num_threads(args.threads)
    files = pull_model(args.model)
    t0 = time.monotonic()
    model = AutoModelForCausalLM.from_pretrained(str(files.folder), gguf_file=files.gguf.name,
                                                 torch_dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    print(f"trainer: {args.model} loaded in PyTorch from {files.gguf.name} "
          f"({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
          f"{time.monotonic() - t0:.1f} s)", flush=True)

    home = Path(args.home or tempfile.mkdtemp(prefix="rolloutd-grpo-"))
    suffix = uuid.uuid4().hex[:6]
    async with local_stack(home, args.model) as (temporal_client, store_url):
        client = RolloutClient(temporal_client, BlobStore(store_url))
        buffer = await client.create_buffer({
            "buffer_id": f"grpo-{suffix}", "num_in_flight": args.in_flight,
            "num_samples": args.num_samples, "max_staleness": args.steps, "lease_s": 900,
        })
        questions = QUESTIONS * 4
        await buffer.push([make_task(i, q, a, suffix) for i, (q, a) in enumerate(questions)])
        try:
            for step in range(1, args.steps + 1):
                t_step = time.monotonic()
                batch = await buffer.take(args.groups_per_step, timeout_s=args.take_timeout_s)
                t_taken = time.monotonic()
                metrics = await asyncio.to_thread(grpo_step, model, optimizer, batch, client,
                                                  args.clip_eps)
                await buffer.ack(batch.batch_id)
                stats = await buffer.set_policy_version(step)
                print(f"step {step}: loss={metrics['loss']:.4f} "
                      f"mean_reward={metrics['mean_reward']:.3f} "
                      f"trainable_fraction={metrics['trainable_fraction']:.3f} "
                      f"logprob_mismatch={metrics['logprob_mismatch']:.4f} "
                      f"groups={metrics['num_groups']} "
                      f"trainable_tokens={metrics['num_trainable_tokens']} "
                      f"wait_s={t_taken - t_step:.1f} train_s={time.monotonic() - t_taken:.1f} "
                      f"step_s={time.monotonic() - t_step:.1f} "
                      f"dropped_zero_variance={stats.state_counters['num_dropped_zero_variance']}",
                      flush=True)
        finally:
            await buffer.close()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups-per-step", type=int, default=2)
    parser.add_argument("--num-samples", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--clip-eps", type=float, default=0.2)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--take-timeout-s", type=float, default=600.0)
    parser.add_argument("--home", default=None, help="state folder (default: a temp folder)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
