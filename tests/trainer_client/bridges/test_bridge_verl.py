"""The verl bridge against verl 0.9.1 itself, in verl's own environment (Python 3.11, its
transformers and hydra: scripts/setup_trainers.sh).

The acceptance test runs 8 prompts through verl's agent-loop machinery
(``tests/support/verl_child.py`` in verl's environment: verl's registry and
``hydra.utils.instantiate``, ``RolloutdAgentLoop.run``, verl's ``AgentLoopOutput.as_dict``
and ``DataProto``); each run is a rolloutd session (the shell harness in bwrap, two chat
calls in one conversation, so the trace has a user turn with mask 0 between two sampled
ones) whose gateway
backend is the ``verl`` kind: every model call goes to verl's server-manager interface,
answered by llama-server (Qwen2.5-Coder-0.5B) behind a subclass of verl's
``LLMServerClient`` (a real engine standing in for verl's GPU replicas). It checks the 8
outputs token for token against the sessions' traces and against what verl's server manager
returned for each prompt; a ninth row, whose evaluator raises, is left out and counted. About
2-4 minutes. The gateway's ``verl`` backend kind itself is
tested in tests/proxy/test_verl_backend.py (no verl needed).

``test_rolloutd_grpo_leaves_left_out_rows_out_of_their_groups`` runs verl's own advantage
computation (``tests/support/verl_advantage_child.py``: ``compute_advantage`` through verl's
estimator registry, on the ``AgentLoopOutput.as_dict`` tensors of ``RolloutdAgentLoop.run``
over canned sessions) on groups with and without left-out rows: seconds, no fleets.

Not exercised here: verl's ``AgentLoopManager`` and ``AgentLoopWorker`` (Ray actors over
GPU replicas), its load balancer, its vLLM/SGLang servers and weight sync, the v1 trainer's
TransferQueue path (``transfer_queue`` is not installed), and a training step.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.support.bridges import INSTALL, ask_task, trainer_python
from tests.support.namespaced_fleets import namespaced_fleets
from tests.support.namespaces import fresh_namespace

ROOT = Path(__file__).resolve().parents[3]
CHILD = ROOT / "tests" / "support" / "verl_child.py"
ADVANTAGE_CHILD = ROOT / "tests" / "support" / "verl_advantage_child.py"
VERL = trainer_python("verl")
WORDS = ["fruit", "colour", "planet", "metal", "bird", "tree", "river", "gem"]

pytestmark = [
    # the trainer packages come from scripts/setup_trainers.sh, which README's acceptance
    # command runs first
    pytest.mark.acceptance,
    pytest.mark.trainers,
    pytest.mark.skipif(
        not VERL.exists()
        or subprocess.run([VERL, "-c", "import verl"], capture_output=True).returncode != 0,
        reason=f"verl's environment ({VERL}) is missing; {INSTALL}",
    ),
]


@pytest.mark.temporal
@pytest.mark.engine
@pytest.mark.sandbox
@pytest.mark.timeout(1200)
async def test_verl_agent_loop_runs_eight_prompts_through_rolloutd(temporal_server, engine):
    """8 verl ``AgentLoopOutput``s from 8 rolloutd sessions whose model calls verl's server
    interface answered: prompt, response, mask and logprobs equal the sessions' traces, every
    sampled token and logprob is what verl's server manager returned for that prompt, the
    reward sits on verl's last response token, and ``to_data_proto`` gives 8 rows; a ninth
    session whose evaluator raises comes back with an all-zero mask and its failure named, and
    is counted. About 2-4 minutes."""
    from rolloutd.engine.models import model_files
    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient
    from rolloutd.types import SessionStatus

    prefix = f"verl-{uuid.uuid4().hex[:6]}"
    tmp_path = Path(tempfile.mkdtemp(prefix="rv-"))
    # the fleets whose gateway's one backend is verl's endpoint run in a namespace of their
    # own: in the session's namespace, the shared fleets (started by the other bridge tests of
    # a run) would take some of these sessions to a gateway that calls llama-server directly
    namespace = await fresh_namespace(temporal_server.address, "verl")
    proc = await asyncio.create_subprocess_exec(
        str(VERL),
        str(CHILD),
        "--engine-url",
        engine.url,
        "--temporal",
        temporal_server.address,
        "--namespace",
        namespace,
        "--store",
        str(tmp_path / "store"),
        "--tokenizer",
        str(model_files("qwen2.5-coder-0.5b").tokenizer),
        "--task",
        json.dumps(ask_task(max_tokens=16, turns=2)),
        "--task-prefix",
        prefix,
        "--failing-task",
        json.dumps(
            {
                **ask_task(max_tokens=16),
                "evaluator": {"type": "tests_raising"},
                "max_replacements": 0,
            }
        ),
        "--words",
        *WORDS,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        start_new_session=True,
        limit=2**26,
    )
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 300)
        endpoint = json.loads(line)["endpoint"]
        async with namespaced_fleets(
            temporal_server.address,
            tmp_path,
            endpoint,
            tag="verl",
            namespace=namespace,
            gateway={"backend_type": "verl"},
        ) as fleets:
            client, store_url = fleets.client, fleets.store_url
            proc.stdin.write(b"go\n")
            await proc.stdin.drain()
            line = await asyncio.wait_for(proc.stdout.readline(), 900)
            assert line, "the verl child ended without its outputs"
            report = json.loads(line)
            rollout = RolloutClient(client, BlobStore(store_url))
            *outputs, failed = report["outputs"]
            assert len(outputs) == 8
            # the ninth row's evaluator raised: left out of training, counted, no reward of it
            assert report["stats"]["num_sessions_left_out"] == 1, report["stats"]
            assert report["stats"]["left_out_by_reason"] == {"evaluator": 1}
            assert failed["output"]["extra_fields"]["rolloutd_failure"] == "evaluator"
            assert set(failed["output"]["response_mask"]) == {0}
            assert failed["output"]["reward_score"] == 0.0
            answers = {}
            for call in report["calls"]:
                answers.setdefault(tuple(call["prompt_ids"]), []).append(call)
            for row, session_id in zip(outputs, report["sessions"][:8], strict=True):
                output = row["output"]
                group = await rollout.result(output["extra_fields"]["rolloutd_task_id"])
                (session,) = group.sessions
                assert session.session_id == session_id
                assert session.status == SessionStatus.COMPLETED, session.error
                (trace,) = rollout.trajectory(session).traces
                # two calls merged: sampled, the second user turn (not sampled), sampled
                assert len(trace.completion_indices) == 2
                assert 0 in trace.loss_mask[trace.response_offsets[0] : trace.response_offsets[1]]
                assert output["prompt_ids"] == trace.prompt_ids
                assert output["response_ids"] == trace.response_ids
                assert output["response_mask"] == trace.loss_mask
                assert output["response_logprobs"] == trace.response_logprobs
                assert output["reward_score"] == session.reward == 1.0
                # each merged call: the tokens and logprobs verl's server manager returned
                for k, offset in enumerate(trace.response_offsets):
                    prompt = tuple(trace.prompt_ids + trace.response_ids[:offset])
                    end = offset
                    while end < len(trace.loss_mask) and trace.loss_mask[end]:
                        end += 1
                    matches = [
                        c
                        for c in answers.get(prompt, [])
                        if c["token_ids"] == trace.response_ids[offset:end]
                        and c["log_probs"] == trace.response_logprobs[offset:end]
                    ]
                    assert matches, f"call {k} of {session_id}: not what verl answered"
                # verl's own tensors: int64 ids, the mask as given, the reward on the last
                # response token
                tensors = row["as_dict"]
                assert tensors["responses"] == ["torch.int64", [len(trace.response_ids)]]
                assert tensors["response_mask"] == trace.loss_mask
                assert tensors["rm_scores"][-1] == session.reward
                assert sum(tensors["rm_scores"][:-1]) == 0.0
            proto = report["data_proto"]
            assert proto["len"] == 8
            assert {"input_ids", "response_mask", "rollout_log_probs"} <= set(proto["keys"])
            assert proto["token_level_scores_sum"] == [1.0] * 8
        await asyncio.wait_for(proc.wait(), 60)
        assert proc.returncode == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.timeout(300)
def test_rolloutd_grpo_leaves_left_out_rows_out_of_their_groups():
    """verl's ``compute_advantage`` with ``algorithm.adv_estimator=rolloutd_grpo`` (registered
    by ``import verl`` alone, through ``VERL_USE_EXTERNAL_MODULES``) over the outputs of
    ``RolloutdAgentLoop.run`` on canned sessions: a failed session and a scored one without a
    sampled token come back with an all-zero ``response_mask``, and only they; the other rows
    of their groups get exactly the advantages verl's GRPO gives the groups without them, the
    left-out rows 0, a group of left-out rows only 0, and nothing moves when no row is left
    out; with and without the std division. The control: verl's stock ``grpo`` on the same
    batch moves the siblings' advantages, and only theirs. And why an estimator rather than a
    ``uid`` of the row's own: verl's legacy trainer refuses an agent loop output whose
    ``uid`` is not its prompt's. Seconds."""
    from rolloutd.engine.models import load_tokenizer, model_files

    load_tokenizer("qwen2.5-coder-0.5b")  # pulled when missing
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "src"),
        "VERL_USE_EXTERNAL_MODULES": "rolloutd.trainer_client.bridges.verl",
    }
    run = subprocess.run(
        [VERL, ADVANTAGE_CHILD, str(model_files("qwen2.5-coder-0.5b").tokenizer)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["registered"] == {"estimator": True, "agent_loop": True}
    rows = report["rows"]
    left_out = {str(i): reason for i, (_, reason) in enumerate(rows) if reason}
    assert left_out == {"1": "backend", "5": "backend", "7": "no_sampled_token"}
    for i, mask in enumerate(report["response_masks"]):
        assert any(mask) is (str(i) not in left_out), (i, mask)
    # the scored rows of the groups that hold a left-out row among scored ones, and the rest
    shifted = {
        str(i)
        for i, (group, reason) in enumerate(rows)
        if not reason and any(g == group and r for g, r in rows)
    }
    assert {rows[int(i)][0] for i in shifted} == {"a", "b"}
    for norm, case in report["cases"].items():
        baseline = case["grpo_without"]["per_row"]
        ours = case["rolloutd_with"]["per_row"]
        assert {k: v for k, v in ours.items() if k not in left_out} == baseline, norm
        assert [ours[k] for k in left_out] == [0.0] * len(left_out), norm
        assert case["rolloutd_without"]["per_row"] == baseline, norm
        assert all(c["zero_off_mask"] for c in case.values()), norm
        # the control: stock GRPO counts a left-out row's 0.0 in its group ...
        stock = case["grpo_with"]["per_row"]
        assert all(stock[k] != baseline[k] for k in shifted), (norm, stock, baseline)
        # ... and only in its group
        assert all(stock[k] == v for k, v in baseline.items() if k not in shifted), norm
    assert report["union"]["prompt_uid"].startswith("ok")
    assert report["union"]["own_uid"].startswith("AssertionError: `uid`"), report["union"]
