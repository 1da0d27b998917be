"""The first real rollout, end to end: the qwen-code CLI in a bubblewrap sandbox calls
Qwen2.5-Coder-0.5B-Instruct on llama-server through rolloutd's gateway; Temporal orchestrates;
the trainer client receives scored, token-faithful trajectories.

Two recording proxies sit on the wire (tests/support/tee.py): one between the gateway and
llama-server (what the engine really answered), one between the harness and the gateway (what
the harness really received).
"""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest

from rolloutd.proxy.sessions.state import hash_session_key
from rolloutd.sandbox.config import npm_prefix
from rolloutd.stack import temporal_binary
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.trainer_client import RolloutClient
from rolloutd.trajectory import check_invariants
from rolloutd.types import SessionStatus

# about 4 minutes on 2 cores (a real qwen-code CLI, 2 samples of up to 4 turns): acceptance
pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.harness,
    pytest.mark.slow,
]


def engine_answers(exchanges) -> dict[tuple[int, ...], list[tuple[list[int], list[float]]]]:
    """prompt ids -> [(sampled ids, logprobs)] as llama-server's /completion returned them
    (sessions of one task often send identical first prompts, hence a list)."""
    answers: dict[tuple[int, ...], list[tuple[list[int], list[float]]]] = {}
    for ex in exchanges:
        if ex.path != "/completion" or ex.status != 200:
            continue
        prompt = tuple(ex.request_json()["prompt"])
        events = ex.sse_events() if "event-stream" in ex.content_type else [ex.response_json()]
        ids: list[int] = []
        logprobs: list[float] = []
        for event in events:
            if event == "[DONE]":
                continue
            for prob in event.get("completion_probabilities", []):
                ids.append(prob["id"])
                logprobs.append(prob["logprob"])
        answers.setdefault(prompt, []).append((ids, logprobs))
    return answers


def assert_openai_chat_response(ex) -> None:
    """The harness received a well-formed OpenAI Chat Completions answer (streamed or not)."""
    assert ex.status == 200, (ex.status, ex.response_body[:500])
    if "event-stream" in ex.content_type:
        events = ex.sse_events()
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert all(isinstance(c["choices"], list) for c in chunks)
        finishes = [ch.get("finish_reason") for c in chunks for ch in c["choices"]]
        assert any(f in ("stop", "length", "tool_calls") for f in finishes)
    else:
        body = ex.response_json()
        assert body["object"] == "chat.completion"
        choice = body["choices"][0]
        assert choice["message"]["role"] == "assistant"
        assert choice["finish_reason"] in ("stop", "length", "tool_calls")
        assert body["usage"]["completion_tokens"] >= 1


@pytest.mark.timeout(1200)
@pytest.mark.skipif(
    not (npm_prefix() / "node_modules/.bin/qwen").exists(),
    reason="qwen-code CLI not installed (scripts/setup.sh installs it)",
)
async def test_qwen_code_rollout_is_token_faithful_and_scored(fleets, temporal_server):
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    task_id = f"e2e-{uuid.uuid4().hex[:6]}"
    handle = await client.submit(
        {
            "task_id": task_id,
            "instruction": "Use the write_file tool to create a file named hello.py that "
            "prints the text hello world.",
            "num_samples": 2,
            "harness": {"type": "qwen_code", "profile": "compact", "max_turns": 4},
            "runtime": {"type": "bwrap"},
            "evaluator": {
                "type": "test_on_output",
                "command": "python3 hello.py",
                "expected_output": "hello world",
            },
            "sampling": {"temperature": 0.7, "max_tokens": 256},
            "phases": {"run_s": 600},
        }
    )
    group = await handle.result()

    assert len(group.sessions) == 2
    answers = engine_answers(fleets.engine_tee.exchanges)
    for session in group.sessions:
        assert session.status in (SessionStatus.COMPLETED, SessionStatus.TIMEOUT), session.error
        assert session.reward in (0.0, 1.0)
        assert session.num_completions >= 1
        completions = CompletionLog(client.store, session.session_id).read_all()
        assert len(completions) == session.num_completions
        trajectory = client.trajectory(session)
        check_invariants(trajectory.traces, completions)
        assert trajectory.reward == session.reward
        assert all(t.reward == session.reward for t in trajectory.traces)
        # every sampled token and logprob is what llama-server returned for that very prompt
        for c in completions:
            candidates = answers.get(tuple(c.prompt_ids), [])
            match = [
                a
                for a in candidates
                if a[0] == c.response_ids and a[1] == pytest.approx(c.response_logprobs, abs=1e-6)
            ]
            assert match, (
                f"completion {c.index} of {session.session_id} is not what the engine sent"
            )
            candidates.remove(match[0])  # one engine answer backs one completion
        # ... and every trainable position of every trace is one of those sampled tokens
        by_index = {c.index: c for c in completions}
        for trace in trajectory.traces:
            merged = [by_index[i] for i in trace.completion_indices if by_index[i].trainable]
            sampled = [t for c in merged for t in c.response_ids]
            sampled_logprobs = [lp for c in merged for lp in c.response_logprobs]
            trainable = [t for t, m in zip(trace.response_ids, trace.loss_mask) if m]
            trainable_logprobs = [
                lp for lp, m in zip(trace.response_logprobs, trace.loss_mask) if m
            ]
            assert trainable == sampled
            assert trainable_logprobs == sampled_logprobs
        # the harness got well-formed OpenAI answers (on a loaded machine a harness may time
        # out and hang up mid-stream, then retry: only answers it read to the end are judged)
        session_state = client.store.get_bytes(f"sessions/{session.session_id}/session.json")
        mine = [
            ex
            for ex in fleets.harness_tee.exchanges  # the gateway keeps key hashes
            if ex.path.endswith("/chat/completions")
            and hash_session_key(ex.path.split("/")[2]) in session_state.decode()
        ]
        read_to_the_end = [ex for ex in mine if ex.complete]
        assert len(read_to_the_end) >= session.num_completions
        for ex in read_to_the_end:
            assert_openai_chat_response(ex)

    listed = subprocess.run(
        [
            temporal_binary(),
            "workflow",
            "list",
            "--address",
            temporal_server.address,
            "--query",
            f"WorkflowId STARTS_WITH 'task/{task_id}'",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    ids = {w["execution"]["workflowId"] for w in json.loads(listed.stdout or "[]")}
    assert {f"task/{task_id}", f"task/{task_id}/0", f"task/{task_id}/1"} <= ids
