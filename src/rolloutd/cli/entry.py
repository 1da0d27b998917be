"""The ``rolloutd`` command's entry point: parse (:mod:`rolloutd.cli.parser`), check the
environment and the config file (:func:`rolloutd.settings.check_startup`), configure logging,
run the command's handler (:mod:`rolloutd.cli.commands`), end the process."""

from __future__ import annotations

import sys

from rolloutd.cli.extras import check_extras
from rolloutd.cli.parser import build_parser
from rolloutd.errors import ConfigError
from rolloutd.logs import configure_logging
from rolloutd.settings import check_startup


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rolloutd`` command.

    Args:
        argv: the arguments; None: the process's own, and the process ends here (see
            :func:`rolloutd.processes.end_process`).

    Returns:
        The command's exit status.
    """
    if argv is not None:
        return _dispatch(argv)
    try:
        code = _dispatch(None)
    except SystemExit as e:  # argparse's and our own error exits: message on stderr, code
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            code = 1
        else:
            code = 0 if e.code is None else int(e.code)
    from rolloutd.processes import end_process

    end_process(code)
    return code


def _dispatch(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if needs := getattr(args, "needs_extras", None):
        check_extras(*needs)
    try:
        settings = check_startup(getattr(args, "config", None))
    except ConfigError as e:
        raise SystemExit(f"rolloutd {args.command}: {e}") from None
    configure_logging(settings.log_level, json=args.command == "worker" and settings.log_json)
    return args.handler(args, settings) or 0
