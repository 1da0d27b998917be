"""prometheus-client metrics of the gateway and sandbox processes (names: :mod:`.names`).

The gateway's hot path only increments counters and observes histograms (no lock of ours, no
per-token work): per-backend state (calls in flight, paused, policy version, health) and the
runtimes alive on a sandbox host are read when a scrape asks, by collectors over the objects
that own that state (:func:`watch_pool`, :func:`watch_runtimes`), so a call pays nothing for
them. Everything registers with prometheus-client's default registry, which a worker's
metrics port and the gateway's ``/metrics`` serve (:mod:`rolloutd.observability.exporter`).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rolloutd.observability import names


def _family(name: str, suffix: str = "_total") -> str:
    """The family name prometheus-client wants for a counter (without ``_total``)."""
    return name.removesuffix(suffix)


GATEWAY_CALLS = Counter(
    _family(names.GATEWAY_CALLS),
    "model calls the gateway answered, by dialect and HTTP status",
    ["dialect", "status"],
)
GATEWAY_ADDED_LATENCY = Histogram(
    names.GATEWAY_ADDED_LATENCY,
    "seconds the gateway adds to a sampled call (its time before "
    "the backend request and after the backend's answer)",
    ["dialect", "stream"],
    buckets=names.ADDED_LATENCY_BUCKETS_S,
)
GATEWAY_PROMPT_TOKENS = Counter(
    _family(names.GATEWAY_PROMPT_TOKENS), "prompt tokens of recorded completions", ["backend"]
)
GATEWAY_SAMPLED_TOKENS = Counter(
    _family(names.GATEWAY_SAMPLED_TOKENS), "sampled tokens of recorded completions", ["backend"]
)
GATEWAY_CACHE_PROMPT_TOKENS = Counter(
    _family(names.GATEWAY_CACHE_PROMPT_TOKENS),
    "prompt tokens of recorded completions whose backend reports its prefix-cache hits",
    ["backend"],
)
GATEWAY_CACHED_TOKENS = Counter(
    _family(names.GATEWAY_CACHED_TOKENS),
    "prompt tokens the backend served from its prefix cache, as it reported them",
    ["backend"],
)
GATEWAY_REUSABLE_TOKENS = Counter(
    _family(names.GATEWAY_REUSABLE_TOKENS),
    "prompt tokens the session's previous call on the same backend left in its cache "
    "(what a working prefix cache serves at least), of completions whose backend reports hits",
    ["backend"],
)
COMPLETION_LOG_WRITE = Histogram(
    names.COMPLETION_LOG_WRITE,
    "seconds to append one completion to its completion log",
    buckets=names.LOG_WRITE_BUCKETS_S,
)
FLEET_ALIVE = Gauge(
    names.FLEET_ALIVE,
    "1 while a worker process of the fleet beat in the fleet registry within its limit "
    "(rolloutd.capabilities.fleet_liveness; a full fleet beats), 0 when the fleet is dead",
    ["fleet"],
)


def set_fleet_alive(fleet: str, alive: bool) -> None:
    """Export one fleet's liveness (the workflows process sets it every heartbeat)."""
    FLEET_ALIVE.labels(fleet).set(1.0 if alive else 0.0)


class _Children:
    """Labelled children of one metric, cached in a plain dict: ``labels()`` takes the
    metric's lock on every call; a dict lookup of a child made once does not."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.children: dict[tuple[str, ...], Any] = {}

    def get(self, *values: str) -> Any:
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = self.metric.labels(*values)
        return child


_calls = _Children(GATEWAY_CALLS)
_added = _Children(GATEWAY_ADDED_LATENCY)
_prompt = _Children(GATEWAY_PROMPT_TOKENS)
_sampled = _Children(GATEWAY_SAMPLED_TOKENS)
_cache_prompt = _Children(GATEWAY_CACHE_PROMPT_TOKENS)
_cached = _Children(GATEWAY_CACHED_TOKENS)
_reusable = _Children(GATEWAY_REUSABLE_TOKENS)


def count_call(dialect: str, status: int) -> None:
    """Count one model call of ``dialect`` answered with HTTP ``status``."""
    _calls.get(dialect, str(status)).inc()


def observe_added_latency(dialect: str, stream: bool, seconds: float) -> None:
    """Record what the gateway added to one sampled call, s (>= 0)."""
    _added.get(dialect, "true" if stream else "false").observe(max(seconds, 0.0))


def count_tokens(backend: str, num_prompt_tokens: int, num_sampled_tokens: int) -> None:
    """Add one recorded completion's prompt and sampled token counts to ``backend``'s
    counters."""
    _prompt.get(backend).inc(num_prompt_tokens)
    _sampled.get(backend).inc(num_sampled_tokens)


def count_prefix_cache(
    backend: str, num_prompt_tokens: int, num_cached_tokens: int | None, num_reusable: int
) -> None:
    """Add one completion's prefix-cache figures to ``backend``'s counters; nothing when the
    backend did not report its cached tokens (``num_cached_tokens`` None), so the hit rate
    (cached / prompt) and the reuse rate (cached / reusable) are over the same completions.

    Args:
        backend: the backend that sampled it.
        num_prompt_tokens: its prompt tokens.
        num_cached_tokens: of those, served from the backend's prefix cache.
        num_reusable: of those, left in the cache by the session's previous call there
            (:func:`rolloutd.proxy.sessions.recorder.reusable_prefix`).
    """
    if num_cached_tokens is None:
        return
    _cache_prompt.get(backend).inc(num_prompt_tokens)
    _cached.get(backend).inc(num_cached_tokens)
    _reusable.get(backend).inc(num_reusable)


class BackendPoolLike(Protocol):
    """What :func:`watch_pool` reads: :class:`rolloutd.proxy.backends.pool.BackendPool`."""

    def describe(self) -> list[dict[str, Any]]:
        """Each backend: ``name``, ``policy_version``, ``paused``, ``num_in_flight``,
        ``healthy``..."""
        ...


_pools: weakref.WeakSet[Any] = weakref.WeakSet()
#: owner -> host id; the owner's ``runtimes`` dict holds the host's live runtimes
_runtime_owners: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def watch_pool(pool: BackendPoolLike) -> None:
    """Export ``pool``'s backends (calls in flight, paused, policy version, health) at each
    scrape, for as long as the pool lives."""
    _pools.add(pool)


def watch_runtimes(owner: Any, host_id: str) -> None:
    """Export ``len(owner.runtimes)`` as the runtimes alive on ``host_id`` at each scrape,
    for as long as ``owner`` (:class:`rolloutd.activities.sandbox.SandboxActivities`) lives."""
    _runtime_owners[owner] = host_id


def _snapshot(read: Any) -> Any:
    """``read()``, again when a scrape thread met the event loop changing a dict under it."""
    for _ in range(3):
        try:
            return read()
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return read()


class StateCollector(Collector):
    """Reads per-backend and per-host state when a scrape asks (registered once)."""

    def collect(self) -> Iterator[Metric]:
        in_flight = GaugeMetricFamily(
            names.BACKEND_CALLS_IN_FLIGHT, "sampling calls running on a backend", labels=["backend"]
        )
        paused = GaugeMetricFamily(
            names.BACKEND_PAUSED, "1 while a backend is paused (weight sync)", labels=["backend"]
        )
        version = GaugeMetricFamily(
            names.BACKEND_POLICY_VERSION, "policy version a backend serves", labels=["backend"]
        )
        healthy = GaugeMetricFamily(
            names.BACKEND_HEALTHY, "1 while a backend answers its probes", labels=["backend"]
        )
        seen: set[str] = set()
        for pool in list(_pools):
            for backend in _snapshot(pool.describe):
                name = str(backend["name"])
                if name in seen:  # two gateways in one process (tests): one series each
                    continue
                seen.add(name)
                in_flight.add_metric([name], backend.get("num_in_flight", 0))
                paused.add_metric([name], 1 if backend.get("paused") else 0)
                version.add_metric([name], backend.get("policy_version", 0))
                healthy.add_metric([name], 1 if backend.get("healthy", True) else 0)
        alive = GaugeMetricFamily(
            names.RUNTIMES_ALIVE,
            "runtimes provisioned and not torn down on a sandbox host",
            labels=["host"],
        )
        per_host: dict[str, int] = {}
        for owner, host in list(_runtime_owners.items()):
            per_host[host] = per_host.get(host, 0) + len(owner.runtimes)
        for host, count in per_host.items():
            alive.add_metric([host], count)
        yield from (in_flight, paused, version, healthy, alive)

    def describe(self) -> Iterator[Metric]:
        # no describe(): the registry would call collect() at registration
        return iter(())


REGISTRY.register(StateCollector())


JUDGE_CALL_SECONDS = Histogram(
    names.JUDGE_CALL_SECONDS,
    "seconds of one judge call (answered or not)",
    buckets=names.JUDGE_CALL_BUCKETS_S,
)
JUDGINGS_RUNNING = Gauge(names.JUDGINGS_RUNNING, "judgings running in this eval process")
JUDGE_TOKENS = Counter(
    _family(names.JUDGE_TOKENS), "the judge's tokens, by kind (prompt, response)", ["kind"]
)
JUDGE_CALLS = Counter(_family(names.JUDGE_CALLS), "judge calls answered")
WARM_POOL_CLAIMS = Counter(
    _family(names.WARM_POOL_CLAIMS),
    "claims of a sandbox host's warm pool, by result (hit, miss)",
    ["result"],
)
for _result in ("hit", "miss"):  # both series exist from the start (0 before any claim)
    WARM_POOL_CLAIMS.labels(result=_result)
WARM_POOL_CLAIM_SECONDS = Histogram(
    names.WARM_POOL_CLAIM_SECONDS,
    "seconds of a warm pool hit (key, policy check, files, env, prepare steps)",
    buckets=names.WARM_POOL_CLAIM_BUCKETS_S,
)


def observe_judge_call(seconds: float) -> None:
    """Record one judge call's duration, s."""
    JUDGE_CALL_SECONDS.observe(seconds)


def set_judgings_running(num: int) -> None:
    """Set the judgings running in this process."""
    JUDGINGS_RUNNING.set(num)


def count_judge_cost(cost: Any) -> None:
    """Count a judging's calls and tokens (a :class:`rolloutd.types.JudgeCost`)."""
    JUDGE_CALLS.inc(cost.num_calls)
    JUDGE_TOKENS.labels("prompt").inc(cost.num_prompt_tokens)
    JUDGE_TOKENS.labels("response").inc(cost.num_response_tokens)


def observe_log_write(seconds: float) -> None:
    """Record one completion-log append, s."""
    COMPLETION_LOG_WRITE.observe(seconds)


class CallClock:
    """What the gateway adds to one sampled call: its time from ``started`` to the backend
    request (:meth:`sent`) plus its time from the backend's answer (:meth:`answered`) to the
    answer being ready (:meth:`observe`); the backend's time, and a stream's wait on its
    reader, are not counted. Four ``time.monotonic()`` reads and one histogram observation
    per call (``rolloutd_gateway_added_latency_seconds``).

    Args:
        started: ``time.monotonic()`` when the call reached the gateway's pipeline.
    """

    __slots__ = ("answered_at", "sent_at", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.sent_at = 0.0
        self.answered_at = 0.0

    def sent(self) -> None:
        """The backend request leaves now."""
        self.sent_at = time.monotonic()

    def answered(self) -> None:
        """The backend's whole answer is in now."""
        self.answered_at = time.monotonic()

    def observe(self, dialect: str, stream: bool) -> None:
        """The answer is ready now: record the call's added latency (nothing when no
        backend request was timed, as for an answer replayed from the log)."""
        if self.sent_at and self.answered_at:
            observe_added_latency(
                dialect,
                stream,
                (self.sent_at - self.started) + (time.monotonic() - self.answered_at),
            )
