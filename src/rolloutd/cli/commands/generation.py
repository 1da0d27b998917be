"""``rolloutd generate`` and ``rolloutd schedule``: offline generations over a dataset and the
Temporal Schedules that re-run them (:mod:`rolloutd.generation.commands`)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rolloutd.cli.commands import ADDRESS_HELP, add_command
from rolloutd.settings import CommonSettings

if TYPE_CHECKING:
    from rolloutd.cli import tables
    from rolloutd.workflows.generation.models import GenerationSummary

#: the help of a command's generation spec
SPEC_HELP = "generation spec, a JSON or TOML (.toml) file (GenerationSpec)"


def _temporal_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", default=None, help=ADDRESS_HELP)
    parser.add_argument(
        "--task-queue",
        default="rolloutd-workflows",
        help="task queue of the generation workflow (its tasks always run on rolloutd-workflows)",
    )


def register(sub: Any) -> None:
    """Add ``generate`` and ``schedule`` with its actions."""
    generate = add_command(
        sub,
        "generate",
        "run an offline generation over a dataset (JSON or TOML spec: "
        "source, template, filters, outputs), each row once; attaches to a run of "
        "the same name; shows progress and a final table",
        run,
    )
    generate.add_argument("spec", type=Path, help=SPEC_HELP)
    generate.add_argument("--name", default=None, help="overrides spec.name")
    generate.add_argument("--limit", type=int, default=None, help="overrides source.limit")
    generate.add_argument(
        "--num-samples", type=int, default=None, help="overrides template.num_samples"
    )
    generate.add_argument("--out", default=None, help="overrides outputs.dir")
    _temporal_options(generate)

    schedule = add_command(
        sub, "schedule", "Temporal Schedules of generations (overlap: skip)", run
    )
    schedule_sub = schedule.add_subparsers(
        dest="schedule_command", required=True, metavar="ACTION", help="what to do"
    )
    create = add_command(
        schedule_sub,
        "create",
        "create a schedule running a generation over the rows not yet journaled",
    )
    create.add_argument("spec", type=Path, help=SPEC_HELP)
    create.add_argument("--cron", default=None, help="cron expression (UTC), e.g. '0 3 * * *'")
    create.add_argument("--every", default=None, help="interval: 90s, 15m, 6h, 1d")
    create.add_argument("--paused", action="store_true", help="create it paused")
    _temporal_options(create)
    listing = add_command(schedule_sub, "list", "list schedules")
    listing.add_argument("--address", default=None, help="Temporal address host:port")
    for action in ("describe", "pause", "unpause", "trigger", "delete"):
        p = add_command(schedule_sub, action, f"{action} a generation's schedule")
        p.add_argument(
            "name", help="the generation's name (schedule generation-NAME) or a schedule id"
        )
        p.add_argument("--address", default=None, help="Temporal address host:port")
        if action in ("pause", "unpause"):
            p.add_argument("--note", default=None, help="why, shown on the schedule")


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Run the generation (exit 1 when a row failed) or the schedule action.

    Raises:
        SystemExit: a rolloutd error or a refused spec, with its message (exit 1).
    """
    from pydantic import ValidationError

    from rolloutd.errors import RolloutdError

    try:
        return asyncio.run(_generation(args, settings))
    except (RolloutdError, ValidationError) as e:
        raise SystemExit(f"rolloutd {args.command}: {e}") from None


def summary_table(summary: GenerationSummary) -> tables.Table:
    """A generation's final table: rows, failed rows, samples, scored, passing, pass@1,
    pass@k, tokens, kept, wall time."""
    from rolloutd.cli import tables

    return tables.table(
        *map(
            tables.num,
            (
                "rows",
                "failed rows",
                "samples",
                "scored",
                "passing",
                "pass@1",
                f"pass@{summary.k}",
                "tokens",
                "kept",
                "wall s",
            ),
        ),
        title=f"generation {summary.name}",
        rows=[
            (
                summary.num_rows,
                summary.num_rows_failed,
                summary.num_samples,
                summary.num_scored,
                summary.num_passing,
                tables.cell(summary.pass_at_1, 3),
                tables.cell(summary.pass_at_k, 3),
                summary.num_tokens,
                summary.num_kept,
                tables.cell(summary.wall_time_s, 1),
            )
        ],
    )


async def _generation(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd.cli import tables
    from rolloutd.generation import commands
    from rolloutd.trainer_client import RolloutClient

    client = (
        await RolloutClient.connect(
            args.address or settings.temporal_address, namespace=settings.temporal_namespace
        )
    ).client
    if args.command == "generate":
        spec = commands.load_spec(
            args.spec,
            {
                "name": args.name,
                "source.limit": args.limit,
                "template.num_samples": args.num_samples,
                "outputs.dir": args.out,
            },
        )
        summary = await commands.generate(
            client, spec, task_queue=args.task_queue, console=tables.console()
        )
        tables.show(
            summary_table(summary),
            *(f"{kind}: {path}" for kind, path in summary.outputs.items()),
        )
        return 0 if summary.num_rows_failed == 0 else 1
    action = args.schedule_command
    if action == "create":
        spec = commands.load_spec(args.spec)
        sid = await commands.create_schedule(
            client,
            spec,
            cron=args.cron,
            every=args.every,
            task_queue=args.task_queue,
            paused=args.paused,
        )
        print(f"schedule {sid} created")
    elif action == "list":
        tables.show(
            tables.table(
                "schedule",
                "paused",
                "next",
                tables.num("recent"),
                rows=(
                    (
                        row["id"],
                        "yes" if row["paused"] else "no",
                        ", ".join(row["next"]),
                        row["recent"],
                    )
                    for row in await commands.list_schedules(client)
                ),
            )
        )
    else:
        sid = args.name if args.name.startswith("generation-") else commands.schedule_id(args.name)
        if action == "describe":
            print(json.dumps(await commands.describe_schedule(client, sid), indent=2, default=str))
        else:
            await commands.schedule_command(client, action, sid, getattr(args, "note", None))
            print(f"schedule {sid}: {action} done")
    return 0
