"""Prefix-cache hit rate and wall time of the gateway's routing modes, on one replayed trace.

A multi-turn agent trace is replayed through an in-process gateway over two real llama-servers
(SmolLM2-135M by default, ``--parallel`` slots of ``--slot-ctx`` tokens each, ``--threads``
CPU threads each, ``--engine-args`` added), once per routing mode: ``round_robin``,
``sticky``, ``cache_aware``. Each mode starts fresh engines (empty caches) and replays the
same requests, all sessions at once (session i starts ``i x --stagger-s`` late), each waiting
between its turns as long as its tool ran (``--tool-s``). The engine's answers are sampled
(greedy, ``--max-tokens``) but not fed back: every turn sends the trace's own conversation, so
each mode sends the same prompts.

Here a trace is a workload: the requests of recorded or generated sessions, replayed as they
are (not the training traces a trajectory is built of). Two of them:

- **recorded** (``--trace FILE``): the requests a real harness sent through rolloutd's gateway,
  read back from the store of a run (``--record STORE RESULTS --trace FILE`` writes the file
  and stops; RESULTS is the run's ``results.jsonl``, e.g. from ``rolloutd eval``): per session,
  each call's request body (messages and tools, as the harness sent them) and the time from the
  end of one call to the start of the next (the harness's own work and its tool run), which
  the replay waits unless ``--tool-s`` is given. ``benchmarks/traces/mini_swe_agent.jsonl.gz``
  is one, recorded from mini-swe-agent (see docs/benchmarks.md for how);
- **synthetic** (no ``--trace``): ``--tasks`` tasks x ``--samples`` samples = sessions,
  ``--turns`` turns each, generated from ``--seed`` (below).

Engine logs (``MODE-engineN.log``) and the gateway's log (``gateway.log``) stay in ``--out``
(default: a new folder under the temporary directory, printed first), also when a mode fails;
a failed call stops the run with its status and body.

A session keeps its cache while its tool runs as long as its engine has a slot for it:
llama.cpp gives a request the idle slot whose prompt shares the longest prefix with it
(``--slot-prompt-similarity``), so with at least as many slots as sessions on an engine each
session finds its own previous turn there. Fewer slots than sessions and slots are taken
over; llama.cpp then saves the prompt it evicts to its host-memory prompt cache
(``--cache-ram``) and loads the best match from there.

The synthetic trace is shaped like a tool-using harness's session: one system prompt with
tool schemas shared by every session (about 1,000 tokens), a task instruction shared by the
samples of a task (a GRPO group), then per turn the assistant's tool call and the tool's
output (``--tool-words`` words), each sample's own; 0.1 s of tool time unless ``--tool-s``.

    python benchmarks/prefix_routing.py [--trace FILE | --tasks 8 --samples 4 --turns 20
        --tool-words 30 --seed 0] [--parallel 32] [--slot-ctx 3072] [--max-tokens 4]
        [--tool-s S] [--model smollm2-135m] [--modes round_robin,sticky,cache_aware]
        [--out DIR] [--json PATH]
    python benchmarks/prefix_routing.py --record STORE RESULTS --trace FILE

Printed (markdown): per mode, the calls, prompt tokens, tokens served from the engines'
prefix caches, hit rate (cached / prompt, from each completion's ``num_cached_tokens``),
hit rate of turns after the first, wall time, and the sessions each backend served calls of.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from rolloutd.engine.models import load_tokenizer
from rolloutd.engine.server import LlamaServer
from rolloutd.logs import configure_logging
from rolloutd.proxy.http.server import Gateway
from rolloutd.settings import GatewaySettings
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.types import SamplingParams

MODES = ("round_robin", "sticky", "cache_aware")
WORDS = (
    "file path line test module class function value error config build check parse "
    "result output input stream buffer index table query cache token session worker "
    "server client request answer patch branch commit merge review"
).split()


def tool_schemas(rng: random.Random) -> list[dict[str, Any]]:
    """Twelve tool schemas with long descriptions: the shared head of every prompt."""
    tools = []
    for i in range(12):
        words = " ".join(rng.choice(WORDS) for _ in range(45))
        tools.append(
            {
                "name": f"tool_{i}",
                "description": f"Tool {i}: {words}.",
                "parameters": {"path": "string", "content": "string", "timeout": "integer"},
            }
        )
    return tools


#: one session of a trace: per turn, ``{"body": request body (messages, tools), "gap_s": s}``
Session = list[dict[str, Any]]

#: tool time of the synthetic trace between turns, s
SYNTHETIC_TOOL_S = 0.1


def trace(tasks: int, samples: int, turns: int, seed: int, tool_words: int = 70) -> list[Session]:
    """Per session (task-major), per turn, the conversation the harness sends; each tool
    output is ``tool_words`` words."""
    rng = random.Random(seed)
    system = (
        "You are a coding agent. Answer with one tool call per turn as JSON.\nTools:\n"
        + json.dumps(tool_schemas(rng), indent=1)
    )
    sessions = []
    for t in range(tasks):
        instruction = f"Task {t}: " + " ".join(rng.choice(WORDS) for _ in range(40))
        for _ in range(samples):
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": system},
                {"role": "user", "content": instruction},
            ]
            conversation = [list(messages)]
            for turn in range(turns - 1):
                call = {"tool": f"tool_{rng.randrange(12)}", "path": f"src/{rng.choice(WORDS)}.py"}
                output = " ".join(rng.choice(WORDS) for _ in range(tool_words))
                messages += [
                    {"role": "assistant", "content": json.dumps(call)},
                    {"role": "user", "content": f"Tool output (turn {turn}):\n{output}"},
                ]
                conversation.append(list(messages))
            sessions.append(
                [{"body": {"messages": m}, "gap_s": SYNTHETIC_TOOL_S} for m in conversation]
            )
    return sessions


#: request fields a replayed turn keeps: the prompt; sampling comes from the replaying session
PROMPT_FIELDS = ("messages", "tools", "tool_choice")


def record(store_url: str, results: Path) -> list[dict[str, Any]]:
    """The trace of a run: per session of ``results`` (a ``results.jsonl``, one line a session),
    its recorded calls in order from the store at ``store_url``.

    Returns:
        Per session ``{"session_id", "harness", "model", "turns": [{"body", "gap_s"}]}``:
        ``body`` holds the request's prompt fields (:data:`PROMPT_FIELDS`) as the harness sent
        them; ``gap_s`` is the time from the end of this call to the start of the next (the
        harness's own work and its tool run; 0 after the last call).

    Raises:
        ValueError: a session has no recorded call, or a call failed (its error is named).
    """
    store = BlobStore(store_url)
    sessions = []
    for line in results.read_text().splitlines():
        row = json.loads(line)
        if row.get("superseded"):
            continue
        calls = CompletionLog(store, row["session_id"]).read_all()
        if not calls:
            raise ValueError(f"{row['session_id']}: no recorded call in {store_url}")
        failed = [c for c in calls if c.error]
        if failed:
            raise ValueError(f"{row['session_id']} call {failed[0].index}: {failed[0].error}")
        turns = []
        for call, after in zip(calls, [*calls[1:], None], strict=True):
            ended = call.timings.started_at + call.timings.duration_s
            gap = max(after.timings.started_at - ended, 0.0) if after else 0.0
            body = {k: call.request[k] for k in PROMPT_FIELDS if k in call.request}
            turns.append({"body": body, "gap_s": round(gap, 3)})
        sessions.append(
            {
                "session_id": row["session_id"],
                "harness": row.get("harness"),
                "model": row.get("model"),
                "turns": turns,
            }
        )
    return sessions


def write_trace(sessions: list[dict[str, Any]], path: Path) -> None:
    """Write ``sessions`` as JSON lines, gzip-compressed when ``path`` ends in ``.gz``."""
    text = "".join(json.dumps(s, separators=(",", ":")) + "\n" for s in sessions)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)


def read_trace(path: Path) -> list[Session]:
    """The sessions of a trace file written by :func:`write_trace`."""
    data = path.read_bytes()
    text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode()
    return [json.loads(line)["turns"] for line in text.splitlines() if line.strip()]


async def replay(
    mode: str, sessions: list[Session], args: argparse.Namespace, home: Path
) -> dict[str, Any]:
    """Replay ``sessions`` through a gateway in ``mode`` over two fresh llama-servers."""
    engines = [
        LlamaServer(
            args.model,
            parallel=args.parallel,
            ctx_size=args.parallel * args.slot_ctx,
            threads=args.threads,
            extra_args=args.engine_args.split(),
            log_path=home / f"{mode}-engine{i}.log",
        )
        for i in range(2)
    ]
    for engine in engines:
        engine.start(timeout_s=180)
    try:
        settings = GatewaySettings(
            store_url=str(home / f"store-{mode}"),
            model=args.model,
            backend_url=",".join(e.url for e in engines),
            gateway_public_url="http://gateway.test",
            backend_timeout_s=600,
            routing=mode,
        )
        gateway = Gateway.from_settings(settings, tokenizer=load_tokenizer(args.model))
        transport = httpx.ASGITransport(app=gateway.app)
        sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway.test", timeout=600
        ) as http:

            async def run(i: int, turns: Session) -> None:
                await asyncio.sleep(i * args.stagger_s)
                info = await gateway.sessions.open_session(f"bench/{i}", "bench", sampling=sampling)
                for turn, step in enumerate(turns):
                    answer = await http.post(
                        f"/s/{info.session_key}/v1/chat/completions",
                        json={**step["body"], "model": "m"},
                    )
                    if answer.is_error:
                        raise RuntimeError(
                            f"{mode}: session {i} turn {turn + 1}: HTTP {answer.status_code} "
                            f"{answer.text[:2000]}"
                        )
                    if turn < len(turns) - 1:
                        await asyncio.sleep(step["gap_s"] if args.tool_s is None else args.tool_s)
                await gateway.sessions.close_session(f"bench/{i}")

            started = time.monotonic()
            await asyncio.gather(*(run(i, t) for i, t in enumerate(sessions)))
            wall_s = time.monotonic() - started
        logs = [CompletionLog(gateway.store, f"bench/{i}").read_all() for i in range(len(sessions))]
        await gateway.aclose()
    finally:
        for engine in engines:
            engine.stop()
    completions = [c for log in logs for c in log]
    later = [c for log in logs for c in log[1:]]
    prompt = sum(c.num_prompt_tokens or 0 for c in completions)
    cached = sum(c.num_cached_tokens or 0 for c in completions)
    names = {e.url: f"engine{i}" for i, e in enumerate(engines)}
    spread = [len({c.backend for c in log}) for log in logs]
    return {
        "mode": mode,
        "num_calls": len(completions),
        "num_unreported": sum(c.num_cached_tokens is None for c in completions),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt if prompt else 0.0,
        "hit_rate_after_turn_1": (
            sum(c.num_cached_tokens or 0 for c in later)
            / max(sum(c.num_prompt_tokens or 0 for c in later), 1)
        ),
        "wall_s": wall_s,
        "calls_per_backend": {
            names[url]: sum(c.backend == url for c in completions) for url in names
        },
        "sessions_on_two_backends": sum(n > 1 for n in spread),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=32, help="slots per llama-server")
    parser.add_argument("--slot-ctx", type=int, default=3072, help="context per slot, tokens")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument(
        "--tool-s",
        type=float,
        help="wait between a session's turns, s (default: the trace's own: recorded gaps, or "
        f"{SYNTHETIC_TOOL_S} for the synthetic trace)",
    )
    parser.add_argument(
        "--trace", type=Path, help="a recorded trace (JSONL, .gz ok) to replay, or to write"
    )
    parser.add_argument(
        "--record",
        nargs=2,
        metavar=("STORE", "RESULTS"),
        help="write the trace of a run (its store and results.jsonl) to --trace, then stop",
    )
    parser.add_argument("--tool-words", type=int, default=30, help="words of each tool output")
    parser.add_argument(
        "--stagger-s", type=float, default=0.0, help="session i starts at i x this, s"
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads per llama-server")
    parser.add_argument(
        "--engine-args",
        default="--cache-ram 2048",
        help="more llama-server arguments (default: a 2 GiB host-memory prompt cache, where "
        "llama.cpp saves a slot's prompt before another prompt takes the slot)",
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--out", type=Path, help="folder kept for engine and gateway logs (default: a new one)"
    )
    args = parser.parse_args()
    if args.record:
        if args.trace is None:
            parser.error("--record needs --trace, the file to write")
        recorded = record(args.record[0], Path(args.record[1]))
        write_trace(recorded, args.trace)
        calls = sum(len(s["turns"]) for s in recorded)
        print(f"{args.trace}: {len(recorded)} sessions, {calls} calls", file=sys.stderr)
        return
    if args.trace:
        sessions = read_trace(args.trace)
        shape = f"{len(sessions)} sessions of {args.trace.name}, {min(map(len, sessions))}-"
        shape += f"{max(map(len, sessions))} turns"
    else:
        sessions = trace(args.tasks, args.samples, args.turns, args.seed, args.tool_words)
        shape = f"{len(sessions)} synthetic sessions x {args.turns} turns"
    load = os.getloadavg()
    rows = []
    home = args.out or Path(tempfile.mkdtemp(prefix="prefix-routing-"))
    home.mkdir(parents=True, exist_ok=True)
    print(f"engine and gateway logs: {home}", file=sys.stderr, flush=True)
    with (home / "gateway.log").open("a") as gateway_log:
        configure_logging("info", json=True, file=gateway_log)
        for mode in args.modes.split(","):
            try:
                rows.append(asyncio.run(replay(mode, sessions, args, home)))
            except Exception:
                print(f"{mode} failed; logs kept in {home}", file=sys.stderr, flush=True)
                raise
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    after = os.getloadavg()
    print(
        f"\n### Prefix-cache routing ({shape}, 2 "
        f"llama-servers x {args.parallel} slots, {args.model}, {os.cpu_count()} cores; load "
        f"average {load[0]:.2f} before, {after[0]:.2f} after)\n"
    )
    print(
        "| routing | calls | prompt tokens | cached tokens | hit rate | hit rate after turn 1 "
        "| wall time (s) | calls per backend | sessions on both backends |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        per_backend = " / ".join(str(n) for n in r["calls_per_backend"].values())
        print(
            f"| `{r['mode']}` | {r['num_calls']} | {r['prompt_tokens']} | {r['cached_tokens']} "
            f"| {r['hit_rate']:.1%} | {r['hit_rate_after_turn_1']:.1%} | {r['wall_s']:.1f} "
            f"| {per_backend} | {r['sessions_on_two_backends']} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "load": [load, after]}, indent=1))


if __name__ == "__main__":
    main()
