"""Acceptance: pi runs a tool-using task through the workflow in each of its three dialects.

The task goes through the trainer client to the shared fleets (real Temporal, llama-server with
Qwen2.5-Coder-0.5B-Instruct); pi speaks OpenAI Chat, OpenAI Responses or Anthropic Messages
(``harness.dialect``) to its session from a bubblewrap runtime that reaches only the gateway.
pi has no turn limit of its own: the adapter's extension ends the agent loop after
``harness.max_turns`` turns (a 0.5B model repeats its write call otherwise); the real CLI
alone against a stand-in model that never stops shows that extension at work.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses import get_harness
from rolloutd.sandbox.harnesses.pi import (
    PiHarness,
    summarize_output,
)
from rolloutd.types import HarnessSpec
from tests.support.contexts import ALL_DIALECTS, harness_context
from tests.support.harness_run import (
    HARNESS_TASK_MARKS,
    check_scored_with_tools,
    hello_world_task,
    run_task,
    skip_unless_runnable_in_bwrap,
)

pytestmark = [
    *HARNESS_TASK_MARKS,
    pytest.mark.timeout(1800),
]


@pytest.mark.parametrize("dialect", ["chat", "responses", "anthropic"])
async def test_pi_makes_a_file_with_its_tools_and_is_scored(fleets, dialect):
    """pi (compact profile, 2 turns) in bwrap with gateway-only network, in each dialect (Chat,
    Responses, Anthropic Messages): every session is scored and recorded completions, and its
    write tool ran in at least one session. About 235-360 s here per dialect with 2 samples
    under load 15-20 (876 s for the three), plus 98 s starting the fleets."""
    skip_unless_runnable_in_bwrap(PiHarness)
    run = await run_task(
        fleets,
        hello_world_task(
            "Use the write tool to create the file hello.py containing "
            "print('hello world'). Then stop.",
            {"type": "pi", "dialect": dialect, "profile": "compact", "max_turns": 2},
        ),
    )
    check_scored_with_tools(run, f"pi/{dialect}")


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
    """The real pi CLI on a local runtime against a stand-in model that calls ``bash`` on every
    turn: the adapter's extension stops it after max_turns=2, so it exits 0 after exactly 2
    model calls and 2 tool calls, stop reason ``aborted``, not an error. About 5 s here."""
    try:
        PiHarness.cli_version()
    except HarnessError as e:
        pytest.skip(str(e))
    server = ThreadingHTTPServer(("127.0.0.1", 0), AlwaysToolCall)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        runtime = await make_runtime("local")
        ctx = harness_context("http://g/s/k", dialects=ALL_DIALECTS).model_copy(
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
