"""Shared fixtures: a real Temporal dev server, a real llama-server, and the four fleets.

Everything a fixture starts, it stops by its id at the end of the session.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rolloutd.stack import TemporalDevServer

#: the sandbox policy of every fleet the tests build (in this process and in the worker
#: processes they start, which inherit it): the stack tests build turns the `local` runtime and
#: the host network on explicitly (the policy's defaults refuse both: tests/security), and lets
#: uploads and image folders come from the temporary folder where tests make them
TEST_SANDBOX_POLICY = {
    "runtimes": ["local", "bwrap", "podman", "apptainer", "docker"],
    "networks": ["gateway", "none", "host"],
    "image_roots": ["/tmp"],
    "upload_sources": ["/tmp"],
}
#: the operator's evaluators of the test stack, by name (a task never names an import path)
TEST_EVALUATORS = {
    "tests_raising": "tests.support.raising_evaluator:RaisingEvaluator",
    "tests_slow": "tests.reliability.slow_evaluator:SlowEvaluator",
    "tests_humaneval_r1": "tests.support.old_evaluators:HumanEvalR1",
    "tests_harbor_r1": "tests.support.old_evaluators:HarborR1",
}
os.environ.setdefault("ROLLOUTD_SANDBOX_POLICY", json.dumps(TEST_SANDBOX_POLICY))
os.environ.setdefault("ROLLOUTD_EVALUATORS", json.dumps(TEST_EVALUATORS))
#: no payload codec unless a test sets keys: a key `rolloutd up` generated in this machine's
#: home ({home}/codec_keys, read where no key is configured) must not reach the test processes
os.environ.setdefault("ROLLOUTD_CODEC_KEYS", "")
#: a home of the tests' own: what `rolloutd up` left in this machine's home (its admin token,
#: codec key and reliability records) must not reach the processes the tests start
os.environ["ROLLOUTD_HOME"] = tempfile.mkdtemp(prefix="rolloutd-tests-home-")
atexit.register(shutil.rmtree, os.environ["ROLLOUTD_HOME"], ignore_errors=True)


@pytest.fixture(scope="session")
def temporal_server() -> Iterator[TemporalDevServer]:
    """A Temporal dev server (in memory, headless) with rolloutd's search attributes."""
    server = TemporalDevServer(headless=True).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def engine():  # -> LlamaServer
    """llama-server serving Qwen2.5-Coder-0.5B-Instruct (the acceptance model)."""
    from rolloutd.engine.server import LlamaServer

    server = LlamaServer("qwen2.5-coder-0.5b", parallel=4, ctx_size=65536).start(timeout_s=180)
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Fleets:
    """The in-process fleets of a test session."""

    client: object
    store_url: str
    gateway_url: str
    runtime_root: Path
    engine_url: str
    engine_tee: object
    harness_tee: object
    #: the process's metrics port (all four fleets run in this process): docs/metrics.md
    metrics_url: str = ""


@pytest.fixture(scope="session")
async def fleets(temporal_server, engine, tmp_path_factory) -> AsyncIterator[Fleets]:
    """All four fleets in this process against the real Temporal server and engine."""
    from rolloutd.settings import EvalSettings, GatewaySettings, SandboxSettings
    from rolloutd.stack import free_port
    from rolloutd.workers import connect, run_fleet
    from tests.support.tee import Tee

    home = tmp_path_factory.mktemp("rolloutd")
    common = {
        "temporal_address": temporal_server.address,
        "store_url": str(home / "store"),
        "host_id": "test-host",
        "log_json": False,
        # the fleets' Prometheus metrics and the Temporal SDK's (tests/observability)
        "metrics_port": free_port(),
        "metrics_host": "127.0.0.1",
    }
    port = free_port()
    # engine_tee records what llama-server really answered; harness_tee what harnesses got.
    engine_tee = await Tee(engine.url).start()
    harness_tee = await Tee(f"http://127.0.0.1:{port}").start()
    gateway_settings = GatewaySettings(
        **common,
        gateway_port=port,
        backend_url=engine_tee.url,
        gateway_public_url=harness_tee.url,
        model="qwen2.5-coder-0.5b",
        tool_parser="hermes_lenient",
    )
    # tests on these fleets hold many sessions open at once (gated harnesses): a host bound
    # above all of them (tests/workflows/test_tenancy.py checks the bound on fleets of its own)
    sandbox_settings = SandboxSettings(
        **common, runtime_root=str(home / "runtimes"), max_concurrent_sessions=64
    )
    client = await connect(gateway_settings)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(run_fleet("gateway", client, gateway_settings))
        await stack.enter_async_context(run_fleet("sandbox", client, sandbox_settings))
        # the tests' receivers listen on loopback: allowed here, as an operator would list
        # the trainers' hosts (none are allowed by default)
        eval_settings = EvalSettings(**common, callback_allowed_hosts=["127.0.0.1", "localhost"])
        await stack.enter_async_context(run_fleet("eval", client, eval_settings))
        await stack.enter_async_context(run_fleet("workflows", client, gateway_settings))
        yield Fleets(
            client=client,
            store_url=common["store_url"],
            gateway_url=f"http://127.0.0.1:{port}",
            runtime_root=home / "runtimes",
            engine_url=engine.url,
            engine_tee=engine_tee,
            harness_tee=harness_tee,
            metrics_url=f"http://127.0.0.1:{common['metrics_port']}/metrics",
        )
    await harness_tee.stop()
    await engine_tee.stop()


def have_bwrap() -> bool:
    """Whether bubblewrap is installed."""
    return shutil.which("bwrap") is not None
