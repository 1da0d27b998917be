"""The ``mini_swe_agent`` harness: mini-SWE-agent (PyPI ``mini-swe-agent``), one-shot, headless.

Installed on the host in its own environment under the tools folder (scripts/setup.sh:
``uv tool install mini-swe-agent --with mcp``; bwrap binds it read-only) and run as::

    {tools}/bin/mini -y --exit-immediately -c mini.yaml -c ~/.config/mini-swe-agent/rollout.yaml \
        -o ~/.rolloutd/mini.traj.json [spec.args] --task=INSTRUCTION

- ``mini`` is the one command that runs headless: ``-y`` (yolo: no confirmation of commands)
  and ``--exit-immediately`` (no "new task?" prompt when the agent submits); the config picks
  the non-interactive ``default`` agent class, so nothing ever reads stdin. ``mini-extra`` holds
  the batch (SWE-bench) runners and the config editor;
- the model speaks OpenAI Chat through litellm: ``openai/{model}`` with ``api_base`` set to the
  session's OpenAI base URL (litellm's OpenAI-compatible provider); the key comes from
  ``OPENAI_API_KEY`` in the environment, never from argv or a file;
- ``rollout.yaml`` (JSON, which is YAML) sets ``agent.step_limit`` to ``max_turns`` (mini counts
  model calls), ``agent.cost_limit: 0`` (off) and ``model.cost_tracking: ignore_errors``:
  litellm has no price for a model it does not know, and mini otherwise aborts on the first
  answer (mini-swe-agent's local-models guide, "Cost tracking"); ``MSWEA_CONFIGURED`` skips the
  first-run setup wizard, ``MSWEA_SILENT_STARTUP`` the banner, ``LITELLM_LOCAL_MODEL_COST_MAP``
  litellm's download of its price list at import (the sandbox has no internet);
- ``compact`` replaces mini's 1K-token instance template by a few lines (the bash tool, the
  heredoc idiom, the submit command), for models served with a small context window;
- after the run a small script (run by the tool's own Python) prints one JSON line
  ``{"mini_swe_agent": {...}}`` from the trajectory file: exit status, submission, API calls;
  :func:`summarize_output` reads it back from stdout.

Config keys come from mini-swe-agent 2.4 (``minisweagent/config/mini.yaml``,
``agents/default.py``, ``models/litellm_model.py``).
"""

from __future__ import annotations

import json
from typing import Any

from rolloutd.sandbox.harnesses.base import HarnessCommand, HarnessContext
from rolloutd.sandbox.harnesses.cli import CliHarness, CliRecipe
from rolloutd.sandbox.harnesses.installed import tool_cli, tool_version
from rolloutd.sandbox.runtimes.base import Runtime

PACKAGE = "mini-swe-agent"
ENTRY_POINT = "mini"

#: where the config and the trajectory go, below the runtime's HOME.
CONFIG_FILE = ".config/mini-swe-agent/rollout.yaml"
TRAJECTORY_FILE = ".rolloutd/mini.traj.json"
SUMMARY_SCRIPT = ".rolloutd/mini_summary.py"

#: the instance template of the ``compact`` profile (mini's own is about 1K tokens).
COMPACT_INSTANCE_TEMPLATE = """\
{{task}}

Use the bash tool: one command per reply; each runs in a new shell in {{cwd}}.
Create a file with a heredoc:
cat <<'EOF' > hello.py
print("hi")
EOF
When the task is done, run exactly: echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
"""

#: prints the trajectory's outcome as one JSON line; run by the tool environment's Python.
SUMMARY = """\
import json, sys
try:
    data = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(json.dumps({"mini_swe_agent": {"exit_status": "NoTrajectory", "error": str(e)}}))
    raise SystemExit(0)
info = data.get("info", {})
last = (data.get("messages") or [{}])[-1]
print(json.dumps({"mini_swe_agent": {
    "exit_status": info.get("exit_status", ""),
    "submission": str(info.get("submission", ""))[:1000],
    "api_calls": info.get("model_stats", {}).get("api_calls", 0),
    "num_messages": len(data.get("messages") or []),
    "exception": str(last.get("extra", {}).get("exception_str", ""))[:1000],
}}))
"""

#: ``sh -c`` wrapper: run the CLI (``"$@"``), then the summary, and exit with the CLI's code.
WRAPPER = 'py=$1 script=$2 traj=$3; shift 3; "$@"; status=$?; "$py" "$script" "$traj"; exit $status'


def mini_config(
    model: str, base_url: str, max_turns: int, workdir: str, compact: bool
) -> dict[str, Any]:
    """The rollout's mini-swe-agent config, merged over the built-in ``mini.yaml``.

    Args:
        model: the model name the session serves; sent as ``openai/{model}``.
        base_url: the session's OpenAI base URL (ends in ``/v1``).
        max_turns: the step limit (model calls).
        workdir: where the bash tool's commands run.
        compact: use :data:`COMPACT_INSTANCE_TEMPLATE`.
    """
    agent: dict[str, Any] = {
        "agent_class": "default",
        "mode": "yolo",
        "confirm_exit": False,
        "step_limit": max_turns,
        "cost_limit": 0,
    }
    if compact:
        agent |= {
            "system_template": "You are a coding agent with a bash tool.\n",
            "instance_template": COMPACT_INSTANCE_TEMPLATE,
        }
    return {
        "agent": agent,
        "environment": {"environment_class": "local", "cwd": workdir, "timeout": 60},
        "model": {
            "model_class": "litellm",
            "model_name": f"openai/{model}",
            "cost_tracking": "ignore_errors",
            "model_kwargs": {"api_base": base_url, "drop_params": True},
        },
    }


class MiniSweAgentHarness(CliHarness):
    """Runs mini-SWE-agent one-shot against the session; see the module docstring."""

    type = "mini_swe_agent"

    @classmethod
    def cli_version(cls) -> str | None:
        """The installed mini-swe-agent's version.

        Raises:
            HarnessError: not installed in the tools folder.
        """
        tool_cli(cls.type, PACKAGE, ENTRY_POINT)
        return tool_version(cls.type, PACKAGE)

    async def recipe(self, runtime: Runtime, ctx: HarnessContext) -> CliRecipe:
        """mini's command, config file and environment.

        Raises:
            HarnessError: mini-swe-agent is not installed.
        """
        cli = tool_cli(self.type, PACKAGE, ENTRY_POINT)
        workdir = ctx.workdir or runtime.workdir
        config = mini_config(
            ctx.model,
            ctx.openai_base_url,
            self.spec.max_turns,
            workdir,
            self.spec.profile == "compact",
        )
        return CliRecipe(
            command=[
                str(cli),
                "-y",
                "--exit-immediately",
                "-c",
                "mini.yaml",
                "-c",
                f"{runtime.home}/{CONFIG_FILE}",
                "-o",
                f"{runtime.home}/{TRAJECTORY_FILE}",
            ],
            dialect="chat",
            env={
                "MSWEA_CONFIGURED": "true",
                "MSWEA_SILENT_STARTUP": "1",
                "MSWEA_COST_TRACKING": "ignore_errors",
                # one retry: the gateway answers a retried identical request from its log
                "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "2",
                "MSWEA_GLOBAL_CONFIG_DIR": f"{runtime.home}/.config/mini-swe-agent",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "OPENAI_API_BASE": "{base_url}",
                "NO_COLOR": "1",
                "TERM": "dumb",
            },
            # JSON is YAML; written as is (a ".yaml" file gets no placeholder escaping)
            files={CONFIG_FILE: json.dumps(config, indent=2), SUMMARY_SCRIPT: SUMMARY},
        )

    async def prepare(self, runtime: Runtime, ctx: HarnessContext) -> HarnessCommand:
        """The recipe's command with the task last, wrapped so the summary line follows it.

        Raises:
            HarnessError: mini-swe-agent is not installed.
        """
        command = await super().prepare(runtime, ctx)
        assert isinstance(command.command, list)
        python = tool_cli(self.type, PACKAGE, ENTRY_POINT).parent.parent / PACKAGE / "bin/python"
        # one argv element, so an instruction starting with "-" is not read as an option
        argv = [*command.command, f"--task={ctx.instruction}"]
        command.command = [
            "/bin/sh",
            "-c",
            WRAPPER,
            self.type,
            str(python),
            f"{runtime.home}/{SUMMARY_SCRIPT}",
            f"{runtime.home}/{TRAJECTORY_FILE}",
            *argv,
        ]
        return command

    def summarize(self, stdout: str) -> dict[str, Any] | None:
        """See :func:`summarize_output`."""
        return summarize_output(stdout)


def summarize_output(stdout: str) -> dict[str, Any]:
    """The outcome mini-swe-agent wrote in its trajectory, from the summary line on stdout.

    mini exits 0 after ``LimitsExceeded`` or ``RepeatedFormatError`` (the model never made a
    parseable tool call) as after ``Submitted``, so the exit status is what tells them apart.

    Args:
        stdout: the run's standard output; the last line starting with ``{"mini_swe_agent"``
            counts.

    Returns:
        ``{"exit_status": str, "submission": str, "api_calls": int, "num_messages": int,
        "exception": str, "is_error": bool}``; ``is_error`` unless the agent submitted.
        Without a summary line: ``{"exit_status": "NoSummary", "is_error": True}``.
    """
    found: dict[str, Any] = {"exit_status": "NoSummary"}
    for line in stdout.splitlines():
        if line.startswith('{"mini_swe_agent"'):
            try:
                found = json.loads(line)["mini_swe_agent"]
            except (ValueError, KeyError, TypeError):
                continue
    return found | {"is_error": found.get("exit_status") != "Submitted"}
