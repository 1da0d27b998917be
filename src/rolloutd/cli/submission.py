"""What ``rolloutd submit``, ``rolloutd eval`` and ``rolloutd demo`` run: read tasks (a JSONL
file, or an external task set), start them or follow the ones already started under the same
ids, wait while showing them live (:mod:`rolloutd.cli.live`), and print the report
(:mod:`rolloutd.cli.report`).

Task ids are business keys: a task id that already names a workflow is followed, not started
again (its group is read when it has ended, awaited while it runs). So a second ``rolloutd
submit`` of one file re-attaches to the first one's tasks, and an interrupted ``rolloutd eval
--resume`` starts only what never started. Nothing here ends a task: an interrupt (Ctrl-C)
stops waiting and leaves every task running (:func:`interrupted_message`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import WorkflowAlreadyStartedError

from rolloutd.cli.live import RunView, watch, watch_run
from rolloutd.cli.report import print_report
from rolloutd.errors import FleetUnavailableError, RolloutdError
from rolloutd.scoring import failure_counts
from rolloutd.trainer_client.health import watch as watch_fleets
from rolloutd.types import TaskRequest, TaskResult

#: the exit status of a command stopped by Ctrl-C (SIGINT): 128 + the signal's number, as
#: POSIX shells report a process ended by a signal (tasks keep running)
INTERRUPTED_EXIT = 130


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


def validate_tasks(tasks: Sequence[dict[str, Any]], suffix: str = "") -> list[TaskRequest]:
    """Validate every task before any starts, ``suffix`` appended to each task id.

    Raises:
        SystemExit: a task is malformed, naming its position and fields.
    """
    from rolloutd.trainer_client import validate_task

    requests = []
    for i, task in enumerate(tasks):
        task = dict(task)
        if suffix and "task_id" in task:
            task["task_id"] = f"{task['task_id']}{suffix}"
        try:
            requests.append(validate_task(task))
        except Exception as e:  # noqa: BLE001 - boundary
            raise SystemExit(f"task {i}: {e}") from None
    return requests


@dataclass
class TaskRun:
    """A run of tasks as it goes: what was started, what was followed, what arrived. The
    caller keeps it, so that an interrupt can say what is still running.

    Attributes:
        requests: every task of the run, in order.
        started: tasks this run started.
        attached: tasks that already ran under their id: followed, not started again.
        results: the groups that arrived, by task id.
        ended: tasks whose workflow ended without a group (``cancelled`` or ``failed``:
            someone cancelled or terminated it), with its words; their ``results`` hold the
            sessions that ended before.
        done: tasks the caller had already (a results file): neither started nor followed.
    """

    requests: list[TaskRequest]
    started: list[str] = field(default_factory=list)
    attached: list[str] = field(default_factory=list)
    results: dict[str, TaskResult] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)

    @property
    def running(self) -> list[str]:
        """Tasks started or followed whose group has not arrived."""
        return [t for t in (*self.attached, *self.started) if t not in self.results]

    def ordered_results(self) -> list[TaskResult]:
        """The groups that arrived, in the tasks' order."""
        return [self.results[r.task_id] for r in self.requests if r.task_id in self.results]


async def start_or_follow(client: Any, request: TaskRequest) -> bool:
    """Start a task, or follow the workflow its id already names.

    Returns:
        True when the task already ran under its id (followed), False when started now.
    """
    try:
        await client.submit(request, check_capabilities=False)
    except WorkflowAlreadyStartedError:
        return True
    return False


async def group_of(client: Any, task_id: str) -> tuple[TaskResult, str | None]:
    """Wait for a task's group.

    Returns:
        ``(group, None)`` when its workflow returned one; ``(group of the sessions that
        ended, why)`` when it ended without one (cancelled, terminated, failed).
    """
    try:
        return await client.whole(await client.get_handle(task_id).result()), None
    except WorkflowFailureError:
        progress = await client.status(task_id)
        group = TaskResult(
            task_id=task_id,
            sessions=progress.sessions,
            replaced=progress.replaced,
            num_sessions=len(progress.sessions),
            num_failed_by_kind=failure_counts(progress.sessions),
        )
        return group, f"{progress.status}: {progress.error or 'no group'}"


async def run_tasks(
    client: Any,
    run: TaskRun,
    view: RunView,
    *,
    concurrency: int | None = None,
    on_group: Callable[[TaskRequest, TaskResult], None] | None = None,
) -> None:
    """Start (or follow) every task of ``run`` not in ``run.done``, at most ``concurrency``
    sessions in flight (None: all at once; a task larger than the bound runs alone), in
    order, and wait for each group; ``on_group`` is called as each arrives.

    Raises:
        Whatever a start or a wait raises (the tasks already started keep running).
    """
    pending = deque(r for r in run.requests if r.task_id not in run.done)
    flights: dict[asyncio.Task[None], int] = {}
    in_flight = 0

    async def one(request: TaskRequest) -> None:
        followed = await start_or_follow(client, request)
        (run.attached if followed else run.started).append(request.task_id)
        view.started(request.task_id)
        group, ended = await group_of(client, request.task_id)
        if ended is not None:
            run.ended[request.task_id] = ended
        run.results[request.task_id] = group
        view.arrived(group)
        if on_group is not None:
            on_group(request, group)

    try:
        while pending or flights:
            while pending and (
                not flights
                or concurrency is None
                or in_flight + min(pending[0].num_samples, concurrency) <= concurrency
            ):
                request = pending.popleft()
                need = (
                    request.num_samples
                    if concurrency is None
                    else min(request.num_samples, concurrency)
                )
                in_flight += need
                flights[asyncio.ensure_future(one(request))] = need
            finished, _ = await asyncio.wait(flights, return_when=asyncio.FIRST_COMPLETED)
            for flight in finished:
                in_flight -= flights.pop(flight)
                flight.result()
    finally:
        for flight in flights:
            flight.cancel()
        if flights:
            await asyncio.gather(*flights, return_exceptions=True)


async def wait_run(
    client: Any,
    run: TaskRun,
    *,
    concurrency: int | None = None,
    on_group: Callable[[TaskRequest, TaskResult], None] | None = None,
    details: bool = False,
    view_total: int | None = None,
) -> None:
    """Run the tasks (:func:`run_tasks`) under the live view and one fleet-health watch
    (a dead fleet ends the wait with ``FleetUnavailableError`` within a minute).

    Args:
        client: a connected :class:`~rolloutd.trainer_client.RolloutClient`.
        run: the run.
        concurrency: sessions in flight at most.
        on_group: called as each group arrives.
        details: the per-task view instead of the overall bar (it asks every task in turn).
        view_total: sessions the bar counts (default: those of the tasks not ``done``).
    """
    todo = [r for r in run.requests if r.task_id not in run.done]
    view = RunView(total=view_total or sum(r.num_samples for r in todo))
    work = watch_fleets(
        run_tasks(client, run, view, concurrency=concurrency, on_group=on_group),
        client.fleet_health,
    )
    if details:
        await watch(client, [r.task_id for r in todo], work)
    else:
        await watch_run(client, view, work)


async def connect(
    address: str,
    store_url: str | None,
    namespace: str,
    gateway_url: str | None,
    *,
    codec_key_file: Path | None = None,
) -> Any:
    """A :class:`~rolloutd.trainer_client.RolloutClient` for a command.

    Args:
        codec_key_file: the payload codec's key file of a stack started on another home
            than the default one (``--home``), used when no ``ROLLOUTD_CODEC_KEYS`` /
            ``ROLLOUTD_CODEC_KEY_FILE`` says otherwise; None: the settings' (the default
            home's key where it exists, :func:`rolloutd.security.connection.payload_codec`).

    Raises:
        SystemExit: no Temporal answers at ``address``, naming it and what to do.
    """
    from rolloutd.settings import CommonSettings
    from rolloutd.trainer_client import RolloutClient

    settings = CommonSettings()
    if codec_key_file is not None and settings.codec_keys is None and not settings.codec_key_file:
        settings = settings.model_copy(update={"codec_key_file": str(codec_key_file)})
    try:
        return await RolloutClient.connect(
            address,
            namespace=namespace,
            store_url=store_url,
            gateway_url=gateway_url,
            settings=settings,
        )
    except RuntimeError as e:  # temporalio's "Failed client connect": nothing answers there
        raise SystemExit(
            f"no Temporal answers at {address} ({e}): start the stack (`rolloutd up`; "
            "`rolloutd status` says when it runs), or name where Temporal runs (--address, "
            "ROLLOUTD_TEMPORAL_ADDRESS)"
        ) from None


async def submit_tasks(
    tasks: list[dict[str, Any]],
    address: str,
    store_url: str | None,
    *,
    suffix: str = "",
    namespace: str = "default",
    gateway_url: str | None = None,
    run: TaskRun | None = None,
    on_group: Callable[[TaskRequest, TaskResult], None] | None = None,
    details: bool = False,
    codec_key_file: Path | None = None,
) -> list[TaskResult]:
    """Validate every task, start each one (or follow the task its id already names), wait
    (showing them live), print a table per session and, under it, what went wrong
    (:func:`rolloutd.cli.report.what_went_wrong`).

    Args:
        tasks: TaskRequest dicts.
        address: Temporal address.
        store_url: blob store (to count trainable tokens).
        suffix: appended to every task_id (new ids: a run afresh).
        namespace: Temporal namespace.
        gateway_url: the gateway's base URL: a dead engine ends the wait (below).
        run: where the run's state goes (the caller's, to say what runs on an interrupt);
            None: a new one.
        on_group: called as each group arrives (the results file).
        details: the per-task live view.
        codec_key_file: the payload codec's key of a stack on another home than the default
            one (:func:`connect`).

    Returns:
        The TaskResults, in the tasks' order.

    Raises:
        InvalidTaskError: before any workflow starts, when any task is malformed.
        SystemExit: no Temporal answers at ``address``; a fleet died while waiting
            (``FleetUnavailableError``, within a minute; the tasks keep running and complete
            once it is back).
        KeyboardInterrupt: Ctrl-C; the tasks keep running (``run`` says which).
    """
    requests = validate_tasks(tasks, suffix)
    client = await connect(
        address, store_url, namespace, gateway_url, codec_key_file=codec_key_file
    )
    try:  # what no registered host can run is refused before any task starts
        requests = await client.check_tasks(requests)
    except RolloutdError as e:
        raise SystemExit(str(e)) from None
    if run is None:
        run = TaskRun(requests)
    else:
        run.requests = requests
    t0 = time.monotonic()
    try:
        await wait_run(client, run, on_group=on_group, details=details)
    except FleetUnavailableError as e:
        raise SystemExit(f"{e} (the tasks keep running: {', '.join(run.running)})") from None
    results = run.ordered_results()
    if run.attached:
        print(
            f"followed {len(run.attached)} task(s) started before under the same id "
            "(--fresh starts them afresh under new ids)"
        )
    print_report(results, time.monotonic() - t0)
    for task_id, why in run.ended.items():
        print(f"note: task {task_id}: its workflow ended without a group ({why})")
    return results


def interrupted_message(
    run: TaskRun, resume: str, command: str = "rolloutd submit", cancel: str | None = None
) -> str:
    """What a command says when Ctrl-C stopped its wait: nothing was cancelled; how to
    follow the tasks again and how to cancel them.

    Args:
        run: the run's state.
        resume: the command line that follows them again.
        command: the interrupted command's name.
        cancel: the command line that cancels them (None: ``rolloutd tasks cancel`` with
            the running tasks' ids).
    """
    order = {r.task_id: i for i, r in enumerate(run.requests)}
    # in the task file's order, whichever started first
    running = sorted(run.running, key=lambda task_id: order.get(task_id, len(order)))
    known = {*running, *run.results, *run.done}
    not_started = sum(r.task_id not in known for r in run.requests)
    counts = [f"{len(running)} task(s) keep running"]
    if run.results:
        counts.append(f"{len(run.results)} ended")
    if not_started:
        counts.append(f"{not_started} not started")
    lines = [
        f"{command}: interrupted (Ctrl-C); nothing was cancelled: {', '.join(counts)}.",
        f"  follow them again: {resume}",
    ]
    if running:
        shown = " ".join(running[:20]) + (" ..." if len(running) > 20 else "")
        lines.append(f"  cancel them:       {cancel or f'rolloutd tasks cancel {shown}'}")
        lines.append("  look at one:       rolloutd tasks show TASK_ID")
    return "\n".join(lines)
