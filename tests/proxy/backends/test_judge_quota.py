"""The judge pool's token quota (``judge_tokens_per_minute``): a token bucket in the gateway's
pool that judge calls spend and policy calls never touch; a judge call past it is answered 429
with ``Retry-After``, and the judge activity waits that long and asks again (never a failure).

In-process: the real gateway app (httpx.ASGITransport) over the scripted llama.cpp of
tests/proxy/support.py, and the real judge activity calling it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.activities.judging import JudgeActivities
from rolloutd.activities.models import JudgeInput, JudgeTarget
from rolloutd.errors import JudgeQuotaError
from rolloutd.proxy.backends.quota import TokenQuota
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.types import EvaluatorSpec, Trace, Trajectory
from tests.proxy.support import Backends, FakeLlamaCpp, asgi_client, chat, make_admin_gateway
from tests.support.judge_stack import DOCSTRING_RUBRIC


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_admits_until_spent_then_says_when_to_ask_again():
    clock = Clock()
    quota = TokenQuota(600, clock=clock)  # 10 tokens a second
    quota.admit()
    quota.charge(650)  # one call may overdraw it: its size is known only once it answered
    with pytest.raises(JudgeQuotaError) as refused:
        quota.admit()
    assert refused.value.retry_after_s == pytest.approx(5.1)  # 51 tokens at 10 a second
    assert refused.value.status_code == 429
    clock.now += 5.2
    quota.admit()  # refilled past zero
    clock.now += 3600
    assert quota.describe()["tokens_left"] == 600  # never more than a minute's tokens
    assert (quota.num_charged, quota.num_refused) == (650, 1)


@pytest.fixture
async def gateway(tmp_path: Path, tokenizer: Any, fake_llama: FakeLlamaCpp):
    fake_llama.answers = ['{"accuracy": 7, "clarity": 4}']
    gw = make_admin_gateway(
        tmp_path / "store",
        tokenizer,
        Backends(fake_llama),
        judge_backend_url="http://judge",
        judge_backend_type="llama_cpp",
        judge_tokens_per_minute=6000,
    )
    yield gw
    await gw.aclose()


async def test_a_spent_quota_holds_judges_back_and_never_policy_calls(gateway, tmp_path):
    quota = gateway.pool.judge_quota
    assert quota is not None
    # the quota is spent, half a second's tokens overdrawn
    quota.level = -quota.rate * 0.5
    judge = await gateway.sessions.open_session("t/0/judge", "t", pool="judge")
    policy = await gateway.sessions.open_session("t/1", "t")
    async with asgi_client(gateway) as http:
        refused = await chat(http, judge.session_key)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        # control: the policy's calls never wait for the judges' quota
        assert (await chat(http, policy.session_key)).status_code == 200
    assert quota.num_refused == 1 and quota.num_charged == 0

    # the judge activity waits as told and asks again: a reward, not a failure
    quota.level = -quota.rate * 0.5
    store = BlobStore(str(tmp_path / "store"))
    trace = Trace(
        prompt_messages=[{"role": "user", "content": "Document add()"}],
        response_messages=[{"role": "assistant", "content": '"""Add two numbers."""'}],
        completion_indices=[0],
    )
    store.put_json(
        "sessions/t/0/trajectory.json", Trajectory(session_id="t/0", task_id="t", traces=[trace])
    )
    judges = JudgeActivities(store, transport=httpx.ASGITransport(app=gateway.app))
    try:
        out = await judges.judge(
            JudgeInput(
                task_id="t",
                evaluator=EvaluatorSpec(type="llm_judge", judge={"rubric": DOCSTRING_RUBRIC}),
                targets=[
                    JudgeTarget(session_id="t/0", trajectory_ref="sessions/t/0/trajectory.json")
                ],
                base_url=judge.openai_base_url,
                session_key=judge.session_key,
                judge_session_id="t/0/judge",
            )
        )
    finally:
        await judges.aclose()
    (verdict,) = out.judged
    assert verdict.reward == pytest.approx((7 / 10 + 0.5 * 4 / 10) / 1.5)
    assert out.cost.quota_wait_s == 1.0 and out.cost.num_calls == 1
    assert quota.num_refused == 2
    # what was charged is what the judge's recorded call used
    (call,) = CompletionLog(store, "t/0/judge").read_all()
    assert quota.num_charged == len(call.prompt_ids) + len(call.response_ids)
    assert not call.trainable
