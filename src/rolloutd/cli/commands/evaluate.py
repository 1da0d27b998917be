"""``rolloutd eval SOURCE -a HARNESS -m MODEL [-n N] [-r SAMPLES] [-c CONCURRENCY] [--out DIR]
[--resume] [--run-name NAME]``: evaluate a model on a task set, with one progress bar, a
summary and a results folder on this machine (:mod:`rolloutd.cli.evaluation`).

It uses a running stack (``--address``, or the ``rolloutd up`` stack running on this home)
or starts the embedded one for the run, as ``rolloutd demo`` does. Ctrl-C stops waiting and
leaves the tasks running (exit status 130): ``--resume`` follows them and starts the rest.
``--tracker tensorboard|wandb|mlflow`` logs each task's group and the summary there too
(:class:`rolloutd.cli.evaluation.EvalTracking`).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import (
    ADDRESS_HELP,
    HOME_HELP,
    STORE_URL_HELP,
    add_command,
    add_port_options,
)
from rolloutd.cli.engine_options import DEFAULT_MODEL
from rolloutd.settings import CommonSettings

#: ``--tracker``'s choices: :data:`rolloutd.trainer_client.tracking.TRACKERS` (spelled out so
#: the parser does not import the tracker module; a test keeps the two equal)
TRACKER_CHOICES = ("tensorboard", "wandb", "mlflow")
#: where the tracker writes when ``--log-dir`` is not given: below the results folder
TRACKER_DIR = "tracker"
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
        "--tracker",
        action="append",
        choices=TRACKER_CHOICES,
        default=None,
        help="also log each task's group and the summary to this tracker (repeatable; "
        "its package: pip install 'rolloutd[NAME]'; W&B offline with WANDB_MODE=offline)",
    )
    p.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help=f"where the tracker writes (TensorBoard's event files, an offline W&B run, a "
        f"local MLflow store); None: OUT/{TRACKER_DIR}",
    )
    p.add_argument(
        "--address",
        default=None,
        help=ADDRESS_HELP.split(";")[0] + " of a running stack; None: the running `rolloutd "
        "up` stack on --home, else an embedded stack for the run",
    )
    p.add_argument("--store-url", default=None, help=STORE_URL_HELP)
    p.add_argument("--home", type=Path, default=None, help=HOME_HELP)
    # the embedded stack's ports, as `rolloutd up` and `demo` take them
    add_port_options(p)


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

    _refuse_a_store_the_embedded_stack_ignores(args)
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
    tracker = _open_tracker(args, setup)
    try:
        target = _running_stack(args, settings)
        if target is not None:
            return asyncio.run(_main(args, settings, setup, state, tracker, *target))
        embedded = True
        return _embedded(args, settings, setup, state, tracker)
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
    finally:
        if tracker is not None:
            tracker.close()


def _open_tracker(args: argparse.Namespace, setup: Any) -> Any:
    """The run's :class:`~rolloutd.trainer_client.tracking.RolloutTracker` (None: no
    ``--tracker``), opened before any stack starts so a missing package is said at once.

    Raises:
        SystemExit: a tracker's package is not installed (naming the extra).
    """
    if not args.tracker:
        return None
    from rolloutd.trainer_client.tracking import RolloutTracker

    plan = setup.plan
    config = {
        "run": setup.run,
        "source": args.source,
        "kind": plan.kind,
        "num_tasks": len(plan.tasks),
        **{k: v for k, v in plan.config.get("overrides", {}).items() if v is not None},
    }
    try:
        return RolloutTracker(
            list(dict.fromkeys(args.tracker)),
            log_dir=args.log_dir or setup.out / TRACKER_DIR,
            project="rolloutd-eval",
            run_name=setup.run,
            config=config,
            pass_reward=plan.pass_reward,
        )
    except ImportError as e:
        raise SystemExit(f"rolloutd eval: {e}") from None


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
        ("--log-dir", args.log_dir),
    ):
        if value is not None:
            words += [flag, str(value)]
    for name in dict.fromkeys(args.tracker or []):
        words += ["--tracker", name]
    return words


def _refuse_a_store_the_embedded_stack_ignores(args: argparse.Namespace) -> None:
    """Refuse ``--store-url`` when the run will start the embedded stack (no ``--address``,
    no ``rolloutd up`` stack on the home) and names another store than that stack's own
    (``HOME/store``): its fleets would write there, not where the option says. URLs are
    compared as fsspec resolves them (``~``, relative paths and ``file://`` included).

    Raises:
        SystemExit: with the store the embedded stack uses and how to choose it.
    """
    if not args.store_url or args.address:
        return
    import fsspec

    from rolloutd.settings import default_home
    from rolloutd.stack.state import read_state

    home = Path(args.home or default_home())
    if _up_stack(read_state(home)):
        return
    fs, path = fsspec.core.url_to_fs(args.store_url)
    own = fsspec.core.url_to_fs(str(home / "store"))[1]
    if fs.protocol != fsspec.filesystem("file").protocol or path.rstrip("/") != own:
        raise SystemExit(
            f"rolloutd eval: --store-url {args.store_url} is for a running stack (--address, "
            f"or `rolloutd up`'s on --home); the embedded stack keeps its store in "
            f"{home / 'store'} (choose it with --home)"
        )


def _up_stack(state: Any) -> bool:
    """Whether a ``rolloutd up`` stack's state (None: no state file) is of a stack that is
    alive and not stopping: one to run on rather than starting the embedded one."""
    return state is not None and state.alive() and state.phase not in ("stopped", "stopping")


def _running_stack(
    args: argparse.Namespace, settings: CommonSettings
) -> tuple[str, str | None, str | None, Path | None] | None:
    """(Temporal address, store URL, gateway URL, codec key file) of the stack to use:
    ``--address``'s, or the ``rolloutd up`` stack alive on the home (one still starting is
    waited for, up to :data:`STACK_START_WAIT_S`; the key file ``up`` keeps there, when it
    does); None: start the embedded one.

    Raises:
        SystemExit: the ``up`` stack on the home failed or stopped while starting.
    """
    if args.address:
        return args.address, args.store_url or settings.store_url, None, None
    import time

    from rolloutd.settings import codec_key_file, default_home
    from rolloutd.stack.state import read_state

    home = args.home or default_home()
    deadline = time.monotonic() + STACK_START_WAIT_S
    said = False
    while True:
        state = read_state(home)
        if not _up_stack(state):
            return None
        if state.phase == "failed":
            raise SystemExit(f"rolloutd eval: the stack on {home} failed: {state.error}")
        if state.phase == "running" and state.temporal_address:
            key = codec_key_file(home)
            return (
                state.temporal_address,
                args.store_url or state.store_url,
                state.gateway_url,
                key if key.is_file() else None,
            )
        if time.monotonic() > deadline:
            raise SystemExit(
                f"rolloutd eval: the stack on {home} is still {state.phase} after "
                f"{STACK_START_WAIT_S:.0f} s (rolloutd status)"
            )
        if not said:
            print(f"waiting for the stack on {home} to start (rolloutd status)", flush=True)
            said = True
        time.sleep(1.0)


def _embedded(
    args: argparse.Namespace, settings: CommonSettings, setup: Any, state: Any, tracker: Any
) -> int:
    """Start the embedded stack (as ``rolloutd demo`` does), run the eval on it, stop it."""
    import time

    from rolloutd.settings import default_home
    from rolloutd.stack.local import LocalStack

    t0 = time.monotonic()
    with LocalStack(
        home=args.home or default_home(),
        model=args.model or DEFAULT_MODEL,
        temporal_port=args.temporal_port,
        ui_port=args.ui_port,
        gateway_port=args.gateway_port,
    ) as stack:
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
                tracker,
                stack.temporal.address,
                stack.store_url,
                stack.gateway_url,
                stack.codec_key_file,
            )
        )


async def _main(
    args: argparse.Namespace,
    settings: CommonSettings,
    setup: Any,
    state: Any,
    tracker: Any,
    address: str,
    store_url: str | None,
    gateway_url: str | None,
    codec_key: Path | None,
) -> int:
    from rolloutd.cli.evaluation import evaluate, print_summary
    from rolloutd.cli.submission import connect
    from rolloutd.errors import FleetUnavailableError, RolloutdError

    # a stack on another home than the default encrypts with that home's key
    client = await connect(
        address, store_url, settings.temporal_namespace, gateway_url, codec_key_file=codec_key
    )
    try:  # what no registered host can run is refused before any task starts
        setup.plan.tasks = await client.check_tasks(setup.plan.tasks)
    except RolloutdError as e:
        raise SystemExit(f"rolloutd eval: {e}") from None
    try:
        summary, groups = await evaluate(
            client,
            setup,
            state,
            concurrency=args.concurrency,
            details=args.details,
            tracker=tracker,
        )
    except FleetUnavailableError as e:
        raise SystemExit(
            f"rolloutd eval: {e} (the tasks keep running; --resume follows them)"
        ) from None
    return print_summary(summary, groups, setup)
