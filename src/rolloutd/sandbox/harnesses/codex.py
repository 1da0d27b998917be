"""The ``codex`` harness: OpenAI's Codex CLI (npm ``@openai/codex``), one-shot, Responses API.

Installed on the host with ``npm install --prefix $ROLLOUTD_NPM_PREFIX @openai/codex`` (bwrap
binds the prefix read-only at the same path); ``bin/codex.js`` starts the native binary of the
platform package (``@openai/codex-linux-x64``) with the runtime's ``node``::

    node {prefix}/node_modules/@openai/codex/bin/codex.js exec --json --ephemeral \
        --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -C WORKDIR \
        [spec.args] - < $HOME/.rolloutd/instruction.md

- ``$CODEX_HOME/config.toml`` (``CODEX_HOME=$HOME/.codex``) declares the session as a custom
  model provider (``wire_api = "responses"``, ``base_url`` the session's OpenAI URL) whose key
  comes from ``OPENAI_API_KEY`` (``env_key``), so the key is never on argv and no login runs;
  retries are off (the gateway's log answers a retried request, Temporal owns retries) and
  the stream idle timeout is an hour: the gateway streams a turn once the backend sampled it,
  and a loaded CPU engine took over Codex's default 300 s (``stream disconnected before
  completion: idle timeout waiting for SSE``, the run then ends with no completion);
  update checks, analytics and feedback are off;
- ``--dangerously-bypass-approvals-and-sandbox`` (and ``approval_policy = "never"``,
  ``sandbox_mode = "danger-full-access"``): the runtime is the sandbox; Codex's own Linux
  sandbox (landlock, its own bubblewrap) cannot nest inside bwrap, and nobody is there to
  approve a command;
- the instruction comes on stdin (``-``): a file has no argv size limit and an instruction
  starting with ``-`` is not read as an option; ``< /dev/null`` would otherwise be appended;
- ``--json`` writes one JSON event per line on stdout; :func:`summarize_output` reads it.
- Codex has no turn limit in ``exec`` mode, so a small model that keeps calling tools runs
  until the run budget, where a call is usually in flight and the session is left unscored.
  ``max_turns`` is applied outside the CLI: :data:`TURN_CAP` (``$HOME/.rolloutd/codex_turns.py``,
  run with the runtime's ``python3``) passes Codex's JSON events through and stops Codex
  (SIGTERM, then exits 0 with a ``rolloutd.max_turns`` event) once ``max_turns`` tool calls
  completed (``command_execution``, ``file_change``, ``mcp_tool_call`` items) or were
  refused by Codex (``codex_core::tools::router: error=`` on stderr: the 0.5B model copies
  the schema's ``justification`` into its calls, which Codex rejects without an item).

``profile: compact`` (measured with codex 0.169.0, first request of a one-line task): the
shipped prompt is 39.5 KB (about 10K tokens: a 17.7 KB developer prompt, 2.7 KB of skills, and
tool schemas of 17.8 KB, 10 KB of them sub-agents); compact is 6.1 KB: ``model_instructions_file``
replaces the developer prompt, skills, apps and permissions instructions are left out, and only
the shell tools stay (``exec_command``, ``write_stdin``, ``request_user_input``; sub-agents,
goals, images, web search, plugins off through ``[features]``, ``[agents]``, ``web_search``).
Config keys are those codex 0.169 accepts (``codex features list``; unknown keys are reported
as ``error`` items in the JSON output).
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
PACKAGE = "@openai/codex"
ENTRY = "bin/codex.js"

#: ``$CODEX_HOME/config.toml`` with placeholders (filled and TOML-escaped by :class:`CliHarness`);
#: top-level keys must precede the first table.
CONFIG_TOML = """\
model = "{model}"
model_provider = "rolloutd"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
model_reasoning_summary = "none"
{compact_top}
[model_providers.rolloutd]
name = "rolloutd"
base_url = "{base_url}"
wire_api = "responses"
env_key = "OPENAI_API_KEY"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 3600000

[analytics]
enabled = false

[feedback]
enabled = false

[history]
persistence = "none"
{compact_tables}"""

#: top-level keys of the compact profile.
COMPACT_TOP = """\
model_instructions_file = "{home}/.codex/instructions.md"
include_permissions_instructions = false
include_apps_instructions = false
web_search = "disabled"
"""

#: tables of the compact profile: tools a one-shot rollout does not need.
COMPACT_TABLES = """
[features]
goals = false
view_image = false
image_generation = false
apps = false
plugins = false
shell_snapshot = false

[skills]
include_instructions = false

[agents]
enabled = false
"""

#: the compact profile's developer prompt (``{workdir}`` is filled in).
COMPACT_INSTRUCTIONS = (
    "You are a coding agent working in the folder {workdir}. Use the exec_command tool to run "
    "shell commands: create and change files with them (for example with cat > file <<'EOF'). "
    "When the task is done, reply with a one-line summary."
)


#: the turn cap (module docstring): ``python3 codex_turns.py MAX_TURNS ARGV...``.
TURN_CAP = """\
import json, signal, subprocess, sys, threading

limit, argv = int(sys.argv[1]), sys.argv[2:]
child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
signal.signal(signal.SIGTERM, lambda *_: (child.terminate(), sys.exit(143)))
lock, done = threading.Lock(), [0]


def count():
    with lock:
        done[0] += 1
        if done[0] == limit:
            child.terminate()


def pump(stream, out, is_call):
    for line in stream:
        out.write(line)
        out.flush()
        if is_call(line):
            count()


def is_item(line):
    try:
        event = json.loads(line)
    except ValueError:
        return False
    if not isinstance(event, dict):
        return False
    item = event.get("item") or {}
    return event.get("type") == "item.completed" and item.get("type") in (
        "command_execution", "file_change", "mcp_tool_call")


# a call Codex refused (bad arguments) is a turn too; it shows only on stderr
threading.Thread(target=pump, daemon=True, args=(
    child.stderr, sys.stderr, lambda line: "codex_core::tools::router: error=" in line)).start()
pump(child.stdout, sys.stdout, lambda line: line.startswith("{") and is_item(line))
code = child.wait()
if done[0] >= limit:
    print(json.dumps({"type": "rolloutd.max_turns", "max_turns": limit}), flush=True)
    sys.exit(0)
sys.exit(code)
"""


def codex_config(profile: str) -> str:
    """The ``config.toml`` template of ``profile`` (``default`` or ``compact``)."""
    compact = profile == "compact"
    return CONFIG_TOML.replace("{compact_top}", COMPACT_TOP if compact else "").replace(
        "{compact_tables}", COMPACT_TABLES if compact else ""
    )


class CodexHarness(CliHarness):
    """Runs ``codex exec`` against the session's Responses URL; see the module docstring."""

    type = "codex"

    npm_package = PACKAGE

    async def recipe(self, runtime: Runtime, ctx: HarnessContext) -> CliRecipe:
        """The Codex recipe: config.toml, the instruction on stdin.

        Raises:
            HarnessError: the CLI is not installed on this host.
        """
        cli = npm_cli(self.type, PACKAGE, ENTRY)
        files = {
            ".codex/config.toml": codex_config(self.spec.profile),
            ".rolloutd/codex_turns.py": TURN_CAP,
        }
        if self.spec.profile == "compact":
            files[".codex/instructions.md"] = COMPACT_INSTRUCTIONS
        command = (
            "exec python3 {home}/.rolloutd/codex_turns.py {max_turns} "
            f"node {shlex.quote(str(cli))} exec --json --ephemeral "
            "--skip-git-repo-check --dangerously-bypass-approvals-and-sandbox "
            "--color never -C {workdir} - < {instruction_file}"
        )
        return CliRecipe(
            command=command,
            dialect="responses",
            files=files,
            env={
                "CODEX_HOME": "{home}/.codex",
                "NO_COLOR": "1",
                # Codex reads RUST_LOG; keep its stderr to warnings
                "RUST_LOG": "warn",
            },
        )

    def summarize(self, stdout: str) -> dict[str, Any] | None:
        """See :func:`summarize_output`."""
        return summarize_output(stdout)


def summarize_output(stdout: str) -> dict[str, Any]:
    """Summarise a ``codex exec --json`` run from its stdout.

    Events (codex 0.169): ``thread.started``, ``turn.started``, ``item.completed`` (items of
    type ``agent_message``, ``command_execution``, ``file_change``, ``error`` -- the latter
    also for warnings such as unknown model metadata), ``turn.completed`` (with ``usage``),
    ``turn.failed`` and ``error`` (the provider's error text); ``rolloutd.max_turns`` comes
    from the turn cap.

    Args:
        stdout: the CLI's standard output, one JSON event per line.

    Returns:
        ``{"completed": bool, "max_turns_reached": bool, "is_error": bool,
        "error": str | None, "num_commands": int,
        "num_warnings": int, "input_tokens": int, "output_tokens": int, "result": str}``
        (texts cut to 1000 characters).
    """
    completed = max_turns_reached = False
    error: str | None = None
    num_commands = num_warnings = input_tokens = output_tokens = 0
    result = ""
    for event in _json_lines(stdout):
        kind = event.get("type")
        if kind == "rolloutd.max_turns":
            max_turns_reached = True
        elif kind == "turn.completed":
            completed = True
            usage = event.get("usage") or {}
            input_tokens += int(usage.get("input_tokens") or 0)
            output_tokens += int(usage.get("output_tokens") or 0)
        elif kind == "turn.failed":
            error = str((event.get("error") or {}).get("message") or error or "turn failed")
        elif kind == "error":
            error = str(event.get("message") or "error")
        elif kind == "item.completed":
            item = event.get("item") or {}
            if item.get("type") == "agent_message":
                result = str(item.get("text") or "")
            elif item.get("type") in ("command_execution", "file_change"):
                num_commands += 1
            elif item.get("type") == "error":
                num_warnings += 1
    return {
        "completed": completed,
        "max_turns_reached": max_turns_reached,
        "is_error": error is not None or not (completed or max_turns_reached),
        "error": error[:1000] if error else None,
        "num_commands": num_commands,
        "num_warnings": num_warnings,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "result": result[:1000],
    }


def _json_lines(stdout: str) -> list[dict[str, Any]]:
    """The JSON objects among ``stdout``'s lines (other lines are warnings)."""
    events = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events
