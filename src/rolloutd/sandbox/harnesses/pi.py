"""The ``pi`` harness: pi (npm ``@mariozechner/pi-coding-agent``), print mode, three dialects.

Installed on the host under the npm prefix (scripts/setup.sh; bwrap binds it read-only) and
run with the runtime's ``node`` (pi 0.73 needs Node >= 20)::

    node {prefix}/node_modules/@mariozechner/pi-coding-agent/dist/cli.js -p --mode json \
        --no-session --offline --no-context-files --no-extensions --no-skills \
        --no-prompt-templates -e ~/.rolloutd/pi-max-turns.js --provider rolloutd \
        --model MODEL [spec.args] INSTRUCTION

- ``harness.dialect`` picks the wire API of pi's custom provider in
  ``$HOME/.pi/agent/models.json``: ``chat`` -> ``openai-completions``, ``responses`` ->
  ``openai-responses`` (both at the session's OpenAI URL), ``anthropic`` ->
  ``anthropic-messages`` (the session root); default ``chat``. ``apiKey`` names the variable
  ``ROLLOUTD_SESSION_KEY``, so the key is in neither argv nor the file;
- pi asks no permission for its tools (read, bash, edit, write) in print mode;
- ``--offline`` / ``PI_OFFLINE``, ``PI_SKIP_VERSION_CHECK`` and ``PI_TELEMETRY=0`` keep it off
  the network; ``--no-session`` writes no session file;
- pi has no turn limit of its own (the agent loop runs until the model stops calling tools;
  a 0.5B model repeats its tool call until the run budget ends it, with a model call in
  flight, which the session counts against the backend and replaces). The adapter adds one:
  :data:`MAX_TURNS_EXTENSION`, loaded with ``-e`` (explicit paths load despite
  ``--no-extensions``), aborts the agent after ``harness.max_turns`` turns (a turn is one
  model answer and its tool calls); the last assistant message then has stop reason
  ``aborted`` and pi exits 0;
- ``profile: compact``: ``--system-prompt`` replaces pi's (already short) prompt with a
  shorter one and ``--tools read,bash,write`` drops ``edit``;
- an instruction that pi's parser would take for an option (``-...``) or a file (``@...``) is
  passed as ``@instruction_file`` instead (pi inlines the file into the message);
- ``--mode json`` prints one JSON event per line, read by :func:`summarize_output` (pi exits 0
  in that mode even when the model call failed).
"""

from __future__ import annotations

import json
from typing import Any

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses.base import HarnessContext
from rolloutd.sandbox.harnesses.cli import CliHarness, CliRecipe, Dialect
from rolloutd.sandbox.harnesses.installed import npm_cli
from rolloutd.sandbox.runtimes.base import Runtime

PACKAGE = "@mariozechner/pi-coding-agent"
ENTRY = "dist/cli.js"
PROVIDER = "rolloutd"

#: harness.dialect -> pi's ``api`` name of the provider.
PI_APIS: dict[str, str] = {
    "chat": "openai-completions",
    "responses": "openai-responses",
    "anthropic": "anthropic-messages",
}

COMPACT_SYSTEM_PROMPT = (
    "You are a coding agent working in the folder {workdir}. Use the tools to create and change "
    "files and to run shell commands. When the task is done, reply with a one-line summary."
)
COMPACT_TOOLS = "read,bash,write"

#: where :data:`MAX_TURNS_EXTENSION` is written, under the runtime's HOME.
MAX_TURNS_FILE = ".rolloutd/pi-max-turns.js"

#: a pi extension (docs/extensions.md of the package: ``turn_end``, ``ctx.abort()``) that ends
#: the agent loop after ``ROLLOUTD_MAX_TURNS`` turns.
MAX_TURNS_EXTENSION = """\
export default function (pi) {
  const maxTurns = Number(process.env.ROLLOUTD_MAX_TURNS || 0);
  pi.on("turn_end", async (event, ctx) => {
    if (maxTurns > 0 && event.turnIndex + 1 >= maxTurns) ctx.abort();
  });
}
"""


def pi_models(api: str, context_window: int = 32768, max_tokens: int = 4096) -> dict[str, Any]:
    """The ``~/.pi/agent/models.json`` of a rollout, ``{base_url}`` and ``{model}`` left as
    placeholders (:mod:`rolloutd.sandbox.harnesses.cli` fills them in, JSON-escaped).

    Args:
        api: pi's wire API (a value of :data:`PI_APIS`).
        context_window: tokens; pi compacts the conversation near it.
        max_tokens: tokens per call pi asks for (the task's sampling policy decides).
    """
    return {
        "providers": {
            PROVIDER: {
                "baseUrl": "{base_url}",
                "api": api,
                "apiKey": "ROLLOUTD_SESSION_KEY",
                "models": [
                    {
                        "id": "{model}",
                        "name": "{model}",
                        "contextWindow": context_window,
                        "maxTokens": max_tokens,
                        "reasoning": False,
                        "input": ["text"],
                        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
                    }
                ],
            }
        }
    }


class PiHarness(CliHarness):
    """Runs pi in print mode against the session; see the module docstring."""

    type = "pi"

    npm_package = PACKAGE

    async def recipe(self, runtime: Runtime, ctx: HarnessContext) -> CliRecipe:
        """Models file, environment and argv of a pi print-mode run.

        Raises:
            HarnessError: the CLI is not installed on this host, or ``harness.dialect`` is one
                pi does not speak (``gemini``).
        """
        cli = npm_cli(self.type, PACKAGE, ENTRY)
        dialect: Dialect = self.spec.dialect or "chat"
        if dialect not in PI_APIS:
            raise HarnessError(
                f"pi harness: harness.dialect={dialect!r} is not one of {', '.join(PI_APIS)}"
            )
        argv = [
            "node",
            str(cli),
            "-p",
            "--mode",
            "json",
            "--no-session",
            "--offline",
            "--no-context-files",
            "--no-extensions",
            "--no-skills",
            "--no-prompt-templates",
            "-e",
            f"{runtime.home}/{MAX_TURNS_FILE}",
            "--provider",
            PROVIDER,
            "--model",
            "{model}",
        ]
        if self.spec.profile == "compact":
            argv += [
                "--system-prompt",
                COMPACT_SYSTEM_PROMPT.replace("{workdir}", ctx.workdir or runtime.workdir),
                "--tools",
                COMPACT_TOOLS,
            ]
        message = (
            "@{instruction_file}" if ctx.instruction.startswith(("-", "@")) else "{instruction}"
        )
        env = {
            "ROLLOUTD_SESSION_KEY": "{api_key}",
            "PI_OFFLINE": "1",
            "PI_SKIP_VERSION_CHECK": "1",
            "PI_TELEMETRY": "0",
            "NO_COLOR": "1",
            "ROLLOUTD_MAX_TURNS": str(self.spec.max_turns),
        }
        files = {
            ".pi/agent/models.json": json.dumps(pi_models(PI_APIS[dialect]), indent=2),
            ".pi/agent/settings.json": json.dumps(
                {"quietStartup": True, "enableInstallTelemetry": False}, indent=2
            ),
            MAX_TURNS_FILE: MAX_TURNS_EXTENSION,
        }
        return CliRecipe(command=[*argv, message], dialect=dialect, env=env, files=files)

    def summarize(self, stdout: str) -> dict[str, Any] | None:
        """See :func:`summarize_output`."""
        return summarize_output(stdout)


def summarize_output(stdout: str) -> dict[str, Any]:
    """Summarise a run from its ``--mode json`` stdout (one agent event per line).

    Args:
        stdout: the CLI's standard output.

    Returns:
        ``{"num_turns": int, "num_tool_calls": int, "tool_errors": int, "is_error": bool,
        "error": str | None, "stop_reason": str | None, "input_tokens": int,
        "output_tokens": int, "result": str}``: turns are assistant messages (the turn-limit
        extension's abort adds one with stop reason ``aborted`` and no model call), the error
        is the last assistant message's ``errorMessage`` when its stop reason is ``error``.
    """
    turns = tool_calls = tool_errors = input_tokens = output_tokens = 0
    last: dict[str, Any] = {}
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("type") == "message_end":
            message = event.get("message") or {}
            if message.get("role") == "assistant":
                turns += 1
                last = message
                usage = message.get("usage") or {}
                input_tokens += int(usage.get("input") or 0)
                output_tokens += int(usage.get("output") or 0)
        elif event.get("type") == "tool_execution_end":
            tool_calls += 1
            tool_errors += bool(event.get("isError"))
    stop_reason = last.get("stopReason")
    failed = stop_reason == "error"
    error = str(last.get("errorMessage") or "request failed") if failed else None
    text = "".join(
        str(c.get("text") or "")
        for c in last.get("content") or []
        if isinstance(c, dict) and c.get("type") == "text"
    )
    return {
        "num_turns": turns,
        "num_tool_calls": tool_calls,
        "tool_errors": tool_errors,
        "is_error": failed or turns == 0,
        "error": error[:1000] if error else None,
        "stop_reason": stop_reason,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "result": text[:1000],
    }
