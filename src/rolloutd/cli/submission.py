"""What ``rolloutd submit`` and ``rolloutd demo`` run: read tasks (a JSONL file, or an external
task set), submit them all, wait while showing them live (:mod:`rolloutd.cli.live`) and print
the report (:mod:`rolloutd.cli.report`)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from rolloutd.cli.live import watch
from rolloutd.cli.report import print_report
from rolloutd.errors import FleetUnavailableError, RolloutdError


def load_tasks(path: Path) -> list[dict[str, Any]]:
    """The tasks of a JSONL file: one JSON object a line; blank lines and ``#`` lines skipped.

    Raises:
        SystemExit: a line is not JSON or not an object, naming the file and line.
    """
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                task = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not JSON: {e}") from None
            if not isinstance(task, dict):
                raise SystemExit(f"{path}:{n}: a task is a JSON object, not {type(task).__name__}")
            tasks.append(task)
    return tasks


def read_task_set(path: Path, task_set: str, harness: str, options: str) -> list[dict[str, Any]]:
    """An external task set's rows as TaskRequest dicts (``rolloutd submit --task-set``).

    Args:
        path: the task set (a Harbor folder, a SWE-bench-family file).
        task_set: its kind (``harbor``, ``swebench``; :func:`rolloutd.tasksets.read_task_set`).
        harness: every task's harness: a type, or a HarnessSpec as JSON.
        options: more TaskOptions: JSON, or a .json or .toml file
            (:func:`rolloutd.tasksets.options.options_from`).

    Raises:
        SystemExit: the set or the options are refused, naming the file and the reason.
    """
    from pydantic import ValidationError

    from rolloutd.errors import ConfigError
    from rolloutd.tasksets import read_task_set as read
    from rolloutd.tasksets.options import options_from

    try:
        spec = json.loads(harness) if harness.lstrip().startswith("{") else {"type": harness}
        tasks = read(task_set, path, {"harness": spec, **options_from(options)})
    except (ConfigError, ValidationError, ValueError, OSError) as e:
        raise SystemExit(f"{path}: {e}") from None
    return [task.model_dump(mode="json") for task in tasks]


async def submit_tasks(
    tasks: list[dict[str, Any]],
    address: str,
    store_url: str | None,
    *,
    suffix: str = "",
    namespace: str = "default",
    gateway_url: str | None = None,
) -> list[Any]:
    """Validate every task, submit them all, wait (showing them live: sessions by phase,
    completions, rewards), print a table per session and, under it, what went wrong
    (:func:`what_went_wrong`).

    Args:
        tasks: TaskRequest dicts.
        address: Temporal address.
        store_url: blob store (to count trainable tokens).
        suffix: appended to every task_id (so a demo can run again).
        namespace: Temporal namespace.
        gateway_url: the gateway's base URL: a dead engine ends the wait (below).

    Returns:
        The TaskResults.

    Raises:
        InvalidTaskError: before any workflow starts, when any task is malformed.
        SystemExit: no Temporal answers at ``address``; a fleet died while waiting
            (``FleetUnavailableError``, within a minute; the tasks keep running and complete
            once it is back).
    """
    from rolloutd.trainer_client import RolloutClient, validate_task

    requests = []
    for i, task in enumerate(tasks):
        task = dict(task)
        if suffix and "task_id" in task:
            task["task_id"] = f"{task['task_id']}{suffix}"
        try:
            requests.append(validate_task(task))
        except Exception as e:  # noqa: BLE001 - boundary
            raise SystemExit(f"task {i}: {e}") from None
    try:
        client = await RolloutClient.connect(
            address, namespace=namespace, store_url=store_url, gateway_url=gateway_url
        )
    except RuntimeError as e:  # temporalio's "Failed client connect": nothing answers there
        raise SystemExit(
            f"no Temporal answers at {address} ({e}): start the stack (`rolloutd up`; "
            "`rolloutd status` says when it runs), or name where Temporal runs (--address, "
            "ROLLOUTD_TEMPORAL_ADDRESS)"
        ) from None
    try:  # what no registered host can run is refused before any task starts
        requests = await client.check_tasks(requests)
    except RolloutdError as e:
        raise SystemExit(str(e)) from None
    t0 = time.monotonic()
    handles = [await client.submit(r, check_capabilities=False) for r in requests]
    try:  # a live view while waiting (rolloutd.cli.live): rich on a terminal,
        # plain lines on stderr otherwise, so a script's stdout stays as it was
        results = await watch(
            client, [h.task_id for h in handles], asyncio.gather(*(h.result() for h in handles))
        )
    except FleetUnavailableError as e:
        raise SystemExit(
            f"{e} (the tasks keep running: {', '.join(h.task_id for h in handles)})"
        ) from None
    print_report(results, time.monotonic() - t0)
    return results
