"""The TRL bridge against trl 1.16.0 itself.

- ``RolloutFunc``'s rows go through TRL's own ``GRPOTrainer._generate_and_score_completions``
  (its padding, ``env_mask`` as ``tool_mask``, its reward functions, its group advantages)
  and ``compute_loss``, on a tiny randomly initialised Llama on CPU. The rolloutd side is a
  stand-in (:class:`FakeClient`: canned groups and trajectories, rolloutd's own types), the
  trainer side is TRL.
- The async protocols: ``RolloutWorker`` and ``WeightTransfer`` have every method of TRL's
  ``RolloutWorkerProtocol`` and ``WeightTransferProtocol`` with their parameters; the
  worker's ``RolloutSample`` rows go through TRL's ``RolloutQueueDataset``,
  ``FixedCountBatcher`` and ``DataCollatorForRollout``. Not exercised: ``AsyncGRPOTrainer``
  itself (on CPU its constructor calls ``torch.cuda``, waits for vLLM's ``/health`` and packs
  with a FlashAttention-3 kernel).
- These run in the default tier (seconds on CPU, no fleet). The acceptance tests run
  ``examples/trl_grpo.py`` for 2 steps (TRL's GRPOTrainer, real sessions in bwrap, weight sync
  and probe after each step), the async weight transfer on the real engine, and the async
  worker on a real buffer.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.bridges import INSTALL, FakeClient, canned_trace, have

pytestmark = [
    # trl comes from scripts/setup.sh (scripts/setup_trainers.sh --project): the tests that
    # need no fleet run in the default tier, the three that run sessions in the acceptance tier
    pytest.mark.trainers,
    pytest.mark.skipif(not have("trl"), reason=f"trl is not installed; {INSTALL}"),
]

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tokenizer():
    from rolloutd.engine.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


#: a two-turn trace's mask: sampled, tool output, sampled
MULTI = [1, 1, 0, 0, 1, 1]


def _canned_groups():
    """Two groups of 4 by prompt: ``p1`` whole (rewards 1, 0, 0.5, 0; the first a two-turn
    trace), ``p2`` with a backend failure (masked whole by the bridge)."""
    from rolloutd.types import FailureCause, SessionStatus

    ok = SessionStatus.COMPLETED
    whole = [
        (ok, 1.0, None, canned_trace([5, 6, 7], [10, 11, 20, 21, 12, 2], MULTI)),
        (ok, 0.0, None, canned_trace([5, 6, 7], [13, 2], [1, 1])),
        (ok, 0.5, None, canned_trace([5, 6, 7], [14, 15, 2], [1, 1, 1])),
        (ok, 0.0, None, canned_trace([5, 6, 7], [16, 2], [1, 1])),
    ]
    broken = [
        (ok, 1.0, None, canned_trace([8, 9], [30, 2], [1, 1])),
        (
            SessionStatus.FAILED,
            None,
            FailureCause(kind="backend", phase="run", message="502"),
            canned_trace([8, 9], [31], [1]),
        ),
        (ok, 0.0, None, canned_trace([8, 9], [32, 2], [1, 1])),
        (ok, 1.0, None, canned_trace([8, 9], [33, 2], [1, 1])),
    ]
    return {"p1": whole, "p2": broken}


def _tiny_llama(tokenizer):
    """A randomly initialised one-layer Llama on the catalog tokenizer (seconds on CPU)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
            tie_word_embeddings=True,
        )
    )


def test_rollout_func_rows_go_through_grpo_trainer_scoring(tokenizer, tmp_path):
    """A whole group trains with TRL's advantages and the trace's mask (env tokens 0); a group
    with a failed session is masked whole: TRL's loss mask 0 and advantage 0 on every row, no
    reward given; TRL's loss is finite. Seconds on CPU (the bridges' tests that need no fleet
    took 108 s together here, with tests/test_architecture.py: docs/trainers.md)."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rolloutd.trainer_client.bridges.trl import RolloutFunc, rolloutd_reward

    client = FakeClient(_canned_groups())
    rows = [{"prompt": p, "harness": {"type": "shell", "command": "true"}} for p in ("p1", "p2")]
    rollout = RolloutFunc(client, asyncio.run, rows, task_prefix="trl-test")
    model = _tiny_llama(tokenizer)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[rolloutd_reward],
        args=GRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            per_device_train_batch_size=8,
            num_generations=4,
            max_steps=1,
            report_to="none",
            save_strategy="no",
            beta=0.0,
        ),
        train_dataset=Dataset.from_list([{"prompt": "p1"}, {"prompt": "p2"}]),
        processing_class=tokenizer,
        rollout_func=rollout,
    )
    trainer.model.train()
    # one dict per sample, as TRL's dataloader gives them (TRL writes extra fields into each)
    inputs = [{"prompt": p} for p in ["p1"] * 4 + ["p2"] * 4]
    out = trainer._generate_and_score_completions(inputs)

    # one task per group of 4, 4 samples each
    assert [r["num_samples"] for r in client.requests] == [4, 4]
    loss_mask = (out["completion_mask"] * out["tool_mask"]).tolist()
    assert loss_mask[0] == MULTI
    assert loss_mask[1] == [1, 1, 0, 0, 0, 0]  # right padding is not trained
    assert all(sum(row) == 0 for row in loss_mask[4:])  # the masked group
    advantages = out["advantages"].tolist()
    assert advantages[4:] == [0.0] * 4
    assert advantages[0] > advantages[2] > 0 > advantages[1] == advantages[3]
    # completion ids as sampled, right-padded with the pad id; prompts left-padded
    assert out["completion_ids"][0].tolist() == [10, 11, 20, 21, 12, 2]
    assert out["prompt_ids"][4].tolist()[-2:] == [8, 9]
    assert out["prompt_mask"][4].tolist() == [0, 1, 1]
    trainer.current_gradient_accumulation_steps = 1  # set by the Trainer's training loop
    loss = trainer.compute_loss(trainer.model, out)
    assert torch.isfinite(loss)
    assert rollout.stats.num_groups == 2 and rollout.stats.num_groups_masked == 1
    assert rollout.stats.left_out_by_reason == {"backend": 1}
    assert rollout.last["rewards"] == [1.0, 0.0, 0.5, 0.0]


@pytest.mark.parametrize("report_to", ["tensorboard", "wandb"])
def test_a_grpo_run_logs_rolloutd_series_through_report_to(report_to, tokenizer, tmp_path):
    """Two steps of TRL's own ``GRPOTrainer.train`` with ``report_to`` TensorBoard or W&B
    (offline): the bridge's batch statistics reach the trainer's logging (TRL's
    ``log_metric``), read back with TensorBoard's event reader or from the W&B run's records;
    each sample's viewer link is a column of TRL's completions table. The rolloutd side is the
    stand-in of the test above (canned groups: one whole, one with a backend failure, masked).
    Seconds on CPU."""
    pytest.importorskip(report_to, reason=f"pip install 'rolloutd[{report_to}]'")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from rolloutd.trainer_client.bridges.trl import RolloutFunc, rolloutd_reward
    from rolloutd.trainer_client.tracking import session_url

    viewer = "http://127.0.0.1:8400"
    rows = [{"prompt": p, "harness": {"type": "shell", "command": "true"}} for p in ("p1", "p2")]
    rollout = RolloutFunc(
        FakeClient(_canned_groups()), asyncio.run, rows, task_prefix="trl-log", viewer_url=viewer
    )
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path)}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        if report_to == "wandb":
            import wandb

            # wandb reads its environment once per process, at its first run: start afresh
            # so this run writes under tmp_path whatever ran before it
            wandb.teardown()
        trainer = GRPOTrainer(
            model=_tiny_llama(tokenizer),
            reward_funcs=[rolloutd_reward],
            args=GRPOConfig(
                output_dir=str(tmp_path / "out"),
                use_cpu=True,
                bf16=False,
                per_device_train_batch_size=8,
                num_generations=4,
                max_steps=2,
                logging_steps=1,
                report_to=report_to,
                log_completions=True,
                save_strategy="no",
                beta=0.0,
            ),
            train_dataset=Dataset.from_list([{"prompt": "p1"}, {"prompt": "p2"}]),
            processing_class=tokenizer,
            rollout_func=rollout,
        )
        trainer.train()
        if report_to == "wandb":
            wandb.finish()  # TRL leaves its run open for the process's end
    # what the trainer logged per step, as its tracker holds it: step -> {name: value}
    if report_to == "tensorboard":
        from tensorboard.backend.event_processing import event_accumulator

        (folder,) = {p.parent for p in (tmp_path / "out").rglob("events.out.tfevents.*")}
        events = event_accumulator.EventAccumulator(str(folder))
        events.Reload()
        logged: dict[int, dict[str, float]] = defaultdict(dict)
        for tag in events.Tags()["scalars"]:
            for e in events.Scalars(tag):
                logged[e.step][tag] = e.value
    else:
        from tests.support.wandb_records import history, run_file

        logged = {
            int(row["train/global_step"]): row
            for row in history(run_file(tmp_path)).values()
            if "train/rolloutd/reward_mean" in row
        }
    assert sorted(logged) == [1, 2], sorted(logged)
    for step in (1, 2):
        row = logged[step]
        # the masked group's failed session has no reward: 1, 0, 0.5, 0 and 1, 0, 1
        assert row["train/rolloutd/reward_mean"] == pytest.approx(3.5 / 7)
        assert row["train/rolloutd/pass_rate"] == pytest.approx(3 / 7)
        assert row["train/rolloutd/failures/backend"] == 1
        assert row["train/rolloutd/failures/sandbox"] == 0  # every kind, a continuous curve
        assert row["train/rolloutd/groups_left_out/masked"] == 1
        assert row["train/rolloutd/num_sessions"] == 8
        assert row["train/rolloutd/policy_version"] == step - 1  # the step's rollouts came first
        assert row["train/rolloutd/rollout_wall_s"] > 0
        # the bridge's cumulative counts
        assert row["train/rolloutd/bridge/num_groups"] == 2 * step
        assert row["train/rolloutd/bridge/num_groups_masked"] == step
    # TRL's completions table carries each sample's trace viewer link
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "out" / "completions" / "completions_00001.parquet")
    links = table.column("rolloutd_viewer").to_pylist()
    assert session_url(viewer, "trl-log-1-0/0") in links
    assert "" in links  # the masked group's missing sample has no session


def test_rollout_func_refuses_prompts_that_are_not_groups(tokenizer):
    """A batch that is not runs of G equal prompts (TRL's RepeatSampler) is refused. Seconds on
    CPU (the bridges' tests that need no fleet took 108 s together here, with
    tests/test_architecture.py: docs/trainers.md)."""
    from rolloutd.trainer_client.bridges.trl import RolloutFunc

    class Trainer:
        num_generations = 2
        eos_token_ids = [2]

        class model:
            training = True

    rows = [{"prompt": p, "harness": {"type": "shell", "command": "true"}} for p in ("a", "b")]
    rollout = RolloutFunc(FakeClient({}), asyncio.run, rows, task_prefix="x")
    with pytest.raises(ValueError, match="not one prompt"):
        rollout(["a", "b", "a", "b"], Trainer())
    with pytest.raises(ValueError, match="not groups of 2"):
        rollout(["a", "a", "b"], Trainer())
    with pytest.raises(ValueError, match="different tasks"):
        RolloutFunc(
            FakeClient({}),
            asyncio.run,
            rows + [{"prompt": "a", "harness": {"type": "x"}}],
            task_prefix="x",
        )


def _methods(cls):
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


def test_async_bridge_implements_trls_protocols():
    """Every method of TRL's RolloutWorkerProtocol and WeightTransferProtocol, with their
    parameter names, and the worker's two queues. Seconds on CPU (the bridges' tests that need
    no fleet took 108 s together here, with tests/test_architecture.py: docs/trainers.md)."""
    from trl.experimental.async_grpo.async_grpo_trainer import (
        RolloutWorkerProtocol,
        WeightTransferProtocol,
    )

    from rolloutd.trainer_client.bridges.trl_async import RolloutWorker, WeightTransfer

    for protocol, ours in (
        (RolloutWorkerProtocol, RolloutWorker),
        (WeightTransferProtocol, WeightTransfer),
    ):
        theirs = _methods(protocol)
        assert theirs, protocol
        mine = _methods(ours)
        for name, signature in theirs.items():
            assert name in mine, f"{ours.__name__} lacks {name}"
            assert list(mine[name].parameters) == list(signature.parameters), name
    assert set(RolloutWorkerProtocol.__annotations__) == {"rollout_buffer", "metrics_queue"}


class FakeBuffer:
    """A stand-in for rolloutd's buffer (rolloutd's own Batch type): two batches, then
    timeouts; records acks and policy versions."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.acked = []
        self.versions = []

    def take(self, num_groups, *, timeout_s):
        if not self.batches:
            time.sleep(min(timeout_s, 0.05))
            raise TimeoutError
        return self.batches.pop(0)

    def ack(self, batch_id):
        self.acked.append(batch_id)

    def set_policy_version(self, version):
        self.versions.append(version)


def test_rollout_worker_samples_feed_trls_async_pipeline():
    """The worker's rows go through TRL's RolloutQueueDataset, FixedCountBatcher and
    DataCollatorForRollout; a group that is not whole is left out and counted; each batch is
    acknowledged after its rows are queued. Seconds on CPU (the bridges' tests that need no
    fleet took 108 s together here, with tests/test_architecture.py: docs/trainers.md)."""
    from trl.experimental.async_grpo.async_grpo_trainer import (
        DataCollatorForRollout,
        FixedCountBatcher,
        RolloutQueueDataset,
    )
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from rolloutd.trainer_client.bridges.common import group_samples
    from rolloutd.trainer_client.bridges.trl_async import RolloutWorker, rollout_samples
    from rolloutd.types import FailureCause, SessionResult, SessionStatus, TaskResult, Trajectory
    from rolloutd.workflows.buffer.models import Batch, BufferedGroup

    trajectories = {}

    def group(task_id, rewards, failed=False):
        sessions = []
        for i, reward in enumerate(rewards):
            sid = f"{task_id}/{i}"
            broken = failed and i == 0
            sessions.append(
                SessionResult(
                    session_id=sid,
                    task_id=task_id,
                    sample_index=i,
                    status=SessionStatus.FAILED if broken else SessionStatus.COMPLETED,
                    reward=None if broken else reward,
                    failure=FailureCause(kind="sandbox", message="lost") if broken else None,
                    trajectory_ref=sid,
                )
            )
            trajectories[sid] = Trajectory(
                session_id=sid,
                task_id=task_id,
                traces=[canned_trace([5, 6], [7 + i, 20, 2], [1, 0, 1])],
            )
        return TaskResult(task_id=task_id, sessions=sessions)

    buffer = FakeBuffer(
        [
            Batch(
                batch_id="b1",
                groups=[BufferedGroup(group=group("t1", [1.0, 0.0]), policy_version=3)],
                policy_version=5,
            ),
            Batch(
                batch_id="b2",
                groups=[
                    BufferedGroup(group=group("t2", [1.0, 0.0], failed=True), policy_version=3),
                    BufferedGroup(group=group("t3", [0.0, 0.5]), policy_version=4),
                ],
            ),
        ]
    )
    worker = RolloutWorker(buffer, lambda s: trajectories[s.trajectory_ref], take_timeout_s=0.1)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while worker.rollout_buffer.qsize() < 4 or len(buffer.acked) < 2:
            assert time.monotonic() < deadline, (worker.rollout_buffer.qsize(), buffer.acked)
            worker.check_health(60)
            time.sleep(0.05)
        worker.update_model_version(4)
        assert buffer.versions == [4]
        assert buffer.acked == ["b1", "b2"]
        assert worker.stats.num_groups_masked == 1
        assert worker.stats.left_out_by_reason == {"sandbox": 1}
        # one metrics dict per batch for TRL's log: the batch's statistics, the running counts
        first, second = worker.metrics_queue.get_nowait(), worker.metrics_queue.get_nowait()
        assert first["rolloutd/reward_mean"] == 0.5 and first["rolloutd/bridge/num_groups"] == 1
        assert first["rolloutd/staleness_mean"] == 2.0  # hand-out version 5, started at 3
        assert second["rolloutd/groups_left_out/masked"] == 1
        assert second["rolloutd/failures/sandbox"] == 1
        assert second["rolloutd/reward_mean"] == pytest.approx(0.5 / 3)  # the failed one left out
        assert second["rolloutd/bridge/num_groups_masked"] == 1

        metrics = defaultdict(list)
        dataset = RolloutQueueDataset(
            worker.rollout_buffer, lambda: 4, worker.check_health, 60, metrics, max_staleness=1
        )
        rows = FixedCountBatcher(dataset, num_processes=1, microbatch_size=4)
        (micro,) = [next(iter(rows))]
        batch = DataCollatorForRollout(pad_token_id=0, metrics=metrics)([micro])
        assert batch["input_ids"].dtype.is_floating_point is False
        assert worker.rollout_buffer.qsize() == 0
        assert metrics["sample/staleness_max"] == [1.0, 1.0, 0.0, 0.0]
    finally:
        worker.stop()

    rows = rollout_samples(
        group_samples(group("t9", [1.0, 0.0]), lambda s: trajectories[s.trajectory_ref]),
        policy_version=2,
        group_id=7,
    )
    assert all(isinstance(r, RolloutSample) for r in rows)
    assert rows[0].input_ids.tolist() == [5, 6, 7, 20, 2]
    assert rows[0].completion_mask.tolist() == [0, 0, 1, 0, 1]
    assert rows[0].old_log_probs.tolist() == [0.0, 0.0, -0.5, 0.0, -0.5]
    assert [r.advantage for r in rows] == pytest.approx([1.0, -1.0], abs=1e-6)
    assert {r.model_version for r in rows} == {2} and {r.group_id for r in rows} == {7}


def _run_example(home: Path, metrics: Path, runs: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "trl_grpo.py"),
            "--steps",
            "2",
            "--eval-samples",
            "1",
            "--home",
            str(home),
            "--metrics",
            str(metrics),
            "--log-dir",
            str(runs),
        ],
        capture_output=True,
        text=True,
        timeout=1400,
        check=False,
    )


@pytest.mark.acceptance
@pytest.mark.engine
@pytest.mark.temporal
@pytest.mark.sandbox
@pytest.mark.timeout(1500)
def test_trl_grpo_example_runs_two_synced_steps(tmp_path):
    """examples/trl_grpo.py for 2 steps: TRL's GRPOTrainer on SmolLM2-135M with rollouts from
    the shell harness in bwrap, the engine reloaded with the trainer's weights after each step
    (probe at the F32 floor), policy versions 1 and 2. About 4-8 minutes."""
    metrics = tmp_path / "metrics.json"
    # short: the sandbox's unix socket lives under the home folder (108-byte limit)
    home = Path(tempfile.mkdtemp(prefix="rt-"))
    try:
        proc = _run_example(home, metrics, tmp_path / "runs")
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = re.findall(
        r"^step (\d+): mean_reward=([\d.]+) .*probe_mismatch=([\d.]+) "
        r"policy_version=(\d+) masked=(\d+)",
        proc.stdout,
        re.M,
    )
    assert [s[0] for s in steps] == ["1", "2"], proc.stdout[-3000:]
    for step, reward, probe, version, masked in steps:
        assert 0.0 <= float(reward) <= 1.0
        assert float(probe) < 0.008  # the engine serves the trainer's weights (F32 floor 0.001)
        assert int(version) == int(step)
        assert int(masked) == 0
    report = json.loads(metrics.read_text())
    assert [r["step"] for r in report["rows"]] == [0, 1, 2]
    assert all(r["rollout_s"] > 0 and r["train_s"] > 0 for r in report["rows"][1:])
    assert report["bridge"]["num_groups"] == 6 and report["bridge"]["num_sessions"] == 24
    # TRL's report_to (TensorBoard by default) holds the bridge's rollout statistics beside
    # its own series; the example's held-out reward and probe go to the same tracker
    from tests.support.tensorboard_events import scalars

    trl_logged = scalars(tmp_path / "runs" / "trl")
    assert [s for s, _ in trl_logged["train/rolloutd/reward_mean"]] == [1, 2]
    assert [v for _, v in trl_logged["train/rolloutd/num_sessions"]] == [12.0, 12.0]
    assert [s for s, _ in trl_logged["train/loss"]] == [1, 2]
    example = scalars(tmp_path / "runs" / "example")
    assert [s for s, _ in example["train/probe_mismatch"]] == [0, 1, 2]


@pytest.mark.acceptance
@pytest.mark.engine
@pytest.mark.timeout(900)
async def test_weight_transfer_makes_the_engine_serve_the_trainers_weights(tmp_path):
    """TRL's weight-transfer sequence (init, pause, send_weights of the named parameters,
    resume) on a real llama-server behind the gateway: after an optimizer step the engine is
    stale, after the transfer its logprobs equal the trainer's (F32 floor) and the next
    completion carries policy version 1. About 1-3 minutes (160.7 s here under load)."""
    import dataclasses

    import httpx
    import torch

    from rolloutd.engine.server import LlamaServer
    from rolloutd.proxy.http.server import Gateway
    from rolloutd.settings import GatewaySettings
    from rolloutd.store import CompletionLog
    from rolloutd.trainer_client.admin import BackendAdmin
    from rolloutd.trainer_client.bridges.common import LoopRunner
    from rolloutd.trainer_client.bridges.trl_async import WeightTransfer
    from rolloutd.trainer_client.training.gguf_export import export_gguf
    from rolloutd.trainer_client.training.probe import probe
    from rolloutd.trainer_client.training.weight_sync import EngineLoader, WeightSync
    from rolloutd.types import SamplingParams
    from tests.support.trainer_model import load_trainer_model

    trainer = load_trainer_model("smollm2-135m")
    files, model = trainer.files, trainer.model
    probe_ids = trainer.chat_ids("Name three colours.")
    start = export_gguf(model.state_dict(), files.gguf, tmp_path / "policy-0.gguf")
    engine = LlamaServer(dataclasses.replace(files, gguf=start), parallel=1, ctx_size=2048).start(
        timeout_s=180
    )
    gateway = Gateway.from_settings(
        GatewaySettings(
            store_url=str(tmp_path / "store"),
            backend_url=engine.url,
            model="smollm2-135m",
            gateway_public_url="http://gateway.test",
            admin_token="admin-secret",
        ),
        tokenizer=trainer.tokenizer,
    )
    transport = httpx.ASGITransport(app=gateway.app)
    try:
        async with BackendAdmin("http://gateway.test", "admin-secret", transport=transport) as a:
            transfer = WeightTransfer(
                WeightSync(a, [EngineLoader(engine, timeout_s=180)]),
                LoopRunner(asyncio.get_running_loop()),
                files.gguf,
                tmp_path / "weights",
            )
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
            ids = torch.tensor([probe_ids])
            (-torch.log_softmax(model(ids).logits[0, -1], -1)[42]).backward()
            optimizer.step()
            assert probe(model, engine.url, probe_ids).mean_abs_diff > 0.03  # stale

            def sync() -> None:  # as TRL's trainer calls the protocol, from its thread
                transfer.init_weight_transfer()
                transfer.pause()
                transfer.send_weights(iter(model.named_parameters()))
                transfer.resume()
                transfer.destroy()

            await asyncio.to_thread(sync)
            assert transfer.policy_version == 1 and engine.policy_version == 1
            assert probe(model, engine.url, probe_ids).mean_abs_diff < 0.008
            info = await gateway.sessions.open_session(
                "wt/after", "wt", sampling=SamplingParams(max_tokens=4)
            )
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
                answer = await http.post(
                    f"/s/{info.session_key}/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
                )
            assert answer.status_code == 200, answer.text
            [last] = CompletionLog(gateway.store, "wt/after").read_all()
            assert last.policy_version == 1
    finally:
        await gateway.aclose()
        engine.stop()


@pytest.mark.acceptance
@pytest.mark.temporal
@pytest.mark.engine
@pytest.mark.sandbox
@pytest.mark.timeout(900)
async def test_rollout_worker_takes_from_a_real_buffer(fleets, temporal_server):
    """RolloutWorker over a rolloutd buffer (the blocking client, in TRL's thread): 2 tasks x
    2 sessions (shell harness in bwrap) become 4 RolloutSample rows tagged with the policy
    version their tasks started under and one group id per task, each batch acknowledged;
    update_model_version moves the buffer's version. About 1-2 minutes."""
    import uuid

    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    from rolloutd.trainer_client import SyncRolloutClient
    from rolloutd.trainer_client.bridges.trl_async import RolloutWorker
    from tests.support.bridges import ask_task

    suffix = uuid.uuid4().hex[:6]
    client = await asyncio.to_thread(
        SyncRolloutClient.connect, temporal_server.address, store_url=fleets.store_url
    )
    try:
        buffer = await asyncio.to_thread(
            client.create_buffer,
            {
                "buffer_id": f"trl-worker-{suffix}",
                "num_in_flight": 2,
                "num_samples": 2,
                "drop_zero_variance": False,  # session_completed gives 1.0 to every session
            },
        )
        await asyncio.to_thread(
            buffer.push,
            [
                {"task_id": f"tw{i}-{suffix}", "instruction": f"Name a {w}.", **ask_task()}
                for i, w in enumerate(("fruit", "planet"))
            ],
        )
        worker = RolloutWorker(buffer, client.trajectory, take_timeout_s=5)
        worker.start()
        rows = []
        try:
            deadline = time.monotonic() + 600
            while len(rows) < 4:
                assert time.monotonic() < deadline, (rows, worker.stats.as_dict())
                worker.check_health(120)
                try:
                    rows.append(await asyncio.to_thread(worker.rollout_buffer.get, True, 1.0))
                except queue.Empty:
                    continue
            await asyncio.to_thread(worker.update_model_version, 1)
        finally:
            await asyncio.to_thread(worker.stop)
        assert all(isinstance(r, RolloutSample) for r in rows)
        assert {r.model_version for r in rows} == {0}
        assert sorted(r.group_id for r in rows) == [0, 0, 1, 1]
        assert all(r.advantage == 0.0 for r in rows)  # equal rewards: no relative signal
        for row in rows:
            mask = row.completion_mask.tolist()
            assert len(mask) == len(row.input_ids) == len(row.old_log_probs)
            assert mask[0] == 0 and sum(mask) > 0
        stats = await asyncio.to_thread(buffer.stats)
        assert stats.policy_version == 1
        assert worker.stats.num_groups == 2 and worker.stats.num_sessions_left_out == 0
        await asyncio.to_thread(buffer.close)
    finally:
        await asyncio.to_thread(client.close)
