"""The ``claude_code`` harness: Anthropic's Claude Code (npm ``@anthropic-ai/claude-code``),
print mode, Anthropic Messages API.

Installed on the host with ``npm install --prefix $ROLLOUTD_NPM_PREFIX
@anthropic-ai/claude-code``: since 2.1 the package's ``bin/claude.exe`` is a native
executable (the platform package's, copied by its postinstall), bound read-only into bwrap::

    {prefix}/node_modules/@anthropic-ai/claude-code/bin/claude.exe -p \
        --output-format stream-json --verbose --model MODEL --max-turns N \
        --permission-mode bypassPermissions --no-session-persistence \
        [compact options] [spec.args] < $HOME/.rolloutd/instruction.md

- the provider is the session: ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` in the
  environment (never on argv; an API key in print mode needs no login or approval); the
  small/fast model that background calls use is the session's model too;
- ``--permission-mode bypassPermissions`` runs every tool without asking; Claude Code refuses
  it as root unless ``IS_SANDBOX=1`` says the process is already sandboxed (it is);
- ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`` (and ``DISABLE_TELEMETRY``,
  ``DISABLE_AUTOUPDATER``, ``DISABLE_ERROR_REPORTING``, ``DISABLE_BUG_COMMAND``): no telemetry,
  update or feedback traffic, and no background model calls (the session-title call would be
  one more completion that is not the agent's work);
- ``--max-turns`` is ``spec.max_turns``; the instruction comes on stdin (no argv size limit);
- ``--output-format stream-json --verbose``: one JSON event per line, ending with a ``result``
  event that :func:`summarize_output` reads.

``profile: compact``, as the hand-configured CLI tests trim it: the shipped prompt describes
every tool, agent and skill (about 18K tokens, more than a 16K-token slot); compact replaces
the system prompt (``--system-prompt``), keeps the core tools (``--tools Bash,Read,Write,Edit``:
no Task tool, so no agent list), loads no MCP servers (``--strict-mcp-config``), no settings
files (``--setting-sources ""``) and no skills or slash commands
(``--disable-slash-commands``). Options and variables are those of Claude Code 2.1
(``claude --help``, docs.anthropic.com/en/docs/claude-code/settings).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from rolloutd.sandbox.harnesses.base import HarnessContext
from rolloutd.sandbox.harnesses.cli import CliHarness, CliRecipe
from rolloutd.sandbox.harnesses.installed import npm_cli
from rolloutd.sandbox.runtimes.base import Runtime

#: npm package and its entry point below the package folder.
PACKAGE = "@anthropic-ai/claude-code"
ENTRY = "bin/claude.exe"

#: the tools the compact profile keeps.
COMPACT_TOOLS = "Bash,Read,Write,Edit"

#: the compact profile's system prompt (``{workdir}`` is filled in).
COMPACT_SYSTEM_PROMPT = (
    "You are a coding agent working in the folder {workdir}. Use the tools to create and "
    "change files and to run shell commands; give files absolute paths inside {workdir}. "
    "When the task is done, reply with a one-line summary."
)

#: environment that keeps Claude Code offline except for the session's provider.
QUIET_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_COST_WARNINGS": "1",
    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1",
    "IS_SANDBOX": "1",
    "NO_COLOR": "1",
}

#: ``~/.claude/settings.json``: the same switches for a CLI that reads settings files.
SETTINGS = {
    "permissions": {"defaultMode": "bypassPermissions"},
    "autoUpdates": False,
    "includeCoAuthoredBy": False,
    "env": QUIET_ENV,
}


class ClaudeCodeHarness(CliHarness):
    """Runs ``claude -p`` against the session's Anthropic URL; see the module docstring."""

    type = "claude_code"

    npm_package = PACKAGE

    async def recipe(self, runtime: Runtime, ctx: HarnessContext) -> CliRecipe:
        """The Claude Code recipe: print mode, quiet environment, the instruction on stdin.

        Raises:
            HarnessError: the CLI is not installed on this host.
        """
        cli = npm_cli(self.type, PACKAGE, ENTRY)
        parts = [
            shlex.quote(str(cli)),
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            "{model}",
            "--max-turns",
            "{max_turns}",
            "--permission-mode",
            "bypassPermissions",
            "--no-session-persistence",
        ]
        if self.spec.profile == "compact":
            prompt = COMPACT_SYSTEM_PROMPT.replace("{workdir}", ctx.workdir or runtime.workdir)
            parts += [
                "--system-prompt",
                shlex.quote(prompt),
                "--tools",
                COMPACT_TOOLS,
                "--strict-mcp-config",
                "--setting-sources",
                "''",
                "--disable-slash-commands",
            ]
        command = "exec " + " ".join(parts) + " < {instruction_file}"
        env = QUIET_ENV | {
            "ANTHROPIC_SMALL_FAST_MODEL": "{model}",
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": "{model}",
            "ANTHROPIC_DEFAULT_SONNET_MODEL": "{model}",
            "ANTHROPIC_DEFAULT_OPUS_MODEL": "{model}",
        }
        return CliRecipe(
            command=command,
            dialect="anthropic",
            env=env,
            files={".claude/settings.json": json.dumps(SETTINGS, indent=2)},
        )

    def summarize(self, stdout: str) -> dict[str, Any] | None:
        """See :func:`summarize_output`."""
        return summarize_output(stdout)


def summarize_output(stdout: str) -> dict[str, Any]:
    """Summarise a ``claude -p --output-format stream-json`` (or ``json``) run from its stdout.

    The last ``{"type": "result"}`` event carries ``subtype`` (``success``,
    ``error_max_turns``, ``error_during_execution``), ``is_error``, ``num_turns``,
    ``api_error_status`` and ``usage``; a provider error surfaces as ``is_error`` with the
    error text as ``result``.

    Args:
        stdout: the CLI's standard output, one JSON event per line.

    Returns:
        ``{"has_result": bool, "is_error": bool, "subtype": str | None, "num_turns": int,
        "num_tool_uses": int, "api_error_status": int | str | None, "input_tokens": int,
        "output_tokens": int, "result": str}`` (result cut to 1000 characters).
    """
    result: dict[str, Any] = {}
    num_tool_uses = 0
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("type") == "result":
            result = event
        elif event.get("type") == "assistant":
            content = (event.get("message") or {}).get("content") or []
            num_tool_uses += sum(
                1
                for block in content
                if isinstance(block, dict) and block.get("type") == "tool_use"
            )
    usage = result.get("usage") or {}
    return {
        "has_result": bool(result),
        "is_error": bool(result.get("is_error")) or not result,
        "subtype": result.get("subtype"),
        "num_turns": int(result.get("num_turns") or 0),
        "num_tool_uses": num_tool_uses,
        "api_error_status": result.get("api_error_status"),
        "input_tokens": int(usage.get("input_tokens") or 0),
        "output_tokens": int(usage.get("output_tokens") or 0),
        "result": str(result.get("result") or "")[:1000],
    }
