"""``rolloutd reverify``: score stored sessions again without sampling
(:mod:`rolloutd.cli.rescoring`)."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import ADDRESS_HELP, STORE_URL_HELP, add_command
from rolloutd.errors import RolloutdError
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``reverify``."""
    reverify = add_command(
        sub,
        "reverify",
        "score stored sessions again without sampling, from each session's stored final "
        "state (tasks with store_final_state), with the evaluator as the fleets have it now; "
        "appends an evaluation record to each trajectory (its reward is never rewritten), "
        "prints what changed and writes the summary as JSON",
        run,
    )
    reverify.add_argument(
        "--task",
        action="append",
        default=None,
        metavar="TASK_ID",
        help="every stored session of this task (repeat for more)",
    )
    reverify.add_argument(
        "--results",
        type=Path,
        default=None,
        help="a results file: JSON or JSONL of task results, session results or trajectories",
    )
    reverify.add_argument(
        "--prefix",
        default=None,
        help="every stored session whose key starts with it (sessions/run-1- or run-1-)",
    )
    reverify.add_argument(
        "--evaluator",
        action="append",
        default=None,
        metavar="[OLD=]NEW",
        help="score with the registry's NEW instead (a fixed verifier registered under "
        "another name): every session, or those OLD scored (repeat for more); None: each "
        "session's own evaluator, as the eval fleet has it now",
    )
    reverify.add_argument(
        "--run-name",
        default=None,
        help="names the run (workflow reverify/NAME, its records' run_id); the same name "
        "attaches to a running run, or runs it again replacing its own records; None: the time "
        "and a random suffix",
    )
    reverify.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the summary goes as JSON; None: reverify-NAME.json in the current folder",
    )
    reverify.add_argument(
        "--max-concurrent", type=int, default=8, help="sessions re-scored at once (1-256)"
    )
    reverify.add_argument("--address", default=None, help=ADDRESS_HELP)
    reverify.add_argument("--store-url", default=None, help=STORE_URL_HELP)


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Run the re-score, print what changed, write the summary.

    Returns:
        1 when a session's re-score failed or a session named is not in the store
        (:func:`rolloutd.cli.rescoring.exit_status`), else 0.
    """
    from rolloutd.cli import rescoring, tables
    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient

    store = BlobStore(args.store_url or settings.store_url)
    try:
        evaluators = rescoring.evaluator_map(args.evaluator)
        session_ids = rescoring.find_sessions(
            store, task_ids=args.task, results=args.results, prefix=args.prefix
        )
    except (RolloutdError, OSError) as e:
        raise SystemExit(f"rolloutd reverify: {e}") from None
    if not session_ids:
        raise SystemExit("rolloutd reverify: no stored session matches")
    run_id = args.run_name or f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"
    out = args.out or Path(f"reverify-{run_id}.json")

    async def main() -> int:
        client = (
            await RolloutClient.connect(
                args.address or settings.temporal_address, namespace=settings.temporal_namespace
            )
        ).client
        summary = await rescoring.run(
            client,
            store,
            session_ids,
            run_id=run_id,
            evaluators=evaluators,
            max_concurrent=args.max_concurrent,
            out=out,
        )
        tables.show(rescoring.render(summary))
        print(f"summary written to {out}")
        return rescoring.exit_status(summary.sessions)

    return asyncio.run(main())
