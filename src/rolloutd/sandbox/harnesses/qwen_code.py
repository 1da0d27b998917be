"""The ``qwen_code`` harness: the Qwen Code CLI (npm ``@qwen-code/qwen-code``), one-shot.

Installed on the host with ``npm install --prefix $ROLLOUTD_NPM_PREFIX @qwen-code/qwen-code``
(bwrap binds the prefix read-only at the same path) and run with the runtime's ``node``::

    node {prefix}/node_modules/@qwen-code/qwen-code/cli.js --auth-type openai --model MODEL \
        --approval-mode yolo --max-session-turns N --output-format stream-json \
        --chat-recording false [spec.args] --prompt=INSTRUCTION

- the provider is the session: ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL``
  from the environment (the key never appears on a command line); ``--auth-type openai`` and
  ``security.auth.selectedType`` skip the interactive auth dialog;
- ``--approval-mode yolo`` runs tools without asking (there is nobody to ask);
- ``$HOME/.qwen/settings.json`` turns off telemetry, usage statistics, auto-update and update
  nags, IDE integration, checkpointing and folder-trust prompts, so nothing tries the internet,
  and the managed auto-memory subagent, which otherwise makes an extra model call (with a 23K
  character system prompt) after the task and adds a memory section to the system prompt;
- ``--output-format stream-json`` writes one JSON event per line on stdout (the run's log);
  :func:`summarize_output` reads it (the CLI exits 0 even when every model call failed);
- ``--prompt=INSTRUCTION`` (one argv element, so an instruction starting with ``-`` is not
  read as an option; a positional after ``--`` is ignored and the CLI waits for stdin).

Settings keys come from the settings schema bundled in ``cli.js`` (qwen-code 0.15).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rolloutd.errors import HarnessError
from rolloutd.sandbox.config import NPM_PREFIX_ENV, npm_prefix
from rolloutd.sandbox.harnesses.base import HarnessAdapter, HarnessCommand, HarnessContext
from rolloutd.sandbox.runtimes.base import Runtime

#: npm package and its entry point below ``{prefix}/node_modules``.
PACKAGE = "@qwen-code/qwen-code"
ENTRY_POINT = f"node_modules/{PACKAGE}/cli.js"


def qwen_cli(prefix: Path | None = None) -> Path:
    """Path of the Qwen Code CLI's entry point.

    Args:
        prefix: npm prefix; default :func:`~rolloutd.sandbox.config.npm_prefix`.

    Raises:
        HarnessError: the package is not installed there.
    """
    prefix = prefix or npm_prefix()
    cli = prefix / ENTRY_POINT
    if not cli.is_file():
        raise HarnessError(
            f"qwen_code harness: {cli} not found; install it with "
            f"`npm install --prefix {prefix} {PACKAGE}` or set {NPM_PREFIX_ENV}"
        )
    return cli


def installed_version(prefix: Path | None = None) -> str:
    """The version of the Qwen Code CLI installed under ``prefix`` (its ``package.json``).

    Raises:
        HarnessError: the package is not installed there, or its ``package.json`` is unreadable.
    """
    package_json = qwen_cli(prefix).parent / "package.json"
    try:
        return str(json.loads(package_json.read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError) as e:
        raise HarnessError(f"qwen_code harness: cannot read {package_json}: {e}") from e


#: tools whose schemas make up most of the first request and that a one-shot rollout does not
#: need (sub-agents, skills, web access, planning, asking the user): 15 tools are 8.2K tokens.
OPTIONAL_TOOLS = (
    "todo_write",
    "agent",
    "skill",
    "web_fetch",
    "monitor",
    "tool_search",
    "send_message",
    "task_stop",
    "ask_user_question",
    "exit_plan_mode",
    "glob",
    "grep_search",
)

#: a short system prompt for small-context models (the built-in one is about 6.3K tokens).
COMPACT_SYSTEM_PROMPT = (
    "You are a coding agent working in the folder {workdir}. Use the tools to change files "
    "and run shell commands; give files absolute paths inside {workdir}. When the task is "
    "done, reply with a one-line summary."
)


def compact_args(
    system_prompt: str = COMPACT_SYSTEM_PROMPT, workdir: str = "/workspace"
) -> list[str]:
    """CLI arguments that fit Qwen Code's first request in a small context window.

    Measured with qwen-code 0.15.10 and Qwen2.5's tokenizer, first request of a one-line task:
    built-in prompt and all 15 tools 14.5K tokens; 7 core tools 8.6K; these arguments (short
    system prompt; list_directory, read_file, write_file, edit, run_shell_command) about 3.2K.
    Put them in ``HarnessSpec.args`` for models served with a context under about 24K tokens.

    Args:
        system_prompt: replaces the built-in system prompt (``--system-prompt``);
            ``{workdir}`` in it is replaced by ``workdir`` (the compact profile skips the
            startup context that would tell the model where it works).
        workdir: the harness's working folder inside the runtime.

    Returns:
        list[str]: ``--exclude-tools ... --system-prompt=...``.
    """
    prompt = system_prompt.replace("{workdir}", workdir)
    return ["--exclude-tools", *OPTIONAL_TOOLS, f"--system-prompt={prompt}"]


def qwen_settings(model: str, max_turns: int) -> dict[str, object]:
    """The ``~/.qwen/settings.json`` of a rollout: offline, non-interactive, OpenAI auth.

    Args:
        model: the model name sent to the provider.
        max_turns: session turn limit.
    """
    return {
        "general": {
            "enableAutoUpdate": False,
            "disableAutoUpdate": True,
            "disableUpdateNag": True,
            "checkpointing": {"enabled": False},
            "chatRecording": False,
        },
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        # background memory/skill subagents make extra model calls after the task is done
        "memory": {
            "enableManagedAutoMemory": False,
            "enableManagedAutoDream": False,
            "enableAutoSkill": False,
        },
        "ide": {"enabled": False, "hasSeenNudge": True},
        "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}},
        "model": {"name": model, "maxSessionTurns": max_turns},
        "ui": {
            "hideTips": True,
            "hideBanner": True,
            "enableUserFeedback": False,
            "enableFollowupSuggestions": False,
        },
    }


class QwenCodeHarness(HarnessAdapter):
    """Runs Qwen Code one-shot against the session; see the module docstring."""

    type = "qwen_code"

    @classmethod
    def cli_version(cls) -> str | None:
        """The installed CLI's version (see :func:`installed_version`)."""
        return installed_version()

    async def prepare(self, runtime: Runtime, ctx: HarnessContext) -> HarnessCommand:
        """Write ``~/.qwen/settings.json`` and return the CLI command.

        Raises:
            HarnessError: the CLI is not installed.
        """
        cli = qwen_cli()
        settings = qwen_settings(ctx.model, self.spec.max_turns)
        if self.spec.profile == "compact":
            # the startup-context turn ("This is the Qwen Code ...", answered "Got it.") costs
            # a small model its task: it echoes "Got it." instead of calling a tool
            settings["model"]["skipStartupContext"] = True  # type: ignore[index]
        await runtime.upload(
            f"{runtime.home}/.qwen/settings.json", json.dumps(settings, indent=2).encode("utf-8")
        )
        await self.write_instruction(runtime, ctx)
        argv = [
            "node",
            str(cli),
            "--auth-type",
            "openai",
            "--model",
            ctx.model,
            "--approval-mode",
            "yolo",
            "--max-session-turns",
            str(self.spec.max_turns),
            "--output-format",
            "stream-json",
            "--chat-recording",
            "false",
            *(
                compact_args(workdir=ctx.workdir or runtime.workdir)
                if self.spec.profile == "compact"
                else []
            ),
            *self.spec.args,
            f"--prompt={ctx.instruction}",
        ]
        env = {
            # no relaunch with a bigger heap: one node process per run, simpler to account
            "QWEN_CODE_NO_RELAUNCH": "true",
            "NO_COLOR": "1",
            "CI": "true",
        } | self.session_env(runtime, ctx)
        return HarnessCommand(command=argv, env=env, cwd=ctx.workdir or runtime.workdir)

    def summarize(self, stdout: str) -> dict[str, Any] | None:
        """See :func:`summarize_output`."""
        return summarize_output(stdout)


def summarize_output(stdout: str) -> dict[str, Any]:
    """Summarise a run from its ``--output-format stream-json`` stdout.

    Qwen Code exits 0 and reports ``is_error: false`` even when every model call failed (the
    error text becomes the answer, e.g. ``[API Error: 400 request (17291 tokens) exceeds the
    available context size ...]``), so the exit code alone does not say the run worked.

    Args:
        stdout: the CLI's standard output, one JSON event per line.

    Returns:
        ``{"has_result": bool, "is_error": bool, "api_error": str | None, "num_turns": int,
        "input_tokens": int, "output_tokens": int, "result": str}`` (result cut to 1000
        characters); ``is_error`` is also true when the answer is an API error.
    """
    result: dict[str, Any] = {}
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("type") == "result":
            result = event
    text = str(result.get("result") or "")
    api_error = text.strip() if text.lstrip().startswith("[API Error") else None
    usage = result.get("usage") or {}
    return {
        "has_result": bool(result),
        "is_error": bool(result.get("is_error")) or api_error is not None or not result,
        "api_error": api_error[:1000] if api_error else None,
        "num_turns": int(result.get("num_turns") or 0),
        "input_tokens": int(usage.get("input_tokens") or 0),
        "output_tokens": int(usage.get("output_tokens") or 0),
        "result": text[:1000],
    }
