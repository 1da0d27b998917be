"""``rolloutd up | worker | engine | models | submit | rest | view | quota | codec-server |
codec-key | demo | generate | schedule | store``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rolloutd.cli_parser import build_parser, package_version  # noqa: F401 - re-exported
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
from rolloutd.settings import (
    CommonSettings,
    EngineSettings,
    admin_token_file,
    codec_server_token_file,
    default_home,
)


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
                task = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{path}:{n}: not JSON: {e}") from None
            if not isinstance(task, dict):
                raise SystemExit(f"{path}:{n}: a task is a JSON object, not {type(task).__name__}")
            tasks.append(task)
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
    and the process ends here; see :func:`rolloutd.processes.end_process`)."""
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
    settings = CommonSettings()
    configure_logging(settings.log_level, json=args.command == "worker" and settings.log_json)
    return COMMANDS[args.command](args, settings) or 0


def _settings(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd.settings import settings_markdown

    print(settings_markdown(), end="")
    return 0


def _doctor(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd import doctor as doctor_mod

    return doctor_mod.main(run=args.run)


def _worker(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd.workers import run_process

    try:  # the gateway fleet on uvloop when installed
        run_process(args.fleet, metrics_port=args.metrics_port)
    except RolloutdError as e:  # a setting refused at start: the message, exit 1
        raise SystemExit(f"rolloutd worker --fleet {args.fleet}: {e}") from None
    return 0


def _engine(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd.engine.control import EngineControlServer
    from rolloutd.engine.server import LlamaServer

    token = EngineSettings().control_token
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
    return 0


def _models(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd.engine.models import CATALOG, pull_model

    if args.models_command == "list":
        for name, entry in CATALOG.items():
            print(f"{name}\t{entry.served_name}")
        return 0
    for name in args.names:
        files = pull_model(name)
        print(
            f"{name}: {files.gguf} ({files.gguf.stat().st_size} bytes), tokenizer {files.tokenizer}"
        )
    return 0


def _up(args: argparse.Namespace, settings: CommonSettings) -> int:
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
        if stack.codec_key_file is not None:
            codec = payload_codec(
                CommonSettings(codec_keys=None, codec_key_file=str(stack.codec_key_file))
            )
        codec_line = (
            f"on, payloads encrypted with key {codec.key_id}"
            + (f" ({stack.codec_key_file}, generated)" if stack.codec_key_file else "")
            if codec
            else 'off (ROLLOUTD_CODEC_KEYS="": payloads stored in clear; docs/security.md)'
        )
        codec_server = (
            f"{stack.codec_url} (the Temporal UI decodes through it; token in "
            f"{codec_server_token_file(stack.home)})"
            if stack.codec_url
            else "the operator's (ROLLOUTD_UI_CODEC_ENDPOINT)"
            if stack.ui_codec_endpoint
            else "off"
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
            f"Codec server: {codec_server}\n"
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
    return 0


def _status(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd.stack.status import main as status_main

    return status_main(args.home or default_home(), as_json=args.json)


def _submit(args: argparse.Namespace, settings: CommonSettings) -> int:
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


def _quota(args: argparse.Namespace, settings: CommonSettings) -> int:
    return asyncio.run(_quota_main(args, settings))


def _rest(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd.rest import serve

    try:
        serve(
            args.address or settings.temporal_address,
            args.store_url or settings.store_url,
            args.host,
            args.port,
            args.gateway_url,
        )
    except RolloutdError as e:
        raise SystemExit(f"rolloutd rest: {e}") from None
    return 0


def _codec_server(args: argparse.Namespace, settings: CommonSettings) -> int:
    try:
        _serve_codec(args.host, args.port)
    except RolloutdError as e:
        raise SystemExit(f"rolloutd codec-server: {e}") from None
    return 0


def _tenant_token(args: argparse.Namespace, settings: CommonSettings) -> int:
    from pydantic import ValidationError

    from rolloutd.security.tenants import add_tenant_token, new_tenant_token

    try:
        token, entry = new_tenant_token(args.tenant, args.max_priority, args.max_fairness_weight)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in e.errors())
        raise SystemExit(f"rolloutd tenant-token: {problems}") from None
    if args.file is not None:
        add_tenant_token(args.file, entry)
        print(f"added tenant {entry.tenant} to {args.file}", file=sys.stderr)
    else:
        print(entry.model_dump_json(), file=sys.stderr)
    print(token)
    return 0


def _codec_key(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd.security.codec import generate_key

    print(f"key-{time.strftime('%Y%m%d')}-{os.urandom(2).hex()}:{generate_key()}")
    return 0


def _view(args: argparse.Namespace, settings: CommonSettings) -> int:
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


def _generation(args: argparse.Namespace, settings: CommonSettings) -> int:
    try:
        return asyncio.run(_generation_main(args, settings))
    except RolloutdError as e:
        raise SystemExit(f"rolloutd {args.command}: {e}") from None


def _demo(args: argparse.Namespace, settings: CommonSettings) -> int:
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


def _store(args: argparse.Namespace, settings: CommonSettings) -> int:
    """``rolloutd store gc``: prints what was deleted and kept; exit 1 when Temporal could
    not say what is held (then nothing is deleted)."""
    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient
    from rolloutd.trainer_client.retention import gc

    days = args.retention_days or settings.store_retention_days

    async def main() -> int:
        client = (
            await RolloutClient.connect(
                args.address or settings.temporal_address, namespace=settings.temporal_namespace
            )
        ).client
        report = await gc(
            client,
            BlobStore(args.store_url or settings.store_url),
            retention_s=days * 86_400,
            dry_run=args.dry_run,
        )
        verb = "would delete" if report.dry_run else "deleted"
        print(
            f"store gc (retention {days:g} days): {verb} {len(report.deleted)} "
            f"({report.num_bytes / 2**20:.1f} MiB); kept {report.kept_young} younger and "
            f"{len(report.kept_held)} held by a running task or an unacknowledged batch"
        )
        for key in report.deleted:
            print(f"  {verb}: {key}")
        return 0

    return asyncio.run(main())


#: what each command runs: ``handler(args, settings) -> exit status``
COMMANDS: dict[str, Callable[[argparse.Namespace, CommonSettings], int]] = {
    "settings": _settings,
    "doctor": _doctor,
    "worker": _worker,
    "engine": _engine,
    "models": _models,
    "up": _up,
    "status": _status,
    "submit": _submit,
    "quota": _quota,
    "rest": _rest,
    "codec-server": _codec_server,
    "codec-key": _codec_key,
    "tenant-token": _tenant_token,
    "view": _view,
    "generate": _generation,
    "schedule": _generation,
    "demo": _demo,
    "store": _store,
}


if __name__ == "__main__":
    sys.exit(main())
