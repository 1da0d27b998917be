"""The ``python`` harness: an agent written as a Python coroutine, in its own process inside the
runtime, with an OpenAI client bound to its session.

A task names the coroutine as ``harness.entry = "module:function"`` and usually ships the module
in ``harness.files`` (written under the runtime's HOME, which is on the import path)::

    {"harness": {"type": "python", "entry": "file_agent:agent", "max_turns": 4,
                 "files": {"file_agent.py": "...source..."}}}

The contract (verl AgentLoop / AReaL style) is in
:mod:`~rolloutd.sandbox.harnesses.python_runner`, the file this adapter copies into the runtime
and runs as ``python -u ~/.rolloutd/python_runner.py module:function``: the agent runs as its own
process, under the runtime's isolation, never in the worker. The interpreter is the worker's own
(``sys.executable``: bwrap binds its installation read-only, so the ``openai`` SDK of rolloutd's
environment is importable inside), or ``harness.command`` (an argv list) for a runtime with its
own Python, such as an image.

``harness.files`` are written with the ``cli`` placeholders filled in (``{model}``,
``{workdir}``, ... in a module's source are replaced): keep those exact names out of shipped
source, or ship the module with ``runtime.files`` into the workspace.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses import python_runner
from rolloutd.sandbox.harnesses.base import HarnessCommand, HarnessContext
from rolloutd.sandbox.harnesses.cli import CliHarness, CliRecipe
from rolloutd.sandbox.runtimes.base import Runtime

#: where the runner goes, below the runtime's HOME.
RUNNER_FILE = ".rolloutd/python_runner.py"


class PythonHarness(CliHarness):
    """Runs ``spec.entry`` through the runner; see the module docstring."""

    type = "python"

    @classmethod
    def cli_version(cls) -> str | None:
        """The ``openai`` SDK's version in the interpreter the runner uses.

        Raises:
            HarnessError: the SDK is not installed in rolloutd's environment.
        """
        try:
            return importlib.metadata.version("openai")
        except importlib.metadata.PackageNotFoundError:
            raise HarnessError(
                "python harness: the openai SDK is not installed in rolloutd's environment; "
                "install rolloutd's test extra (`bash scripts/setup.sh`) or `openai`"
            ) from None

    async def recipe(self, runtime: Runtime, ctx: HarnessContext) -> CliRecipe:
        """The runner's command and environment.

        Raises:
            HarnessError: no ``harness.entry``.
        """
        if not self.spec.entry:
            raise HarnessError(
                "harness.entry (`module:function`) is required for the python harness"
            )
        interpreter = (
            list(self.spec.command) if isinstance(self.spec.command, list) else [sys.executable]
        )
        return CliRecipe(
            command=[*interpreter, "-u", f"{runtime.home}/{RUNNER_FILE}", self.spec.entry],
            dialect="chat",
            env={
                "ROLLOUTD_WORKDIR": "{workdir}",
                "ROLLOUTD_MAX_TURNS": "{max_turns}",
                "PYTHONDONTWRITEBYTECODE": "1",
            },
        )

    async def prepare(self, runtime: Runtime, ctx: HarnessContext) -> HarnessCommand:
        """Copy the runner into the runtime, write ``spec.files``, return its command.

        Raises:
            HarnessError: no ``harness.entry``.
        """
        await runtime.upload(
            f"{runtime.home}/{RUNNER_FILE}", Path(python_runner.__file__).read_bytes()
        )
        return await super().prepare(runtime, ctx)

    def summarize(self, stdout: str) -> dict[str, Any] | None:
        """See :func:`summarize_output`."""
        return summarize_output(stdout)


def summarize_output(stdout: str) -> dict[str, Any]:
    """The runner's outcome line (:mod:`~rolloutd.sandbox.harnesses.python_runner`).

    Returns:
        ``{"ok": bool, "result": str, "error": str, "error_type": str, "is_error": bool}``;
        without an outcome line (the process was killed): ``ok`` false, ``error_type``
        ``"NoOutcome"``.
    """
    found: dict[str, Any] = {"ok": False, "result": "", "error": "", "error_type": "NoOutcome"}
    prefix = '{"' + python_runner.SUMMARY_KEY + '"'
    for line in stdout.splitlines():
        if line.startswith(prefix):
            try:
                found = json.loads(line)[python_runner.SUMMARY_KEY]
            except (ValueError, KeyError, TypeError):
                continue
    return found | {"is_error": not found.get("ok")}
