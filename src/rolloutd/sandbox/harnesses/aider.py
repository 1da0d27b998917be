"""The ``aider`` harness: Aider (PyPI ``aider-chat``), one message, then exit.

Installed on the host in its own environment under the tools folder (scripts/setup.sh:
``uv tool install aider-chat``; bwrap binds it read-only) and run as::

    {tools}/bin/aider --config ~/.aider.conf.yml [spec.args]
        --message-file ~/.rolloutd/instruction.md

- ``~/.aider.conf.yml`` (aider's own config file; JSON, which is YAML; keys are the long option
  names) holds everything else: ``model: openai/{model}`` (litellm's OpenAI-compatible provider;
  the base URL and key come from ``OPENAI_API_BASE`` and ``OPENAI_API_KEY`` in the environment,
  never from argv or a file), ``yes-always`` (every question answered yes: there is nobody to
  ask), ``git: false`` (the workspace need not be a repository, and a rollout commits nothing),
  ``check-update``, ``show-release-notes``, ``analytics`` off (``analytics-disable``), no model
  warnings, no URL detection, no shell-command suggestions, no pretty output or fancy input, and
  the chat and input histories in HOME instead of the workspace;
- ``~/.aider.model.metadata.json`` gives litellm the model's context window and a zero price,
  so aider neither warns about an unknown model nor fetches litellm's price list
  (``LITELLM_LOCAL_MODEL_COST_MAP``: the sandbox has no internet);
- aider's "tools" are its edit formats: the model answers in text (``whole``: a file name, then
  the whole file in a fence) and aider writes the files. It sends no tool-calling API requests,
  so what it did shows in the workspace, not as tool results in the completion log;
- ``max_turns`` has nothing to map to: a ``--message`` run is one user turn plus at most three
  automatic reflections (``Coder.max_reflections``, fixed in aider's code);
- ``compact`` turns off the repository map and linting, bounds the chat history and drops the
  edit-format reminder after the request (:func:`compact_model_settings`), for small models
  served with a small context window; ``default`` is aider as shipped (for a model it does not
  know, aider's own default edit format, ``whole``).

Options come from aider-chat 0.86 (``aider/args.py``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from rolloutd.sandbox.harnesses.base import HarnessContext
from rolloutd.sandbox.harnesses.cli import CliHarness, CliRecipe
from rolloutd.sandbox.harnesses.installed import tool_cli, tool_version
from rolloutd.sandbox.runtimes.base import Runtime

PACKAGE = "aider-chat"
ENTRY_POINT = "aider"

CONFIG_FILE = ".aider.conf.yml"
METADATA_FILE = ".aider.model.metadata.json"
SETTINGS_FILE = ".aider.model.settings.yml"

#: the context window aider is told the model has (tokens); the gateway enforces the real one.
CONTEXT_TOKENS = 16384

#: what aider prints after writing a file (aider/coders/base_coder.py ``apply_updates``).
APPLIED = re.compile(r"^Applied edit to (.+?)\s*$")
#: what aider prints for a failed model call or an edit it could not apply.
ERROR = re.compile(
    r"(litellm\.\w+|\w*Error\b|The LLM did not conform|Did not apply|"
    r"Only \d+ reflections allowed)"
)
TOKENS = re.compile(r"^Tokens: (.+?)\s*$")


def aider_config(model: str, home: str, compact: bool) -> dict[str, Any]:
    """The rollout's ``~/.aider.conf.yml``.

    Args:
        model: the model name the session serves; sent as ``openai/{model}``.
        home: the runtime's HOME (histories and the metadata file live there).
        compact: trim the context (module docstring).
    """
    config: dict[str, Any] = {
        "model": f"openai/{model}",
        "model-metadata-file": f"{home}/{METADATA_FILE}",
        "yes-always": True,
        "git": False,
        "gitignore": False,
        "auto-commits": False,
        "dirty-commits": False,
        "check-update": False,
        "show-release-notes": False,
        "analytics-disable": True,
        "show-model-warnings": False,
        "check-model-accepts-settings": False,
        "detect-urls": False,
        "suggest-shell-commands": False,
        "fancy-input": False,
        "pretty": False,
        "notifications": False,
        "chat-history-file": f"{home}/.aider.chat.history.md",
        "input-history-file": f"{home}/.aider.input.history",
    }
    if compact:
        config |= {
            "map-tokens": 0,
            "auto-lint": False,
            "max-chat-history-tokens": 2048,
            "model-settings-file": f"{home}/{SETTINGS_FILE}",
        }
    return config


def compact_model_settings(model: str) -> list[dict[str, Any]]:
    """aider model settings of the ``compact`` profile: no edit-format reminder after the
    request (the format stays in the system prompt), the examples in the system message.

    Qwen2.5-Coder-0.5B answered aider's reminder (the whole-file format rules, appended to the
    instruction by default, or as a last system message with ``reminder: sys``) by echoing it
    ("To suggest changes to a file you MUST return ...") instead of a file listing. aider adds
    the reminder only for ``reminder`` ``user`` or ``sys`` (``Coder.format_chat_chunks``).
    """
    return [
        {
            "name": f"openai/{model}",
            "edit_format": "whole",
            "reminder": "none",
            "examples_as_sys_msg": True,
        }
    ]


def model_metadata(model: str) -> dict[str, Any]:
    """litellm model metadata for ``openai/{model}``: context window, no price."""
    return {
        f"openai/{model}": {
            "max_input_tokens": CONTEXT_TOKENS,
            "max_output_tokens": 4096,
            "max_tokens": CONTEXT_TOKENS,
            "input_cost_per_token": 0.0,
            "output_cost_per_token": 0.0,
            "litellm_provider": "openai",
            "mode": "chat",
        }
    }


class AiderHarness(CliHarness):
    """Runs Aider on one message against the session; see the module docstring."""

    type = "aider"

    @classmethod
    def cli_version(cls) -> str | None:
        """The installed aider-chat's version.

        Raises:
            HarnessError: not installed in the tools folder.
        """
        tool_cli(cls.type, PACKAGE, ENTRY_POINT)
        return tool_version(cls.type, PACKAGE)

    async def recipe(self, runtime: Runtime, ctx: HarnessContext) -> CliRecipe:
        """aider's command, config files and environment.

        Raises:
            HarnessError: aider-chat is not installed.
        """
        cli = tool_cli(self.type, PACKAGE, ENTRY_POINT)
        config = aider_config(ctx.model, runtime.home, self.spec.profile == "compact")
        return CliRecipe(
            # the task's args go after these; the message file is an option, not a positional
            command=[
                str(cli),
                "--config",
                f"{runtime.home}/{CONFIG_FILE}",
                "--message-file",
                "{instruction_file}",
            ],
            dialect="chat",
            env={
                "OPENAI_API_BASE": "{base_url}",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "NO_COLOR": "1",
                "TERM": "dumb",
            },
            files={
                CONFIG_FILE: json.dumps(config, indent=2),
                METADATA_FILE: json.dumps(model_metadata(ctx.model), indent=2),
            }
            | (
                {SETTINGS_FILE: json.dumps(compact_model_settings(ctx.model), indent=2)}
                if self.spec.profile == "compact"
                else {}
            ),
        )

    def summarize(self, stdout: str) -> dict[str, Any] | None:
        """See :func:`summarize_output`."""
        return summarize_output(stdout)


def summarize_output(stdout: str) -> dict[str, Any]:
    """What aider's output says of the run.

    aider exits 0 when the model call failed or no edit applied, so the exit code alone does
    not say it worked.

    Args:
        stdout: aider's standard output (``pretty: false``: plain lines).

    Returns:
        ``{"edited_files": list[str], "errors": list[str] (first 5 lines, 300 characters
        each), "tokens": str | None (aider's last "Tokens:" line), "is_error": bool}``;
        ``is_error`` when no file was edited.
    """
    edited: list[str] = []
    errors: list[str] = []
    tokens = None
    for line in stdout.splitlines():
        if m := APPLIED.match(line):
            edited.append(m.group(1))
        elif m := TOKENS.match(line):
            tokens = m.group(1)
        elif ERROR.search(line) and len(errors) < 5:
            errors.append(line.strip()[:300])
    return {"edited_files": edited, "errors": errors, "tokens": tokens, "is_error": not edited}
