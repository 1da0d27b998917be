"""The shell harness: template rendering, quoting, session environment."""

from __future__ import annotations

import pytest

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses import HARNESSES, get_harness
from rolloutd.sandbox.harnesses.shell import ShellHarness, render_template
from rolloutd.types import HarnessSpec
from tests.support.contexts import harness_context

NASTY = 'It\'s "quoted" $HOME `id` ; rm -rf / && echo {model} \\ \n second line'


def test_render_template_quotes_and_leaves_other_braces():
    out = render_template(
        "a {instruction} ${HOME} awk '{print}' {unknown}", {"instruction": "x y'z"}
    )
    assert out == "a 'x y'\"'\"'z' ${HOME} awk '{print}' {unknown}"


async def test_shell_harness_runs_with_exact_instruction(make_runtime):
    runtime = await make_runtime("local")
    spec = HarnessSpec(
        type="shell",
        command=(
            "printf '%s' {instruction} > instruction.txt; "
            "echo {base_url} {model} {api_key} {workdir} > values.txt; "
            'echo "$OPENAI_BASE_URL $OPENAI_API_KEY $OPENAI_MODEL" > env.txt; '
            'cat "$ROLLOUTD_INSTRUCTION_FILE" > from_file.txt; cat {instruction_file} > file2.txt; '
            "printf '%s\\n' > args.txt"
        ),
        args=["--flag", "two words"],
        env={"EXTRA": "1"},
    )
    adapter = get_harness(spec)
    assert isinstance(adapter, ShellHarness)
    command = await adapter.prepare(
        runtime,
        harness_context("http://127.0.0.1:8300/s/key123", instruction=NASTY, api_key="key123"),
    )
    assert isinstance(command.command, str)
    assert command.command.endswith("--flag 'two words'")
    assert command.env["EXTRA"] == "1"
    assert command.cwd == runtime.workdir
    process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
    assert await process.wait(30) == 0, process.stderr_path.read_text()
    assert (await runtime.download("instruction.txt")).decode() == NASTY
    assert (await runtime.download("from_file.txt")).decode() == NASTY
    assert (await runtime.download("args.txt")).decode() == "--flag\ntwo words\n"
    assert (await runtime.download("file2.txt")).decode() == NASTY
    assert (await runtime.download("values.txt")).decode().split() == [
        "http://127.0.0.1:8300/s/key123/v1",
        "Qwen2.5-Coder-0.5B-Instruct",
        "key123",
        runtime.workdir,
    ]
    assert (await runtime.download("env.txt")).decode().split() == [
        "http://127.0.0.1:8300/s/key123/v1",
        "key123",
        "Qwen2.5-Coder-0.5B-Instruct",
    ]


async def test_session_env_includes_other_dialects_when_set(make_runtime):
    runtime = await make_runtime("local")
    adapter = get_harness(HarnessSpec(type="shell", command="true"))
    plain = await adapter.prepare(
        runtime,
        harness_context("http://127.0.0.1:8300/s/key123", instruction=NASTY, api_key="key123"),
    )
    assert "ANTHROPIC_BASE_URL" not in plain.env
    full = await adapter.prepare(
        runtime,
        harness_context(
            "http://127.0.0.1:8300/s/key123",
            instruction=NASTY,
            api_key="key123",
            anthropic_base_url="http://g/s/k",
            gemini_base_url="http://g/s/k",
        ),
    )
    assert full.env["ANTHROPIC_BASE_URL"] == "http://g/s/k"
    assert full.env["ANTHROPIC_API_KEY"] == "key123"
    assert full.env["GOOGLE_GEMINI_BASE_URL"] == "http://g/s/k"


def test_get_harness_refuses_unbuilt_types(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delitem(HARNESSES, "codex", raising=False)
    with pytest.raises(HarnessError, match="not built yet"):
        get_harness(HarnessSpec(type="codex"))
