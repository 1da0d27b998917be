"""Gateway overhead: what rolloutd adds to a model call, against LiteLLM's proxy.

One run, one instant local backend (a fake llama.cpp ``/completion`` + OpenAI
``/v1/chat/completions`` server written here, answering at once with fixed tokens), four paths:

- ``direct``: the fake backend itself (``/completion`` for the tokens row, chat for the others);
- ``passthrough``: rolloutd, capture mode ``passthrough`` (the backend renders the chat);
- ``tokens``: rolloutd, capture mode ``tokens`` (chat template, token chain, logprobs);
- ``litellm``: the LiteLLM proxy (``litellm --config``), if installed (``--litellm BIN``).

Each system runs in its own process on loopback; the load generator is this process (httpx,
one client per worker: a single pool of 64 connections costs more than the systems measured).
The gateway children run on uvloop and uvicorn picks httptools when those are installed, as the
gateway fleet's process does (the report says which the gateway used). Latency is measured per call
at 1 and at 64 concurrent sessions (one
session per worker, each call a new single-turn conversation); added latency is the path's
percentile minus the direct one. CPU/call is the serving process's own CPU time per call
(from /proc): on a shared machine it varies much less than latency. Before those rows, one
tokens-mode session grows a conversation to ``--turns`` turns, each call followed by a
single-turn call in another session; the per-call cost of both (latency, gateway CPU) and
their ratio are reported by turn window, and a fresh conversation's prompt with a long system
prompt is rendered and encoded with and without the gateway's cache of encoded turns. LiteLLM
starts after the other rows are measured (its background work would weigh on them) and the
gateways stop before its rows. Output: markdown tables on stdout.

    python benchmarks/gateway_overhead.py [--litellm ~/.cache/rolloutd/litellm-venv/bin/litellm]

Targets, tokens mode, against LiteLLM in the same run (the report checks them): added p50 at
one call in flight at most 1/5 of LiteLLM's; throughput at 64 in flight at least 4x LiteLLM's
(the backend calls on httpx over aiohttp; 0.09x and 8.6x measured on 2026-11-24 with a
hand-written HTTP/1.1 client, since removed). Per-call cost flat in conversation length.
Bounded loops only; loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx

MODEL = "qwen2.5-coder-0.5b"
#: tokens mode against LiteLLM: added p50 at 1 in flight at most this share of LiteLLM's
TARGET_ADDED_P50_SHARE = 0.2
#: tokens mode against LiteLLM: calls/s at 64 in flight at least this multiple of LiteLLM's
TARGET_THROUGHPUT_MULTIPLE = 4.0
ANSWER = "Hello there!"
LITELLM_KEY = "sk-rolloutd-bench-0123456789abcdef"
# -------------------------------------------------------------------------- the fake backend


def _fake_answers(ids: list[int]) -> dict[str, bytes]:
    """Fixed answer bodies by path: llama.cpp ``/completion`` and ``/props``, OpenAI chat."""
    probs = [
        {
            "id": i,
            "token": "",
            "bytes": [],
            "logprob": -0.01,
            "top_logprobs": [{"id": i, "logprob": -0.01}],
        }
        for i in ids
    ]
    completion = {
        "content": ANSWER,
        "tokens": ids,
        "completion_probabilities": probs,
        "stop": True,
        "stop_type": "eos",
        "tokens_evaluated": 10,
        "timings": {"cache_n": 0},
    }
    chat = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": "bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ANSWER},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": len(ids), "total_tokens": 20},
    }
    return {
        "/completion": json.dumps(completion).encode(),
        "/props": json.dumps({"default_generation_settings": {"n_ctx": 131072}}).encode(),
        "/v1/chat/completions": json.dumps(chat).encode(),
        "/chat/completions": json.dumps(chat).encode(),
        "/v1/models": json.dumps({"object": "list", "data": [{"id": "bench"}]}).encode(),
    }


class _FakeProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server: reads a request (Content-Length body), answers the
    fixed body of its path at once."""

    answers: ClassVar[dict[str, bytes]] = {}

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        for _ in range(1000):  # bounded: requests pipelined in one read
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buffer[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            end = head_end + 4 + length
            if len(self.buffer) < end:
                return
            self.buffer = self.buffer[end:]
            path = head.split(" ", 2)[1].split("?", 1)[0]
            body = self.answers.get(path)
            status = "200 OK" if body is not None else "404 Not Found"
            body = body if body is not None else b'{"error": {"message": "not found"}}'
            self.transport.write(
                f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n".encode()
                + body
            )


async def _run_fake(port: int, ids: list[int]) -> None:
    _FakeProtocol.answers = _fake_answers(ids)
    server = await asyncio.get_running_loop().create_server(_FakeProtocol, "127.0.0.1", port)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    async with server:
        await server.serve_forever()


# -------------------------------------------------------------------------- the gateway


async def _run_gateway(
    backend_url: str, backend_type: str, capture_mode: str, num_sessions: int, store: str
) -> None:
    from rolloutd.logs import configure_logging
    from rolloutd.proxy.http.server import Gateway, serve
    from rolloutd.settings import GatewaySettings
    from rolloutd.types import SamplingParams
    from rolloutd.workers import freeze_startup_objects

    configure_logging("warning", json=True)
    settings = GatewaySettings(
        store_url=store,
        backend_url=backend_url,
        backend_type=backend_type,
        model=MODEL,
        gateway_port=0,
    )
    gateway = Gateway.from_settings(settings)
    handle = await serve(gateway, "127.0.0.1", 0)
    keys = []
    for i in range(num_sessions):
        info = await gateway.sessions.open_session(
            f"bench/{i}", "bench", sampling=SamplingParams(max_tokens=16), capture_mode=capture_mode
        )
        keys.append(info.session_key)
    freeze_startup_objects()  # as the gateway fleet's process does once started
    loop = asyncio.get_running_loop()
    print(
        json.dumps(
            {
                "port": handle.port,
                "keys": keys,
                "http_parser": getattr(handle, "http_parser", "?"),
                "event_loop": f"{type(loop).__module__}.{type(loop).__name__}",
            }
        ),
        flush=True,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await handle.shutdown()
    await gateway.aclose()


# -------------------------------------------------------------------------- processes


@dataclass
class Proc:
    """A child process and the JSON line it printed when ready."""

    popen: subprocess.Popen[str]
    ready: dict[str, Any]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s, by pid."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def _start(args: list[str], timeout_s: float = 120.0, prefix: tuple[str, ...] = ()) -> Proc:
    """Start ``prefix python this_file args`` and wait for its JSON ready line."""
    popen = subprocess.Popen(
        [*prefix, sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + timeout_s
    assert popen.stdout is not None
    while time.monotonic() < deadline:
        line = popen.stdout.readline()
        if not line:
            raise RuntimeError(f"{args[0]} exited before it was ready")
        with contextlib.suppress(json.JSONDecodeError):
            ready = json.loads(line)
            if isinstance(ready, dict) and "port" in ready:
                return Proc(popen, ready)
    popen.kill()
    raise RuntimeError(f"{args[0]} not ready after {timeout_s} s")


def _start_litellm(binary: str, fake_port: int, port: int, folder: Path) -> subprocess.Popen:
    config = folder / "litellm.yaml"
    config.write_text(
        "model_list:\n  - model_name: bench\n    litellm_params:\n"
        f"      model: openai/bench\n      api_base: http://127.0.0.1:{fake_port}/v1\n"
        "      api_key: sk-bench\n"
        "litellm_settings:\n  telemetry: false\n  drop_params: true\n  set_verbose: false\n"
        "  json_logs: false\n"
    )
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "NO_DOCS": "True",
        "DISABLE_ADMIN_UI": "True",
    }
    return subprocess.Popen(
        [
            binary,
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--num_workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )


async def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with httpx.AsyncClient(timeout=2) as client:
        while loop.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code < 500:
                    return
            await asyncio.sleep(0.2)  # polling a starting server, bounded by the deadline
    raise RuntimeError(f"{url} not up after {timeout_s} s")


# -------------------------------------------------------------------------- load


@dataclass
class Path_:
    """One path under test: where calls go and what they look like."""

    name: str
    url: str
    keys: list[str]
    kind: str  # "completion" (llama.cpp), "chat" (OpenAI)
    auth: str | None = None
    pid: int | None = None  # the serving process, whose CPU time per call is reported


def _cpu_s(pid: int | None) -> float:
    """CPU time (user + system, s) of process ``pid`` and its descendants so far: on a shared
    machine the CPU cost per call varies much less than latency does."""
    if pid is None:
        return 0.0
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    tree, total = {pid}, 0.0
    for _ in range(8):  # bounded: descendants a few levels deep
        tree |= {p for p, (ppid, _) in stats.items() if ppid in tree}
    for p in tree:
        total += stats.get(p, (0, 0.0))[1]
    return total


def _cpu_ns_s(pid: int | None) -> float:
    """CPU time (s) of every thread of process ``pid`` so far, from the scheduler's
    statistics (``/proc/PID/task/TID/schedstat``, nanoseconds: precise per call, where
    ``/proc/PID/stat`` counts 10 ms ticks)."""
    if pid is None:
        return 0.0
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
    return total / 1e9


def _body(path: Path_, worker: int, call: int) -> dict[str, Any]:
    if path.kind == "completion":
        return {
            "prompt": list(range(20 + call % 7)),
            "n_predict": 16,
            "n_probs": 1,
            "cache_prompt": True,
            "return_tokens": True,
        }
    return {
        "model": "bench",
        "max_tokens": 16,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Say hello to worker {worker}, call {call}."},
        ],
    }


def _target(path: Path_, worker: int) -> tuple[str, dict[str, str]]:
    if path.keys:
        return f"{path.url}/s/{path.keys[worker]}/v1/chat/completions", {}
    suffix = "/completion" if path.kind == "completion" else "/v1/chat/completions"
    return path.url + suffix, ({"Authorization": f"Bearer {path.auth}"} if path.auth else {})


async def _load(
    path: Path_, concurrency: int, calls_per_worker: int, first_call: int
) -> tuple[list[float], float, int, float]:
    """Latencies (s) of every successful call, the wall time of the run, failed calls, and
    the serving process's CPU time per call (s)."""
    latencies: list[float] = []
    failures: list[str] = []
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=1)
    clients = [httpx.AsyncClient(limits=limits, timeout=60) for _ in range(concurrency)]
    try:

        async def worker(w: int) -> None:
            url, headers = _target(path, w)
            client = clients[w]
            for call in range(first_call, first_call + calls_per_worker):
                started = time.perf_counter()
                try:
                    response = await client.post(url, json=_body(path, w, call), headers=headers)
                except httpx.HTTPError as e:
                    failures.append(repr(e))
                    continue
                if response.status_code != 200:
                    failures.append(f"{response.status_code} {response.text[:200]}")
                    continue
                latencies.append(time.perf_counter() - started)

        for w in range(concurrency):  # warm-up: one call per connection
            url, headers = _target(path, w)
            with contextlib.suppress(httpx.HTTPError):
                await clients[w].post(url, json=_body(path, w, 10**6 + w), headers=headers)
        cpu = _cpu_s(path.pid)
        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - started
        cpu = _cpu_s(path.pid) - cpu
    finally:
        for client in clients:
            await client.aclose()
    if failures:
        print(
            f"{path.name} @{concurrency}: {len(failures)} failed calls, first: {failures[0]}",
            file=sys.stderr,
        )
    return latencies, wall, len(failures), cpu / max(1, len(latencies))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _growth(
    url: str, key: str, baseline_key: str, turns: int, pid: int | None
) -> dict[str, list[float]]:
    """One tokens-mode session growing a conversation to ``turns`` turns, each of its calls
    followed by a single-turn call in another session (the baseline, measured at the same
    moment, so that a machine that slows down or speeds up during the run does not read as
    growth). Per call: latency (s) and gateway CPU time (s) of both."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    out: dict[str, list[float]] = {"lat": [], "cpu": [], "base_lat": [], "base_cpu": []}
    headers = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=60) as client:

        async def timed(target: str, body: bytes) -> tuple[float, float, httpx.Response]:
            cpu_before = _cpu_ns_s(pid)
            started = time.perf_counter()
            response = await client.post(target, content=body, headers=headers)
            latency = time.perf_counter() - started
            if response.status_code != 200:
                raise RuntimeError(f"growth: {response.status_code} {response.text}")
            return latency, _cpu_ns_s(pid) - cpu_before, response

        for turn in range(turns):
            messages.append({"role": "user", "content": f"Turn {turn}: say hello."})
            body = json.dumps({"model": "bench", "messages": messages}).encode()
            latency, cpu, response = await timed(f"{url}/s/{key}/v1/chat/completions", body)
            out["lat"].append(latency)
            out["cpu"].append(cpu)
            messages.append(response.json()["choices"][0]["message"])
            fresh = json.dumps(
                {
                    "model": "bench",
                    "messages": [
                        messages[0],
                        {"role": "user", "content": f"Turn {turn}: say hello."},
                    ],
                }
            ).encode()
            latency, cpu, _ = await timed(f"{url}/s/{baseline_key}/v1/chat/completions", fresh)
            out["base_lat"].append(latency)
            out["base_cpu"].append(cpu)
    return out


# -------------------------------------------------------------------------- main


async def _main(args: argparse.Namespace) -> None:
    from rolloutd.engine.models import load_tokenizer

    tokenizer = load_tokenizer(MODEL)
    ids = list(tokenizer.encode(ANSWER, add_special_tokens=False)) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]
    procs: list[Proc] = []
    litellm: subprocess.Popen | None = None
    folder = Path(tempfile.mkdtemp(prefix="rolloutd-bench-"))
    try:
        fake = _start(["fake", json.dumps(ids)])
        procs.append(fake)
        fake_url = f"http://127.0.0.1:{fake.ready['port']}"
        sessions = max(args.concurrency)
        tokens = _start(
            ["gateway", fake_url, "llama_cpp", "tokens", str(sessions + 2), str(folder / "tokens")]
        )
        procs.append(tokens)
        passthrough = _start(
            [
                "gateway",
                fake_url,
                "openai",
                "passthrough",
                str(sessions),
                str(folder / "passthrough"),
            ]
        )
        procs.append(passthrough)
        paths = [
            Path_("direct (/completion)", fake_url, [], "completion", pid=fake.popen.pid),
            Path_("direct (chat)", fake_url, [], "chat", pid=fake.popen.pid),
            Path_(
                "rolloutd passthrough",
                f"http://127.0.0.1:{passthrough.ready['port']}",
                passthrough.ready["keys"],
                "chat",
                pid=passthrough.popen.pid,
            ),
            Path_(
                "rolloutd tokens",
                f"http://127.0.0.1:{tokens.ready['port']}",
                tokens.ready["keys"][:-2],
                "chat",
                pid=tokens.popen.pid,
            ),
        ]
        results: dict[tuple[str, int], tuple[list[float], float, int, float]] = {}
        growth = await _growth(
            paths[3].url,
            tokens.ready["keys"][-1],
            tokens.ready["keys"][-2],
            args.turns,
            tokens.popen.pid,
        )
        if args.litellm:  # started last: its background work would weigh on the other rows
            litellm_port = args.litellm_port
            litellm = _start_litellm(args.litellm, fake.ready["port"], litellm_port, folder)
            await _wait_http(f"http://127.0.0.1:{litellm_port}/health/liveliness", 180, litellm)
            paths.append(
                Path_(
                    "LiteLLM proxy",
                    f"http://127.0.0.1:{litellm_port}",
                    [],
                    "chat",
                    auth=LITELLM_KEY,
                    pid=litellm.pid,
                )
            )
        for path in paths:
            if path.name == "LiteLLM proxy":
                for proc in procs[1:]:  # the gateways are idle from here on
                    proc.stop()
            for concurrency in args.concurrency:
                calls = args.calls if concurrency == 1 else max(5, args.calls // concurrency * 4)
                results[(path.name, concurrency)] = await _load(path, concurrency, calls, 0)
                lat, wall, failed, cpu = results[(path.name, concurrency)]
                print(
                    f"{path.name} @{concurrency}: p50 {_pct(lat, 0.5) * 1000:.2f} ms, "
                    f"{len(lat) / wall:.0f} calls/s, {failed} failed, "
                    f"{cpu * 1000:.2f} ms CPU/call",
                    file=sys.stderr,
                )
    finally:
        if litellm is not None and litellm.poll() is None:
            litellm.terminate()
            try:
                litellm.wait(15)
            except subprocess.TimeoutExpired:
                litellm.kill()
        for proc in procs:
            proc.stop()
        shutil.rmtree(folder, ignore_errors=True)
    _report(paths, results, growth, args, tokens.ready)


def _report(
    paths: list[Path_],
    results: dict[tuple[str, int], tuple[list[float], float, int, float]],
    growth: dict[str, list[float]],
    args: argparse.Namespace,
    gateway: dict[str, Any],
) -> None:
    ms = 1000.0
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"\n### Gateway overhead ({os.cpu_count()} cores, instant fake backend, load average "
        f"at the end {load}; gateway event loop {gateway.get('event_loop', '?')}, HTTP "
        f"parser {gateway.get('http_parser', '?')})\n"
    )
    cols = " | ".join(
        f"p50 @{c} | p99 @{c} | added p50 @{c} | added p99 @{c} | calls/s @{c} | CPU/call @{c}"
        for c in args.concurrency
    )
    print(f"| path | {cols} |")
    print("|---|" + "---|" * (6 * len(args.concurrency)))
    for path in paths:
        base = "direct (/completion)" if path.kind == "completion" else "direct (chat)"
        cells = []
        for c in args.concurrency:
            lat, wall, failed, cpu = results[(path.name, c)]
            base_lat = results[(base, c)][0]
            p50, p99 = _pct(lat, 0.5), _pct(lat, 0.99)
            cells.append(
                f"{p50 * ms:.2f} ms | {p99 * ms:.2f} ms | "
                f"{(p50 - _pct(base_lat, 0.5)) * ms:+.2f} ms | "
                f"{(p99 - _pct(base_lat, 0.99)) * ms:+.2f} ms | {len(lat) / wall:.0f}"
                + (f" ({failed} failed)" if failed else "")
                + f" | {cpu * ms:.2f} ms"
            )
        print(f"| {path.name} | {' | '.join(cells)} |")
    print(
        "\nCPU/call: the serving process's own CPU time (user + system, with its children) "
        "per call; for direct rows, the fake backend's."
    )
    _report_targets(results)
    lat, cpu, base_lat, base_cpu = (growth[k] for k in ("lat", "cpu", "base_lat", "base_cpu"))
    print(
        f"\n### tokens mode: per-call cost as one conversation grows to {len(lat)} turns, "
        "against a single-turn call made right after each (request bodies encoded before "
        "the clock starts; CPU from the gateway's scheduler statistics, ns)\n"
    )
    print(
        "| turns | p50 | single-turn p50 | ratio | gateway CPU/call (mean) | single-turn "
        "CPU/call | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    window = max(1, len(lat) // 5)
    for start in range(0, len(lat), window):
        part = slice(start, start + window)
        p50, base_p50 = statistics.median(lat[part]), statistics.median(base_lat[part])
        mean_cpu, mean_base = statistics.mean(cpu[part]), statistics.mean(base_cpu[part])
        print(
            f"| {start + 1}-{start + len(lat[part])} | {p50 * ms:.2f} ms | "
            f"{base_p50 * ms:.2f} ms | {p50 / base_p50:.2f} | {mean_cpu * ms:.2f} ms | "
            f"{mean_base * ms:.2f} ms | {mean_cpu / mean_base:.2f} |"
        )
    num_tokens, plain_ms, gateway_ms = _fresh_prompts()
    print(
        f"\n### tokens mode: a fresh conversation's prompt ({num_tokens} tokens: a long "
        "system prompt and 15 tools sent before, a new task), rendered and encoded\n"
    )
    print(
        "| transformers (apply_chat_template + encode) | rolloutd (turns encoded before "
        "from its cache) |"
    )
    print("|---|---|")
    print(f"| {plain_ms:.2f} ms | {gateway_ms:.2f} ms |")


def _report_targets(results: dict[tuple[str, int], tuple[list[float], float, int, float]]) -> None:
    """The targets of the module docstring, checked on this run's tokens and LiteLLM rows."""
    needed = [
        ("rolloutd tokens", 1),
        ("rolloutd tokens", 64),
        ("LiteLLM proxy", 1),
        ("LiteLLM proxy", 64),
        ("direct (/completion)", 1),
        ("direct (chat)", 1),
    ]
    if any(key not in results for key in needed):
        print("\nTargets: not checked (they need LiteLLM and concurrencies 1 and 64).")
        return
    added = _pct(results[("rolloutd tokens", 1)][0], 0.5) - _pct(
        results[("direct (/completion)", 1)][0], 0.5
    )
    added_litellm = _pct(results[("LiteLLM proxy", 1)][0], 0.5) - _pct(
        results[("direct (chat)", 1)][0], 0.5
    )

    def rate(name: str) -> float:
        latencies, wall, _, _ = results[(name, 64)]
        return len(latencies) / wall

    share = added / added_litellm
    multiple = rate("rolloutd tokens") / rate("LiteLLM proxy")
    print(
        f"\nTargets (tokens mode, against LiteLLM in this run): added p50 @1 "
        f"{share:.2f}x LiteLLM's (target <= {TARGET_ADDED_P50_SHARE:g}x: "
        f"{'met' if share <= TARGET_ADDED_P50_SHARE else 'MISSED'}); calls/s @64 "
        f"{multiple:.1f}x LiteLLM's (target >= {TARGET_THROUGHPUT_MULTIPLE:g}x: "
        f"{'met' if multiple >= TARGET_THROUGHPUT_MULTIPLE else 'MISSED'})."
    )


def _fresh_prompts(num: int = 30) -> tuple[int, float, float]:
    """A harness's fresh conversations (a long system prompt and tools sent before, a new
    task): prompt tokens, and ms per prompt rendered and encoded by transformers alone and by
    the gateway's chat template (turns encoded before come from its cache)."""
    from rolloutd.engine.models import load_tokenizer
    from rolloutd.proxy.render.chat_template import ChatTemplate

    tokenizer = load_tokenizer(MODEL)
    template = ChatTemplate(tokenizer)
    system = "You are a coding agent working in a repository. " * 800
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "Runs one step of the task. " * 20,
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            },
        }
        for i in range(15)
    ]

    def fresh(i: int) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Task {i}: fix the failing test."},
        ]

    def plain(i: int) -> list[int]:
        return tokenizer.encode(template.render_text(fresh(i), tools), add_special_tokens=False)

    def gateway(i: int) -> list[int]:
        return template.encode(template.render_text(fresh(i), tools))

    assert plain(-1) == gateway(-1)
    out = []
    for fn in (plain, gateway):
        started = time.perf_counter()
        for i in range(num):
            fn(i)
        out.append((time.perf_counter() - started) / num * 1000)
    return len(plain(0)), out[0], out[1]


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _run(main: Any) -> None:
    """``asyncio.run`` on uvloop when it is installed."""
    if _has("uvloop"):
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def main() -> None:
    """Entry point: ``fake``/``gateway`` run a child process; no command runs the benchmark."""
    if len(sys.argv) > 1 and sys.argv[1] == "fake":
        _run(_run_fake(0, json.loads(sys.argv[2])))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "gateway":
        _, _, url, kind, mode, num, store = sys.argv
        _run(_run_gateway(url, kind, mode, int(num), store))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_litellm = Path.home() / ".cache/rolloutd/litellm-venv/bin/litellm"
    parser.add_argument(
        "--litellm",
        default=str(default_litellm) if default_litellm.exists() else None,
        help="litellm binary (omit to skip LiteLLM)",
    )
    parser.add_argument("--litellm-port", type=int, default=4017)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--calls", type=int, default=1000, help="calls at concurrency 1")
    parser.add_argument("--turns", type=int, default=200)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
