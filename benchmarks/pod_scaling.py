"""Benchmark: sessions per minute with 1 and with 3 sandbox pods.

helm/rolloutd is played on real pods as tests/deploy/test_pods.py plays it
(tests/deploy/podplay.py: the chart's local rendering, what is converted for podman 4.3), once
per sandbox replica count, each sandbox pod limited to the same concurrent sessions
(``sandbox.maxConcurrentSessions``: ROLLOUTD_MAX_CONCURRENT_SESSIONS). The workload is the
same each time: ``--sessions`` sessions of a shell harness in bubblewrap that makes one tiny
model call through the gateway (8 tokens) and sleeps ``--sleep-s``, so the per-host slot limit,
not the CPU, bounds throughput. Sessions per minute = sessions / (last session's end - submit).

Run: ``python benchmarks/pod_scaling.py`` (needs podman and the images of
scripts/build_images.sh); prints one JSON line per replica count, then a table. Exits non-zero
when a session does not complete.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "deploy"))

from podplay import PodDeployment, local_values  # noqa: E402

from rolloutd.trainer_client import RolloutClient  # noqa: E402
from rolloutd.types import SessionStatus  # noqa: E402
from tests.reliability.conftest import agent_task  # noqa: E402


def images() -> dict[str, str]:
    """The images of scripts/build_images.sh (built or reused)."""
    env = {**os.environ, "ROLLOUTD_VENV": sys.prefix}
    out = subprocess.run(
        ["nice", "-n", "10", str(ROOT / "scripts" / "build_images.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    tags = dict(
        line[len("IMAGE_") :].split("=", 1)
        for line in out.splitlines()
        if line.startswith("IMAGE_")
    )
    return {"rolloutd": tags["ROLLOUTD"], "engine": tags["ENGINE"]}


async def run_workload(pods: PodDeployment, num_sessions: int, sleep_s: float) -> dict:
    """Submit ``num_sessions`` one-call sessions at once; wait for all; return the figures."""
    os.environ["ROLLOUTD_CODEC_KEYS"] = pods.secret("codec-keys")
    temporal = f"{pods.ip(f'{pods.fullname}-temporal-dev')}:7233"
    client = await RolloutClient.connect(temporal, store_url=str(pods.store_path()))
    tag = uuid.uuid4().hex[:6]
    task = agent_task(
        f"scale-{tag}", f"rolloutd-scale-{tag}", num_samples=num_sessions, pause_s=sleep_s
    )
    task["harness"]["command"] = task["harness"]["command"].replace("agent.py 3 ", "agent.py 1 ")
    t0 = time.monotonic()
    await client.submit(task)
    group = await asyncio.wait_for(client.result(task["task_id"]), 1800)
    wall_s = time.monotonic() - t0
    completed = sum(s.status == SessionStatus.COMPLETED for s in group.sessions)
    return {
        "sessions": num_sessions,
        "completed": completed,
        "wall_s": round(wall_s, 1),
        "sessions_per_min": round(num_sessions / wall_s * 60, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument(
        "--max-sessions", type=int, default=2, help="concurrent sessions per sandbox pod"
    )
    parser.add_argument("--sleep-s", type=float, default=8.0)
    args = parser.parse_args()
    tags = images()
    rows = []
    for replicas in args.replicas:
        release = f"ps{uuid.uuid4().hex[:6]}"
        with tempfile.TemporaryDirectory() as tmp:
            pods = PodDeployment(
                release,
                local_values(
                    tags,
                    sandbox_replicas=replicas,
                    gateway_replicas=1,
                    max_sessions=args.max_sessions,
                ),
                Path(tmp),
            )
            try:
                pods.up()
                pods.wait_started(timeout_s=300)
                row = {
                    "sandbox_replicas": replicas,
                    "max_sessions_per_pod": args.max_sessions,
                    "sleep_s": args.sleep_s,
                    **asyncio.run(run_workload(pods, args.sessions, args.sleep_s)),
                }
            finally:
                left = pods.down()
        print(json.dumps(row), flush=True)
        rows.append(row)
        if left:
            print(f"left after kube down: {left}", file=sys.stderr)
            return 1
        if row["completed"] != row["sessions"]:
            print(
                f"{row['sessions'] - row['completed']} sessions did not complete", file=sys.stderr
            )
            return 1
    print("\n| sandbox pods | sessions | wall s | sessions/min |\n|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['sandbox_replicas']} | {row['sessions']} | {row['wall_s']} | "
            f"{row['sessions_per_min']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
