"""The ``rolloutd`` commands, one module each (a module may hold a command's family:
``generation`` gives ``generate`` and ``schedule``).

A command module gives ``register(sub)``: it adds its subcommand with :func:`add_command`,
naming its handler, ``handler(args, settings) -> exit status``. The parser
(:func:`rolloutd.cli.parser.build_parser`) finds the modules by listing this package, so a new
command is one new module. A handler imports what it runs when it runs, so ``rolloutd --help``
and the parser import no fleet, engine or trainer code.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rolloutd.cli.extras import EXTRA_MODULES

if TYPE_CHECKING:
    from rolloutd.settings import CommonSettings

#: what a command runs: ``handler(args, settings) -> exit status``
Handler = Callable[[argparse.Namespace, "CommonSettings"], int]

#: the help of ``--address`` where it names the settings' default
ADDRESS_HELP = "Temporal address host:port; None: $ROLLOUTD_TEMPORAL_ADDRESS or localhost:7233"
#: the help of ``--store-url`` where it names the settings' default
STORE_URL_HELP = "fsspec URL of the blob store; None: $ROLLOUTD_STORE_URL or ~/.rolloutd/store"
#: the help of ``--home`` of the commands that start the stack
HOME_HELP = (
    "state folder (Temporal SQLite, store, logs, runtimes); None: $ROLLOUTD_HOME or ~/.rolloutd"
)


def add_port_options(parser: argparse.ArgumentParser) -> None:
    """Add the ports of the stack a command starts (``up``, ``demo``): a second stack on one
    machine (another ``--home``) needs its own."""
    parser.add_argument("--temporal-port", type=int, default=7233, help="Temporal's gRPC port")
    parser.add_argument("--ui-port", type=int, default=8233, help="the Temporal UI's port")
    parser.add_argument("--gateway-port", type=int, default=8300, help="the gateway's port")


def add_command(
    sub: Any,
    name: str,
    help: str,
    handler: Handler | None = None,
    *,
    extras: tuple[str, ...] = (),
) -> argparse.ArgumentParser:
    """Add a subcommand that shows its defaults next to each option's help, with
    ``--config`` (:func:`add_config_option`).

    Args:
        sub: the ``add_subparsers()`` action to add to (the top level's, or a command's
            actions').
        name: the subcommand (``up``, ``pull``).
        help: one line, shown in the parent's help and as the subcommand's description.
        handler: what the command runs; None for an action of a command that has one.
        extras: the install extras it needs (``("server",)``; :mod:`rolloutd.cli.extras`):
            without one the entry point exits 1 naming it, before the handler runs. Empty:
            the client install runs it.

    Returns:
        The subcommand's parser, for its options.

    Raises:
        KeyError: an extra that :data:`rolloutd.cli.extras.EXTRA_MODULES` does not know.
    """
    parser = sub.add_parser(
        name, help=help, description=help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add_config_option(parser)
    if handler is not None:
        parser.set_defaults(handler=handler)
    if unknown := [extra for extra in extras if extra not in EXTRA_MODULES]:
        raise KeyError(f"{name}: unknown extras {unknown}; known: {sorted(EXTRA_MODULES)}")
    if extras:
        parser.set_defaults(needs_extras=(parser.prog.removeprefix("rolloutd "), extras))
    return parser


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--config FILE``: the config file (``rolloutd.toml``) this command and the
    processes it starts read; absent from the parsed arguments unless given, so a command's
    own ``--config`` and the top level's do not overwrite each other."""
    parser.add_argument(
        "--config",
        type=Path,
        default=argparse.SUPPRESS,
        help="config file (rolloutd.toml: settings, sandbox policy, evaluators; "
        "docs/settings.md); default: $ROLLOUTD_CONFIG, else none",
    )


def modules() -> list[ModuleType]:
    """Every command module of this package, imported, in name order (modules whose name
    starts with ``_`` are helpers, not commands)."""
    return [
        importlib.import_module(f"{__name__}.{info.name}")
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name)
        if not info.name.startswith("_")
    ]
