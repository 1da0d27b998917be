"""``rolloutd eval SOURCE -a HARNESS -m MODEL [-n N] [-r SAMPLES] [-c CONCURRENCY] [--out DIR]
[--resume] [--run-name NAME]``: evaluate a model on a task set, with one progress bar, a
summary and a results folder on this machine (:mod:`rolloutd.cli.evaluation`).

It uses a running stack (``--address``, or the ``rolloutd up`` stack running on this home)
or starts the embedded one for the run, as ``rolloutd demo`` does. Ctrl-C stops waiting and
leaves the tasks running (exit status 130): ``--resume`` follows them and starts the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import ADDRESS_HELP, HOME_HELP, STORE_URL_HELP, add_command
from rolloutd.settings import CommonSettings

#: the catalog model the embedded stack serves when -m does not name one
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
#: how long a ``rolloutd up`` stack still starting on the home is waited for, s
STACK_START_WAIT_S = 300.0


def register(sub: Any) -> None:
    """Add ``eval`` and its options."""
    p = add_command(
        sub,
        "eval",
        "evaluate a model on a task set: a progress bar, a summary (mean ± std, pass@k, "
        "failures by kind) and DIR/results.jsonl; resumable",
        run,
        # the embedded stack, when no stack is given or running
        extras=("server",),
    )
    p.add_argument(
        "source",
        help="a JSONL/Parquet file of tasks, a Harbor task folder (or a folder of them), a "
        "SWE-bench-family JSONL/Parquet file, `humaneval`, a JSONL or `datasets` folder of "
        "HumanEval problems, or an eval config (TOML/JSON; a `generate` spec works too)",
    )
    p.add_argument(
        "-a",
        "--harness",
        default=None,
        help="every task's harness, over what rows say: a type (oracle, qwen_code, ...; "
        "`shell` alone does nothing) or a HarnessSpec as JSON; None: the rows' own",
    )
    p.add_argument(
        "-m",
        "--model",
        default=None,
        help="the model: the name shown to the harness, over what rows say; the embedded "
        f"stack serves it (a catalog name; None: {DEFAULT_MODEL})",
    )
    p.add_argument("-n", "--num-rows", type=int, default=None, help="only the first N rows")
    p.add_argument(
        "-r", "--samples", type=int, default=None, help="samples per task (the k of pass@k)"
    )
    p.add_argument(
        "-c",
        "--concurrency",
        type=int,
        default=None,
        help="sessions in flight at most; None: the config's, else 32",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (config.json, results.jsonl, summary.json); None: runs/RUN",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out (or runs/RUN-NAME): follow its tasks, start the rest; "
        "no session runs twice",
    )
    p.add_argument(
        "--run-name",
        default=None,
        help="the run's name; task ids are RUN-ROWKEY (None: the source's stem and the time)",
    )
    p.add_argument(
        "--details",
        action="store_true",
        help="show every task live (asks each in turn) instead of one overall bar",
    )
    p.add_argument(
        "--address",
        default=None,
        help=ADDRESS_HELP.split(";")[0] + " of a running stack; None: the running `rolloutd "
        "up` stack on --home, else an embedded stack for the run",
    )
    p.add_argument("--store-url", default=None, help=STORE_URL_HELP)
    p.add_argument("--home", type=Path, default=None, help=HOME_HELP)


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Plan, run on a stack, print the summary.

    Returns:
        0; 1 when a session ended with an infrastructure cause no replacement made good;
        130 when Ctrl-C stopped the wait (the tasks keep running).

    Raises:
        SystemExit: the source, the options or the run are refused, with the reason.
    """
    from rolloutd.cli.eval_sources import Overrides
    from rolloutd.cli.evaluation import set_up
    from rolloutd.cli.submission import INTERRUPTED_EXIT, TaskRun, interrupted_message
    from rolloutd.errors import ConfigError

    overrides = Overrides(
        harness=args.harness,
        model=args.model,
        num_samples=args.samples,
        num_rows=args.num_rows,
    )
    try:
        setup = set_up(
            args.source,
            overrides,
            run_name=args.run_name,
            out=args.out,
            resume=args.resume,
            command=["rolloutd", "eval", *sys.argv[2:]],
        )
    except ConfigError as e:
        raise SystemExit(f"rolloutd eval: {e}") from None
    print(
        f"eval run {setup.run}: {len(setup.plan.tasks)} task(s) from {args.source} "
        f"({setup.plan.kind}), results in {setup.out}" + (" (resumed)" if setup.resumed else ""),
        flush=True,
    )
    state = TaskRun([])
    embedded = False
    try:
        target = _running_stack(args, settings)
        if target is not None:
            return asyncio.run(_main(args, settings, setup, state, *target))
        embedded = True
        return _embedded(args, settings, setup, state)
    except KeyboardInterrupt:
        resume = shlex.join(_resume_words(args, setup))
        print(
            interrupted_message(
                state,
                resume,
                "rolloutd eval",
                cancel=f"rolloutd tasks cancel --prefix {setup.run}-",
            ),
            file=sys.stderr,
        )
        if embedded:
            print(
                "  the embedded stack stopped with this command: its tasks wait in Temporal "
                "(SQLite under the home) and go on when --resume starts it again",
                file=sys.stderr,
            )
        return INTERRUPTED_EXIT


def _resume_words(args: argparse.Namespace, setup: Any) -> list[str]:
    words = ["rolloutd", "eval", args.source, "--resume", "--out", str(setup.out)]
    for flag, value in (
        ("-a", args.harness),
        ("-m", args.model),
        ("-n", args.num_rows),
        ("-r", args.samples),
        ("-c", args.concurrency),
        ("--address", args.address),
        ("--home", args.home),
    ):
        if value is not None:
            words += [flag, str(value)]
    return words


def _running_stack(
    args: argparse.Namespace, settings: CommonSettings
) -> tuple[str, str | None, str | None] | None:
    """(Temporal address, store URL, gateway URL) of the stack to use: ``--address``'s, or
    the ``rolloutd up`` stack alive on the home (one still starting is waited for, up to
    :data:`STACK_START_WAIT_S`); None: start the embedded one.

    Raises:
        SystemExit: the ``up`` stack on the home failed or stopped while starting.
    """
    if args.address:
        return args.address, args.store_url or settings.store_url, None
    import time

    from rolloutd.settings import default_home
    from rolloutd.stack.state import read_state

    home = args.home or default_home()
    deadline = time.monotonic() + STACK_START_WAIT_S
    said = False
    while True:
        state = read_state(home)
        if state is None or not state.alive() or state.phase in ("stopped", "stopping"):
            return None
        if state.phase == "failed":
            raise SystemExit(f"rolloutd eval: the stack on {home} failed: {state.error}")
        if state.phase == "running" and state.temporal_address:
            return state.temporal_address, args.store_url or state.store_url, state.gateway_url
        if time.monotonic() > deadline:
            raise SystemExit(
                f"rolloutd eval: the stack on {home} is still {state.phase} after "
                f"{STACK_START_WAIT_S:.0f} s (rolloutd status)"
            )
        if not said:
            print(f"waiting for the stack on {home} to start (rolloutd status)", flush=True)
            said = True
        time.sleep(1.0)


def _embedded(args: argparse.Namespace, settings: CommonSettings, setup: Any, state: Any) -> int:
    """Start the embedded stack (as ``rolloutd demo`` does), run the eval on it, stop it."""
    import time

    from rolloutd.settings import default_home
    from rolloutd.stack.local import LocalStack

    t0 = time.monotonic()
    with LocalStack(home=args.home or default_home(), model=args.model or DEFAULT_MODEL) as stack:
        assert stack.temporal is not None
        print(
            f"embedded stack up in {time.monotonic() - t0:.1f} s; Temporal UI: "
            f"{stack.temporal.ui_url}",
            flush=True,
        )
        return asyncio.run(
            _main(
                args,
                settings,
                setup,
                state,
                stack.temporal.address,
                stack.store_url,
                stack.gateway_url,
            )
        )


async def _main(
    args: argparse.Namespace,
    settings: CommonSettings,
    setup: Any,
    state: Any,
    address: str,
    store_url: str | None,
    gateway_url: str | None,
) -> int:
    from rolloutd.cli.evaluation import evaluate, print_summary
    from rolloutd.cli.submission import connect
    from rolloutd.errors import FleetUnavailableError, RolloutdError

    client = await connect(address, store_url, settings.temporal_namespace, gateway_url)
    try:  # what no registered host can run is refused before any task starts
        setup.plan.tasks = await client.check_tasks(setup.plan.tasks)
    except RolloutdError as e:
        raise SystemExit(f"rolloutd eval: {e}") from None
    try:
        summary, groups = await evaluate(
            client, setup, state, concurrency=args.concurrency, details=args.details
        )
    except FleetUnavailableError as e:
        raise SystemExit(
            f"rolloutd eval: {e} (the tasks keep running; --resume follows them)"
        ) from None
    return print_summary(summary, groups, setup)
