"""Replay coverage per harness adapter and runtime on a fixed tool-using task.

For each (harness, runtime): the task runs once to its end (attempt 1); then the same sample
runs again as a new attempt whose replay source is attempt 1's sealed log (a
``RolloutSessionWorkflow`` started with ``replay_from``, what a lost host or a replacement
does). Coverage is calls replayed / calls recorded by attempt 1; the table says where each
conversation's replay ended and why (``ReplayStats.ends``), which shows the volatile values
(a timestamp, a temporary path, a per-process id) that a harness puts in its requests.

Real parts: a Temporal dev server, llama-server (Qwen2.5-Coder-0.5B), the four fleets in this
process, the harness CLIs installed by scripts/setup.sh, bwrap or the local runtime. Sampling
at temperature 0 does not decide coverage: attempt 2 gets attempt 1's answers while it replays.

    python benchmarks/replay_coverage.py [--harness shell,qwen_code,...] [--runtime bwrap,local]

Output: a markdown table on stdout (docs/sessions.md keeps the last one).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rolloutd.engine.server import LlamaServer
from rolloutd.processes import run_until_sigterm
from rolloutd.settings import EvalSettings, GatewaySettings, SandboxSettings
from rolloutd.stack import TemporalDevServer, free_port
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionResult, TaskRequest
from rolloutd.workers import connect, run_fleet
from rolloutd.workflows.session.models import SessionInput
from rolloutd.workflows.session.workflow import RolloutSessionWorkflow

MODEL = "qwen2.5-coder-0.5b"
INSTRUCTION = "Run the command `sh next.sh` in the shell and do what it says."
#: each run says what to do next, so a small model makes 3 tool calls and a final reply; the
#: counter starts at 0 in every fresh runtime, so both attempts see the same tool outputs
NEXT_SH = """n=$(cat .count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > .count
if [ $n -lt 3 ]; then echo "Step $n of 3 done. Now run the command: sh next.sh"
else echo "Step 3 of 3 done. All steps are finished. Reply with one word: done."; fi
"""
#: every adapter of a CLI harness, and the shell harness
ADAPTERS = (
    "shell",
    "qwen_code",
    "codex",
    "claude_code",
    "gemini_cli",
    "opencode",
    "pi",
    "mini_swe_agent",
    "aider",
)
#: the shell harness's agent: a tool (a shell command) per turn, its output sent back
SHELL_AGENT = r"""
import json, os, subprocess, urllib.request
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
messages = [{"role": "user",
             "content": open(os.environ["ROLLOUTD_INSTRUCTION_FILE"]).read()}]
for command in ["sh next.sh"] * 3 + [None]:
    body = json.dumps({"model": "m", "max_tokens": 16, "messages": messages}).encode()
    request = urllib.request.Request(base + "/chat/completions", data=body, headers={
        "Authorization": "Bearer " + key, "Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(request, timeout=300))
    if command is None:
        break
    out = subprocess.run(command, shell=True, capture_output=True, text=True).stdout
    messages += [{"role": "assistant",
                  "content": reply["choices"][0]["message"].get("content") or ""},
                 {"role": "user", "content": f"$ {command}\n{out}"}]
"""


def harness_spec(name: str) -> dict[str, Any]:
    if name == "shell":
        return {"type": "shell", "command": "python3 agent.py"}
    # the compact profile (short system prompt, fewer tools) keeps a CPU engine's prefill short
    return {"type": name, "profile": "compact", "max_turns": 6}


def task(harness: str, runtime: str) -> dict[str, Any]:
    files = {"next.sh": NEXT_SH, **({"agent.py": SHELL_AGENT} if harness == "shell" else {})}
    return {
        "task_id": f"cov-{harness.replace('_', '-')}-{runtime}-{uuid.uuid4().hex[:6]}",
        "instruction": INSTRUCTION,
        "num_samples": 1,
        "harness": harness_spec(harness),
        "runtime": {"type": runtime, "files": files},
        "evaluator": {"type": "session_completed"},
        "sampling": {"temperature": 0.0, "max_tokens": 128},
        "phases": {"run_s": 300},
        "timeout_s": 600,
    }


async def measure(client: Any, store_url: str, harness: str, runtime: str) -> dict[str, Any]:
    """Run the task, then a new attempt replaying it; return the row."""
    spec = TaskRequest.model_validate(task(harness, runtime))
    trainer = RolloutClient(client)
    t0 = time.monotonic()
    first = (await (await trainer.submit(spec)).result()).sessions[0]
    first_s = time.monotonic() - t0
    t0 = time.monotonic()
    second: SessionResult = await client.execute_workflow(
        RolloutSessionWorkflow.run,
        SessionInput(
            task=spec,
            sample_index=0,
            session_id=f"{spec.task_id}/0/replay",
            replay_from=[first.session_id],
        ),
        id=f"task/{spec.task_id}/0/replay",
        task_queue="rolloutd-workflows",
    )
    second_s = time.monotonic() - t0
    replay = second.replay
    ends = ", ".join(f"#{e.last_index} {e.reason}" for e in replay.ends) or "-"
    return {
        "harness": harness,
        "runtime": runtime,
        "recorded": first.num_completions,
        "replayed": replay.num_replayed,
        "calls_2": second.num_completions,
        "ends": ends,
        "status": f"{first.status.value}/{second.status.value}",
        "seconds": f"{first_s:.0f}/{second_s:.0f}",
    }


async def main(args: argparse.Namespace) -> None:
    rows = []
    engine = LlamaServer(MODEL, parallel=2, ctx_size=32768).start(timeout_s=180)
    temporal = TemporalDevServer(headless=True).start()
    try:
        with tempfile.TemporaryDirectory() as home:
            common = {
                "temporal_address": temporal.address,
                "store_url": str(Path(home) / "store"),
                "host_id": "coverage",
                "log_json": False,
            }
            port = free_port()
            gateway = GatewaySettings(
                **common,
                gateway_port=port,
                backend_url=engine.url,
                gateway_public_url=f"http://127.0.0.1:{port}",
                model=MODEL,
                tool_parser="hermes_lenient",
            )
            client = await connect(gateway)
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(run_fleet("gateway", client, gateway))
                await stack.enter_async_context(
                    run_fleet(
                        "sandbox",
                        client,
                        SandboxSettings(**common, runtime_root=str(Path(home) / "runtimes")),
                    )
                )
                await stack.enter_async_context(run_fleet("eval", client, EvalSettings(**common)))
                await stack.enter_async_context(run_fleet("workflows", client, gateway))
                for runtime in args.runtime.split(","):
                    for harness in args.harness.split(","):
                        try:
                            rows.append(
                                await measure(client, common["store_url"], harness, runtime)
                            )
                        except Exception as e:  # noqa: BLE001 - a row per pair, whatever fails
                            rows.append(
                                {
                                    "harness": harness,
                                    "runtime": runtime,
                                    "ends": f"error: {type(e).__name__}: {e}"[:120],
                                }
                            )
                        print(rows[-1], file=sys.stderr, flush=True)  # progress, kept if killed
    finally:
        temporal.stop()
        engine.stop()
    print(
        "| harness | runtime | calls recorded | replayed | coverage | attempt 2 calls | "
        "replay ended | status 1/2 | s 1/2 |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
    for r in rows:
        recorded = r.get("recorded")
        coverage = f"{r['replayed'] / recorded:.0%}" if recorded else "-"
        print(
            f"| {r['harness']} | {r['runtime']} | {recorded if recorded is not None else '-'}"
            f" | {r.get('replayed', '-')} | {coverage} | {r.get('calls_2', '-')} | "
            f"{r['ends']} | {r.get('status', '-')} | {r.get('seconds', '-')} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--harness", default=",".join(ADAPTERS))
    parser.add_argument("--runtime", default="bwrap,local")
    # SIGTERM cancels main: its finally stops the servers started here, then exit 143
    run_until_sigterm(main(parser.parse_args()))
