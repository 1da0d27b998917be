"""The embedded stack of ``rolloutd up``: Temporal dev server, llama-server, and each fleet as
its own child process, all on this machine, supervised.

- :mod:`~rolloutd.stack.processes`: the Temporal dev server (children are started and
  stopped with :mod:`rolloutd.processes`, re-exported here);
- :mod:`~rolloutd.stack.supervisor`: restart with capped backoff and a restart limit;
- :mod:`~rolloutd.stack.state`: the state file ``{home}/stack.json``;
- :mod:`~rolloutd.stack.local`: :class:`~rolloutd.stack.local.LocalStack`, what ``up`` runs
  (import it from there: it imports the server's packages, and this package's face stays
  importable with rolloutd's client install, for ``submit`` and ``status``);
- :mod:`~rolloutd.stack.status`: what ``rolloutd status`` shows.
"""

from rolloutd.processes import free_port, spawn, stop_process, stop_processes
from rolloutd.stack.processes import SQLITE_PRAGMAS, TemporalDevServer, temporal_binary
from rolloutd.stack.state import StackState, read_state
from rolloutd.stack.supervisor import RestartPolicy

__all__ = [
    "SQLITE_PRAGMAS",
    "RestartPolicy",
    "StackState",
    "TemporalDevServer",
    "free_port",
    "read_state",
    "spawn",
    "stop_process",
    "stop_processes",
    "temporal_binary",
]
