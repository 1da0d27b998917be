"""The ``opencode`` harness: opencode (npm ``opencode-ai``), one-shot, OpenAI Chat dialect.

``opencode-ai`` installs a self-contained executable (Bun-compiled, about 185 MB; no ``node``
needed) under the npm prefix (scripts/setup.sh; bwrap binds it read-only)::

    {prefix}/node_modules/opencode-ai/bin/opencode.exe run -m rolloutd/MODEL --format json \
        --title rollout --pure [spec.args] INSTRUCTION

- ``$HOME/.config/opencode/opencode.json`` (also named by ``OPENCODE_CONFIG``) declares one
  provider, ``rolloutd``: ``@ai-sdk/openai-compatible`` (bundled in the executable, nothing is
  installed) with ``baseURL`` the session's OpenAI URL and the key read from the environment
  (``{env:ROLLOUTD_SESSION_KEY}``: the key is in neither argv nor the file);
  ``enabled_providers`` keeps the others from loading;
- every permission is ``allow`` (nobody is there to answer a prompt) except ``question``;
  ``autoupdate``/``share`` off; no LSP servers or formatters (both download binaries);
- ``agent.build.steps`` is ``harness.max_turns``: opencode's own cap on agentic iterations,
  after which it forces a text-only response. It is not a hard stop: a fake server that
  answers every request with a tool call got 396 calls in 120 s with ``steps: 2``. Against
  the gateway it held: with ``steps: 3`` the third call was the forced turn ("MAXIMUM STEPS
  REACHED ... Respond with text only") and opencode exited 0. The run budget
  (``phases.run_s``) is the bound that always holds;
- ``profile: compact``: ``agent.build.prompt`` replaces the shipped system prompt and
  ``permission`` denies the tools a one-shot task does not need (sub-agents, to-do lists, web);
- no network at start: ``OPENCODE_DISABLE_MODELS_FETCH`` (the models.dev catalogue),
  ``OPENCODE_DISABLE_AUTOUPDATE``, ``OPENCODE_DISABLE_DEFAULT_PLUGINS`` and ``--pure`` (plugins
  are npm packages installed at start), ``OPENCODE_DISABLE_LSP_DOWNLOAD``;
- the provider's request, header and stream-chunk timeouts (300 s each by default) are off: on
  a loaded CPU a 2.7K-token first prompt took longer, opencode aborted the call and sent it
  again, and the session never got an answer; the run budget bounds the run instead;
- ``--title rollout`` names the session, so opencode makes no extra model call to title it;
- ``--format json`` prints one JSON event per line, read by :func:`summarize_output`.

opencode's ``task`` tool (kept by the default profile) runs sub-agents whose calls reach the
session concurrently with the parent's.
"""

from __future__ import annotations

import json
from typing import Any

from rolloutd.sandbox.harnesses.base import HarnessContext
from rolloutd.sandbox.harnesses.cli import CliHarness, CliRecipe
from rolloutd.sandbox.harnesses.installed import npm_cli
from rolloutd.sandbox.runtimes.base import Runtime

PACKAGE = "opencode-ai"
ENTRY = "bin/opencode.exe"
PROVIDER = "rolloutd"
CONFIG = ".config/opencode/opencode.json"

#: tools the compact profile removes (opencode permission names; ``deny`` drops the tool).
OPTIONAL_TOOLS = (
    "task",
    "todowrite",
    "todoread",
    "webfetch",
    "websearch",
    "codesearch",
    "skill",
    "question",
    "glob",
    "grep",
    "list",
    "lsp",
    "patch",
)

COMPACT_SYSTEM_PROMPT = (
    "You are a coding agent working in the folder {workdir}. Use the tools to create and change "
    "files and to run shell commands; give files absolute paths inside {workdir}. When the task "
    "is done, reply with a one-line summary."
)


def opencode_config(max_turns: int, compact: bool, workdir: str) -> dict[str, Any]:
    """The ``opencode.json`` of a rollout, with ``{openai_base_url}`` and ``{model}`` left as
    placeholders (:mod:`rolloutd.sandbox.harnesses.cli` fills them in, JSON-escaped).

    Args:
        max_turns: ``agent.build.steps``.
        compact: short system prompt, :data:`OPTIONAL_TOOLS` denied.
        workdir: the folder named by the compact prompt.
    """
    permission: dict[str, str] = {
        "*": "allow",
        "external_directory": "allow",
        "doom_loop": "allow",
        "question": "deny",
    }
    build: dict[str, Any] = {"steps": max_turns}
    if compact:
        permission |= {tool: "deny" for tool in OPTIONAL_TOOLS}
        build["prompt"] = COMPACT_SYSTEM_PROMPT.replace("{workdir}", workdir)
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "enabled_providers": [PROVIDER],
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": PROVIDER,
                "options": {
                    "baseURL": "{openai_base_url}",
                    "apiKey": "{env:ROLLOUTD_SESSION_KEY}",
                    # see the module docstring: the run budget bounds a call instead
                    "timeout": False,
                    "headerTimeout": False,
                    "chunkTimeout": False,
                },
                "models": {"{model}": {"name": "{model}", "tool_call": True}},
            }
        },
        "model": f"{PROVIDER}/{{model}}",
        "small_model": f"{PROVIDER}/{{model}}",
        "permission": permission,
        "agent": {"build": build},
        "lsp": False,
        "formatter": False,
    }


class OpencodeHarness(CliHarness):
    """Runs ``opencode run`` against the session's OpenAI Chat URL; see the module docstring."""

    type = "opencode"

    npm_package = PACKAGE

    async def recipe(self, runtime: Runtime, ctx: HarnessContext) -> CliRecipe:
        """Config file, environment and argv of a one-shot opencode run.

        Raises:
            HarnessError: the CLI is not installed on this host.
        """
        cli = npm_cli(self.type, PACKAGE, ENTRY)
        config = opencode_config(
            self.spec.max_turns, self.spec.profile == "compact", ctx.workdir or runtime.workdir
        )
        env = {
            "ROLLOUTD_SESSION_KEY": "{api_key}",
            "OPENCODE_CONFIG": f"{runtime.home}/{CONFIG}",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            # it would read ~/.claude prompts and skills of whoever built the image
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "NO_COLOR": "1",
            "CI": "true",
        }
        return CliRecipe(
            command=[
                str(cli),
                "run",
                "-m",
                f"{PROVIDER}/{{model}}",
                "--format",
                "json",
                "--title",
                "rollout",
                "--pure",
                "{instruction}",
            ],
            dialect="chat",
            env=env,
            files={CONFIG: json.dumps(config, indent=2)},
        )

    def summarize(self, stdout: str) -> dict[str, Any] | None:
        """See :func:`summarize_output`."""
        return summarize_output(stdout)


def summarize_output(stdout: str) -> dict[str, Any]:
    """Summarise a run from its ``--format json`` stdout (one event per line).

    Args:
        stdout: the CLI's standard output.

    Returns:
        ``{"num_steps": int, "num_tool_calls": int, "tool_errors": int, "is_error": bool,
        "error": str | None, "input_tokens": int, "output_tokens": int, "result": str}``:
        steps are model calls (``step_finish`` events), ``error`` is the last ``error``
        event's message (cut to 1000 characters), ``result`` the last text part.
    """
    steps = tool_calls = tool_errors = input_tokens = output_tokens = 0
    error: str | None = None
    text = ""
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        kind, part = event.get("type"), event.get("part") or {}
        if kind == "step_finish":
            steps += 1
            tokens = part.get("tokens") or {}
            input_tokens += int(tokens.get("input") or 0)
            output_tokens += int(tokens.get("output") or 0)
        elif kind == "tool_use":
            tool_calls += 1
            tool_errors += (part.get("state") or {}).get("status") == "error"
        elif kind == "text":
            text = str(part.get("text") or "")
        elif kind == "error":
            err = event.get("error") or {}
            error = str((err.get("data") or {}).get("message") or err.get("name") or err)
    return {
        "num_steps": steps,
        "num_tool_calls": tool_calls,
        "tool_errors": tool_errors,
        "is_error": error is not None or steps == 0,
        "error": error[:1000] if error else None,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "result": text[:1000],
    }
