"""The ``oracle`` harness: a task's reference solution, run as the agent (the standard sanity
check of a task set: every task's oracle must earn reward 1).

As Harbor's ``OracleAgent`` (harbor/agents/oracle.py) does: the solution folder
(``HarnessSpec.solution``, a host folder holding ``solve.sh``, below one of the sandbox policy's
``upload_sources``) is copied to ``/solution``, the
script is made executable and run from the workdir with ``DEBIAN_FRONTEND=noninteractive`` and
the task's ``[solution] env`` (``HarnessSpec.env``), its output kept in
``/logs/agent/oracle.txt`` (and in the harness's own output). It makes no model call.
"""

from __future__ import annotations

from pathlib import Path

from rolloutd.errors import HarnessError, RolloutdError
from rolloutd.sandbox.harnesses.base import HarnessAdapter, HarnessCommand, HarnessContext
from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.sandbox.transfer import check_source, copy_tree_in

#: where the solution is copied inside (Harbor's ``EnvironmentPaths.solution_dir``).
SOLUTION_INSIDE = "/solution"
#: the oracle's log inside (Harbor's ``/logs/agent/oracle.txt``).
ORACLE_LOG = "/logs/agent/oracle.txt"
#: runs solve.sh, its output both in the log and on stdout, its exit code kept.
COMMAND = (
    f"chmod +x {SOLUTION_INSIDE}/solve.sh && mkdir -p /logs/agent && "
    f"{SOLUTION_INSIDE}/solve.sh 2>&1 | tee {ORACLE_LOG}; exit ${{PIPESTATUS[0]}}"
)


class OracleHarness(HarnessAdapter):
    """Runs ``spec.solution``'s ``solve.sh`` in the runtime; see the module docstring."""

    type = "oracle"

    async def prepare(self, runtime: Runtime, ctx: HarnessContext) -> HarnessCommand:
        """Copy the solution in; return ``bash -c`` of :data:`COMMAND`.

        Raises:
            HarnessError: no ``solution`` folder with a ``solve.sh``, or the copy failed (a
                runtime whose root file system is read-only, such as bwrap's).
            PolicyError: the folder is outside the sandbox policy's ``upload_sources``.
        """
        if not self.spec.solution or not (Path(self.spec.solution) / "solve.sh").is_file():
            raise HarnessError(
                f"the oracle harness needs harness.solution, a folder holding solve.sh "
                f"(got {self.spec.solution!r})"
            )
        check_source(runtime, Path(self.spec.solution), "harness.solution")
        try:
            await copy_tree_in(runtime, Path(self.spec.solution), SOLUTION_INSIDE)
        except RolloutdError as e:
            raise HarnessError(f"oracle: {e.message}") from e
        return HarnessCommand(
            command=["bash", "-c", COMMAND],
            env={"DEBIAN_FRONTEND": "noninteractive", **self.spec.env},
            cwd=ctx.workdir or runtime.workdir,
        )
