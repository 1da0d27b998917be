"""The gemini_cli harness's recipe: settings, environment and argv, on a local runtime."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV
from rolloutd.sandbox.harnesses import get_harness, harness_capabilities
from rolloutd.sandbox.harnesses.gemini_cli import (
    CORE_TOOLS,
    ENTRY,
    FETCH_PRELOAD,
    PACKAGE,
    summarize_output,
)
from rolloutd.types import HarnessSpec
from tests.support.contexts import ALL_DIALECTS, SESSION_KEY, harness_context

#: the stand-in CLI (unit/conftest.py ``fake_prefix``): package, entry, text, package.json
STAND_IN = (PACKAGE, ENTRY, "// stand-in for gemini.js\n", {"version": "0.61.0"})


async def test_compact_run_is_offline_one_shot_and_keeps_the_key_off_argv(
    make_runtime, fake_prefix
):
    runtime = await make_runtime("local")
    spec = HarnessSpec(type="gemini_cli", profile="compact", max_turns=3, args=["--debug"])
    command = await get_harness(spec).prepare(
        runtime,
        harness_context("http://g/s/k", instruction="-make hello.py", dialects=ALL_DIALECTS),
    )
    argv = command.command
    assert isinstance(argv, list)
    assert argv[:2] == ["node", str(fake_prefix / "node_modules" / PACKAGE / ENTRY)]
    assert argv[argv.index("-m") + 1] == "Qwen2.5-Coder-0.5B-Instruct"
    assert "--yolo" in argv and "--debug" in argv
    assert "--prompt=-make hello.py" in argv  # one element: not read as an option
    assert not any(SESSION_KEY in a for a in argv)
    assert command.env["GEMINI_API_KEY"] == SESSION_KEY
    assert command.env["GOOGLE_GEMINI_BASE_URL"] == "http://g/s/k"
    preload = command.env["NODE_OPTIONS"].removeprefix("--require=")
    assert (await runtime.download(preload)).decode() == FETCH_PRELOAD
    settings = json.loads(await runtime.download(f"{runtime.home}/.gemini/settings.json"))
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert settings["telemetry"]["enabled"] is False
    assert settings["general"]["disableAutoUpdate"] is True
    assert settings["model"]["maxSessionTurns"] == 3
    assert settings["tools"]["core"] == list(CORE_TOOLS)
    system_md = (await runtime.download(command.env["GEMINI_SYSTEM_MD"])).decode()
    assert runtime.workdir in system_md and len(system_md) < 400


async def test_default_profile_keeps_the_shipped_prompt_and_tools(make_runtime, fake_prefix):
    runtime = await make_runtime("local")
    command = await get_harness(HarnessSpec(type="gemini_cli")).prepare(
        runtime,
        harness_context("http://g/s/k", instruction="-make hello.py", dialects=ALL_DIALECTS),
    )
    assert "GEMINI_SYSTEM_MD" not in command.env
    settings = json.loads(await runtime.download(f"{runtime.home}/.gemini/settings.json"))
    assert "tools" not in settings and settings["model"]["maxSessionTurns"] == 10


async def test_missing_cli_names_the_setup_step(make_runtime, tmp_path, monkeypatch):
    monkeypatch.setenv(NPM_PREFIX_ENV, str(tmp_path / "empty"))
    runtime = await make_runtime("local")
    with pytest.raises(HarnessError, match="scripts/setup.sh"):
        await get_harness(HarnessSpec(type="gemini_cli")).prepare(
            runtime,
            harness_context("http://g/s/k", instruction="-make hello.py", dialects=ALL_DIALECTS),
        )
    assert "gemini_cli" in harness_capabilities()[1]


def test_summarize_reads_the_json_result_among_warnings():
    out = (
        'Warning: something\n{\n  "response": "Created hello.py",\n  "stats": {"models": '
        '{"m": {"api": {"totalRequests": 2}, "tokens": {"prompt": 900, "candidates": 40}}},'
        ' "tools": {"totalCalls": 1}}\n}\n'
    )
    assert summarize_output(out) == {
        "has_result": True,
        "is_error": False,
        "error": None,
        "num_requests": 2,
        "num_tool_calls": 1,
        "input_tokens": 900,
        "output_tokens": 40,
        "result": "Created hello.py",
    }
    failed = summarize_output('{"error": {"type": "Error", "message": "Reached max turns"}}')
    assert failed["is_error"] and failed["error"] == "Reached max turns"
    assert "stderr" in summarize_output("no json")["error"]


#: what Gemini CLI does at start, scaled down: replace the global dispatcher with an undici
#: Agent whose headersTimeout is short (the CLI's is 60 s), then fetch from a slow server.
NODE_CLIENT = """
const sym = Symbol.for('undici.globalDispatcher.1');
(async () => {
  await fetch(process.argv[2] + '/fast');
  globalThis[sym] = new globalThis[sym].constructor({ headersTimeout: 300 });
  try {
    const r = await fetch(process.argv[2] + '/slow');
    console.log('status ' + r.status);
  } catch (e) {
    console.log('failed ' + (e.cause && e.cause.code));
  }
})();
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_fetch_preload_lifts_the_clis_header_timeout(tmp_path):
    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/slow":
                time.sleep(1.0)  # the server under test is slow on purpose, nothing waits on it
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    preload = tmp_path / "preload.cjs"
    preload.write_text(FETCH_PRELOAD)
    script = tmp_path / "client.js"
    script.write_text(NODE_CLIENT)
    try:

        def run(env: dict[str, str]) -> str:
            return subprocess.run(
                ["node", str(script), url],
                capture_output=True,
                text=True,
                timeout=60,
                env={"PATH": os.environ["PATH"], **env},
            ).stdout.strip()

        assert run({}) == "failed UND_ERR_HEADERS_TIMEOUT"
        assert (
            run({"NODE_OPTIONS": f"--require={preload}", "ROLLOUTD_FETCH_TIMEOUT_MS": "0"})
            == "status 200"
        )
    finally:
        server.shutdown()
        server.server_close()
