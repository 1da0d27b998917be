"""The declarative ``cli`` harness through the workflow: a CLI no adapter knows (the `openai`
SDK's own command line, from aider's tool environment), defined only in the task's JSON, under
bwrap with gateway-only network, against llama-server, scored."""

from __future__ import annotations

import pytest

from rolloutd.sandbox.config import tools_dir
from tests.conftest import have_bwrap
from tests.support.harness_run import run_task

OPENAI_CLI = tools_dir() / "aider-chat" / "bin" / "openai"

#: the whole harness: a script written by `files`, run with the session's placeholders
ASK = """#!/bin/sh
# answer.txt holds the model's reply; the CLI reads OPENAI_BASE_URL and OPENAI_API_KEY
exec "$1" api chat.completions.create -m "$2" -M 16 -t 0 -g user "$(cat "$3")" > answer.txt
"""


@pytest.mark.temporal
@pytest.mark.engine
@pytest.mark.sandbox
@pytest.mark.harness
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed")
@pytest.mark.skipif(
    not OPENAI_CLI.exists(), reason="the openai CLI comes with aider's tool environment (setup.sh)"
)
async def test_a_cli_harness_defined_only_in_json_runs_and_is_scored(fleets):
    """A ``cli`` harness written only in the task (a script calling the openai SDK's CLI with
    the session's placeholders) runs in bwrap: it exits 0, its one completion carries the
    instruction and max_tokens 16, and the check scores it 1.0. About 30 s here, plus 65 s
    starting the fleets (load 13-24)."""
    run = await run_task(
        fleets,
        {
            "instruction": "Reply with one word: hello",
            "num_samples": 1,
            "harness": {
                "type": "cli",
                "dialect": "chat",
                "command": [
                    "/bin/sh",
                    "{home}/ask.sh",
                    str(OPENAI_CLI),
                    "{model}",
                    "{instruction_file}",
                ],
                "files": {"ask.sh": ASK},
            },
            "runtime": {"type": "bwrap", "network": "gateway"},
            "evaluator": {
                "type": "test_on_output",
                "command": "test -s answer.txt && echo ok",
                "expected_output": "ok",
            },
            "sampling": {"temperature": 0.0, "max_tokens": 16, "seed": 7},
            "phases": {"run_s": 300},
        },
    )
    (session,) = run.sessions
    assert session.harness["exit_code"] == 0, session.harness
    assert session.result.failure is None, session.result.failure
    assert session.result.reward == 1.0
    (completion,) = session.completions
    assert completion.messages[-1]["content"] == "Reply with one word: hello"
    assert completion.request.get("max_tokens") == 16
