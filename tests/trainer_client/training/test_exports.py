"""Exports to verl tensors, slime samples, SFT JSONL and Parquet, on small synthetic traces."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rolloutd.trainer_client.training.exports import (
    to_openai_messages_jsonl,
    to_parquet,
    to_slime_samples,
    to_verl_batch,
    trace_reward,
)
from rolloutd.types import FailureCause, SessionStatus, Trace, Trajectory

try:
    import torch
except ImportError:  # the verl export needs torch; the other exports do not
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

PAD = 0  # deliberately also a real token id below: padding must be told by the masks


def make_trace(
    prompt_ids: list[int],
    response_ids: list[int],
    loss_mask: list[int],
    *,
    trace_index: int = 0,
    reward: float | None = 1.0,
    num_traces: int = 1,
    finish_reason: str = "stop",
) -> Trace:
    """A trace whose logprobs are -0.5, -1.0, ... on sampled tokens and 0.0 elsewhere."""
    logprobs = [-(i + 1) * 0.5 if m else 0.0 for i, m in enumerate(loss_mask)]
    return Trace(
        trace_index=trace_index,
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        loss_mask=loss_mask,
        response_logprobs=logprobs,
        reward=reward,
        num_traces_in_session=num_traces,
        finish_reason=finish_reason,
        prompt_messages=[{"role": "user", "content": f"solve {trace_index}"}],
        response_messages=[{"role": "assistant", "content": "done ✓"}],
        tools=[{"type": "function", "function": {"name": "bash", "parameters": {}}}],
        policy_versions=[3],
        completion_indices=[trace_index],
        metadata={"k": trace_index},
    )


def make_trajectory(
    task_id: str,
    sample_index: int,
    traces: list[Trace],
    *,
    reward: float | None = None,
    status: SessionStatus = SessionStatus.COMPLETED,
) -> Trajectory:
    return Trajectory(
        session_id=f"{task_id}-s{sample_index}",
        task_id=task_id,
        sample_index=sample_index,
        traces=traces,
        reward=reward,
        status=status,
    )


def small_batch() -> list[Trajectory]:
    """Two tasks; task-a's second session has two traces, the second ending with a tool turn."""
    return [
        make_trajectory("task-a", 0, [make_trace([5, 6, 7], [8, 9, 2], [1, 1, 1], reward=1.0)]),
        make_trajectory(
            "task-a",
            1,
            [
                make_trace([5, 6], [0, 11], [1, 1], trace_index=0, reward=0.0, num_traces=2),
                make_trace(
                    [5, 6, 7, 0, 4],
                    [12, 13, 14, 15, 16],
                    [1, 1, 0, 0, 0],
                    trace_index=1,
                    reward=0.0,
                    num_traces=2,
                    finish_reason="length",
                ),
            ],
        ),
        make_trajectory("task-b", 0, [make_trace([1], [17], [1], reward=0.5)]),
    ]


# --------------------------------------------------------------------------- verl


@st.composite
def trajectories(draw: st.DrawFn) -> list[Trajectory]:
    token = st.integers(min_value=0, max_value=50)  # includes PAD
    result = []
    for session in range(draw(st.integers(min_value=1, max_value=5))):
        traces = []
        num_traces = draw(st.integers(min_value=1, max_value=3))
        for index in range(num_traces):
            prompt = draw(st.lists(token, min_size=0, max_size=10))
            length = draw(st.integers(min_value=1, max_value=10))
            response = draw(st.lists(token, min_size=length, max_size=length))
            mask = draw(st.lists(st.integers(0, 1), min_size=length, max_size=length))
            reward = draw(st.floats(min_value=-2, max_value=2, allow_nan=False))
            traces.append(
                make_trace(
                    prompt, response, mask, trace_index=index, reward=reward, num_traces=num_traces
                )
            )
        task_id = f"task-{draw(st.integers(min_value=0, max_value=2))}"
        result.append(make_trajectory(task_id, session, traces))
    return result


def _rows(batch: list[Trajectory]) -> list[tuple[Trajectory, Trace]]:
    return [(t, trace) for t in batch for trace in t.traces]


@needs_torch
@settings(max_examples=60, deadline=None)
@given(trajectories())
def test_verl_batch_layout_padding_and_alignment(batch: list[Trajectory]) -> None:
    out = to_verl_batch(batch, pad_token_id=PAD)
    rows = _rows(batch)
    num_rows = len(rows)
    prompt_len = max(len(tr.prompt_ids) for _, tr in rows)
    response_len = max(len(tr.response_ids) for _, tr in rows)

    assert out["prompts"].shape == (num_rows, prompt_len)
    for key in ("responses", "response_mask", "rollout_log_probs", "token_level_scores"):
        assert out[key].shape == (num_rows, response_len), key
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert out[key].shape == (num_rows, prompt_len + response_len), key
    assert out["rollout_log_probs"].dtype == torch.float32
    assert out["token_level_scores"].dtype == torch.float32
    assert out["input_ids"].dtype == torch.long
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], dim=1))

    for row, (trajectory, trace) in enumerate(rows):
        p, r = len(trace.prompt_ids), len(trace.response_ids)
        pad_left, pad_right = prompt_len - p, response_len - r
        assert out["prompts"][row].tolist() == [PAD] * pad_left + trace.prompt_ids
        assert out["responses"][row].tolist() == trace.response_ids + [PAD] * pad_right
        assert out["response_mask"][row].tolist() == trace.loss_mask + [0] * pad_right
        assert out["rollout_log_probs"][row].tolist() == pytest.approx(
            trace.response_logprobs + [0.0] * pad_right
        )
        attention = out["attention_mask"][row]
        assert attention.tolist() == [0] * pad_left + [1] * (p + r) + [0] * pad_right
        # round trip: the real tokens are exactly prompt + response
        real = out["input_ids"][row][attention.bool()].tolist()
        assert real == trace.prompt_ids + trace.response_ids
        # positions count real tokens only: 0 on left padding, 0..L-1 on real tokens
        positions = out["position_ids"][row].tolist()
        assert positions[:pad_left] == [0] * pad_left
        assert positions[pad_left : pad_left + p + r] == list(range(p + r))
        # the reward sits on the last real response token, nothing elsewhere
        scores = out["token_level_scores"][row]
        expected = [0.0] * response_len
        expected[r - 1] = trace.reward
        assert scores.tolist() == pytest.approx(expected)
        assert out["uid"][row] == trajectory.task_id
        assert out["session_id"][row] == trajectory.session_id


@needs_torch
def test_verl_batch_on_a_known_batch() -> None:
    out = to_verl_batch(small_batch(), pad_token_id=PAD)
    assert out["prompts"].tolist() == [
        [0, 0, 5, 6, 7],
        [0, 0, 0, 5, 6],
        [5, 6, 7, 0, 4],
        [0, 0, 0, 0, 1],
    ]
    assert out["response_mask"].tolist() == [
        [1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0],
    ]
    assert out["position_ids"][1].tolist() == [0, 0, 0, 0, 1, 2, 3, 3, 3, 3]
    assert out["uid"].dtype == object
    assert list(out["uid"]) == ["task-a", "task-a", "task-a", "task-b"]
    assert out["token_level_scores"][3].tolist() == [0.5, 0, 0, 0, 0]


@needs_torch
def test_verl_reward_on_last_trainable_token() -> None:
    batch = [make_trajectory("t", 0, [make_trace([1, 2], [3, 4, 5, 6], [1, 1, 0, 0], reward=2.0)])]
    last = to_verl_batch(batch, pad_token_id=PAD)["token_level_scores"][0].tolist()
    trainable = to_verl_batch(batch, pad_token_id=PAD, reward_position="last_trainable")
    assert last == [0, 0, 0, 2.0]
    assert trainable["token_level_scores"][0].tolist() == [0, 2.0, 0, 0]


@needs_torch
def test_verl_refuses_traces_over_the_limits_and_names_them() -> None:
    batch = small_batch()
    with pytest.raises(ValueError, match=r"trace 1 of session task-a-s1 .*prompt has 5 tokens"):
        to_verl_batch(batch, pad_token_id=PAD, max_prompt_len=4)
    with pytest.raises(ValueError, match=r"trace 1 of session task-a-s1 .*response has 5"):
        to_verl_batch(batch, pad_token_id=PAD, max_response_len=3)


@needs_torch
def test_verl_truncates_when_asked() -> None:
    out = to_verl_batch(
        small_batch(), pad_token_id=PAD, max_prompt_len=4, max_response_len=3, truncate=True
    )
    assert out["prompts"].shape == (4, 4)
    assert out["responses"].shape == (4, 3)
    assert out["prompts"][2].tolist() == [6, 7, 0, 4]  # the prompt's end is kept
    assert out["responses"][2].tolist() == [12, 13, 14]  # the response's start is kept
    assert out["response_mask"][2].tolist() == [1, 1, 0]
    assert out["rollout_log_probs"][2].tolist() == [-0.5, -1.0, 0.0]
    assert out["token_level_scores"][0].tolist() == [0, 0, 1.0]


@needs_torch
def test_verl_reward_resolution() -> None:
    unscored = make_trajectory("t", 0, [make_trace([1], [2], [1], reward=None)])
    with pytest.raises(ValueError, match="session t-s0 .*no reward"):
        to_verl_batch([unscored], pad_token_id=PAD)
    out = to_verl_batch([unscored], pad_token_id=PAD, default_reward=-1.0)
    assert out["token_level_scores"].tolist() == [[-1.0]]
    session_scored = make_trajectory("t", 0, [make_trace([1], [2], [1], reward=None)], reward=0.25)
    assert trace_reward(session_scored, session_scored.traces[0]) == 0.25
    assert to_verl_batch([session_scored], pad_token_id=PAD)["token_level_scores"].tolist() == [
        [0.25]
    ]


def failed_session(task_id: str = "task-a") -> Trajectory:
    """A session whose backend failed, that an older evaluator still scored 1.0."""
    failed = make_trajectory(
        task_id,
        7,
        [make_trace([5], [8, 9], [1, 1], reward=1.0)],
        reward=1.0,
        status=SessionStatus.FAILED,
    )
    failed.failure = FailureCause(kind="backend", message="502 BackendError", phase="run")
    return failed


@needs_torch
def test_verl_leaves_failed_sessions_out_or_marks_them() -> None:
    batch = [*small_batch(), failed_session()]
    plain = to_verl_batch(batch, pad_token_id=PAD)
    assert list(plain["session_id"]).count("task-a-s7") == 0
    assert list(plain["failure"]) == [None] * 4
    out = to_verl_batch(batch, pad_token_id=PAD, include_failed=True)
    assert list(out["failure"]) == [None] * 4 + ["backend"]
    # a group of its own: task-a's GRPO baseline stays over its two scored sessions
    assert list(out["uid"]) == ["task-a", "task-a", "task-a", "task-b", "failed/task-a-s7"]
    assert out["response_mask"][4].sum().item() == 0 and out["responses"][4, :2].tolist() == [8, 9]
    assert out["token_level_scores"][4].abs().sum().item() == 0.0


def test_jsonl_marks_failed_sessions_when_asked(tmp_path: Path) -> None:
    batch = [*small_batch(), failed_session()]
    assert to_openai_messages_jsonl(batch, io.StringIO()) == 4
    buffer = io.StringIO()
    assert to_openai_messages_jsonl(batch, buffer, include_failed=True) == 5
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert lines[-1]["failure"]["kind"] == "backend"
    assert all("failure" not in line for line in lines[:-1])
    # its stale reward of 1.0 is not the policy's: rejection sampling never keeps it
    assert to_openai_messages_jsonl(batch, io.StringIO(), min_reward=1.0, include_failed=True) == 1


@needs_torch
def test_verl_refuses_empty_batches_and_empty_responses() -> None:
    with pytest.raises(ValueError, match="at least one trace"):
        to_verl_batch([make_trajectory("t", 0, [])], pad_token_id=PAD)
    with pytest.raises(ValueError, match="no response tokens"):
        to_verl_batch([make_trajectory("t", 0, [make_trace([1], [], [])])], pad_token_id=PAD)


# --------------------------------------------------------------------------- slime

#: the fields of slime's Sample dataclass (THUDM/slime slime/utils/types.py)
SLIME_SAMPLE_FIELDS = {
    "group_index",
    "index",
    "prompt",
    "tokens",
    "multimodal_inputs",
    "multimodal_train_inputs",
    "response",
    "response_length",
    "label",
    "reward",
    "loss_mask",
    "weight_versions",
    "rollout_log_probs",
    "rollout_routed_experts",
    "remove_sample",
    "teacher_log_probs",
    "mopd_teacher_log_probs",
    "status",
    "metadata",
    "generate_function_path",
    "train_metadata",
    "session_id",
    "non_generation_time",
    "spec_info",
    "prefix_cache_info",
}


@settings(max_examples=40, deadline=None)
@given(trajectories())
def test_slime_sample_lengths_are_consistent(batch: list[Trajectory]) -> None:
    samples = to_slime_samples(batch)
    rows = _rows(batch)
    assert len(samples) == len(rows)
    for index, (sample, (trajectory, trace)) in enumerate(zip(samples, rows, strict=True)):
        assert set(sample) <= SLIME_SAMPLE_FIELDS
        assert sample["index"] == index
        length = sample["response_length"]
        assert length == len(trace.response_ids)
        assert len(sample["tokens"]) == len(trace.prompt_ids) + length
        assert sample["tokens"][len(trace.prompt_ids) :] == trace.response_ids
        assert len(sample["loss_mask"]) == len(sample["rollout_log_probs"]) == length
        assert sample["loss_mask"] == trace.loss_mask
        assert sample["reward"] == trace.reward
        assert sample["metadata"]["task_id"] == trajectory.task_id


def test_slime_groups_and_statuses() -> None:
    batch = small_batch()
    batch.append(
        make_trajectory(
            "task-a", 2, [make_trace([1], [2], [1], reward=None)], status=SessionStatus.TIMEOUT
        )
    )
    batch.append(
        make_trajectory("task-c", 0, [make_trace([1], [2], [1])], status=SessionStatus.FAILED)
    )
    # the timed-out (unrewarded) and failed sessions are left out unless asked for
    assert [s["session_id"] for s in to_slime_samples(batch)] == [
        "task-a-s0",
        "task-a-s1",
        "task-a-s1",
        "task-b-s0",
    ]
    samples = to_slime_samples(batch, include_failed=True, default_reward=0.0)
    assert [s["group_index"] for s in samples] == [0, 0, 0, 1, 0, 2]
    assert [s["status"] for s in samples] == [
        "completed",
        "completed",
        "truncated",
        "completed",
        "aborted",
        "failed",
    ]
    # marked: no reward (not even the default, nor the failed trace's own 1.0), nothing
    # trainable, removed from slime's loss, the cause in metadata
    for sample, kind in zip(samples[4:], ["timeout", "sandbox"], strict=True):
        assert sample["reward"] is None and sample["remove_sample"]
        assert sample["loss_mask"] == [0] and sample["metadata"]["failure"]["kind"] == kind
    assert samples[0]["reward"] == 1.0 and not samples[0]["remove_sample"]
    assert samples[0]["weight_versions"] == ["3"]
    assert samples[0]["session_id"] == "task-a-s0"
    json.dumps(samples)  # plain data: serialisable as is


# --------------------------------------------------------------------------- JSONL


def test_jsonl_lines_parse_and_filter_by_reward(tmp_path: Path) -> None:
    path = tmp_path / "sft.jsonl"
    assert to_openai_messages_jsonl(small_batch(), path) == 4
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 4
    assert lines[0]["messages"] == [
        {"role": "user", "content": "solve 0"},
        {"role": "assistant", "content": "done ✓"},
    ]
    assert lines[0]["tools"][0]["function"]["name"] == "bash"

    buffer = io.StringIO()
    assert to_openai_messages_jsonl(small_batch(), buffer, min_reward=0.5) == 2
    kept = buffer.getvalue().splitlines()
    assert len(kept) == 2
    assert [json.loads(line)["messages"][0]["content"] for line in kept] == ["solve 0", "solve 0"]
    unscored = [make_trajectory("t", 0, [make_trace([1], [2], [1], reward=None)])]
    assert to_openai_messages_jsonl(unscored, io.StringIO(), min_reward=-10.0) == 0
    assert to_openai_messages_jsonl(unscored, io.StringIO()) == 1


# --------------------------------------------------------------------------- Parquet


def test_parquet_round_trip(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    batch = small_batch()
    batch.append(
        make_trajectory(
            "task-c", 0, [make_trace([], [2], [1], reward=None)], status=SessionStatus.CANCELLED
        )
    )
    path = tmp_path / "traces.parquet"
    assert to_parquet(batch, path) == 4  # the cancelled session is left out
    assert to_parquet(batch, path, include_failed=True) == 5
    rows = pq.read_table(path).to_pylist()
    assert len(rows) == 5
    cancelled = batch[-1].traces[0].model_copy(update={"loss_mask": [0]})
    expected = [*_rows(batch[:-1]), (batch[-1], cancelled)]
    for row, (trajectory, trace) in zip(rows, expected, strict=True):
        assert row["task_id"] == trajectory.task_id
        assert row["session_id"] == trajectory.session_id
        assert row["status"] == trajectory.status.value
        assert row["trace_index"] == trace.trace_index
        assert row["prompt_ids"] == trace.prompt_ids
        assert row["response_ids"] == trace.response_ids
        assert row["loss_mask"] == trace.loss_mask
        assert row["response_logprobs"] == trace.response_logprobs  # exact: float64
        assert row["reward"] == trace.reward
        assert row["num_traces_in_session"] == trace.num_traces_in_session
        assert json.loads(row["prompt_messages"]) == trace.prompt_messages
        assert json.loads(row["response_messages"]) == trace.response_messages
        assert json.loads(row["tools"]) == trace.tools
        assert json.loads(row["metadata"]) == {
            **trace.metadata,
            **({"failure": json.loads(row["failure"])} if row["failure"] else {}),
        }
    assert rows[-1]["reward"] is None and json.loads(rows[-1]["failure"])["kind"] == "cancelled"
    assert [r["failure"] for r in rows[:-1]] == [None] * 4


def test_parquet_of_no_traces_has_the_schema(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "empty.parquet"
    assert to_parquet([], path) == 0
    table = pq.read_table(path)
    assert table.num_rows == 0
    assert "response_logprobs" in table.schema.names
