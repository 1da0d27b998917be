"""helm/rolloutd on real pods: the chart rendered for a local run and
played with ``podman kube play`` (tests/deploy/podplay.py says exactly what is converted for
podman 4.3 and why), sessions run through the REST facade (HTTP) and the trainer client (gRPC
to Temporal), and one sandbox pod and one gateway pod are SIGKILLed and removed mid-run.

Pods: Temporal dev server, engine (llama-server, SmolLM2-135M), 2 gateway pods, 2 sandbox pods
(bubblewrap in privileged pods), workflows, eval, REST, on one podman network; the blob store
is the chart's PersistentVolumeClaim (a podman volume every pod mounts, read here from the
host). No controller runs here, so the test recreates what Kubernetes would: the killed
gateway pod under its StatefulSet name (sessions pinned to it wait for it), the killed sandbox
pod as a new Deployment pod. Its sessions restart on a live host and replay the recorded calls
(docs/faults.md).

Asserted: 0 sessions lost, every session completed and scored, each completion log's indices
0..n-1, every harness got exactly the recorded answers once each, in order (0 lost, 0
duplicated), at least one session restarted and replayed. Acceptance tier (README's
acceptance command): the images are built first when missing (scripts/build_images.sh, about
23 minutes cold, seconds cached), then the run takes about 6 minutes; skipped only where
podman is absent.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rolloutd.proxy.sessions.recorder import answer_id
from rolloutd.store import BlobStore, CompletionLog, artifact_key
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus, TaskResult

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from podplay import PodDeployment, local_values, podman  # noqa: E402

from tests.reliability.conftest import (  # noqa: E402
    AGENT,
    NUM_CALLS,
    agent_task,
    harness_ids,
    poll,
)
from tests.support.images import no_podman  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.deploy,
    pytest.mark.slow,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.skipif(no_podman() is not None, reason=str(no_podman())),
    pytest.mark.timeout(900),
]

#: sessions per submission path (REST facade, trainer client)
NUM_SAMPLES = 4
PAUSE_S = 3.0
#: tests/reliability's agent, with a 20 s client timeout instead of 120 s, and its retries
#: marked as the OpenAI/Anthropic SDKs mark theirs (``x-stainless-retry-count``). A pod that
#: is SIGKILLed takes its network namespace with it, so its open connections get no reset and
#: a call in flight hangs until the harness's own timeout. A retry the client marks is
#: answered from the log, or waits for the same request still being sampled; an unmarked
#: identical request while the first is sampling is another call (sub-agents) and samples.
POD_AGENT = AGENT.replace("timeout=120", "timeout=20").replace(
    '"Content-Type": "application/json"}',
    '"Content-Type": "application/json", "x-stainless-retry-count": str(attempt)}',
)
assert POD_AGENT.count("timeout=20") == 1 and POD_AGENT.count("x-stainless") == 1


def pod_task(task_id: str, marker: str) -> dict:
    """A task of :data:`NUM_SAMPLES` sessions running :data:`POD_AGENT` in bubblewrap."""
    task = agent_task(task_id, marker, num_samples=NUM_SAMPLES, pause_s=PAUSE_S)
    task["runtime"]["files"]["agent.py"] = POD_AGENT
    return task


def build_images() -> dict[str, str]:
    """``{"rolloutd"|"engine": tag}`` from scripts/build_images.sh (builds or reuses)."""
    env = {**os.environ, "ROLLOUTD_VENV": sys.prefix}
    result = subprocess.run(
        ["nice", "-n", "10", str(ROOT / "scripts" / "build_images.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert result.returncode == 0, f"build_images.sh failed:\n{result.stdout}\n{result.stderr}"
    tags = {
        line.split("=", 1)[0][len("IMAGE_") :].lower(): line.split("=", 1)[1]
        for line in result.stdout.splitlines()
        if line.startswith("IMAGE_")
    }
    return {"rolloutd": tags["rolloutd"], "engine": tags["engine"]}


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[PodDeployment]:
    """The chart played on pods, every fleet started; torn down always (pods, volume,
    secret, network), and the test fails if anything of it is left."""
    images = build_images()
    print("images:", images)
    release = f"pt{uuid.uuid4().hex[:6]}"
    pods = PodDeployment(release, local_values(images), tmp_path_factory.mktemp("pods"))
    try:
        t0 = time.monotonic()
        pods.up()
        started = pods.wait_started(timeout_s=300)
        print(f"fleets started in {time.monotonic() - t0:.1f} s: {started}")
        yield pods
    finally:
        for pod in pods.pod_names():  # the fleets' logs, for a failure's reader
            sys.stdout.write(f"--- {pod}\n{pods.logs(pod)[-1500:]}\n")
        left = pods.down()
        assert left == [], f"left after kube down: {left}"


def _runtimes(pod: str) -> list[str]:
    """The runtime ids a sandbox pod holds now (its runtime root's folders; a first
    attempt's id starts with its session id, "/" made ".")."""
    out = podman(
        "exec", f"{pod}-sandbox", "ls", "/var/lib/rolloutd/runtimes", check=False
    ).stdout.split()
    return [n for n in out if not n.startswith(".")]


async def test_pods_lose_no_session_or_completion_when_a_sandbox_and_gateway_die(
    deployment: PodDeployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart played on pods runs 8 sessions through REST and the trainer client while one
    sandbox pod and one gateway pod are SIGKILLed and recreated: no session is lost, every one
    completes scored, each completion log is 0..n-1, every harness got the recorded answers once
    each in order, and at least one session was replayed. About 6 minutes once the images exist
    (building them cold takes about 23 minutes here, docs/images.md)."""
    pods = deployment
    monkeypatch.setenv("ROLLOUTD_CODEC_KEYS", pods.secret("codec-keys"))
    temporal = f"{pods.ip(f'{pods.fullname}-temporal-dev')}:7233"
    rest_url = f"http://{pods.ip(f'{pods.fullname}-rest')}:8080"
    store = BlobStore(str(pods.store_path()))
    client = await RolloutClient.connect(temporal, store_url=str(pods.store_path()))
    tag = uuid.uuid4().hex[:6]
    t0 = time.monotonic()

    # the REST facade (HTTP, Polar's shape): a shell harness making NUM_CALLS model calls
    rest_task = pod_task(f"pods-rest-{tag}", f"rolloutd-pods-{tag}")
    auth = {"Authorization": f"Bearer {pods.secret('rest-token')}"}
    async with httpx.AsyncClient(base_url=rest_url, headers=auth, timeout=60) as http:
        assert (await http.get("/rollout/status")).status_code == 200
        assert (
            await http.get("/rollout/status", headers={"Authorization": "Bearer x"})
        ).status_code == 401
        submitted = await http.post(
            "/rollout/task/submit",
            json={
                "task_id": rest_task["task_id"],
                "instruction": rest_task["instruction"],
                "num_samples": NUM_SAMPLES,
                "timeout_seconds": rest_task["timeout_s"],
                "runtime": {"backend": "bwrap", "files": rest_task["runtime"]["files"]},
                "agent": {
                    "harness": "shell",
                    "settings": {"command": rest_task["harness"]["command"]},
                },
                "evaluator": {"strategy": "session_completed"},
                "sampling": rest_task["sampling"],
                "phases": rest_task["phases"],
            },
        )
        assert submitted.status_code == 200, submitted.text
        # the trainer client (gRPC to Temporal)
        grpc_task = pod_task(f"pods-grpc-{tag}", f"rolloutd-pods-{tag}")
        await client.submit(grpc_task)
        task_ids = [rest_task["task_id"], grpc_task["task_id"]]
        sessions = [f"{t}/{i}" for t in task_ids for i in range(NUM_SAMPLES)]

        # mid-run: sessions with recorded calls; the sandbox pod holding more runtimes dies
        def mid_run() -> dict[str, int]:
            """{sandbox pod: its sessions with recorded calls}, once 3 sessions have some."""
            with_calls = [s for s in sessions if len(CompletionLog(store, s)) >= 1]
            if len(with_calls) < 3:
                return {}
            held = {p: _runtimes(p) for p in pods.pods_of("sandbox")}
            busy = {
                p: sum(
                    any(r.startswith(s.replace("/", ".") + "-") for s in with_calls) for r in ids
                )
                for p, ids in held.items()
            }
            return busy if any(busy.values()) else {}

        busy = await poll(
            lambda: asyncio.to_thread(mid_run),
            240,
            "sessions mid-run with recorded calls",
            every_s=1,
        )
        victim_sandbox = max(busy, key=busy.get)
        held = busy
        victim_gateway = f"{pods.fullname}-gateway-0"
        completions_before = sum(len(CompletionLog(store, s)) for s in sessions)
        print(
            f"killing {victim_sandbox} (sessions with calls {held}) and {victim_gateway} with "
            f"{completions_before} completions recorded"
        )
        pods.kill(victim_sandbox)
        pods.kill(victim_gateway)
        # what the controllers would do: the StatefulSet's pod under its name, a new
        # Deployment pod for the sandbox
        pods.replace(victim_gateway)
        pods.replace(victim_sandbox)

        # every session ends; REST reports each one scored
        async def rest_done() -> dict:
            body = (await http.get(f"/rollout/task/{rest_task['task_id']}")).json()
            return body if body["status"] != "running" else {}

        rest_body = await poll(rest_done, 420, "the REST task to finish", every_s=3)
    groups = [await asyncio.wait_for(client.result(t), 120) for t in task_ids]
    wall_s = time.monotonic() - t0

    for group in groups:  # what a harness said, for a failure's reader
        for s in group.sessions:
            if s.reward != 1.0:
                harness = store.get_json(artifact_key(s.session_id, "harness"))
                print(
                    f"{s.session_id}: {s.status} reward {s.reward} error {s.error}\n"
                    f"{str(harness.get('stderr'))[-2000:]}"
                )
    assert rest_body["status"] == "completed", rest_body
    assert len(rest_body["results"]) == NUM_SAMPLES
    assert all(
        r["status"].lower() == "completed" and r["reward"] == 1.0 for r in rest_body["results"]
    ), rest_body["results"]
    figures = check_groups(store, groups)
    figures |= {
        "wall_s": round(wall_s, 1),
        "completions_before_kill": completions_before,
        "killed": [victim_sandbox, victim_gateway],
    }
    print("pod-kill figures:", json.dumps(figures))
    assert figures["sessions"] == 2 * NUM_SAMPLES
    assert figures["lost_sessions"] == 0 and figures["scored"] == 2 * NUM_SAMPLES, figures
    assert figures["lost"] == 0 and figures["duplicated"] == 0, figures
    # the kill mattered: sessions of the killed host ran again, replaying their calls
    assert figures["restarted"] >= 1 and figures["replayed"] >= 1, figures


def check_groups(store: BlobStore, groups: list[TaskResult]) -> dict:
    """The invariants of every session (as tests/reliability/test_kills.py checks them);
    returns the figures."""
    out = {
        "sessions": 0,
        "lost_sessions": 0,
        "scored": 0,
        "completions": 0,
        "replayed": 0,
        "restarted": 0,
        "lost": 0,
        "duplicated": 0,
    }
    for group in groups:
        for s in group.sessions:
            out["sessions"] += 1
            if s.status != SessionStatus.COMPLETED:
                out["lost_sessions"] += 1
                continue
            out["scored"] += s.reward is not None
            completions = CompletionLog(store, s.session_id).read_all()
            assert [c.index for c in completions] == list(range(len(completions)))
            assert s.replay.num_replayed == sum(c.replayed_from is not None for c in completions)
            out["completions"] += len(completions)
            out["replayed"] += s.replay.num_replayed
            out["restarted"] += bool(s.attempts)
            ids = harness_ids(store, s.session_id)
            assert ids is not None, f"{s.session_id}: harness printed no ids"
            expected = [answer_id(c) for c in completions]
            out["lost"] += len(set(expected) - set(ids))
            out["duplicated"] += len(ids) - len(set(ids)) + max(0, len(completions) - NUM_CALLS)
            assert ids == expected and len(completions) == NUM_CALLS, (s.session_id, ids)
    return out
