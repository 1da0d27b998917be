"""``rolloutd demo``: the embedded stack and the bundled example tasks, once."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import HOME_HELP, add_command, add_port_options
from rolloutd.cli.engine_options import DEFAULT_MODEL, add_engine_options
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``demo`` and its options."""
    demo = add_command(
        sub, "demo", "run the stack and the bundled examples", run, extras=("server",)
    )
    demo.add_argument(
        "--examples",
        type=Path,
        default=None,
        help="JSONL tasks to run; None: the repository's examples/tasks.jsonl",
    )
    add_engine_options(demo)
    add_port_options(demo)
    demo.add_argument("--home", type=Path, default=None, help=HOME_HELP)


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Start the stack, run the examples through it, print the report.

    Returns:
        :func:`rolloutd.cli.report.exit_code` of the results.

    Raises:
        SystemExit: no examples, or a refused engine (before anything starts).
    """
    from rolloutd.cli import tables
    from rolloutd.cli.engine_options import external_engine
    from rolloutd.cli.engines import engine_view
    from rolloutd.cli.report import exit_code
    from rolloutd.cli.submission import load_tasks, submit_tasks
    from rolloutd.settings import GatewaySettings, default_home
    from rolloutd.stack.local import LocalStack
    from rolloutd.stack.status import check_engines

    examples = args.examples or Path(__file__).resolve().parents[4] / "examples" / "tasks.jsonl"
    if not examples.is_file():
        raise SystemExit(f"no examples at {examples}; pass --examples FILE")
    tasks = load_tasks(examples)
    engine = external_engine(args, GatewaySettings().backend_api_key)
    t0 = time.monotonic()
    with LocalStack(
        home=args.home or default_home(),
        model=args.model or DEFAULT_MODEL,
        external_engine=engine,
        temporal_port=args.temporal_port,
        ui_port=args.ui_port,
        gateway_port=args.gateway_port,
    ) as stack:
        assert stack.temporal is not None
        print(
            f"Temporal UI: {stack.temporal.ui_url} (stack up in {time.monotonic() - t0:.1f} s)",
            flush=True,
        )
        tables.show(*engine_view(stack.state, check_engines(stack.state, stack.home)))
        results = asyncio.run(
            submit_tasks(
                tasks,
                stack.temporal.address,
                stack.store_url,
                suffix=f"-{int(time.time())}",
                # a home other than the default one has a codec key of its own
                codec_key_file=stack.codec_key_file,
            )
        )
    print(f"demo wall time {time.monotonic() - t0:.1f} s")
    return exit_code(results)
