"""Each fleet's Prometheus metrics after real sessions (docs/metrics.md).

Real parts: the shared Temporal dev server, llama-server, the gateway, bwrap runtimes and the
``shell`` harness (curl calls of the gateway), from tests/conftest.py. The in-process fleets
share one process, so its metrics port (``fleets.metrics_url``) serves the workflows,
sandbox and eval fleets' series and the gateway's ``/metrics`` the same registry; a separate
``rolloutd worker --metrics-port`` process is scraped on its own.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rolloutd.observability import names
from rolloutd.stack import free_port
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus

pytestmark = [pytest.mark.temporal, pytest.mark.engine, pytest.mark.sandbox]

#: one plain and one streamed Chat Completions call per session
TWO_CALLS = (
    'for s in false true; do curl -sS -f "$OPENAI_BASE_URL/chat/completions" '
    "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
    '-d "{\\"model\\": \\"m\\", \\"max_tokens\\": 6, \\"stream\\": $s, '
    '\\"messages\\": [{\\"role\\": \\"user\\", \\"content\\": \\"Say hi $s\\"}]}" '
    "> reply-$s.txt || exit 1; done; sleep 2"
)

Samples = dict[str, dict[frozenset, float]]


def parse(text: str) -> Samples:
    """``sample name -> {labels: value}`` of one scrape's text."""
    out: Samples = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name][frozenset(sample.labels.items())] = sample.value
    return out


def scrape(url: str) -> Samples:
    """One scrape of ``url`` (from a process whose event loop serves nothing)."""
    return parse(httpx.get(url, timeout=30).raise_for_status().text)


async def ascrape(url: str) -> Samples:
    """One scrape of ``url``; the gateway it may ask runs on this test's event loop."""
    async with httpx.AsyncClient(timeout=30) as http:
        return parse((await http.get(url)).raise_for_status().text)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s series whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for k, v in samples.get(name, {}).items() if want <= k)


@pytest.mark.timeout(600)  # the shared engine is slow when other tests load the machine
async def test_each_fleet_exports_what_real_sessions_did(fleets):
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    gateway_metrics = f"{fleets.gateway_url}/metrics"
    before_gw, before = await ascrape(gateway_metrics), await ascrape(fleets.metrics_url)
    task_id = f"metrics-{uuid.uuid4().hex[:6]}"
    handle = await client.submit(
        {
            "task_id": task_id,
            "instruction": "metrics",
            "num_samples": 2,
            "harness": {"type": "shell", "command": TWO_CALLS},
            "runtime": {"type": "bwrap"},
            "evaluator": {"type": "test_on_output", "command": "test -s reply-true.txt"},
        }
    )
    # while the harnesses sleep, the sandbox host shows their runtimes alive, beside any an
    # earlier test left (a session whose workflow was terminated from outside never tears its
    # runtime down)
    earlier = total(before, names.RUNTIMES_ALIVE, host="test-host")
    deadline, alive = time.monotonic() + 60, 0.0
    while alive < earlier + 1 and time.monotonic() < deadline:
        alive = total(await ascrape(fleets.metrics_url), names.RUNTIMES_ALIVE, host="test-host")
        await asyncio.sleep(0.2)
    assert alive >= earlier + 1
    group = await handle.result()
    assert [s.status for s in group.sessions] == [SessionStatus.COMPLETED] * 2
    after_gw, after = await ascrape(gateway_metrics), await ascrape(fleets.metrics_url)
    # the workflows process exports every fleet's liveness from the heartbeats (every 10 s:
    # a fleet of another test's namespace in this process may have set it last)
    fleets_alive, deadline = {}, time.monotonic() + 30
    while time.monotonic() < deadline:
        scraped = await ascrape(fleets.metrics_url)
        fleets_alive = {
            f: total(scraped, names.FLEET_ALIVE, fleet=f)
            for f in ("workflows", "sandbox", "gateway", "eval")
        }
        if set(fleets_alive.values()) == {1}:
            break
        await asyncio.sleep(1)  # polling the scrape, bounded by the deadline
    assert set(fleets_alive.values()) == {1}, fleets_alive

    def delta(name: str, *, gateway: bool = False, **labels: str) -> float:
        a, b = (after_gw, before_gw) if gateway else (after, before)
        return total(a, name, **labels) - total(b, name, **labels)

    # sessions, by harness and status (workflow metrics, the Temporal SDK's exporter)
    started, ended = map(names.counter_series, (names.SESSIONS_STARTED, names.SESSIONS_ENDED))
    assert delta(started, harness="shell") == 2
    assert delta(ended, harness="shell", status="completed") == 2
    # every phase each session went through, with a non-zero duration
    phase = names.SESSION_PHASE_SECONDS
    for name in ("open", "provision", "run", "teardown", "close", "build", "evaluate"):
        assert delta(f"{phase}_count", harness="shell", phase=name) == 2, name
        assert delta(f"{phase}_sum", harness="shell", phase=name) > 0, name
    assert delta(f"{phase}_sum", harness="shell", phase="run") >= 2 * 2  # the sleeps

    # gateway calls and tokens equal the completion logs'
    completions = [
        c for s in group.sessions for c in CompletionLog(client.store, s.session_id).read_all()
    ]
    assert len(completions) == sum(s.num_completions for s in group.sessions) == 4
    calls = names.GATEWAY_CALLS
    assert delta(calls, gateway=True, dialect="openai_chat", status="200") == 4
    assert delta(calls, gateway=True, dialect="openai_chat") == 4
    backend = completions[0].backend
    assert delta(names.GATEWAY_PROMPT_TOKENS, gateway=True, backend=backend) == sum(
        len(c.prompt_ids) for c in completions
    )
    assert (
        delta(names.GATEWAY_SAMPLED_TOKENS, gateway=True, backend=backend)
        == sum(len(c.response_ids) for c in completions)
        > 0
    )
    added = names.GATEWAY_ADDED_LATENCY
    for stream in ("false", "true"):
        assert delta(f"{added}_count", gateway=True, dialect="openai_chat", stream=stream) == 2
    assert delta(f"{added}_sum", gateway=True, dialect="openai_chat") > 0
    # the added latency excludes the backend's time: less than the calls' own durations
    assert delta(f"{added}_sum", gateway=True) < sum(c.timings.duration_s for c in completions)
    assert delta(f"{names.COMPLETION_LOG_WRITE}_count", gateway=True) == 4
    assert delta(f"{names.COMPLETION_LOG_WRITE}_sum", gateway=True) > 0

    # per-backend state, read at scrape time: nothing in flight after the sessions
    assert total(after_gw, names.BACKEND_CALLS_IN_FLIGHT, backend=backend) == 0
    assert total(after_gw, names.BACKEND_PAUSED, backend=backend) == 0
    assert (
        total(after_gw, names.BACKEND_POLICY_VERSION, backend=backend)
        == completions[0].policy_version
    )
    assert total(after_gw, names.BACKEND_HEALTHY, backend=backend) == 1
    # this test's runtimes are gone
    assert total(after, names.RUNTIMES_ALIVE, host="test-host") == earlier

    # the Temporal SDK's own metrics: the backlog signal of the activity and workflow queues
    sdk = names.TEMPORAL_ACTIVITY_SCHEDULE_TO_START
    # run, collect and teardown of both sessions waited on the sandbox host's own queue
    assert delta(f"{sdk}_count", task_queue="rolloutd-sandbox@test-host") >= 2 * 3
    assert delta(f"{names.TEMPORAL_WORKFLOW_TASK_SCHEDULE_TO_START}_count") > 0
    # every documented series is in a scrape (the failure-only counters once they count)
    event_only = names.series_names(
        {
            n: "counter"
            for n in (names.SESSION_FAILURES, names.SESSION_REPLACEMENTS, names.INCOMPLETE_GROUPS)
        }
    )
    missing = names.exported_series() - event_only - set(after) - set(after_gw)
    assert not missing, missing


def test_a_worker_process_serves_its_metrics_port(temporal_server, tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "ROLLOUTD_TEMPORAL_ADDRESS": temporal_server.address,
        "ROLLOUTD_STORE_URL": str(tmp_path / "store"),
        "ROLLOUTD_HOST_ID": "metrics-host",
        "ROLLOUTD_METRICS_HOST": "127.0.0.1",
        "ROLLOUTD_LOG_JSON": "false",
    }
    env.pop("ROLLOUTD_METRICS_PORT", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rolloutd.cli",
            "worker",
            "--fleet",
            "eval",
            "--metrics-port",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline, samples = time.monotonic() + 90, None
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                samples = scrape(f"http://127.0.0.1:{port}/metrics")
                if total(samples, names.TEMPORAL_SLOTS_AVAILABLE, task_queue="rolloutd-eval"):
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert samples is not None, "the metrics port never answered"
        # the SDK's worker slots of this process's queue, and prometheus-client's own series
        assert total(samples, names.TEMPORAL_SLOTS_AVAILABLE, task_queue="rolloutd-eval") > 0
        assert "process_cpu_seconds_total" in samples
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
