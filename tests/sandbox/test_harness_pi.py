"""The pi harness's recipe: models.json per dialect, environment and argv, on a local runtime."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV
from rolloutd.sandbox.harnesses import HarnessContext, get_harness
from rolloutd.sandbox.harnesses.pi import (
    ENTRY,
    MAX_TURNS_EXTENSION,
    PACKAGE,
    PiHarness,
    summarize_output,
)
from rolloutd.types import HarnessSpec

KEY = "sk-session-secret"


def _ctx(instruction: str = "make hello.py") -> HarnessContext:
    return HarnessContext(
        instruction=instruction,
        openai_base_url="http://g/s/k/v1",
        anthropic_base_url="http://g/s/k",
        gemini_base_url="http://g/s/k",
        api_key=KEY,
        model="Qwen2.5-Coder-0.5B-Instruct",
    )


@pytest.fixture
def fake_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "npm" / "node_modules" / PACKAGE
    (package / ENTRY).parent.mkdir(parents=True)
    (package / ENTRY).write_text("// stand-in for pi's cli.js\n")
    (package / "package.json").write_text('{"version": "0.73.1"}')
    monkeypatch.setenv(NPM_PREFIX_ENV, str(tmp_path / "npm"))
    return tmp_path / "npm"


@pytest.mark.parametrize(
    ("dialect", "api", "url"),
    [
        (None, "openai-completions", "http://g/s/k/v1"),
        ("responses", "openai-responses", "http://g/s/k/v1"),
        ("anthropic", "anthropic-messages", "http://g/s/k"),
    ],
)
async def test_dialect_picks_the_provider_api_and_url(make_runtime, fake_prefix, dialect, api, url):
    runtime = await make_runtime("local")
    spec = HarnessSpec(type="pi", dialect=dialect)
    command = await get_harness(spec).prepare(runtime, _ctx())
    argv = command.command
    assert isinstance(argv, list)
    assert argv[:3] == ["node", str(fake_prefix / "node_modules" / PACKAGE / ENTRY), "-p"]
    assert argv[argv.index("--mode") + 1] == "json"
    assert "--offline" in argv and "--no-session" in argv
    assert command.env["ROLLOUTD_MAX_TURNS"] == "10"
    extension = argv[argv.index("-e") + 1]
    assert (await runtime.download(extension)).decode() == MAX_TURNS_EXTENSION
    assert argv[-1] == "make hello.py"
    assert not any(KEY in a for a in argv)
    assert command.env["ROLLOUTD_SESSION_KEY"] == KEY
    text = (await runtime.download(f"{runtime.home}/.pi/agent/models.json")).decode()
    assert KEY not in text
    provider = json.loads(text)["providers"]["rolloutd"]
    assert (provider["api"], provider["baseUrl"]) == (api, url)
    assert provider["apiKey"] == "ROLLOUTD_SESSION_KEY"
    assert provider["models"][0]["id"] == "Qwen2.5-Coder-0.5B-Instruct"


async def test_compact_profile_and_an_instruction_that_looks_like_an_option(
    make_runtime, fake_prefix
):
    runtime = await make_runtime("local")
    spec = HarnessSpec(type="pi", profile="compact")
    command = await get_harness(spec).prepare(runtime, _ctx("--help me write hello.py"))
    argv = command.command
    assert argv[argv.index("--tools") + 1] == "read,bash,write"
    assert runtime.workdir in argv[argv.index("--system-prompt") + 1]
    # pi would parse "--help ..." as its own flag: the instruction goes in as a file
    assert argv[-1].startswith("@") and argv[-1].endswith(".rolloutd/instruction.md")
    assert await runtime.download(argv[-1][1:]) == b"--help me write hello.py"


async def test_gemini_dialect_and_missing_cli_are_refused(
    make_runtime, fake_prefix, tmp_path, monkeypatch
):
    runtime = await make_runtime("local")
    with pytest.raises(HarnessError, match="dialect='gemini'"):
        await get_harness(HarnessSpec(type="pi", dialect="gemini")).prepare(runtime, _ctx())
    monkeypatch.setenv(NPM_PREFIX_ENV, str(tmp_path / "empty"))
    with pytest.raises(HarnessError, match="scripts/setup.sh"):
        await get_harness(HarnessSpec(type="pi")).prepare(runtime, _ctx())


def test_summarize_reads_the_last_assistant_message():
    def end(message):
        return json.dumps({"type": "message_end", "message": message})

    out = "\n".join(
        [
            json.dumps({"type": "session", "id": "x"}),
            end({"role": "user", "content": []}),
            end(
                {
                    "role": "assistant",
                    "stopReason": "toolUse",
                    "content": [],
                    "usage": {"input": 800, "output": 40},
                }
            ),
            json.dumps({"type": "tool_execution_end", "toolName": "write", "isError": False}),
            end(
                {
                    "role": "assistant",
                    "stopReason": "stop",
                    "content": [{"type": "text", "text": "Done."}],
                    "usage": {"input": 900, "output": 3},
                }
            ),
        ]
    )
    assert summarize_output(out) == {
        "num_turns": 2,
        "num_tool_calls": 1,
        "tool_errors": 0,
        "is_error": False,
        "error": None,
        "stop_reason": "stop",
        "input_tokens": 1700,
        "output_tokens": 43,
        "result": "Done.",
    }
    failed = summarize_output(
        end(
            {
                "role": "assistant",
                "stopReason": "error",
                "content": [],
                "errorMessage": "400 status code (no body)",
            }
        )
    )
    assert failed["is_error"] and failed["error"] == "400 status code (no body)"


class AlwaysToolCall(BaseHTTPRequestHandler):
    """A Chat Completions server whose model calls ``bash`` on every turn, as a small model
    that never stops does; counts the calls."""

    calls = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        type(self).calls += 1
        call = {
            "index": 0,
            "id": f"call_{self.calls}",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "echo hi"}'},
        }
        chunks = [
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "tool_calls": [call]},
                        "finish_reason": None,
                    }
                ]
            },
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ]
        body = (
            "".join(
                f"data: {json.dumps({'id': 'c', 'object': 'chat.completion.chunk', 'created': 0, 'model': 'm', **c})}\n\n"  # noqa: E501
                for c in chunks
            )
            + "data: [DONE]\n\n"
        )
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.harness
@pytest.mark.timeout(120)
async def test_turn_limit_extension_stops_a_model_that_never_stops(make_runtime):
    try:
        PiHarness.cli_version()
    except HarnessError as e:
        pytest.skip(str(e))
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlwaysToolCall)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        runtime = await make_runtime("local")
        ctx = _ctx().model_copy(
            update={"openai_base_url": f"http://127.0.0.1:{server.server_port}/v1"}
        )
        command = await get_harness(HarnessSpec(type="pi", max_turns=2)).prepare(runtime, ctx)
        process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
        code = await process.wait(90)
        if code is None:
            await process.terminate()
        summary = summarize_output(process.stdout_path.read_text())
    finally:
        server.shutdown()
        server.server_close()
    assert code == 0, process.stderr_path.read_text()[-2000:]
    assert AlwaysToolCall.calls == 2
    assert summary["num_tool_calls"] == 2 and summary["stop_reason"] == "aborted"
    assert not summary["is_error"]
