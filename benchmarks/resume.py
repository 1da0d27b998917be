"""Resume versus restart of a half-finished session : engine tokens and wall time.

A scripted harness makes ``--calls`` model calls (temperature 0) through a real gateway to a
real llama-server, running a real tool (a shell command) between calls and sending its output
back. Attempt 1 is killed after ``--kill-at`` calls (the harness stops; its session is sealed,
as the session workflow does when the sandbox host is lost). Then the same harness runs again
from the start in a new session, twice:

- ``resume``: the new session replays attempt 1's log (``TaskRequest.resume = "replay"``);
- ``restart``: it samples everything again (``resume = "restart"``, the behaviour before).

Reported per mode: engine requests, prompt tokens sent, response tokens sampled, and the
wall time of the second attempt. The gateway runs in this process (httpx.ASGITransport);
llama-server is started here and stopped at the end.

    python benchmarks/resume.py [--calls 20] [--kill-at 15] [--max-tokens 48] [--model M]

Output: a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from rolloutd.engine.models import load_tokenizer
from rolloutd.engine.server import LlamaServer
from rolloutd.processes import run_until_sigterm
from rolloutd.proxy.http.server import Gateway
from rolloutd.settings import GatewaySettings
from rolloutd.store import CompletionLog
from rolloutd.types import SamplingParams

#: the catalog model (the figures compare token counts: its quality does not matter)
MODEL = "smollm2-135m"


async def harness(client: httpx.AsyncClient, key: str, calls: int) -> None:
    """The scripted agent: ask, run the tool, send its output back."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "We count files together. Say a short sentence."}
    ]
    for turn in range(calls):
        response = await client.post(
            f"/s/{key}/v1/chat/completions", json={"model": "m", "messages": messages}
        )
        response.raise_for_status()
        content = response.json()["choices"][0]["message"].get("content") or ""
        tool = await asyncio.to_thread(
            subprocess.run,
            ["sh", "-c", f"echo turn {turn}; ls /"],
            capture_output=True,
            text=True,
            check=True,
        )
        messages += [
            {"role": "assistant", "content": content},
            {"role": "user", "content": f"The tool printed:\n{tool.stdout}\nGo on."},
        ]


def engine_figures(gateway: Gateway, session_id: str) -> tuple[int, int, int]:
    """(engine requests, prompt tokens, response tokens) the session's sampled calls cost."""
    sampled = [
        c for c in CompletionLog(gateway.store, session_id).read_all() if c.replayed_from is None
    ]
    return (
        len(sampled),
        sum(len(c.prompt_ids) for c in sampled),
        sum(len(c.response_ids) for c in sampled),
    )


async def main(args: argparse.Namespace) -> None:
    tokenizer = load_tokenizer(args.model)
    server = LlamaServer(args.model, parallel=1, ctx_size=8192).start(timeout_s=180)
    try:
        with tempfile.TemporaryDirectory() as home:
            settings = GatewaySettings(
                store_url=str(Path(home) / "store"),
                backend_url=server.url,
                backend_timeout_s=300,
                gateway_public_url="http://gateway.bench",
            )
            gateway = Gateway.from_settings(settings, tokenizer=tokenizer)
            sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
            transport = httpx.ASGITransport(app=gateway.app)
            rows = []
            async with httpx.AsyncClient(
                transport=transport, base_url="http://gateway.bench", timeout=600
            ) as client:
                first = await gateway.sessions.open_session("bench/0", "bench", sampling=sampling)
                t0 = time.monotonic()
                await harness(client, first.session_key, args.kill_at)
                first_s = time.monotonic() - t0
                await gateway.sessions.close_session("bench/0")
                rows.append(("attempt 1 (killed)", *engine_figures(gateway, "bench/0"), first_s))
                for mode, source in (("resume", ["bench/0"]), ("restart", [])):
                    session_id = f"bench/0.{mode}"
                    opened = await gateway.sessions.open_session(
                        session_id, "bench", sampling=sampling, replay_from=source
                    )
                    t0 = time.monotonic()
                    await harness(client, opened.session_key, args.calls)
                    wall_s = time.monotonic() - t0
                    await gateway.sessions.close_session(session_id)
                    rows.append(
                        (f"attempt 2, {mode}", *engine_figures(gateway, session_id), wall_s)
                    )
            await gateway.aclose()
    finally:
        server.stop()
    print(
        f"{args.calls}-call session killed after call {args.kill_at} ({args.model}, "
        f"llama-server, temperature 0, max_tokens {args.max_tokens})\n"
    )
    print("| attempt | engine requests | prompt tokens | response tokens sampled | wall s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, requests, prompt, response, wall_s in rows:
        print(f"| {name} | {requests} | {prompt} | {response} | {wall_s:.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--kill-at", type=int, default=15)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--model", default=MODEL, help="a catalog model name")
    # SIGTERM cancels main: its finally stops the servers started here, then exit 143
    run_until_sigterm(main(parser.parse_args()))
