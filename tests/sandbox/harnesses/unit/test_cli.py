"""The declarative ``cli`` harness: a CLI no adapter knows, configured from the task's JSON."""

from __future__ import annotations

import json
import sys

import pytest
from pydantic import ValidationError

from rolloutd.sandbox.harnesses import CliHarness, get_harness
from rolloutd.sandbox.harnesses.cli import render
from rolloutd.types import HarnessSpec
from tests.support.contexts import ALL_DIALECTS, harness_context

NASTY = 'It\'s "quoted" $HOME `id` ; echo {model} \\ \n second line'


def test_render_quotes_per_place_and_leaves_other_braces():
    values = {"instruction": "a \"b\" 'c'", "model": "m"}
    assert (
        render('{"k": "{instruction}", "o": {}}', values, "json")
        == '{"k": "a \\"b\\" \'c\'", "o": {}}'
    )
    assert (
        render("x {instruction} ${HOME} {unknown}", values, "shell")
        == "x 'a \"b\" '\"'\"'c'\"'\"'' ${HOME} {unknown}"
    )
    # one pass: a value holding a placeholder is not substituted again
    assert render("{instruction}", {"instruction": "{model}", "model": "m"}) == "{model}"


def test_cli_spec_needs_a_command():
    with pytest.raises(ValidationError, match="harness.command is required"):
        HarnessSpec(type="cli")
    with pytest.raises(ValidationError, match="one shell string"):
        HarnessSpec(type="shell", command=["echo", "x"])


async def test_cli_harness_from_json_writes_files_and_runs_argv(make_runtime):
    """A task's JSON alone defines the harness: files (JSON-escaped), argv, env, dialect."""
    runtime = await make_runtime("local")
    agent = (
        "import json, os, pathlib, sys\n"
        "cfg = json.loads(pathlib.Path(os.environ['HOME'], '.agent/config.json').read_text())\n"
        "out = {'argv': sys.argv[1:], 'cfg': cfg, 'env': os.environ['AGENT_URL'],\n"
        "       'key': os.environ['ANTHROPIC_API_KEY'],\n"
        "       'instruction': pathlib.Path(cfg['task_file']).read_text()}\n"
        "pathlib.Path('out.json').write_text(json.dumps(out))\n"
    )
    spec = HarnessSpec.model_validate(
        {
            "type": "cli",
            "dialect": "anthropic",
            "max_turns": 3,
            "command": [
                sys.executable,
                "{home}/.agent/agent.py",
                "--url",
                "{base_url}",
                "--model={model}",
                "--turns",
                "{max_turns}",
            ],
            "files": {
                ".agent/agent.py": agent,
                ".agent/config.json": '{"prompt": "{instruction}", '
                '"task_file": "{instruction_file}"}',
            },
            "env": {"AGENT_URL": "{openai_base_url}"},
            "args": ["--extra"],
        }
    )
    adapter = get_harness(spec)
    assert isinstance(adapter, CliHarness)
    command = await adapter.prepare(
        runtime,
        harness_context(
            "http://g/s/key123", instruction=NASTY, api_key="key123", dialects=ALL_DIALECTS
        ),
    )
    process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
    assert await process.wait(30) == 0, process.stderr_path.read_text()
    out = json.loads(await runtime.download("out.json"))
    assert out["argv"] == [
        "--url",
        "http://g/s/key123",
        "--model=Qwen2.5-Coder-0.5B-Instruct",
        "--turns",
        "3",
        "--extra",
    ]
    assert out["cfg"]["prompt"] == NASTY
    assert out["instruction"] == NASTY
    assert out["env"] == "http://g/s/key123/v1"
    assert out["key"] == "key123"


async def test_cli_harness_shell_string_quotes_values(make_runtime):
    runtime = await make_runtime("local")
    adapter = get_harness(
        HarnessSpec(type="cli", command="printf '%s' {instruction} > i.txt", env={"X": "{model}"})
    )
    command = await adapter.prepare(
        runtime,
        harness_context(
            "http://g/s/key123", instruction=NASTY, api_key="key123", dialects=ALL_DIALECTS
        ),
    )
    assert command.env["X"] == "Qwen2.5-Coder-0.5B-Instruct"
    process = await runtime.spawn(command.command, env=command.env, cwd=command.cwd)
    assert await process.wait(30) == 0, process.stderr_path.read_text()
    assert (await runtime.download("i.txt")).decode() == NASTY
