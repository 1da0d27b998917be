"""Soak: many short sessions through ``rolloutd up`` on this machine, watching whether any
process grows without bound.

Each session is the ``shell`` harness on the ``local`` runtime making 2 chat calls
(SmolLM2-135M, 4 tokens an answer: the engine is not what this measures), scored by the
``session_completed`` evaluator. Tasks of ``--per-task`` samples are submitted so that at
most ``--in-flight`` tasks run at once, until ``--sessions`` sessions have ended.

    python benchmarks/soak.py [--sessions 10000] [--per-task 50] [--in-flight 2]
        [--max-minutes M] [--model smollm2-135m] [--sample-every 30] [--home DIR]

``--max-minutes``: submit no task after that long (the tasks in flight still end), so a
shared machine gets as many sessions as fit in that time, and the figures are printed.

Printed (markdown): every ``--sample-every`` seconds, the sessions ended and each child
process's RSS (MiB: Temporal, the engine and each fleet, from ``/proc/{pid}/status``) with the
gateway's session maps (``/health``: ``sessions``); then the lost sessions (submitted, no
result or not completed), failures by kind, each process's RSS growth from the sample after
the first 1,000 sessions (or the first tenth of the run, when shorter) to the end, and the
gateway's session maps at the end (only open sessions stay: 0 once every session ended).

The stack is ``rolloutd up``'s (:class:`rolloutd.stack.LocalStack`: Temporal, llama-server
and the four fleets as supervised child processes, :meth:`serve_forever` until SIGTERM), run
as a child process in its own home (a temporary folder unless ``--home``) on free ports, so
that it shares a machine with other stacks (``rolloutd up`` itself takes fixed ports); it is
stopped at the end with SIGTERM by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from rolloutd.settings import codec_key_file
from rolloutd.stack.state import read_state
from rolloutd.trainer_client import FleetUnavailableError, RolloutClient

#: the child process: ``rolloutd up``'s stack on free ports, until SIGTERM; arguments: its
#: home, the model, optionally a backend URL to use instead of starting llama-server ("" for
#: none) and the engine's slots (llama-server --parallel)
STACK = """
import sys
from pathlib import Path
from rolloutd.processes import free_port
from rolloutd.stack.local import LocalStack
with LocalStack(
    home=Path(sys.argv[1]), model=sys.argv[2], temporal_port=free_port(),
    ui_port=free_port(), gateway_port=free_port(), engine_port=free_port(),
    engine_url=sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None,
    engine_parallel=int(sys.argv[4]) if len(sys.argv) > 4 else 4,
) as stack:
    failure = stack.serve_forever()
sys.exit(1 if failure else 0)
"""

#: the harness: 2 chat calls (curl fails on an error answer), then exit 0
TWO_CALLS = " && ".join(
    'curl -sS -f -o /dev/null "$OPENAI_BASE_URL/chat/completions" '
    "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
    f'-d \'{{"model": "m", "messages": [{{"role": "user", "content": "say {word}"}}]}}\''
    for word in ("hi", "bye")
)


def rss_mib(pid: int | None) -> float | None:
    """The resident set size of process ``pid``, MiB
    (``VmRSS`` of proc(5)); None when it is gone."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def task(per_task: int) -> dict[str, Any]:
    return {
        "task_id": f"soak-{uuid.uuid4().hex[:8]}",
        "instruction": "soak",
        "num_samples": per_task,
        "harness": {"type": "shell", "command": TWO_CALLS},
        "runtime": {"type": "local"},
        "evaluator": {"type": "session_completed"},
        "sampling": {"max_tokens": 4, "policy": "override"},
        "phases": {"run_s": 120},
        "timeout_s": 1800,
        "max_replacements": 0,
    }


async def wait_for_stack(home: Path, up: subprocess.Popen[bytes], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise SystemExit(f"rolloutd up exited {up.returncode}; see {home}/logs")
        state = read_state(home)
        if state is not None and state.phase == "running" and state.gateway_url:
            return state
        await asyncio.sleep(1.0)  # the stack starts in tens of seconds
    raise SystemExit(f"rolloutd up did not start within {timeout_s:.0f} s")


def start_stack(
    home: Path,
    model: str,
    engine_url: str | None = None,
    *,
    parallel: int = 4,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start :data:`STACK` in ``home`` (its stderr in ``{home}/up.log``), in a process group
    of its own; ``engine_url``: a backend to use instead of starting llama-server;
    ``parallel``: the engine's slots; ``env``: more environment (settings) for the stack."""
    # the harness runs on the ``local`` runtime (cheap: the runtime is not what this
    # measures), which the sandbox policy allows only where its operator lists it
    env = {
        **os.environ,
        "ROLLOUTD_HOME": str(home),
        "ROLLOUTD_SANDBOX_POLICY": '{"runtimes": ["local", "bwrap"]}',
        **(env or {}),
    }
    return subprocess.Popen(
        [sys.executable, "-c", STACK, str(home), model, engine_url or "", str(parallel)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(home / "up.log").open("wb"),
        start_new_session=True,
    )


def stop_stack(up: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the stack's process group, by its pid (it drains and stops its children),
    then SIGKILL after 120 s."""
    os.killpg(up.pid, signal.SIGTERM)
    try:
        up.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
        up.wait()


async def soak(args: argparse.Namespace, home: Path) -> None:
    up = start_stack(home, args.model)
    try:
        state = await wait_for_stack(home, up, 600)
        await run(args, home, state)
    finally:
        stop_stack(up)


async def run(args: argparse.Namespace, home: Path, state: Any) -> None:
    # the stack encrypts payloads with the key it generated in its home (secure by default)
    os.environ["ROLLOUTD_CODEC_KEY_FILE"] = str(codec_key_file(home))
    client = await RolloutClient.connect(state.temporal_address, store_url=state.store_url)
    http = httpx.AsyncClient(base_url=state.gateway_url, timeout=30)
    names = [c.name for c in state.children]
    samples: list[tuple[float, int, dict[str, float | None], dict[str, int]]] = []
    results: list[Any] = []
    unavailable: list[str] = []
    submitted = 0
    running: set[asyncio.Task[Any]] = set()
    started = time.monotonic()
    next_sample = started

    async def one(request: dict[str, Any]) -> Any:
        handle = await client.submit(request, check_capabilities=False)
        while True:
            try:
                return await handle.result()
            except FleetUnavailableError as e:
                # a full sandbox host stops polling its shared queue and is called dead
                # after 70 s while its harnesses run: only the wait was given up, the task
                # goes on (docs/failures.md); the soak waits again and counts it
                unavailable.append(str(e))

    def ended() -> int:
        return sum(len(r.sessions) for r in results)

    print(f"soak: {args.sessions} sessions, tasks of {args.per_task}, home {home}")
    print("| s | sessions ended | " + " | ".join(f"{n} MiB" for n in names) + " | gateway maps |")
    print("| --- | --- | " + " | ".join("---" for _ in names) + " | --- |")
    while True:
        in_time = args.max_minutes is None or time.monotonic() - started < 60 * args.max_minutes
        while in_time and submitted < args.sessions and len(running) < args.in_flight:
            size = min(args.per_task, args.sessions - submitted)
            running.add(asyncio.create_task(one(task(size))))
            submitted += size
        if not running:
            break
        done, running = await asyncio.wait(running, timeout=5)
        for finished in done:
            results.append(finished.result())
        if time.monotonic() >= next_sample or not running:
            now = read_state(home) or state
            rss = {c.name: rss_mib(c.pid) for c in now.children}
            maps = (await http.get("/health")).json().get("sessions", {})
            samples.append((time.monotonic() - started, ended(), rss, maps))
            t, n, r, m = samples[-1]
            cells = " | ".join(f"{r.get(x) or 0:.0f}" for x in names)
            print(f"| {t:.0f} | {n} | {cells} | {m} |", flush=True)
            next_sample = time.monotonic() + args.sample_every
    sessions = [s for r in results for s in r.sessions]
    lost = submitted - sum(1 for s in sessions if s.status == "completed" and s.failure is None)
    kinds: dict[str, int] = {}
    for s in sessions:
        kind = s.failure.kind if s.failure else "none"
        kinds[kind] = kinds.get(kind, 0) + 1
    elapsed = time.monotonic() - started
    print()
    print(
        f"sessions submitted {submitted}, ended {len(sessions)}, lost {lost} "
        f"(not completed or failed), by failure kind {kinds}, in {elapsed:.0f} s "
        f"({len(sessions) / max(elapsed, 1e-9):.2f} sessions/s)"
    )
    mark = min(1000, max(1, submitted // 10))
    base = next((x for x in samples if x[1] >= mark), samples[0])
    last = samples[-1]
    print(f"RSS growth from {base[1]} sessions ended ({base[0]:.0f} s) to the end:")
    for name in names:
        before, after = base[2].get(name), last[2].get(name)
        if before and after:
            print(f"- {name}: {before:.0f} -> {after:.0f} MiB ({100 * (after / before - 1):+.1f}%)")
    print(f"gateway session maps at the end: {last[3]}")
    print(f"waits given up on a fleet called unavailable, then resumed: {len(unavailable)}")
    await http.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--per-task", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=2)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-minutes", type=float, default=None)
    parser.add_argument("--sample-every", type=float, default=30.0)
    parser.add_argument("--home", type=Path, default=None)
    args = parser.parse_args()
    if args.home is not None:
        args.home.mkdir(parents=True, exist_ok=True)
        asyncio.run(soak(args, args.home))
        return
    with tempfile.TemporaryDirectory(prefix="rolloutd-soak-") as folder:
        asyncio.run(soak(args, Path(folder)))


if __name__ == "__main__":
    main()
