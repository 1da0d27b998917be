"""The ``rolloutd`` command line's parser: the top-level options and the subcommands of every
command module (:mod:`rolloutd.cli.commands`), each option with its help (``rolloutd --help``;
tests/cli/test_cli.py checks that every one has one)."""

from __future__ import annotations

import argparse
import importlib.metadata

from rolloutd import __version__
from rolloutd.cli import commands


def package_version() -> str:
    """rolloutd's installed version, from the distribution's metadata.

    Returns:
        The version string (``0.1.0``); the package's ``__version__`` when rolloutd runs
        from a source tree that was never installed (no metadata).
    """
    try:
        return importlib.metadata.version("rolloutd")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def build_parser() -> argparse.ArgumentParser:
    """The ``rolloutd`` command line: every subcommand, option and positional with its help.

    Returns:
        The parser; ``rolloutd --version`` prints :func:`package_version`. A parsed command
        carries its ``handler`` (:data:`rolloutd.cli.commands.Handler`). Options whose default
        is ``None`` fall back to the ``ROLLOUTD_*`` settings their help names.
    """
    parser = argparse.ArgumentParser(
        prog="rolloutd",
        description="rolloutd: durable rollouts of multi-turn LLM agents for "
        "RL training. Settings not given as options come from ROLLOUTD_* variables, "
        "then the config file (--config or ROLLOUTD_CONFIG; docs/settings.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"rolloutd {package_version()}",
        help="print rolloutd's version and exit",
    )
    commands.add_config_option(parser)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to run"
    )
    for module in commands.modules():
        module.register(sub)
    return parser
