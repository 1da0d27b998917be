"""The qwen_code harness: configuration, and one real run against llama-server under bwrap."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rolloutd.errors import ConfigError, HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV, npm_prefix
from rolloutd.sandbox.harnesses import HarnessContext, get_harness
from rolloutd.sandbox.harnesses.qwen_code import ENTRY_POINT, compact_args, summarize_output
from rolloutd.types import HarnessSpec

SESSION_KEY = "sk-session-secret"


def _ctx(url: str = "http://127.0.0.1:8300/s/k/v1", **overrides: str) -> HarnessContext:
    return HarnessContext(
        **(
            {
                "instruction": "Create a file hello.txt containing the word hello",
                "openai_base_url": url,
                "api_key": SESSION_KEY,
                "model": "Qwen2.5-Coder-0.5B-Instruct",
            }
            | overrides
        )
    )


@pytest.fixture
def fake_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    prefix = tmp_path / "npm"
    cli = prefix / ENTRY_POINT
    cli.parent.mkdir(parents=True)
    cli.write_text("// stand-in for the qwen CLI\n")
    monkeypatch.setenv(NPM_PREFIX_ENV, str(prefix))
    return prefix


async def test_prepare_writes_offline_settings_and_keeps_key_off_argv(make_runtime, fake_prefix):
    runtime = await make_runtime("local")
    adapter = get_harness(HarnessSpec(type="qwen_code", max_turns=4, args=["--debug"]))
    command = await adapter.prepare(runtime, _ctx())
    argv = command.command
    assert isinstance(argv, list)
    assert argv[:2] == ["node", str(fake_prefix / ENTRY_POINT)]
    assert argv[argv.index("--approval-mode") + 1] == "yolo"
    assert argv[argv.index("--max-session-turns") + 1] == "4"
    assert argv[argv.index("--auth-type") + 1] == "openai"
    assert "--debug" in argv
    assert argv[-1] == "--prompt=Create a file hello.txt containing the word hello"
    assert not any(SESSION_KEY in arg for arg in argv)
    assert command.env["OPENAI_API_KEY"] == SESSION_KEY
    assert command.env["OPENAI_BASE_URL"] == "http://127.0.0.1:8300/s/k/v1"
    settings = json.loads(await runtime.download(f"{runtime.home}/.qwen/settings.json"))
    assert settings["security"]["auth"]["selectedType"] == "openai"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["enableAutoUpdate"] is False
    assert settings["memory"]["enableManagedAutoMemory"] is False
    assert settings["model"]["maxSessionTurns"] == 4


async def test_prepare_without_the_cli_says_how_to_install(make_runtime, tmp_path, monkeypatch):
    monkeypatch.setenv(NPM_PREFIX_ENV, str(tmp_path / "empty"))
    runtime = await make_runtime("local")
    with pytest.raises(HarnessError, match="npm install --prefix"):
        await get_harness(HarnessSpec(type="qwen_code")).prepare(runtime, _ctx())


def test_summarize_output_flags_api_errors_despite_exit_zero():
    ok = (
        '{"type":"system","subtype":"init"}\n'
        '{"type":"result","is_error":false,"num_turns":2,"result":"Done.",'
        '"usage":{"input_tokens":3215,"output_tokens":17}}\n'
    )
    assert summarize_output(ok) == {
        "has_result": True,
        "is_error": False,
        "api_error": None,
        "num_turns": 2,
        "input_tokens": 3215,
        "output_tokens": 17,
        "result": "Done.",
    }
    failed = (
        '{"type":"result","is_error":false,"num_turns":1,"result":"[API Error: 400 '
        'request (17291 tokens) exceeds the available context size (8192 tokens)]"}'
    )
    summary = summarize_output(failed)
    assert summary["is_error"] and "17291 tokens" in summary["api_error"]
    assert summarize_output("not json\n")["is_error"]


# --------------------------------------------------------------------------- end to end


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
    command = await get_harness(spec).prepare(runtime, _ctx(f"{llama_server.url}/v1"))
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
