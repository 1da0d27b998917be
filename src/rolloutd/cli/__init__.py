"""The ``rolloutd`` command line.

- :mod:`~rolloutd.cli.entry`: :func:`main`, the entry point (``rolloutd``, ``python -m
  rolloutd.cli``);
- :mod:`~rolloutd.cli.parser`: the parser, built from the command modules;
- :mod:`~rolloutd.cli.commands`: one module per command (its options and its handler);
- :mod:`~rolloutd.cli.submission`: what ``submit`` and ``demo`` run: read, submit, wait;
- :mod:`~rolloutd.cli.live`: what ``submit`` shows while it waits;
- :mod:`~rolloutd.cli.report`: what ``submit`` and ``demo`` print of finished tasks, and
  their exit status;
- :mod:`~rolloutd.cli.reliability`: the reliability figures ``reliability`` shows;
- :mod:`~rolloutd.cli.checks`: what ``doctor`` checks on this host;
- :mod:`~rolloutd.cli.retention`: what ``store gc`` deletes and keeps;
- :mod:`~rolloutd.cli.tables`: the one table style every command prints with;
- :mod:`~rolloutd.cli.extras`: the install extras a command needs, checked before it runs.
"""

from rolloutd.cli.entry import main

__all__ = ["main"]
