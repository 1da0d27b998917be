"""Acceptance: the real qwen-code CLI under bwrap against a real llama-server
(Qwen2.5-Coder-0.5B), straight to the engine: it writes the file the instruction asks for.
Needs qwen-code installed (scripts/setup.sh) and bubblewrap."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator

import pytest

from rolloutd.errors import ConfigError
from rolloutd.sandbox.config import NPM_PREFIX_ENV, npm_prefix
from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.qwen_code import ENTRY_POINT, compact_args, summarize_output
from rolloutd.types import HarnessSpec
from tests.support.contexts import harness_context

INSTRUCTION = "Create a file hello.txt containing the word hello"


@pytest.fixture(scope="module")
def llama_server() -> Iterator[object]:
    """A llama-server on the catalog's Qwen2.5-Coder-0.5B, stopped at the end of the module."""
    from rolloutd.engine.server import LlamaServer, llama_server_binary

    try:
        llama_server_binary()
        server = LlamaServer("qwen2.5-coder-0.5b", parallel=2, ctx_size=16384)
    except ConfigError as exc:
        pytest.skip(f"no engine: {exc}")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.harness
@pytest.mark.engine
@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
async def test_qwen_code_runs_against_llama_server_under_bwrap(
    make_runtime, llama_server, runtime_pids
):
    """The real qwen-code CLI in bwrap, straight to llama-server: it exits 0 with a result that
    is not an error, made 1 to 4 model calls none of which failed, counted input tokens, and
    left no process behind. About 25 s here (23 s in a run of the whole acceptance
    tier)."""
    if not (npm_prefix() / ENTRY_POINT).is_file():
        pytest.skip(f"qwen-code is not installed in {npm_prefix()} (set {NPM_PREFIX_ENV})")
    # straight to llama-server, not through a gateway session: the gateway-only network
    # (bwrap's default) would rightly refuse it
    runtime = await make_runtime("bwrap", grace_s=5.0, network="host")
    logs = f"{runtime.home}/openai-logs"
    spec = HarnessSpec(
        type="qwen_code",
        max_turns=2,
        args=[*compact_args(), "--openai-logging", f"--openai-logging-dir={logs}"],
    )
    command = await get_harness(spec).prepare(
        runtime, harness_context(llama_server.url, instruction=INSTRUCTION)
    )
    began = time.monotonic()
    process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
    code = await process.wait(600)
    duration_s = time.monotonic() - began
    if code is None:
        await process.terminate()
    stdout = process.stdout_path.read_text()
    stderr = process.stderr_path.read_text()
    assert code == 0, stderr[-2000:]
    summary = summarize_output(stdout)
    assert summary["has_result"] and not summary["is_error"], summary
    calls = [
        json.loads(p.read_text())
        for p in sorted((runtime.host_home / "openai-logs").glob("*.json"))
    ]
    assert 1 <= len(calls) <= 2 * spec.max_turns
    assert all(call.get("error") in (None, {}) for call in calls), calls[-1].get("error")
    assert summary["input_tokens"] > 0
    print(
        f"qwen_code: exit {code}, {len(calls)} model calls, {duration_s:.1f} s, "
        f"{summary['input_tokens']} input tokens, {summary['num_turns']} turns"
    )
    assert runtime_pids(runtime) == []  # the CLI exited and left nothing behind
