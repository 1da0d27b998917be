"""``rolloutd doctor``: what rolloutd needs on this host, each thing found or not and how to fix
what is missing (:mod:`rolloutd.cli.checks`); exit status 1 when something is missing."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import ADDRESS_HELP, HOME_HELP, STORE_URL_HELP, add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``doctor`` and its options."""
    doctor = add_command(
        sub,
        "doctor",
        "check what rolloutd needs on this host (sandboxes, containers, harness CLIs, ports, "
        "Temporal, the store, the engine, disk space) and say how to fix each miss",
        run,
        extras=("server",),
    )
    doctor.add_argument("--home", type=Path, default=None, help=HOME_HELP)
    doctor.add_argument(
        "--address",
        default=None,
        help=ADDRESS_HELP + "; checked when given or configured (else `up` starts its own)",
    )
    doctor.add_argument("--store-url", default=None, help=STORE_URL_HELP)
    doctor.add_argument(
        "--engine-url",
        default=None,
        help="an engine to check, or several comma-separated (each must answer as "
        "--engine-kind and serve --model); None: $ROLLOUTD_BACKEND_URL, the running `up` "
        "stack's, else what `up` starts (llama-server and the pulled catalog model)",
    )
    doctor.add_argument(
        "--engine-kind",
        choices=("llama_cpp", "vllm", "sglang", "openai"),
        default=None,
        help="the kind of --engine-url's servers; None: the running `up` stack's engine's, "
        "else $ROLLOUTD_BACKEND_TYPE",
    )
    doctor.add_argument(
        "--model",
        default=None,
        help="the catalog model `up` serves, or the name the engine serves; None: "
        "$ROLLOUTD_MODEL or qwen2.5-coder-0.5b",
    )
    doctor.add_argument(
        "--json",
        action="store_true",
        help="print the rows as JSON (a list of {name, status, detail, fix}) instead of the table",
    )
    doctor.add_argument(
        "--tokenizer",
        default=None,
        help="a catalog name, a folder with a saved tokenizer, or a Hugging Face repo id; "
        "None: --model",
    )


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Run every check, print the table (or, with ``--json``, the rows).

    Returns:
        1 when a check found something missing, else 0.
    """
    from rolloutd.cli import checks
    from rolloutd.cli.commands import up
    from rolloutd.settings import (
        GatewaySettings,
        SandboxSettings,
        default_cache,
        default_home,
        engine_api_key_file,
    )
    from rolloutd.stack import read_state
    from rolloutd.stack.local import LocalStack

    home = args.home or default_home()
    sandbox = SandboxSettings()
    gateway = GatewaySettings()
    state = read_state(home)
    stack = state if state is not None and state.phase == "running" and state.alive() else None
    defaults = {f.name: f.default for f in dataclasses.fields(LocalStack)}
    up_parser = argparse.ArgumentParser()
    up.register(up_parser.add_subparsers())
    metrics = up_parser.parse_args(["up"]).metrics_port  # `up`'s own default
    ports = {
        defaults["temporal_port"]: "Temporal",
        defaults["ui_port"]: "Temporal UI",
        defaults["gateway_port"]: "gateway",
    }
    engine_url = args.engine_url or gateway.backend_url
    engine_key = gateway.backend_api_key
    kind: str = gateway.backend_type if gateway.backend_type != "verl" else "openai"
    # the engine a running stack uses without running it: its kind, model and tokenizer
    own = stack.external_engine if stack is not None and engine_url is None else None
    if own is not None:
        engine_url, kind = ",".join(own.urls), own.kind
    elif stack is not None and engine_url is None:
        engine_url = stack.engine.url if stack.engine else stack.backend_url
        key_file = engine_api_key_file(home)
        if stack.engine and key_file.is_file():
            engine_key = key_file.read_text().strip()
    if engine_url is None or stack is not None:
        ports[defaults["engine_port"]] = "engine"
    if metrics:
        from rolloutd.workers import FLEETS

        for i, fleet in enumerate(FLEETS):
            ports[metrics + i] = f"{fleet} metrics"
    configured = "temporal_address" in settings.model_fields_set
    address = args.address or (settings.temporal_address if configured else None)
    if address is None and stack is not None:
        address = stack.temporal_address
    model = args.model or (own.model if own is not None else gateway.model)
    tokenizer = args.tokenizer or (own.tokenizer if own is not None else None)
    store_url = (
        settings.store_url if "store_url" in settings.model_fields_set else str(home / "store")
    )
    target = checks.Target(
        home=home,
        cache=default_cache(),
        runtime_root=Path(sandbox.runtime_root),
        policy=sandbox.sandbox_policy,
        address=address,
        namespace=settings.temporal_namespace,
        store_url=args.store_url or (stack.store_url if stack else None) or store_url,
        engine_url=engine_url,
        engine_api_key=engine_key,
        model=model,
        tokenizer=tokenizer or gateway.tokenizer or model,
        tokenizer_revision=own.tokenizer_revision
        if own is not None and not args.tokenizer
        else gateway.tokenizer_revision,
        engine_kind=args.engine_kind or kind,
        ports=ports,
        stack_pid=stack.pid if stack is not None else None,
    )
    rows = checks.run_checks(target)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
    else:
        from rolloutd.cli import tables

        tables.show(checks.render(rows))
    return 1 if any(r.status == "miss" for r in rows) else 0
