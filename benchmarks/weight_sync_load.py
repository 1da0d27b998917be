"""Weight syncs under load: multi-turn sessions keep running through ``rolloutd up`` while the
trainer's side syncs weights every few seconds; what each sync pauses, and what it aborts.

One task of ``--sessions`` samples, pushed through a buffer: each session is a multi-turn
agent on the ``python`` harness (``--turns`` chat calls, each resending the whole conversation
with the model's answer and a new user turn) in the ``local`` runtime, on llama-server
(SmolLM2-135M by default, ``--max-tokens`` an answer), scored by ``session_completed``.
While they run, a weight sync every ``--sync-every`` seconds goes through the gateway's admin
API, step by step (:class:`rolloutd.trainer_client.training.weight_sync.WeightSync`): pause
(new calls wait at the gateway, calls in flight drain), load (``POST /admin/engine/load``:
``up``'s supervisor restarts llama-server on the GGUF), stamp the version, resume.

**What stands in for a GPU engine's weight load.** llama.cpp has no in-place weight update,
so a load here is a restart of llama-server on the same GGUF (the weights do not change: what
is measured is the pause and what it aborts), and its slots' prompt cache goes with the
process. vLLM (``reload_weights``) and SGLang (``update_weights_from_disk``) load in place, in
a time this machine cannot measure (no GPU); the pause around the load (drain, stamp, resume)
is the gateway's and the same for every kind: an engine that loads in place would not cut the
calls in flight, but would sample the rest of them on new weights, so exact versions need the
drain there too.

    python benchmarks/weight_sync_load.py [--sessions 16] [--turns 8] [--sync-every 3]
        [--max-tokens 24] [--parallel 16] [--model smollm2-135m] [--home DIR] [--json PATH]

Printed (markdown): the run (sessions, turns, syncs, wall time), aborted calls (the gateway's
``rolloutd_gateway_calls_total`` answers other than 200, and the sessions' failed calls),
failed and replaced sessions, completions whose version is not the one served while they ran,
sessions by the number of versions they span, per sync the pause (pause request to resume
answer: what a new call may wait), the drain and the load, p50 / p95 / max (and a model
call's backend time, for scale), and the calls in flight at each pause (drained, not
aborted). ``--json`` writes the figures, the sync windows and the task id, for the acceptance
test that checks them against the store (``--home`` keeps the stack's home, and so its store,
after the run).

After the run, the buffer (``max_staleness`` 1, kept at version 0 while the group runs, so
the group is kept on arrival) is moved to the version just above the group's token-weighted
version, where it keeps the group though its task started more than 1 version earlier, then
one further, where it drops it as stale: the token-weighted rule through a real buffer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from rolloutd.engine.models import model_files
from rolloutd.settings import codec_key_file, find_admin_token
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.trainer_client import RolloutClient
from rolloutd.trainer_client.admin import BackendAdmin
from rolloutd.trainer_client.training.weight_sync import GatewayEngineLoader, WeightSync

sys.path.insert(0, str(Path(__file__).parent))
import soak  # noqa: E402

#: the agent each session runs (the ``python`` harness's contract); no names in braces: the
#: harness fills the ``cli`` placeholders into shipped files
AGENT = """
async def agent(client, instruction, workdir, *, model, max_turns):
    messages = [{"role": "user", "content": instruction}]
    for _ in range(max_turns):
        response = await client.chat.completions.create(model=model, messages=messages)
        messages.append({"role": "assistant", "content": response.choices[0].message.content or ""})
        messages.append({"role": "user", "content": "Go on: one more sentence."})
    return messages[-2]["content"]
"""


def task(args: argparse.Namespace) -> dict[str, Any]:
    """The task: ``--sessions`` samples of the multi-turn agent (module docstring)."""
    return {
        "task_id": f"wsl-{uuid.uuid4().hex[:8]}",
        "instruction": "Tell a story about a lighthouse keeper, one sentence at a time.",
        "num_samples": args.sessions,
        "harness": {
            "type": "python",
            "entry": "story_agent:agent",
            "max_turns": args.turns,
            "files": {"story_agent.py": AGENT},
        },
        "runtime": {"type": "local"},
        "evaluator": {"type": "session_completed"},
        "sampling": {"max_tokens": args.max_tokens, "temperature": 1.0, "policy": "override"},
        "phases": {"run_s": 1200},
        "timeout_s": 2400,
    }


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank); nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def non_200_calls(metrics: str) -> int:
    """Model calls the gateway answered with a status other than 200, from its Prometheus
    text (``rolloutd_gateway_calls_total{...,status="..."}``)."""
    total = 0
    for line in metrics.splitlines():
        if line.startswith("rolloutd_gateway_calls_total{") and 'status="200"' not in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


def served_window(syncs: list[dict[str, float]], version: int) -> tuple[float, float]:
    """(start, end) Unix times while the engine served ``version`` alone: from the end of its
    load (``-inf`` for version 0) to the moment the next sync's drain ended (``inf`` for the
    last): no call may run across a load."""
    start = -math.inf if version == 0 else syncs[version - 1]["loaded_at"]
    end = syncs[version]["drained_at"] if version < len(syncs) else math.inf
    return start, end


async def sync_loop(
    sync: WeightSync, gguf: Path, every_s: float, stop: asyncio.Event
) -> list[dict[str, float]]:
    """A weight sync every ``every_s`` seconds until ``stop``; each sync's times."""
    syncs: list[dict[str, float]] = []
    while True:
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return syncs
        except TimeoutError:
            pass
        version = len(syncs) + 1
        paused_at = time.time()
        await sync.begin()
        drained_at = time.time()
        await sync.push(gguf, version)
        loaded_at = time.time()
        await sync.end(version)
        resumed_at = time.time()
        syncs.append(
            {
                "version": version,
                "paused_at": paused_at,
                "drained_at": drained_at,
                "loaded_at": loaded_at,
                "resumed_at": resumed_at,
            }
        )
        print(
            f"sync {version}: pause {resumed_at - paused_at:.2f} s "
            f"(drain {drained_at - paused_at:.2f}, load {loaded_at - drained_at:.2f})",
            flush=True,
        )


async def run(args: argparse.Namespace, home: Path, state: Any) -> dict[str, Any]:
    os.environ["ROLLOUTD_CODEC_KEY_FILE"] = str(codec_key_file(home))
    client = await RolloutClient.connect(state.temporal_address, store_url=state.store_url)
    token = find_admin_token(home)
    request = task(args)
    buffer = await client.create_buffer(
        {
            "buffer_id": f"wsl-{uuid.uuid4().hex[:8]}",
            "num_in_flight": 1,
            "max_staleness": 1,
            "staleness_admission": False,
            "drop_zero_variance": False,
        }
    )
    async with (
        BackendAdmin(state.gateway_url, token) as admin,
        httpx.AsyncClient(base_url=state.gateway_url, timeout=30) as http,
    ):
        sync = WeightSync(admin, [GatewayEngineLoader(admin, timeout_s=180)])
        stop = asyncio.Event()
        started = time.monotonic()
        await buffer.push([request])
        syncing = asyncio.create_task(
            sync_loop(sync, model_files(args.model).gguf, args.sync_every, stop)
        )
        while True:
            stats = await buffer.stats()
            if stats.state_counters.get("num_groups_finished", 0) >= 1:
                break
            if syncing.done():
                syncing.result()  # a failed sync ends the run, named
            await asyncio.sleep(1.0)  # the group takes minutes; a poll a second is plenty
        stop.set()
        syncs = await syncing
        wall_s = time.monotonic() - started
        metrics = (await http.get("/metrics")).text

    result = await client.result(request["task_id"])
    kept_on_arrival = request["task_id"] in stats.ready_task_ids
    weighted = result.token_weighted_policy_version
    keep_at = math.floor(weighted) + 1 if weighted is not None else None
    kept_at: bool | None = None
    dropped: dict[str, Any] | None = None
    if keep_at is not None:
        # the buffer's version must not go down: it is still 0 here
        kept_at = request["task_id"] in (await buffer.set_policy_version(keep_at)).ready_task_ids
        moved = await buffer.set_policy_version(keep_at + 1)
        dropped = next(
            (d.model_dump() for d in moved.dropped if d.task_id == request["task_id"]), None
        )
    await buffer.close()

    store = BlobStore(state.store_url)
    sessions = [*result.sessions, *result.replaced]
    mismatched = spans = 0
    versions_spanned: dict[int, int] = {}
    completions = 0
    drained = [0] * len(syncs)
    call_s: list[float] = []
    for s in result.sessions:
        log = CompletionLog(store, s.session_id).read_all()
        completions += len(log)
        call_s += [c.timings.duration_s for c in log]
        seen = {c.policy_version for c in log}
        versions_spanned[len(seen)] = versions_spanned.get(len(seen), 0) + 1
        spans += len(seen) >= 3
        for c in log:
            begin, end = c.timings.started_at, c.timings.started_at + c.timings.duration_s
            window = served_window(syncs, c.policy_version)
            mismatched += not (window[0] <= begin and end <= window[1])
            for k, one in enumerate(syncs):
                drained[k] += begin <= one["paused_at"] <= end
    pauses = [s["resumed_at"] - s["paused_at"] for s in syncs]
    drains = [s["drained_at"] - s["paused_at"] for s in syncs]
    loads = [s["loaded_at"] - s["drained_at"] for s in syncs]
    return {
        "task_id": request["task_id"],
        "store_url": state.store_url,
        "trajectory_refs": {s.session_id: s.trajectory_ref for s in result.sessions},
        "model": args.model,
        "sessions": args.sessions,
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        "parallel": args.parallel,
        "sync_every_s": args.sync_every,
        "wall_s": wall_s,
        "syncs": syncs,
        "completions": completions,
        "aborted_calls_gateway": non_200_calls(metrics),
        "failed_calls_sessions": sum(s.num_call_errors for s in sessions),
        "failed_sessions": sum(s.failure is not None for s in sessions),
        "replaced_sessions": len(result.replaced),
        "completions_off_their_version": mismatched,
        "sessions_by_versions_spanned": versions_spanned,
        "sessions_spanning_3_versions": spans,
        "token_weighted_policy_version": weighted,
        "buffer": {
            "kept_on_arrival": kept_on_arrival,
            "keep_at_version": keep_at,
            "kept_at_that_version": kept_at,
            "dropped_one_version_later": dropped,
        },
        "pause_s": {
            "p50": quantile(pauses, 0.5),
            "p95": quantile(pauses, 0.95),
            "max": max(pauses, default=math.nan),
        },
        "drain_s": {
            "p50": quantile(drains, 0.5),
            "p95": quantile(drains, 0.95),
            "max": max(drains, default=math.nan),
        },
        "load_s": {
            "p50": quantile(loads, 0.5),
            "p95": quantile(loads, 0.95),
            "max": max(loads, default=math.nan),
        },
        "mean_calls_drained": statistics.fmean(drained) if drained else math.nan,
        "call_s": {
            "p50": quantile(call_s, 0.5),
            "p95": quantile(call_s, 0.95),
            "max": max(call_s, default=math.nan),
        },
    }


def report(figures: dict[str, Any]) -> None:
    """The markdown tables of the module docstring."""
    f = figures
    print()
    print(
        f"{f['sessions']} sessions x {f['turns']} turns ({f['model']}, {f['max_tokens']} tokens "
        f"an answer, {f['parallel']} engine slots), a sync every {f['sync_every_s']} s: "
        f"{len(f['syncs'])} syncs, {f['completions']} completions in {f['wall_s']:.0f} s"
    )
    print()
    print("| check | count |")
    print("| --- | --- |")
    print(f"| calls aborted (gateway answers other than 200) | {f['aborted_calls_gateway']} |")
    print(f"| failed calls in the sessions' records | {f['failed_calls_sessions']} |")
    print(f"| failed sessions | {f['failed_sessions']} |")
    print(f"| replaced sessions | {f['replaced_sessions']} |")
    print(
        "| completions not inside their version's serving window | "
        f"{f['completions_off_their_version']} |"
    )
    spanned = ", ".join(f"{k}: {v}" for k, v in sorted(f["sessions_by_versions_spanned"].items()))
    print(f"| sessions by versions spanned | {spanned} |")
    print()
    print("| per sync, s | p50 | p95 | max |")
    print("| --- | --- | --- | --- |")
    for key, label in (
        ("pause_s", "pause (new calls wait)"),
        ("drain_s", "drain"),
        ("load_s", "load (llama-server restart)"),
        ("call_s", "a model call (backend time, for scale)"),
    ):
        q = f[key]
        print(f"| {label} | {q['p50']:.2f} | {q['p95']:.2f} | {q['max']:.2f} |")
    print(
        f"calls in flight at a pause (drained, not aborted), mean per sync: "
        f"{f['mean_calls_drained']:.1f}"
    )
    b = f["buffer"]
    print()
    print(
        f"buffer (max_staleness 1): group token-weighted version "
        f"{f['token_weighted_policy_version']}, kept on arrival {b['kept_on_arrival']}, kept at "
        f"version {b['keep_at_version']}: {b['kept_at_that_version']}, dropped one later: "
        f"{b['dropped_one_version_later']}"
    )


async def main_async(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    up = soak.start_stack(
        home,
        args.model,
        parallel=args.parallel,
        env={"ROLLOUTD_MAX_CONCURRENT_SESSIONS": str(args.sessions)},
    )
    try:
        state = await soak.wait_for_stack(home, up, 600)
        return await run(args, home, state)
    finally:
        soak.stop_stack(up)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--sync-every", type=float, default=3.0)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--parallel", type=int, default=16, help="llama-server slots")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    for name in ("ROLLOUTD_CODEC_KEYS", "ROLLOUTD_CODEC_KEY_FILE"):
        os.environ.pop(name, None)
    if args.home is not None:
        args.home.mkdir(parents=True, exist_ok=True)
        figures = asyncio.run(main_async(args, args.home))
    else:
        with tempfile.TemporaryDirectory(prefix="rolloutd-wsl-") as folder:
            figures = asyncio.run(main_async(args, Path(folder)))
    report(figures)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
