"""The ``gemini_cli`` harness: Gemini CLI (npm ``@google/gemini-cli``), one-shot, Gemini dialect.

Installed on the host under the npm prefix (scripts/setup.sh; bwrap binds it read-only) and
run with the runtime's ``node`` (Gemini CLI 0.61 needs Node >= 20)::

    node {prefix}/node_modules/@google/gemini-cli/bundle/gemini.js -m MODEL --yolo \
        --skip-trust --output-format json [spec.args] --prompt=INSTRUCTION

- the provider is the session: ``GOOGLE_GEMINI_BASE_URL`` (the session root; the CLI's
  ``@google/genai`` client appends ``/v1beta/models/...``) and ``GEMINI_API_KEY`` from the
  environment, never argv; ``security.auth.selectedType: gemini-api-key`` skips the auth dialog;
- ``--yolo`` approves every tool call; ``--skip-trust`` and ``GEMINI_CLI_TRUST_WORKSPACE`` skip
  the folder-trust prompt (a headless run in an untrusted folder refuses tools);
- ``$HOME/.gemini/settings.json``: telemetry, usage statistics, auto-update and update nags
  off; ``model.maxSessionTurns`` is ``harness.max_turns`` (the CLI stops with an error after it);
- ``profile: compact``: ``GEMINI_SYSTEM_MD`` names a file holding a short system prompt (the
  shipped one plus every tool's schema is about 10K tokens) and settings ``tools.core`` keeps
  the few file and shell tools a one-shot task needs;
- ``--output-format json``: one JSON object on stdout, ``{"response", "stats", "error"?}``,
  read by :func:`summarize_output`;
- the CLI installs an undici dispatcher whose ``headersTimeout`` is 60 s (only Google's
  server-side experiment flags raise it): a call whose first byte takes longer (prompt
  processing of a 2.4K-token first request on a loaded CPU does) fails with ``fetch failed``
  and is retried from scratch, forever. ``NODE_OPTIONS=--require`` loads :data:`FETCH_PRELOAD`,
  which gives ``fetch`` an agent of the same class with no header or body timeout; the run
  budget (``phases.run_s``) bounds the run instead.

Settings keys come from the settings schema bundled in the CLI (gemini-cli 0.61).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rolloutd.sandbox.harnesses.base import HarnessContext
from rolloutd.sandbox.harnesses.cli import CliHarness, CliRecipe
from rolloutd.sandbox.harnesses.installed import npm_cli
from rolloutd.sandbox.runtimes.base import Runtime

PACKAGE = "@google/gemini-cli"
ENTRY = "bundle/gemini.js"

#: the compact profile's tools (Gemini CLI's own tool names).
CORE_TOOLS = ("list_directory", "read_file", "write_file", "replace", "run_shell_command")

#: the compact profile's system prompt (``GEMINI_SYSTEM_MD`` replaces the shipped one whole).
COMPACT_SYSTEM_PROMPT = (
    "You are a coding agent working in the folder {workdir}. Use the tools to create and change "
    "files and to run shell commands; give files absolute paths inside {workdir}. When the task "
    "is done, reply with a one-line summary."
)

#: where the compact system prompt is written, under the runtime's HOME.
SYSTEM_MD = ".gemini/system.md"

#: where :data:`FETCH_PRELOAD` is written, under the runtime's HOME.
FETCH_PRELOAD_FILE = ".rolloutd/fetch-timeout.cjs"

#: preloaded into node: every ``fetch`` without a dispatcher of its own gets one built from the
#: current global dispatcher's class (undici's Agent, as the CLI installs it) with
#: ``headersTimeout``/``bodyTimeout`` from ``ROLLOUTD_FETCH_TIMEOUT_MS`` (0: none).
FETCH_PRELOAD = """\
'use strict';
const GLOBAL_DISPATCHER = Symbol.for('undici.globalDispatcher.1');
const timeoutMs = Number(process.env.ROLLOUTD_FETCH_TIMEOUT_MS || 0);
const originalFetch = globalThis.fetch;
let base;
let agent;
globalThis.fetch = function fetch(input, init) {
  const current = globalThis[GLOBAL_DISPATCHER];
  if (current && current !== base) {
    base = current;
    agent = new current.constructor({ headersTimeout: timeoutMs, bodyTimeout: timeoutMs });
  }
  if (!agent || (init && init.dispatcher)) return originalFetch(input, init);
  return originalFetch(input, { ...init, dispatcher: agent });
};
"""


def gemini_settings(max_turns: int, compact: bool) -> dict[str, Any]:
    """The ``~/.gemini/settings.json`` of a rollout: offline, non-interactive, API-key auth.

    Args:
        max_turns: ``model.maxSessionTurns``, the CLI's own turn limit.
        compact: keep only :data:`CORE_TOOLS` (``tools.core``).
    """
    settings: dict[str, Any] = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {
            "disableAutoUpdate": True,
            "disableUpdateNag": True,
            "enableAutoUpdate": False,
            "checkpointing": {"enabled": False},
        },
        "ide": {"enabled": False, "hasSeenNudge": True},
        "ui": {"hideTips": True, "hideBanner": True},
        "model": {"maxSessionTurns": max_turns},
    }
    if compact:
        settings["tools"] = {"core": list(CORE_TOOLS)}
    return settings


class GeminiCliHarness(CliHarness):
    """Runs Gemini CLI one-shot against the session's Gemini URL; see the module docstring."""

    type = "gemini_cli"

    npm_package = PACKAGE

    async def recipe(self, runtime: Runtime, ctx: HarnessContext) -> CliRecipe:
        """Settings file, environment and argv of a one-shot Gemini CLI run.

        Raises:
            HarnessError: the CLI is not installed on this host.
        """
        cli = npm_cli(self.type, PACKAGE, ENTRY)
        compact = self.spec.profile == "compact"
        env = {
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "NO_COLOR": "1",
            "CI": "true",
            # no relaunch with a bigger heap: one node process per run
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "NODE_OPTIONS": f"--require={runtime.home}/{FETCH_PRELOAD_FILE}",
            "ROLLOUTD_FETCH_TIMEOUT_MS": "0",
        }
        files = {
            ".gemini/settings.json": json.dumps(
                gemini_settings(self.spec.max_turns, compact), indent=2
            ),
            FETCH_PRELOAD_FILE: FETCH_PRELOAD,
        }
        if compact:
            # a file, not a template: the prompt's own braces stay as written
            files[SYSTEM_MD] = COMPACT_SYSTEM_PROMPT.replace(
                "{workdir}", ctx.workdir or runtime.workdir
            )
            env["GEMINI_SYSTEM_MD"] = f"{runtime.home}/{SYSTEM_MD}"
        return CliRecipe(
            command=[
                "node",
                str(cli),
                "-m",
                "{model}",
                "--yolo",
                "--skip-trust",
                "--output-format",
                "json",
                # one argv element: an instruction starting with "-" is not an option
                # (yargs reads spec.args, appended after it, as options all the same)
                "--prompt={instruction}",
            ],
            dialect="gemini",
            env=env,
            files=files,
        )

    def summarize(self, stdout: str) -> dict[str, Any] | None:
        """See :func:`summarize_output`."""
        return summarize_output(stdout)


def summarize_output(stdout: str) -> dict[str, Any]:
    """Summarise a run from its ``--output-format json`` stdout.

    Args:
        stdout: the CLI's standard output: warnings, then one JSON object.

    Returns:
        ``{"has_result": bool, "is_error": bool, "error": str | None, "num_requests": int,
        "num_tool_calls": int, "input_tokens": int, "output_tokens": int, "result": str}``
        (texts cut to 1000 characters); ``num_requests`` and tokens add up every model in
        ``stats.models``. A fatal error (exit 53 when ``model.maxSessionTurns`` is reached)
        goes to stderr, not stdout: then ``has_result`` is False and ``error`` says so.
    """
    result: dict[str, Any] = {}
    for match in re.finditer(r"^\{", stdout, re.MULTILINE):
        try:
            candidate, _ = json.JSONDecoder().raw_decode(stdout, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(candidate, dict) and ("response" in candidate or "error" in candidate):
            result = candidate
    error = result.get("error")
    if isinstance(error, dict):
        error = error.get("message") or json.dumps(error)
    if not result:
        # a fatal error (exit 53: maxSessionTurns reached) is printed as JSON on stderr, which
        # the harness artifact keeps; stdout then holds nothing
        error = "no JSON result on stdout; a fatal error is printed as JSON on stderr"
    stats = result.get("stats") or {}
    models = (stats.get("models") or {}).values()
    tokens = [m.get("tokens") or {} for m in models]
    return {
        "has_result": bool(result),
        "is_error": not result or error is not None,
        "error": str(error)[:1000] if error is not None else None,
        "num_requests": sum(int((m.get("api") or {}).get("totalRequests") or 0) for m in models),
        "num_tool_calls": int((stats.get("tools") or {}).get("totalCalls") or 0),
        "input_tokens": sum(int(t.get("prompt") or 0) for t in tokens),
        "output_tokens": sum(int(t.get("candidates") or 0) for t in tokens),
        "result": str(result.get("response") or "")[:1000],
    }
