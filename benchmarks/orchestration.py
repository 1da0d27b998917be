"""Orchestration: what a rolloutd session costs Temporal and the fleets, beside Temporal's own
floor for the same shape, in one run on one Temporal dev server.

    python benchmarks/orchestration.py [--sessions 400] [--per-task 50] [--in-flight 2]
        [--warmup 10] [--idle-s 10] [--settle-s 5] [--engine instant|llama]
        [--model smollm2-135m] [--home DIR]

The stack is ``rolloutd up``'s (:class:`rolloutd.stack.LocalStack`, started as
``benchmarks/soak.py`` starts it: a child process in its own home, free ports, the payload
codec on with the key it generates). A session has the soak's shape: the ``shell`` harness on
the ``local`` runtime making 2 chat calls of 4 tokens, scored by ``session_completed``; tasks
of ``--per-task`` samples, at most ``--in-flight`` tasks at once, until ``--sessions``
sessions have ended.

The engine, by default, is an instant stand-in for a GPU engine: ``gateway_overhead.py``'s
fake llama.cpp server, which answers every ``/completion`` at once with the same 4 token ids
(``Hello there!`` and ``<|im_end|>`` in the model's own tokenizer) and their logprobs, so that
orchestration is measured, not inference. The gateway still renders, records and builds
everything as with a real engine (capture mode ``tokens``). ``--engine llama`` runs
llama-server with the model instead (``up``'s own engine), to compare: on this 2-core machine
it spent about 440 ms of CPU a session (2 calls of 4 tokens from SmolLM2-135M), twice what
the whole orchestration spent, and rolloutd's sessions ran about 4x slower, so its
contention, not orchestration, would set the figures (docs/benchmarks.md).

The floor (``benchmarks/orchestration_floor.py``) runs on the same server after rolloutd's
sessions: a parent workflow per task, one child workflow per sample, as many no-op activities
(and local activities) per session and per task as rolloutd's ran in this run (counted from
its histories), with rolloutd's client factory (data converter, payload codec, failure
converter) and the fleets' poller settings, in one worker process. It runs twice: its
activities on its workflows' own queue (``floor``: the SDK gets each at once with the workflow
task that scheduled it, Temporal's eager activity execution), then on a queue of their own
(``floor, own activity queue``: each is polled for, as rolloutd's activities on their fleets'
queues are).

Each system runs ``--warmup`` sessions first (not measured). Then, with nothing running, each
process's CPU over ``--idle-s`` seconds is its idle rate (pollers, the fleets' heartbeats,
the stack's supervision). Each measured phase is from its first submit to its last result;
``--settle-s`` seconds after it, the server's request counters are read (it publishes them to
its endpoint on an interval), and the next phase starts.

Measured, per phase (markdown on stdout):

- sessions/s;
- CPU ms per session of every process: user + system time from ``/proc/{pid}/stat``
  (proc(5): utime, stime) plus its children's (cutime, cstime of the children it reaped, and
  the live descendants that are not themselves measured: the sandbox fleet's runtimes and
  harness processes), between the phase's first submit and last result; the orchestration
  total is the Temporal server and rolloutd's processes (four fleets, the stack's supervisor,
  the codec server) against the Temporal server and the floor's worker; the engine and this
  process (the client) are shown, not counted;
- the gateway's CPU per model call (its process's CPU over the model calls answered);
- from the histories (Temporal's ``GetWorkflowExecutionHistory``, every workflow with an
  event in the phase): events, history bytes and payload bytes (every ``Payload`` message in
  the events, as stored: encrypted) per session, by workflow (the session's; its task's
  share; every other workflow's, such as the fleet registry's heartbeats and the watches a
  session waiting for a sandbox slot sends it); events by type; what a session
  asks of Temporal: activities by name, local activities, child workflows, signals sent and
  received, search-attribute and memo upserts, timers, workflow tasks;
- the Temporal frontend's requests per session by operation and its persistence requests
  (the dev server's own Prometheus ``/metrics``, ``service_requests`` and
  ``persistence_requests``, found on its listening ports): queries, heartbeats and polls,
  which no history shows.

On a shared machine the load moves the wall time far more than the CPU per session; say the
load with any figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.client import Client

import rolloutd
from rolloutd.engine.models import load_tokenizer
from rolloutd.settings import codec_key_file
from rolloutd.trainer_client import RolloutClient

sys.path.insert(0, str(Path(__file__).parent))
import gateway_overhead as overhead  # noqa: E402
import orchestration_floor as floor  # noqa: E402
import soak  # noqa: E402
from orchestration_probes import (  # noqa: E402
    PERSISTENCE,
    HistoryProfile,
    ProcCPU,
    cpu_delta,
    cpu_snapshot,
    find_metrics_url,
    read_histories,
    server_counts,
)

#: the floor's task queues on the stack's Temporal server: its workflows' (and activities',
#: dispatched eagerly), and one for activities alone
FLOOR_QUEUE = "orchestration-floor"
FLOOR_ACTIVITY_QUEUE = "orchestration-floor-activities"
#: workflow types whose histories are a session's and a task's
ROLLOUTD_KINDS = {"RolloutSessionWorkflow": "session", "RolloutTaskWorkflow": "task"}
FLOOR_KINDS = {"FloorSessionWorkflow": "session", "FloorTaskWorkflow": "task"}
#: the frontend operation whose count ends a phase's reading of the server's counters
SETTLED_BY = "RespondActivityTaskCompleted"
#: the systems measured, in order: rolloutd, then the floor with its activities on the
#: workflows' queue, then on a queue of their own (column titles of the report)
SYSTEMS = ("rolloutd", "floor", "floor, own activity queue")
#: measured processes by role: rolloutd's (counted in its total), the floor's, neither
ROLLOUTD_PROCESSES = ("workflows", "sandbox", "gateway", "eval", "stack", "codec-server")
LABELS = {
    "temporal": "Temporal server",
    "workflows": "workflows fleet",
    "sandbox": "sandbox fleet",
    "gateway": "gateway fleet",
    "eval": "eval fleet",
    "stack": "stack (`up`'s supervisor)",
    "codec-server": "codec server",
    "floor": "floor worker",
    "engine": "engine",
    "client": "client (this process)",
}

# --------------------------------------------------------------------------- phases


@dataclass
class Phase:
    """One measured phase: its sessions, wall time, CPU, server requests and histories."""

    name: str
    sessions: int = 0
    completed: int = 0
    model_calls: int = 0
    tasks: int = 0
    wall_s: float = 0.0
    t0: float = 0.0
    t1: float = 0.0
    cpu: dict[str, ProcCPU] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)
    history: HistoryProfile = field(default_factory=HistoryProfile)

    def per_session(self, value: float) -> float:
        return value / max(self.sessions, 1)


@dataclass
class Bench:
    """The processes measured and how to reach them."""

    pids: dict[str, int]
    metrics_url: str
    rollout: RolloutClient
    args: argparse.Namespace


async def in_flight(
    run_task: Callable[[int], Awaitable[tuple[int, int, int]]], sessions: int, per_task: int, n: int
) -> tuple[int, int, int, int]:
    """Submit tasks of ``per_task`` samples, at most ``n`` at once, until ``sessions`` have
    ended. ``run_task(size)`` runs one and returns (sessions ended, completed, model calls).

    Returns:
        (sessions ended, completed, model calls, tasks).
    """
    running: set[asyncio.Task[tuple[int, int, int]]] = set()
    submitted = tasks = 0
    ended = completed = calls = 0
    while True:
        while submitted < sessions and len(running) < n:
            size = min(per_task, sessions - submitted)
            running.add(asyncio.create_task(run_task(size)))
            submitted += size
            tasks += 1
        if not running:
            return ended, completed, calls, tasks
        done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        for finished in done:
            e, c, k = finished.result()
            ended, completed, calls = ended + e, completed + c, calls + k


def rolloutd_task(rollout: RolloutClient) -> Callable[[int], Awaitable[tuple[int, int, int]]]:
    """A task of the soak's shape through the trainer client; what it returns."""

    async def run(size: int) -> tuple[int, int, int]:
        request = {**soak.task(size), "task_id": f"orch-{uuid.uuid4().hex[:8]}"}
        handle = await rollout.submit(request, check_capabilities=False)
        group = await handle.result()
        done = [s for s in group.sessions if s.status == "completed" and s.failure is None]
        return len(group.sessions), len(done), sum(s.num_completions for s in group.sessions)

    return run


def floor_task(
    client: Client, shape: dict[str, int], activity_queue: str | None
) -> Callable[[int], Awaitable[Any]]:
    """A task of the floor with the activities of ``shape`` on ``activity_queue`` (None: the
    workflows' own); what it returns."""

    async def run(size: int) -> tuple[int, int, int]:
        task_id = f"floor-{uuid.uuid4().hex[:8]}"
        out = await client.execute_workflow(
            floor.FloorTaskWorkflow.run,
            floor.FloorTaskInput(
                task_id=task_id, num_samples=size, activity_queue=activity_queue, **shape
            ),
            id=f"floor/{task_id}",
            task_queue=FLOOR_QUEUE,
        )
        return len(out.sessions), len(out.sessions), 0

    return run


async def measure(
    bench: Bench, name: str, run_task: Callable[[int], Awaitable[Any]], kinds: dict[str, str]
) -> Phase:
    """One measured phase of ``--sessions`` sessions."""
    args = bench.args
    phase = Phase(name)
    requests0 = server_counts(bench.metrics_url)
    cpu0 = cpu_snapshot(bench.pids)
    phase.t0, started = time.time(), time.monotonic()
    ended, phase.completed, phase.model_calls, phase.tasks = await in_flight(
        run_task, args.sessions, args.per_task, args.in_flight
    )
    phase.wall_s, phase.t1 = time.monotonic() - started, time.time()
    phase.cpu = cpu_delta(cpu0, cpu_snapshot(bench.pids))
    # the server hands its counters to its Prometheus endpoint on an interval: the phase's
    # last requests show a moment later (its CPU was read above)
    await asyncio.sleep(args.settle_s)
    phase.requests = await settled_counts(bench.metrics_url) - requests0
    phase.sessions = ended
    phase.history = await read_histories(bench.rollout.client, kinds, phase.t0, phase.t1)
    print(f"{name}: {ended} sessions in {phase.wall_s:.1f} s", file=sys.stderr, flush=True)
    return phase


async def settled_counts(url: str, timeout_s: float = 30.0) -> Counter[str]:
    """The server's counters once its activity completions stopped moving (two reads 1 s
    apart agree: nothing completes activities between phases), at most ``timeout_s``."""
    counts = server_counts(url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        later = server_counts(url)
        if later[SETTLED_BY] == counts[SETTLED_BY]:
            return later
        counts = later
    raise SystemExit(f"the server's {SETTLED_BY} count still moves after {timeout_s:.0f} s")


def floor_shape(rolloutd: Phase) -> dict[str, int]:
    """The floor's activities per session and per task: rolloutd's, rounded."""
    asks = rolloutd.history.asks

    def mean(kind: str, prefix: str, per: int) -> int:
        n = sum(v for (k, what), v in asks.items() if k == kind and what.startswith(prefix))
        return round(n / max(per, 1))

    return {
        "session_activities": mean("session", "activity ", rolloutd.sessions),
        "session_local_activities": mean("session", "local activity ", rolloutd.sessions),
        "task_activities": mean("task", "activity ", rolloutd.tasks),
        "task_local_activities": mean("task", "local activity ", rolloutd.tasks),
    }


# --------------------------------------------------------------------------- report


def _ms(seconds: float) -> str:
    return f"{1000 * seconds:.1f}"


def _n(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value else "0"


def _row(cells: Iterable[object]) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


def _head(*titles: str) -> None:
    _row(titles)
    _row("---" for _ in titles)


def report(
    phases: list[Phase],
    idle: dict[str, ProcCPU],
    idle_s: float,
    shape: dict[str, int],
    context: dict[str, str],
) -> None:
    """The tables, markdown, on stdout: one column per system (:data:`SYSTEMS`), rolloutd
    first."""
    r = phases[0]
    print("## Orchestration: rolloutd against Temporal's floor, one run\n")
    for key, value in context.items():
        print(f"- {key}: {value}")
    print(
        f"- floor shape per session: {shape['session_activities']} activities, "
        f"{shape['session_local_activities']} local activities; per task: "
        f"{shape['task_activities']} activities, {shape['task_local_activities']} local "
        "activities (rolloutd's, from its histories)"
    )
    print()
    _head("", *SYSTEMS)
    _row(["sessions", *(p.sessions for p in phases)])
    _row(["sessions completed", *(p.completed for p in phases)])
    _row(["tasks", *(p.tasks for p in phases)])
    _row(["model calls", *(p.model_calls for p in phases)])
    _row(["wall s", *(f"{p.wall_s:.1f}" for p in phases)])
    _row(["sessions/s", *(f"{p.sessions / p.wall_s:.2f}" for p in phases)])
    print()
    print("CPU ms per session (own + children); idle: ms per second with nothing running\n")
    _head("process", SYSTEMS[0], "of which children", *SYSTEMS[1:], "idle ms/s")
    order = list(LABELS)
    for name in sorted(r.cpu, key=lambda n: order.index(n) if n in order else len(order)):
        cells = [_ms(p.per_session(p.cpu[name].own_s + p.cpu[name].children_s)) for p in phases]
        idle_rate = (idle[name].own_s + idle[name].children_s) / idle_s
        _row(
            [LABELS.get(name, name), cells[0], _ms(r.per_session(r.cpu[name].children_s))]
            + cells[1:]
            + [_ms(idle_rate)]
        )

    def total(phase: Phase, names: Iterable[str]) -> float:
        return phase.per_session(sum(phase.cpu[n].own_s + phase.cpu[n].children_s for n in names))

    # rolloutd's: the server, the fleets, the stack and the codec server; a floor's: the
    # server and the floor's worker
    servers = [total(p, ["temporal"]) for p in phases]
    workers = [total(r, ROLLOUTD_PROCESSES)] + [total(p, ["floor"]) for p in phases[1:]]
    sums = [a + b for a, b in zip(servers, workers, strict=True)]

    def spread(values: list[str]) -> list[str]:
        return [values[0], "", *values[1:], ""]

    _row(
        [
            "orchestration (server + rolloutd's processes / floor worker)",
            *spread([_ms(x) for x in sums]),
        ]
    )
    _row(["of which Temporal server", *spread([_ms(x) for x in servers])])
    _row(["of which rolloutd's processes / floor worker", *spread([_ms(x) for x in workers])])
    _row(
        [
            "ratio rolloutd / this system: orchestration",
            *spread([f"{sums[0] / x:.2f}x" for x in sums]),
        ]
    )
    _row(
        [
            "ratio rolloutd / this system: Temporal server",
            *spread([f"{servers[0] / x:.2f}x" for x in servers]),
        ]
    )
    gateway = r.cpu["gateway"].own_s + r.cpu["gateway"].children_s
    _row(
        [
            f"gateway CPU ms per model call ({r.model_calls} calls)",
            *spread([_ms(gateway / max(r.model_calls, 1))] + [""] * (len(phases) - 1)),
        ]
    )
    print()
    print("History per session (events in the phase; bytes as stored, payloads encrypted)\n")
    _head("", *SYSTEMS)
    kinds = (
        ("session", "session workflow"),
        ("task", "task workflow (share)"),
        ("other", "other workflows"),
    )
    for label in ("events", "history bytes", "payload bytes"):
        counts = [getattr(p.history, label.replace(" ", "_")) for p in phases]
        for kind, kind_label in kinds:
            _row(
                [
                    f"{label}: {kind_label}",
                    *(_n(p.per_session(c[kind])) for p, c in zip(phases, counts, strict=True)),
                ]
            )
        _row(
            [
                f"{label}: session + task",
                *(
                    _n(p.per_session(c["session"] + c["task"]))
                    for p, c in zip(phases, counts, strict=True)
                ),
            ]
        )
    print()
    print("Events per session by type (session and task workflows)\n")
    _head("event", *SYSTEMS, "rolloutd payload bytes")
    for name in sorted(set().union(*(p.history.by_type for p in phases))):
        _row(
            [name]
            + [_n(p.per_session(p.history.by_type[name])) for p in phases]
            + [_n(r.per_session(r.history.payload_by_type[name]))]
        )
    print()
    print("What a session asks of Temporal, per session (from the histories)\n")
    _head("workflow: asked", *SYSTEMS)
    for kind, asked in sorted(set().union(*(p.history.asks for p in phases))):
        _row(
            [
                f"{kind}: {asked}",
                *(_n(p.per_session(p.history.asks[(kind, asked)])) for p in phases),
            ]
        )
    print()
    print("Temporal frontend requests per session, by operation (the server's metrics)\n")
    _head("operation", *SYSTEMS)
    operations = set().union(*(p.requests for p in phases))
    for op in sorted(operations, key=lambda o: (o == PERSISTENCE, -r.requests[o], o)):
        _row([op, *(_n(p.per_session(p.requests[op])) for p in phases)])


def _commit() -> str:
    """The measured checkout's commit (where ``rolloutd`` is imported from), ``+`` if dirty."""
    folder = Path(rolloutd.__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+ (src changed)" if dirty else "")


def _machine() -> str:
    model = "?"
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} CPUs ({model}), {platform.platform()}"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ----------------------------------------------------------------------------- run


async def run(args: argparse.Namespace, home: Path) -> None:
    context = {
        "command": "python benchmarks/orchestration.py " + " ".join(sys.argv[1:]),
        "commit": _commit(),
        "machine": _machine(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load before (1, 5, 15 min)": _load(),
        "sessions": f"{args.sessions} a system, tasks of {args.per_task}, "
        f"{args.in_flight} in flight, {args.warmup} warm-up sessions each",
    }
    engine: overhead.Proc | None = None
    engine_url = None
    if args.engine == "instant":
        tokenizer = load_tokenizer(args.model)
        ids = list(tokenizer.encode(overhead.ANSWER, add_special_tokens=False)) + [
            tokenizer.convert_tokens_to_ids("<|im_end|>")
        ]
        engine = overhead._start(["fake", json.dumps(ids)])
        engine_url = f"http://127.0.0.1:{engine.ready['port']}"
        context["engine"] = f"instant stand-in ({len(ids)} tokens an answer, {args.model}'s ids)"
    else:
        context["engine"] = f"llama-server, {args.model}"
    # `up`'s default: the stack generates its codec key and encrypts every payload
    for name in ("ROLLOUTD_CODEC_KEYS", "ROLLOUTD_CODEC_KEY_FILE"):
        os.environ.pop(name, None)
    up = soak.start_stack(home, args.model, engine_url)
    worker: subprocess.Popen[bytes] | None = None
    try:
        state = await soak.wait_for_stack(home, up, 600)
        os.environ["ROLLOUTD_CODEC_KEY_FILE"] = str(codec_key_file(home))
        worker = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import orchestration_floor as f; f.main()",
                state.temporal_address,
                FLOOR_QUEUE,
                FLOOR_ACTIVITY_QUEUE,
            ],
            # ``-c`` puts the working folder first on sys.path: benchmarks/
            cwd=Path(__file__).parent,
            stdout=subprocess.PIPE,
            stderr=(home / "floor.log").open("wb"),
        )
        # its start (imports, connection) is over before anything is measured
        ready = await asyncio.to_thread(worker.stdout.readline)  # type: ignore[union-attr]
        if not ready.startswith(b"floor worker polling"):
            raise SystemExit(f"the floor worker did not start; see {home}/floor.log")
        pids = {c.name: c.pid for c in state.children if c.pid is not None}
        pids.update(stack=up.pid, floor=worker.pid, client=os.getpid())
        if engine is not None:
            pids["engine"] = engine.popen.pid
        temporal_pid = pids["temporal"]
        rollout = await RolloutClient.connect(state.temporal_address, store_url=state.store_url)
        bench = Bench(pids, find_metrics_url(temporal_pid), rollout, args)
        print("warm-up: rolloutd", file=sys.stderr, flush=True)
        await in_flight(rolloutd_task(rollout), args.warmup, args.warmup, 1)
        idle0 = cpu_snapshot(pids)
        await asyncio.sleep(args.idle_s)
        idle = cpu_delta(idle0, cpu_snapshot(pids))
        phases = [await measure(bench, SYSTEMS[0], rolloutd_task(rollout), ROLLOUTD_KINDS)]
        shape = floor_shape(phases[0])
        for name, queue in zip(SYSTEMS[1:], (None, FLOOR_ACTIVITY_QUEUE), strict=True):
            print(f"warm-up: {name}", file=sys.stderr, flush=True)
            run_task = floor_task(rollout.client, shape, queue)
            await in_flight(run_task, args.warmup, args.warmup, 1)
            await asyncio.sleep(args.settle_s)
            phases.append(await measure(bench, name, run_task, FLOOR_KINDS))
        context["load after (1, 5, 15 min)"] = _load()
        report(phases, idle, args.idle_s, shape, context)
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        soak.stop_stack(up)
        if engine is not None:
            engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=400, help="measured sessions a system")
    parser.add_argument("--per-task", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=2, help="tasks at once")
    parser.add_argument("--warmup", type=int, default=10, help="sessions before measuring")
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--engine", choices=("instant", "llama"), default="instant")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=None)
    args = parser.parse_args()
    if args.home is not None:
        args.home.mkdir(parents=True, exist_ok=True)
        asyncio.run(run(args, args.home))
        return
    # short: the runtimes' unix sockets live under the home (108 bytes at most)
    with tempfile.TemporaryDirectory(prefix="orch-", dir="/tmp") as folder:
        asyncio.run(run(args, Path(folder)))


if __name__ == "__main__":
    main()
