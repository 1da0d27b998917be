"""``rolloutd doctor``'s checks of what the stack needs (:mod:`rolloutd.cli.checks`): the ports
``rolloutd up`` binds, Temporal, the store, the engine and its tokenizer, and disk space."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import uuid
from pathlib import Path

from rolloutd.cli.checks.rows import (
    PROBE_TIMEOUT_S,
    Check,
    Target,
    checked_runtimes,
    miss,
    ok,
    run_command,
    skipped,
)
from rolloutd.errors import RolloutdError

#: free space each file system rolloutd writes to should keep, GiB: the catalog models
#: (0.6 GB), the base image and task images (0.3 GB and up each), runtimes' workspaces and the
#: store's completion logs.
MIN_FREE_GB = 5.0


# -- the stack ---------------------------------------------------------------------------------


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` can be bound now (a listener on any address takes it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(target: Target) -> list[Check]:
    """The ports ``rolloutd up`` binds: free, or held by the ``up`` running on this home."""
    rows = []
    for port, what in sorted(target.ports.items()):
        name = f"port {port} ({what})"
        if port_free(port):
            rows.append(ok(name, "free"))
        elif target.stack_pid is not None:
            rows.append(ok(name, f"in use by the running `rolloutd up` (pid {target.stack_pid})"))
        else:
            rows.append(
                miss(
                    name,
                    "taken by another process",
                    f"stop it (`ss -ltnp 'sport = :{port}'` names it), or run `rolloutd up` "
                    "where the port is free",
                )
            )
    return rows


def check_temporal(target: Target) -> list[Check]:
    """Temporal answers at the configured address (with the project's client settings)."""
    name = "temporal"
    if target.address is None:
        return [
            skipped(
                name,
                "no address configured (ROLLOUTD_TEMPORAL_ADDRESS, --address) and no stack "
                "running: `rolloutd up` starts its own",
            )
        ]
    from rolloutd.security.connection import connect_temporal

    async def probe() -> None:
        client = await asyncio.wait_for(
            connect_temporal(address=target.address, namespace=target.namespace),
            PROBE_TIMEOUT_S,
        )
        await asyncio.wait_for(client.count_workflows("WorkflowId = 'rolloutd-doctor'"), 10)

    try:
        asyncio.run(probe())
    except (RuntimeError, TimeoutError, RolloutdError) as e:
        return [
            miss(
                name,
                f"no answer at {target.address} (namespace {target.namespace}): {e}",
                "start it (`rolloutd up`, or `temporal server start-dev`), or set "
                "ROLLOUTD_TEMPORAL_ADDRESS / --address to where it runs",
            )
        ]
    return [ok(name, f"answers at {target.address} (namespace {target.namespace})")]


def check_store(target: Target) -> list[Check]:
    """A probe object written, read back and deleted at the store's URL."""
    from rolloutd.store import BlobStore

    name = "store"
    key = f".doctor/{uuid.uuid4().hex}"
    data = os.urandom(16)
    try:
        store = BlobStore(target.store_url)
        store.put_bytes(key, data)
        read = store.get_bytes(key)
        store.fs.rm(f"{store.root.rstrip('/')}/{key}")
    except (OSError, ValueError, RolloutdError) as e:
        return [
            miss(
                name,
                f"{target.store_url}: {e!r}",
                "make it writable by rolloutd's processes, or set ROLLOUTD_STORE_URL to a "
                "folder or bucket they may write",
            )
        ]
    if read != data:
        return [miss(name, f"{target.store_url}: read back other bytes", "check the store")]
    return [ok(name, f"{target.store_url}: a probe object written, read back and deleted")]


def check_engine(target: Target) -> list[Check]:
    """The engine: an external one answers and serves the model; or what ``up`` starts
    (llama-server and the pulled catalog model); then the tokenizer."""
    rows = _external_engine(target) if target.engine_url else _own_engine(target)
    rows.append(_tokenizer(target))
    return rows


def _own_engine(target: Target) -> list[Check]:
    from rolloutd.engine.models import CATALOG, model_files, verify_gguf
    from rolloutd.engine.server import llama_server_binary
    from rolloutd.errors import ConfigError

    rows = []
    try:
        binary = llama_server_binary()
    except ConfigError as e:
        rows.append(miss("llama-server", e.message, "scripts/setup.sh builds it"))
    else:
        code, out = run_command([str(binary), "--version"])
        line = next((x for x in out.splitlines() if x.startswith("version")), out[-120:])
        rows.append(
            ok("llama-server", f"{line} at {binary}")
            if code == 0
            else miss("llama-server", f"{binary} --version failed: {out[-300:]}", "rebuild it")
        )
    name = f"model {target.model}"
    if target.model not in CATALOG:
        rows.append(
            miss(
                name,
                f"{target.model!r} is not a catalog model (rolloutd models list)",
                "name a catalog model, or an engine you run (--engine-url)",
            )
        )
        return rows
    files = model_files(target.model, target.cache)
    if not files.gguf.is_file():
        rows.append(
            miss(name, f"not pulled ({files.gguf})", f"rolloutd models pull {target.model}")
        )
        return rows
    try:
        verify_gguf(CATALOG[target.model], files.gguf)
    except ConfigError as e:
        return [*rows, miss(name, e.message, f"rolloutd models pull {target.model}")]
    rows.append(ok(name, f"{files.gguf}, sha256 as the catalog pins"))
    return rows


def _external_engine(target: Target) -> list[Check]:
    """Each URL answers as its kind (:func:`rolloutd.stack.engine_check.check_engine`) and
    lists the model by the name the gateway will ask for."""
    from rolloutd.engine.models import CATALOG
    from rolloutd.stack.engine_check import check_engines, kind_route

    served = CATALOG[target.model].served_name if target.model in CATALOG else target.model
    urls = [u.strip().rstrip("/") for u in (target.engine_url or "").split(",") if u.strip()]
    kind = target.engine_kind
    rows = []
    for c in check_engines([(kind, url, target.engine_api_key) for url in urls]):
        name = "engine" if len(urls) == 1 else f"engine {c.url}"
        if not c.answers:
            fix = "start the engine, or point ROLLOUTD_BACKEND_URL / --engine-url at it"
            rows.append(miss(name, f"{c.url} {c.describe()}", fix))
        elif not c.is_kind:
            fix = (
                f"name the server's kind (ROLLOUTD_BACKEND_TYPE / --engine-kind): a {kind} "
                f"server answers {kind_route(kind)}"
            )
            rows.append(miss(name, f"{c.url} {c.describe()}", fix))
        elif served not in c.models:
            rows.append(
                miss(
                    name,
                    f"{c.url} serves {', '.join(c.models) or 'no model'}, not {served}",
                    "serve that model (llama-server --alias, vLLM --served-model-name), or "
                    "name the one it serves",
                )
            )
        else:
            rows.append(ok(name, f"{c.url} answers as {kind} and serves {served}"))
    return rows


def _tokenizer(target: Target) -> Check:
    """The tokenizer loads (a catalog model's saved folder, a folder, or a repo id)."""
    from rolloutd.engine.models import CATALOG, model_files

    name = f"tokenizer {target.tokenizer}"
    if target.tokenizer in CATALOG:
        path = model_files(target.tokenizer, target.cache).tokenizer
        if not (path / "tokenizer_config.json").is_file():
            return miss(name, f"not saved yet ({path})", f"rolloutd models pull {target.tokenizer}")
        source = str(path)
    else:
        source = target.tokenizer
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=target.tokenizer_revision)
    except (OSError, ValueError) as e:
        return miss(
            name,
            f"{source}: {str(e)[:300]}",
            "name a catalog model, a folder with a saved tokenizer, or a Hugging Face repo "
            "id this host can download",
        )
    template = "with" if tokenizer.chat_template else "WITHOUT"
    return ok(name, f"{source}: {len(tokenizer)} tokens, {template} a chat template")


def check_disk_space(target: Target) -> list[Check]:
    """Free space on each file system rolloutd writes to (home, cache, runtimes, podman's
    storage)."""
    places: dict[str, Path] = {
        "home": target.home,
        "cache": target.cache,
        "runtimes": target.runtime_root,
    }
    graph_root = Path("/var/lib/containers/storage")
    if "podman" in checked_runtimes(target.policy) and graph_root.exists():
        places["podman storage"] = graph_root
    seen: dict[int, list[str]] = {}
    found: dict[int, Path] = {}
    for what, path in places.items():
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        device = existing.stat().st_dev
        seen.setdefault(device, []).append(what)
        found.setdefault(device, existing)
    rows = []
    for device, whats in seen.items():
        usage = shutil.disk_usage(found[device])
        free_gb = usage.free / 2**30
        where = (
            f"{', '.join(whats)} on {found[device]}: {free_gb:.1f} GiB free of "
            f"{usage.total / 2**30:.0f} GiB"
        )
        rows.append(
            ok("disk space", where)
            if free_gb >= MIN_FREE_GB
            else miss(
                "disk space",
                f"{where}, under {MIN_FREE_GB:.0f} GiB",
                "free space there (`rolloutd store gc`, `podman image prune`), or move "
                "ROLLOUTD_HOME / ROLLOUTD_CACHE",
            )
        )
    return rows
