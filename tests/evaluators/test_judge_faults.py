"""LLM judges on the real stack, at scale and under faults (acceptance tier).

The policy runs on the session's llama-server; the judge is Qwen2.5-Coder-0.5B-Instruct on a
llama-server of its own (two slots, 4,096 tokens each) in the gateway's judge pool; the eval
host runs at most :data:`JUDGE_SLOTS` judgings at once. The judge's quality is not the point:
every reward must come from its parsed answer, and a judge that fails must never yield a
reward.

- 8 samples judged each on its own, and 8 judged as a group in chunks of 4 linked through
  anchor samples, each group session calling back once it has its reward;
- the judge killed mid-judging and left dead, a judge call past its time limit: no reward,
  the judge's cause, then rewards from a re-run of the judging on the stored trajectories
  (never a new sample; one through ``rolloutd rejudge``);
- the judge killed and restarted while the judging waits for it: rewards, no attempt spent;
- an answer that never parses: the rubric's minimum, the cause named (the pool answered);
- a group with one sample failed for the infrastructure: judged over the others;
- a long session past the judge's context: per-turn scores in chunks, none lost;
- 64 judgings at once: never more than :data:`JUDGE_SLOTS` in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid

import pytest
from fastapi import FastAPI, Request, Response

from rolloutd.scoring import JUDGE_FAILURE, failure_counts
from rolloutd.store import CompletionLog
from rolloutd.types import SessionResult, TaskRequest, TaskResult, Trajectory
from tests.support.cli_runs import cli_env, run_cli
from tests.support.judge_stack import docstring_task, judge_server, judge_stack
from tests.support.served import served

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.timeout(1800),
]

#: judgings one eval host runs at once in these tests
JUDGE_SLOTS = 3

#: a python-harness agent for the tests' odd sessions: the first session to claim the marker
#: makes no model call (an infrastructure failure: a harness without an answered call); with
#: TURNS > 1, a long session (each turn's tool output a few thousand characters)
AGENT = """
import os

MARKER = {marker!r}
TURNS = {turns}


async def agent(client, instruction, workdir, *, model):
    if MARKER:
        try:
            os.close(os.open(MARKER, os.O_CREAT | os.O_EXCL))
            return "no call"
        except FileExistsError:
            pass
    messages = [{{"role": "user", "content": instruction}}]
    answer = ""
    for turn in range(TURNS):
        response = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=24
        )
        answer = response.choices[0].message.content or ""
        messages.append({{"role": "assistant", "content": answer}})
        if turn + 1 < TURNS:
            log = "\\n".join(f"line {{k}}: value {{k * turn}}" for k in range(130))
            messages.append({{"role": "user", "content": "Build log:\\n" + log + "\\nGo on."}})
    return answer
"""


def agent_task(*, marker: str = "", turns: int = 1, **fields) -> dict:
    """The docstring task on :data:`AGENT`."""
    task = docstring_task(**fields)
    task["harness"] = {
        "type": "python",
        "entry": "judge_agent:agent",
        "files": {"judge_agent.py": AGENT.format(marker=marker, turns=turns)},
    }
    return task


@pytest.fixture(scope="module")
def judge(engine):
    """The judge's llama-server, on a port of its own a test may restart it on."""
    server = judge_server()
    server.start(timeout_s=180)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
async def stack(temporal_server, engine, judge, tmp_path_factory):
    async with judge_stack(
        temporal_server.address,
        tmp_path_factory.mktemp("judges"),
        engine.url,
        judge.url,
        tag="judges",
        max_concurrent_judgings=JUDGE_SLOTS,
        callback_allowed_hosts=["127.0.0.1"],
    ) as (fleets, client):
        yield fleets, client


async def run(client, task: dict) -> tuple[TaskRequest, TaskResult]:
    request = TaskRequest.model_validate(task)
    return request, await (await client.submit(request)).result()


def parsed(record_reason: str) -> dict[str, float]:
    """The criterion scores a record's reason lists (``accuracy=7, clarity=5``)."""
    text = record_reason.split(": ", 1)[-1] if " as " in record_reason else record_reason
    text = text.split(" (")[0]
    return {k: float(v) for k, v in (item.split("=") for item in text.split(", "))}


def expected_reward(rubric, reason: str) -> float:
    """The reward a record's reason accounts for: the rubric's reward of the parsed scores,
    mapped through the chunk's link when the reason gives one (``raw R, linked xA +B``)."""
    raw = rubric.reward(parsed(reason))
    linked = re.search(r"raw ([0-9.]+), linked x([0-9.-]+) ([+-][0-9.]+)", reason)
    if linked is None:
        return raw
    assert float(linked.group(1)) == pytest.approx(raw, abs=1e-4), reason
    slope, shift = float(linked.group(2)), float(linked.group(3))
    return min(1.0, max(0.0, slope * raw + shift))


@contextlib.asynccontextmanager
async def receiver():
    """A real HTTP receiver of callbacks: each POST's JSON body, in order."""
    app = FastAPI()
    bodies: list[dict] = []

    @app.post("/callback")
    async def callback(request: Request) -> Response:
        bodies.append(json.loads(await request.body()))
        return Response(status_code=200)

    async with served(app) as url:
        yield f"{url}/callback", bodies


def with_judge(request: TaskRequest, **judge) -> TaskRequest:
    """``request`` with its judge spec updated."""
    spec = request.evaluator.judge.model_copy(update=judge)
    return request.model_copy(
        update={"evaluator": request.evaluator.model_copy(update={"judge": spec})}
    )


def judge_log(client, session_id: str) -> list:
    return CompletionLog(client.store, session_id).read_all()


async def test_eight_per_sample_and_eight_as_a_group(stack):
    fleets, client = stack
    t0 = time.monotonic()
    async with receiver() as (url, callbacks):
        (per_sample, one_by_one), (grouped, together) = await asyncio.gather(
            run(client, docstring_task(8)),
            run(
                client,
                docstring_task(8, judge={"mode": "group", "group_chunk_size": 4})
                | {"callback_url": url},
            ),
        )
        wall = time.monotonic() - t0
        deadline = time.monotonic() + 60
        while len(callbacks) < 8:
            assert time.monotonic() < deadline, callbacks
            await asyncio.sleep(0.2)
    for request, group, source in (
        (per_sample, one_by_one, "judge"),
        (grouped, together, "group_judge"),
    ):
        rubric = request.evaluator.judge.rubric
        assert len(group.sessions) == 8
        for session in group.sessions:
            assert session.failure is None, session.failure
            record = session.evaluation
            assert record is not None and record.source == source, record
            assert "did not parse" not in (record.reason or ""), record.reason
            assert expected_reward(rubric, record.reason) == pytest.approx(
                session.reward, abs=1e-4
            ), record.reason
            stored = client.trajectory(session)
            assert stored.reward == session.reward
            # the judge's calls are in no trace: the trajectory holds the session's own
            own = {c.index for c in judge_log(client, session.session_id)}
            assert {i for t in stored.traces for i in t.completion_indices} == own
    assert one_by_one.judge_cost.num_calls >= 8 and together.judge_cost.num_calls >= 3
    for session in one_by_one.sessions:
        calls = judge_log(client, f"{session.session_id}/judge")
        assert calls and all(not c.trainable for c in calls)
    group_calls = judge_log(client, f"{grouped.task_id}/group-judge")
    assert len(group_calls) >= 3 and all(not c.trainable for c in group_calls)
    # 4 new samples, then 2 new beside the first chunk's best and worst, twice
    reasons = sorted(s.evaluation.reason.split(" as ")[0] for s in together.sessions)
    assert reasons == ["group chunk 1"] * 4 + ["group chunk 2"] * 2 + ["group chunk 3"] * 2
    assert all("linked" in s.evaluation.reason for s in together.sessions[4:])
    assert all("Attempt D" in c.messages[-1]["content"] for c in group_calls)
    # each group session called back once, after the judging, with its reward
    rewards = {s.session_id: s.reward for s in together.sessions}
    assert sorted(b["session_id"] for b in callbacks) == sorted(rewards)
    assert all(
        b["reward"] is not None and b["reward"] == rewards[b["session_id"]] for b in callbacks
    )
    # the group's sessions say so in their search attributes (visibility catches up)
    query = f"RolloutJudgedByGroup = true AND RolloutTaskId = '{grouped.task_id}'"
    deadline = time.monotonic() + 30
    while len([w async for w in fleets.client.list_workflows(query)]) != 8:
        assert time.monotonic() < deadline, query
        await asyncio.sleep(0.5)
    print("per-sample rewards", [s.reward for s in one_by_one.sessions])
    print("group rewards", [s.reward for s in together.sessions], f"wall {wall:.0f} s")


async def _wait_for_any(client, keys: list[str], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(await asyncio.to_thread(lambda: [client.store.exists(k) for k in keys])):
        assert time.monotonic() < deadline, f"none of {keys} appeared"
        await asyncio.sleep(0.05)


async def test_a_judge_killed_mid_judging_leaves_no_reward_until_rejudged(stack, judge):
    _, client = stack
    # the judging waits 10 s for the dead pool, then gives up
    task = docstring_task(3, judge={"max_attempts": 2}, phases={"provision_wait_s": 10})
    request = TaskRequest.model_validate(task)
    handle = await client.submit(request)
    # the first judge session opened: its judging is under way; the judge dies now
    await _wait_for_any(
        client, [f"sessions/{request.task_id}/{k}/judge/session.json" for k in range(3)]
    )
    judge.process.kill()
    judge.process.wait()
    try:
        group = await handle.result()
    finally:
        judge.start(timeout_s=180)
    assert failure_counts(group.sessions) == {JUDGE_FAILURE: 3}
    for session in group.sessions:
        assert session.reward is None and session.failure.phase == "judge"
        assert session.failure.kind == "evaluator" and not session.failure.retryable
        assert "judge pool stayed down" in session.failure.message, session.failure
        stored = client.trajectory(session)
        assert stored.reward is None and stored.failure.phase == "judge"
        assert stored.evaluation.error
    assert group.num_replacements == 0  # a judging is never re-sampled
    # the judge is back; the gateway sees it at its next probe (backoff up to 5 s), so the
    # re-judging's attempts span longer than the task's two
    rejudged = await client.rejudge(
        with_judge(request, max_attempts=5), group.sessions, run_id=f"kill-{uuid.uuid4().hex[:6]}"
    )
    assert not rejudged.errors and len(rejudged.judged) == 3
    for session in group.sessions:
        stored = client.trajectory(session)
        assert stored.failure is None and stored.reward is not None
        assert stored.rescores[-1].reward == stored.reward
        assert stored.rescores[-1].judge_cost.num_calls >= 1
        # the session was not sampled again: its own log is what it was
        assert len(judge_log(client, session.session_id)) == session.num_completions


async def test_a_judge_past_its_time_limit_leaves_no_reward_until_rejudged(
    stack, temporal_server, tmp_path
):
    fleets, client = stack
    request, group = await run(
        client, docstring_task(2, judge={"timeout_s": 0.05, "max_attempts": 2})
    )
    assert failure_counts(group.sessions) == {JUDGE_FAILURE: 2}
    assert all("timed out" in s.failure.message for s in group.sessions), group.sessions
    # re-judged by the command line, with a patient judge of its own
    patient = with_judge(request, timeout_s=120, max_attempts=5)
    judge_file = tmp_path / "judge.json"
    judge_file.write_text(patient.evaluator.judge.model_dump_json())
    env = cli_env(fleets.store_url) | {"ROLLOUTD_TEMPORAL_NAMESPACE": fleets.namespace}
    code, out, err = await run_cli(
        "rejudge",
        "--task",
        request.task_id,
        "--judge",
        str(judge_file),
        "--run-name",
        f"slow-{uuid.uuid4().hex[:6]}",
        "--address",
        temporal_server.address,
        env=env,
        timeout_s=600,
    )
    assert code == 0, (out, err)
    rows = [re.split(r"\s{2,}", line.strip()) for line in out.splitlines()]
    judged = {row[0]: row for row in rows if len(row) >= 4 and row[1] == "judged"}
    assert sorted(judged) == sorted(s.session_id for s in group.sessions), out
    for session in group.sessions:
        stored = client.trajectory(session)
        assert stored.reward is not None and stored.failure is None
        assert judged[session.session_id][3] == f"{stored.reward:.2f}"


async def test_a_judge_restarted_while_the_judging_waits_leaves_no_failure(stack, judge):
    """The judge dies before the sessions reach their judging and comes back 20 s later: the
    judgings wait for the pool as for a dead engine, without spending their one attempt, and
    every session gets its reward. (The control, a judge that stays dead past the wait, is
    the killed-judge test above.)"""
    _, client = stack
    task = docstring_task(2, judge={"max_attempts": 1}, phases={"provision_wait_s": 180})
    judge.process.kill()
    judge.process.wait()
    try:
        handle = await client.submit(TaskRequest.model_validate(task))
        await _wait_for_any(
            client, [f"sessions/{task['task_id']}/{k}/judge/session.json" for k in range(2)]
        )
        await asyncio.sleep(20)
    finally:
        judge.start(timeout_s=180)
    group = await handle.result()
    for session in group.sessions:
        assert session.failure is None and session.reward is not None, session
        assert session.evaluation.source == "judge"


async def test_an_answer_that_never_parses_scores_the_rubric_minimum(stack):
    _, client = stack
    request, group = await run(
        client,
        docstring_task(
            2,
            judge={
                "max_parse_attempts": 1,
                "rubric": docstring_task()["evaluator"]["judge"]["rubric"]
                | {"template": "Reply with exactly one word, fine or poor:\n{final_answer}"},
            },
        ),
    )
    for session in group.sessions:
        assert session.failure is None and session.reward == 0.0  # the pool answered
        assert "did not parse after 1 call" in session.evaluation.reason
    # the judging re-run with a rubric that asks for the schema: records appended, the reward
    # already handed out stays
    fixed = TaskRequest.model_validate(docstring_task() | {"task_id": request.task_id})
    rejudged = await client.rejudge(fixed, group.sessions, run_id=f"fix-{uuid.uuid4().hex[:6]}")
    assert not rejudged.errors
    for session in group.sessions:
        stored = client.trajectory(session)
        assert stored.reward == 0.0 and "did not parse" not in stored.rescores[-1].reason


async def test_a_group_is_judged_over_its_samples_that_ran(stack, tmp_path):
    _, client = stack
    marker = str(tmp_path / f"claimed-{uuid.uuid4().hex[:6]}")
    _, group = await run(
        client,
        agent_task(marker=marker, num_samples=4, max_replacements=0, judge={"mode": "group"}),
    )
    failed = [s for s in group.sessions if s.failure is not None]
    judged = [s for s in group.sessions if s.failure is None]
    assert len(failed) == 1 and failed[0].failure.kind == "harness", group.sessions
    assert failed[0].reward is None and failed[0].evaluation is None
    assert len(judged) == 3 and all(s.reward is not None for s in judged)
    prompt = judge_log(client, f"{group.task_id}/group-judge")[0].messages[-1]["content"]
    assert "Attempt C" in prompt and "Attempt D" not in prompt


async def test_a_long_session_is_judged_in_chunks_without_losing_a_score(stack):
    _, client = stack
    # 40,000 characters of prompt at most: more than the judge's 4,096-token context holds, so
    # the judge refuses and the judging halves its budget until the prompts fit (the outcome
    # prompt loses its middle, and the turns go in chunks)
    _, group = await run(
        client,
        agent_task(
            turns=5,
            num_samples=1,
            judge={"per_turn": True, "turn_chunk_size": 2, "max_prompt_chars": 40_000},
            phases={"run_s": 600},
        ),
    )
    (session,) = group.sessions
    assert session.failure is None and session.reward is not None, session
    stored: Trajectory = client.trajectory(session)
    size = sum(len(json.dumps(t.prompt_messages + t.response_messages)) for t in stored.traces)
    assert size > 9_000  # about 4,500 tokens: more than the judge's 4,096-token context
    turn_rewards = [r for t in stored.traces for r in t.turn_rewards]
    assert len(turn_rewards) == session.num_completions == 5
    assert all(r is not None and 0.0 <= r <= 1.0 for r in turn_rewards)
    calls = judge_log(client, f"{session.session_id}/judge")
    assert len(calls) >= 4  # the outcome, then the turns in chunks of at most 2
    assert "elided" in session.evaluation.reason
    print("long session", size, "chars;", len(calls), "judge calls; turns", turn_rewards)


async def test_judge_concurrency_holds_under_64_judgings(stack):
    fleets, client = stack
    _, group = await run(client, docstring_task(2))
    source = client.trajectory(group.sessions[0])
    batch = f"batch-{uuid.uuid4().hex[:6]}"
    targets = []
    for k in range(64):
        copy = source.model_copy(update={"session_id": f"{batch}/{k}", "rescores": []})
        key = f"sessions/{batch}/{k}/trajectory.json"
        client.store.put_json(key, copy)
        targets.append(
            SessionResult(
                session_id=copy.session_id, task_id=batch, status=source.status, trajectory_ref=key
            )
        )
    request = TaskRequest.model_validate(docstring_task() | {"task_id": batch})
    judges = fleets.handles["eval"].resources["judges"]
    judges.max_running = 0
    t0 = time.monotonic()
    rejudged = await client.rejudge(request, targets, run_id=batch, max_concurrent=64)
    wall = time.monotonic() - t0
    assert not rejudged.errors and len(rejudged.judged) == 64
    # in flight at once: judgings on the host, and calls as the judge's logs time them
    spans = sorted(
        (c.timings.started_at, c.timings.started_at + c.timings.duration_s)
        for k in range(64)
        for c in judge_log(client, f"{batch}/{k}/judge-{batch}")
    )
    most = max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)
    print(
        f"64 judgings: {wall:.0f} s, at most {judges.max_running} judgings and {most} "
        f"calls in flight (bound {JUDGE_SLOTS})"
    )
    assert judges.max_running == JUDGE_SLOTS  # reached, never passed
    assert most <= JUDGE_SLOTS
