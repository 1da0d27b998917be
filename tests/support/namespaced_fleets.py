"""The four fleets (gateway, sandbox, eval, workflows) in this process, in a fresh Temporal
namespace of their own, for the tests that need fleets configured apart from the session's
shared ones (a bounded sandbox host, an uncached worker, a gateway backend that misbehaves)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client

from rolloutd.settings import EvalSettings, GatewaySettings, SandboxSettings
from rolloutd.stack import free_port
from rolloutd.workers import FleetHandle, connect, run_fleet
from tests.support.namespaces import fresh_namespace


@dataclass
class NamespacedFleets:
    """Running fleets in their own namespace.

    Attributes:
        client: a Temporal client of the namespace.
        namespace: the namespace's name.
        store_url: the store every fleet writes to.
        handles: fleet name -> its running handle (``sandbox`` only when it runs).
    """

    client: Client
    namespace: str
    store_url: str
    handles: dict[str, FleetHandle] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def namespaced_fleets(
    address: str,
    home: Path,
    backend_url: str,
    *,
    tag: str,
    sandbox: bool = True,
    namespace: str | None = None,
    common: dict[str, Any] | None = None,
    gateway: dict[str, Any] | None = None,
    sandbox_host: dict[str, Any] | None = None,
    eval_host: dict[str, Any] | None = None,
) -> AsyncIterator[NamespacedFleets]:
    """The gateway (its backend at ``backend_url``), sandbox (when ``sandbox``), eval and
    workflows fleets, started in that order in a fresh namespace named after ``tag``, and
    stopped in the reverse order when the block exits.

    Args:
        address: the Temporal server's address.
        home: a folder for the store (``home / "store"``).
        backend_url: the gateway's backend.
        tag: names the namespace, the host (``{tag}-host``) and the runtime root.
        sandbox: run the sandbox fleet.
        namespace: a namespace registered already (:func:`fresh_namespace`); None: a fresh
            one named after ``tag``.
        common: more settings every fleet takes (``max_cached_workflows``).
        gateway: more gateway settings (``max_sessions_per_slot``).
        sandbox_host: more sandbox settings (``max_concurrent_sessions``).
        eval_host: more eval settings (``max_concurrent_judgings``).
    """
    namespace = namespace or await fresh_namespace(address, tag)
    shared = {
        "temporal_address": address,
        "temporal_namespace": namespace,
        "store_url": str(home / "store"),
        "host_id": f"{tag}-host",
        "log_json": False,
        **(common or {}),
    }
    port = free_port()
    gateway_settings = GatewaySettings(
        **shared,
        gateway_port=port,
        backend_url=backend_url,
        gateway_public_url=f"http://127.0.0.1:{port}",
        model="qwen2.5-coder-0.5b",
        **(gateway or {}),
    )
    client = await connect(gateway_settings)
    fleets = NamespacedFleets(client, namespace, shared["store_url"])
    async with contextlib.AsyncExitStack() as stack:
        fleets.handles["gateway"] = await stack.enter_async_context(
            run_fleet("gateway", client, gateway_settings)
        )
        if sandbox:
            # a short root: a runtime's unix sockets live under it (108 bytes at most)
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix=f"{tag[:4]}-"))
            fleets.handles["sandbox"] = await stack.enter_async_context(
                run_fleet(
                    "sandbox",
                    client,
                    SandboxSettings(**shared, runtime_root=root, **(sandbox_host or {})),
                )
            )
        fleets.handles["eval"] = await stack.enter_async_context(
            run_fleet("eval", client, EvalSettings(**shared, **(eval_host or {})))
        )
        fleets.handles["workflows"] = await stack.enter_async_context(
            run_fleet("workflows", client, gateway_settings)
        )
        yield fleets
