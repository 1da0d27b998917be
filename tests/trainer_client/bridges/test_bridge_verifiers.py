"""The verifiers bridge against verifiers 0.4.0 itself: verifiers' own ``EnvClient`` (ZMQ,
msgpack, its delta assembly, its ``WireEpisode`` validation) drives rolloutd sessions through
:class:`RolloutdEnvServer`.

The wire-type test runs in the default tier (no fleet, seconds). The acceptance test runs 4
tasks (the shell harness in bwrap, one chat call each through the gateway to
Qwen2.5-Coder-0.5B on llama-server) and cancels one of them mid-run, as prime-rl's
orchestrator does when it drops a rollout: about 1-3 minutes on 2 cores. Skipped when
verifiers is not installed (scripts/setup.sh installs it).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from tests.support.bridges import INSTALL, ask_task, have

pytestmark = [
    # verifiers comes from scripts/setup.sh (scripts/setup_trainers.sh --project)
    pytest.mark.trainers,
    pytest.mark.skipif(not have("verifiers"), reason=f"verifiers is not installed; {INSTALL}"),
]


def _episode_parts():
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.types import SamplingConfig

    return EvalClientConfig(base_url="http://127.0.0.1:9/v1"), SamplingConfig


def test_episode_of_a_session_validates_as_verifiers_wire_episode():
    """A session's trajectory becomes verifiers' Episode: it survives verifiers' own delta
    stream, assembly and ``WireEpisode`` validation, with the tokens, mask and logprobs of
    the trace on its nodes and the reward only when the session counts."""
    from verifiers.v1.episode import WireEpisode
    from verifiers.v1.serve.delta import (
        DeltaStreamer,
        EpisodeAssembly,
        TraceSummary,
        dump,
        pack,
        unpack,
    )

    from rolloutd.trainer_client.bridges.verifiers import episode_of
    from rolloutd.types import FailureCause, SessionResult, SessionStatus, Trace, Trajectory

    trace = Trace(
        prompt_ids=[1, 2, 3],
        response_ids=[10, 11, 12, 20, 21, 30],
        loss_mask=[1, 1, 0, 0, 0, 1],
        response_logprobs=[-0.5, -0.25, 0.0, 0.0, 0.0, -1.5],
        response_messages=[
            {"role": "assistant", "content": "a"},
            {"role": "tool", "tool_call_id": "c1", "content": "out"},
            {"role": "assistant", "content": "b"},
        ],
        completion_indices=[0, 1],
        policy_versions=[3, 3],
    )

    def round_trip(session, trajectory):
        episode = episode_of({"instruction": "do it"}, session, trajectory, env_id="rolloutd")
        sent = []

        async def stream():
            async def send(delta):
                sent.append(unpack(pack(delta)))

            async with DeltaStreamer(lambda: episode.traces, send) as streamer:
                for t in episode.traces:
                    streamer.watch(t)

        asyncio.run(stream())
        assembly = EpisodeAssembly()
        for delta in sent:
            assembly.apply(delta)
        head = unpack(pack(dump(episode, exclude={"traces"})))
        counts = [TraceSummary(id=t.id, nodes=len(t.nodes), calls=0) for t in episode.traces]
        return WireEpisode.model_validate(assembly.finish(head, counts))

    done = SessionResult(session_id="s1", task_id="t", status=SessionStatus.COMPLETED, reward=0.5)
    wire = round_trip(done, Trajectory(session_id="s1", task_id="t", traces=[trace]))
    assert wire.ok
    (got,) = wire.traces
    assert got.rewards["rolloutd"].score == 0.5
    tokens = [t for node in got.nodes for t in node.token_ids]
    assert tokens == trace.prompt_ids + trace.response_ids
    mask = [m for node in got.nodes[1:] for m in node.mask]
    assert mask == [bool(m) for m in trace.loss_mask]
    sampled = [lp for node in got.nodes if node.sampled for lp in node.logprobs]
    assert sampled == [-0.5, -0.25, -1.5]
    assert [n.message.role for n in got.nodes] == ["user", "assistant", "tool", "assistant"]
    assert got.info["session_id"] == "s1" and got.info["policy_versions"] == [3, 3]

    failed = SessionResult(
        session_id="s2",
        task_id="t",
        status=SessionStatus.FAILED,
        reward=0.0,  # an old evaluator's reward of an infrastructure failure: never passed on
        failure=FailureCause(kind="backend", message="502 from the engine"),
    )
    wire = round_trip(failed, Trajectory(session_id="s2", task_id="t", traces=[trace]))
    assert not wire.ok
    assert [e.type for e in wire.errors] == ["backend"]
    assert wire.traces[0].rewards == {}
    # prime-rl's GRPO keeps a trace with an error out of its group's statistics
    # (prime_rl/orchestrator/algo/base.py, iter_trainable_traces)
    assert wire.traces[0].has_error and not got.has_error


@pytest.mark.acceptance
@pytest.mark.temporal
@pytest.mark.engine
@pytest.mark.sandbox
@pytest.mark.timeout(900)
async def test_verifiers_client_runs_four_tasks_and_cancels_one(fleets):
    """verifiers' EnvClient: health, 4 runs through rolloutd sessions (3 answered, 1 cancelled
    while its harness runs); the episodes carry the sessions' traces token for token, and the
    cancelled session's sandbox is torn down. About 1-3 minutes."""
    from verifiers.v1.serve import EnvClient

    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient
    from rolloutd.trainer_client.bridges.verifiers import RolloutdEnvServer
    from rolloutd.types import SessionStatus

    client_config, SamplingConfig = _episode_parts()
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    suffix = uuid.uuid4().hex[:6]
    server = RolloutdEnvServer(client, task_prefix=f"vf-{suffix}")
    serving = asyncio.create_task(server.serve())
    env = EnvClient(server.address)
    sampling = SamplingConfig(temperature=1.0, max_tokens=16)
    marker = f"started-{suffix}"
    cancel_id = f"vf-cancel-{suffix}"
    try:
        assert await env.health(timeout=10)
        runs = [
            asyncio.create_task(
                env.run(
                    client_config,
                    "qwen2.5-coder-0.5b",
                    sampling,
                    {"instruction": f"Name a {word}. One word.", **ask_task(turns=2)},
                )
            )
            for word in ("fruit", "colour", "planet")
        ]
        sleeper = {
            **ask_task(),
            "task_id": cancel_id,
            "instruction": "wait",
            "harness": {"type": "shell", "command": f"touch {marker} && sleep 600"},
        }
        cancelled = asyncio.create_task(
            env.run(client_config, "qwen2.5-coder-0.5b", sampling, sleeper)
        )
        deadline = time.monotonic() + 300
        while not list(fleets.runtime_root.rglob(marker)):
            assert time.monotonic() < deadline, "the cancel target's harness never started"
            assert not cancelled.done(), cancelled
            await asyncio.sleep(0.2)
        cancelled.cancel()  # EnvClient sends verifiers' `cancel` for the dropped run
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        episodes = await asyncio.gather(*runs)

        # the cancelled run's task ends cancelled and its sandbox is gone
        deadline = time.monotonic() + 120
        while (progress := await client.status(cancel_id)).status == "running":
            assert time.monotonic() < deadline, progress
            await asyncio.sleep(0.5)
        assert progress.status == "cancelled" or all(
            s.status == SessionStatus.CANCELLED for s in progress.sessions
        ), progress
        assert not list(fleets.runtime_root.rglob(marker))
        assert server.num_cancelled == 1

        for episode in episodes:
            (trace,) = episode.traces
            session_id = trace.info["session_id"]
            group = await client.result(trace.info["task_id"])
            (session,) = group.sessions
            assert session.session_id == session_id
            assert session.status == SessionStatus.COMPLETED, session.error
            assert episode.ok
            assert trace.rewards["rolloutd"].score == session.reward == 1.0
            (expected,) = client.trajectory(session).traces
            assert 0 in expected.loss_mask  # the second user turn between two sampled ones
            assert [n.message.role for n in trace.nodes] == [
                "user",
                "assistant",
                "user",
                "assistant",
            ]
            tokens = [t for node in trace.nodes for t in node.token_ids]
            assert tokens == expected.prompt_ids + expected.response_ids
            mask = [m for node in trace.nodes[1:] for m in node.mask]
            assert mask == [bool(m) for m in expected.loss_mask]
            logprobs = [lp for node in trace.nodes if node.sampled for lp in node.logprobs]
            assert logprobs == [
                lp for lp, m in zip(expected.response_logprobs, expected.loss_mask) if m
            ]
        assert server.stats.num_sessions_left_out == 0
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await env.close()
        server.close()
