"""The names of every metric rolloutd exports, in one module (docs/metrics.md).

Imports nothing: workflow code, activities, the gateway, the dashboard test and the docs all
read the names from here. No label carries a session or task id (docs/decisions.md, "Metrics"):
a label's values are few (harness types, phases, statuses, dialects, backends, hosts).

Two exporters:

- **workflow metrics** are counted in workflow code through ``workflow.metric_meter()``
  (not emitted again on replay) and exported by the Temporal SDK's Prometheus exporter of the
  workflows fleet; the SDK adds the labels ``namespace``, ``task_queue``, ``workflow_type``
  and ``service_name``; its exporter appends ``_total`` to counters (``counters_total_suffix``),
  so a counter named ``rolloutd_sessions_started`` here is scraped as
  ``rolloutd_sessions_started_total`` (:func:`series_names`), as are the SDK's own counters;
- **process metrics** are prometheus-client metrics of the gateway and sandbox processes
  (counters end in ``_total``, as prometheus-client names them).

A worker process with a metrics port serves both on that port; the gateway's ``/metrics``
route serves its process's (:mod:`rolloutd.observability.exporter`).
"""

from __future__ import annotations

# --- workflow metrics (workflow.metric_meter(), Temporal's exporter) ---------------------
#: counter: sessions whose workflow started; labels ``harness``
SESSIONS_STARTED = "rolloutd_sessions_started"
#: counter: sessions that ended with a result; labels ``harness``, ``status``
#: (completed, failed, timeout, cancelled: :class:`rolloutd.types.SessionStatus`)
SESSIONS_ENDED = "rolloutd_sessions_ended"
#: histogram, seconds: wall time of one phase of a session (open, provision, run, collect,
#: teardown, close, build, evaluate, eval_provision, eval_teardown), queue time included;
#: labels ``phase``, ``harness``
SESSION_PHASE_SECONDS = "rolloutd_session_phase_seconds"
#: counter: sessions that ended with a failure cause; label ``kind`` (docs/failures.md)
SESSION_FAILURES = "rolloutd_session_failures"
#: counter: sessions replaced after an infrastructure failure; labels ``kind``, ``fleet_down``
SESSION_REPLACEMENTS = "rolloutd_session_replacements"
#: counter: task groups that ended with fewer scored sessions than samples
INCOMPLETE_GROUPS = "rolloutd_incomplete_groups"
#: histogram, policy versions: the token-weighted staleness of each group a buffer hands out
#: (its version at take minus the mean version of the group's trainable tokens)
GROUP_STALENESS = "rolloutd_group_staleness"

#: bucket bounds of :data:`GROUP_STALENESS`, policy versions (a mean: fractions occur)
STALENESS_BUCKETS = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0)

#: bucket bounds of :data:`SESSION_PHASE_SECONDS`, s: phases last from milliseconds (open,
#: close) to the run budget (minutes)
PHASE_BUCKETS_S = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)

# --- gateway process (prometheus-client) --------------------------------------------------
#: counter: model calls answered (or refused) by the gateway; labels ``dialect``
#: (openai_chat, openai_responses, anthropic, gemini), ``status`` (HTTP status code)
GATEWAY_CALLS = "rolloutd_gateway_calls_total"
#: histogram, seconds: what the gateway adds to a sampled call: its time before the backend
#: request plus its time after the backend's answer (rendering, parsing, recording); labels
#: ``dialect``, ``stream`` (``true``/``false``)
GATEWAY_ADDED_LATENCY = "rolloutd_gateway_added_latency_seconds"
#: counter: prompt tokens of recorded completions (rate() gives prompt tokens per second);
#: label ``backend``
GATEWAY_PROMPT_TOKENS = "rolloutd_gateway_prompt_tokens_total"
#: counter: sampled tokens of recorded completions (rate() gives tokens per second); label
#: ``backend``
GATEWAY_SAMPLED_TOKENS = "rolloutd_gateway_sampled_tokens_total"
#: counter: prompt tokens of recorded completions whose backend reported its prefix-cache
#: hits (the hit rate's denominator); label ``backend``
GATEWAY_CACHE_PROMPT_TOKENS = "rolloutd_gateway_cache_prompt_tokens_total"
#: counter: prompt tokens the backend served from its prefix cache, as reported (llama.cpp
#: ``timings.cache_n``, SGLang ``cached_tokens``, OpenAI ``prompt_tokens_details``); the hit
#: rate is ``rate(cached) / rate(cache_prompt)``; label ``backend``
GATEWAY_CACHED_TOKENS = "rolloutd_gateway_cached_tokens_total"
#: counter: prompt tokens the session's previous call on the same backend left in its cache
#: (a working cache serves at least these); ``rate(cached) / rate(reusable)`` falling far
#: below 1 is a cache that stopped serving (a restart, eviction, lost affinity); label
#: ``backend``
GATEWAY_REUSABLE_TOKENS = "rolloutd_gateway_reusable_tokens_total"
#: histogram, seconds: appending one completion to its session's completion log
COMPLETION_LOG_WRITE = "rolloutd_completion_log_write_seconds"
#: gauge: sampling calls running on a backend; label ``backend``
BACKEND_CALLS_IN_FLIGHT = "rolloutd_backend_calls_in_flight"
#: gauge: 1 while a backend is paused (weight sync), else 0; label ``backend``
BACKEND_PAUSED = "rolloutd_backend_paused"
#: gauge: the policy version a backend serves; label ``backend``
BACKEND_POLICY_VERSION = "rolloutd_backend_policy_version"
#: gauge: 1 while a backend is healthy (answers its probes), else 0; label ``backend``
BACKEND_HEALTHY = "rolloutd_backend_healthy"

#: bucket bounds of :data:`GATEWAY_ADDED_LATENCY`, s (the gateway's goal is a few ms)
ADDED_LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: bucket bounds of :data:`COMPLETION_LOG_WRITE`, s (a page-cache write, or an fsync)
LOG_WRITE_BUCKETS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)

# --- eval process, judge queue (prometheus-client) --------------------------------------
#: histogram: seconds of one judge call (answered or not)
JUDGE_CALL_SECONDS = "rolloutd_judge_call_seconds"
#: gauge: judgings running in an eval process now (its judge slots in use)
JUDGINGS_RUNNING = "rolloutd_judgings_running"
#: counter: the judge's tokens, label ``kind`` (``prompt``, ``response``)
JUDGE_TOKENS = "rolloutd_judge_tokens_total"
#: counter: judge calls answered
JUDGE_CALLS = "rolloutd_judge_calls_total"
#: buckets of a judge call, s
JUDGE_CALL_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# --- sandbox process (prometheus-client) --------------------------------------------------
#: gauge: runtimes provisioned and not yet torn down on a sandbox host; label ``host``
RUNTIMES_ALIVE = "rolloutd_runtimes_alive"
#: counter: claims of the warm pool, label ``result`` (``hit``: a warm runtime was claimed,
#: ``miss``: a pooled kind of runtime found none ready and started cold)
WARM_POOL_CLAIMS = "rolloutd_warm_pool_claims_total"
#: histogram: seconds of a warm pool hit (key, policy check, files, env, prepare steps)
WARM_POOL_CLAIM_SECONDS = "rolloutd_warm_pool_claim_seconds"
#: buckets of a warm pool claim, s
WARM_POOL_CLAIM_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

# --- workflows process (prometheus-client) ------------------------------------------------
#: gauge: 1 while the fleet lives (rolloutd.capabilities.fleet_liveness), 0 when dead; label
#: ``fleet``
FLEET_ALIVE = "rolloutd_fleet_alive"

# --- the Temporal SDK's own metrics (its Prometheus exporter, every worker process) ------
#: histogram, ms: time an activity task waited in its queue (the backlog signal of the
#: sandbox, gateway and eval fleets); label ``task_queue``
TEMPORAL_ACTIVITY_SCHEDULE_TO_START = "temporal_activity_schedule_to_start_latency"
#: histogram, ms: time a workflow task waited in its queue (the workflows fleet's backlog)
TEMPORAL_WORKFLOW_TASK_SCHEDULE_TO_START = "temporal_workflow_task_schedule_to_start_latency"
#: histogram, ms: an activity's execution time; label ``task_queue``
TEMPORAL_ACTIVITY_EXECUTION = "temporal_activity_execution_latency"
#: gauge: free task slots of a worker; labels ``worker_type``, ``task_queue``
TEMPORAL_SLOTS_AVAILABLE = "temporal_worker_task_slots_available"
#: gauge: used task slots of a worker; labels ``worker_type``, ``task_queue``
TEMPORAL_SLOTS_USED = "temporal_worker_task_slots_used"
#: counter (scraped as ``..._total``): workflows completed; label ``workflow_type``
TEMPORAL_WORKFLOW_COMPLETED = "temporal_workflow_completed"

#: metric families counted in workflow code, with their Prometheus type
WORKFLOW_METRICS = {
    SESSIONS_STARTED: "counter",
    SESSIONS_ENDED: "counter",
    SESSION_PHASE_SECONDS: "histogram",
    SESSION_FAILURES: "counter",
    SESSION_REPLACEMENTS: "counter",
    INCOMPLETE_GROUPS: "counter",
    GROUP_STALENESS: "histogram",
}
#: the Temporal SDK's metric families that docs/metrics.md and the dashboard use, with
#: their Prometheus type (the SDK exports more: docs.temporal.io/references/sdk-metrics)
TEMPORAL_SDK_METRICS = {
    TEMPORAL_ACTIVITY_SCHEDULE_TO_START: "histogram",
    TEMPORAL_WORKFLOW_TASK_SCHEDULE_TO_START: "histogram",
    TEMPORAL_ACTIVITY_EXECUTION: "histogram",
    TEMPORAL_SLOTS_AVAILABLE: "gauge",
    TEMPORAL_SLOTS_USED: "gauge",
    TEMPORAL_WORKFLOW_COMPLETED: "counter",
}
#: metric families of the gateway and sandbox processes, with their Prometheus type
PROCESS_METRICS = {
    GATEWAY_CALLS: "counter",
    GATEWAY_ADDED_LATENCY: "histogram",
    GATEWAY_PROMPT_TOKENS: "counter",
    GATEWAY_SAMPLED_TOKENS: "counter",
    GATEWAY_CACHE_PROMPT_TOKENS: "counter",
    GATEWAY_CACHED_TOKENS: "counter",
    GATEWAY_REUSABLE_TOKENS: "counter",
    COMPLETION_LOG_WRITE: "histogram",
    BACKEND_CALLS_IN_FLIGHT: "gauge",
    BACKEND_PAUSED: "gauge",
    BACKEND_POLICY_VERSION: "gauge",
    BACKEND_HEALTHY: "gauge",
    RUNTIMES_ALIVE: "gauge",
    WARM_POOL_CLAIMS: "counter",
    WARM_POOL_CLAIM_SECONDS: "histogram",
    FLEET_ALIVE: "gauge",
    JUDGE_CALL_SECONDS: "histogram",
    JUDGINGS_RUNNING: "gauge",
    JUDGE_TOKENS: "counter",
    JUDGE_CALLS: "counter",
}


def series_names(families: dict[str, str]) -> set[str]:
    """The sample names a scrape shows for metric families: a histogram ``h`` shows
    ``h_bucket``, ``h_sum`` and ``h_count``; a counter ``c`` ``c_total``; a gauge its own
    name.

    Args:
        families: family name -> Prometheus type (``counter``, ``gauge``, ``histogram``).

    Returns:
        Every sample name those families export.
    """
    out: set[str] = set()
    for name, kind in families.items():
        if kind == "histogram":
            out.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        elif kind == "counter":
            out.add(counter_series(name))
        else:
            out.add(name)
    return out


def counter_series(name: str) -> str:
    """The sample name a scrape shows for counter ``name``: ``name`` with ``_total``
    (prometheus-client's and the SDK exporter's convention)."""
    return name if name.endswith("_total") else f"{name}_total"


def exported_series() -> set[str]:
    """Every sample name rolloutd's fleets export that docs/metrics.md documents: workflow,
    process and the named Temporal SDK metrics."""
    return series_names({**WORKFLOW_METRICS, **TEMPORAL_SDK_METRICS, **PROCESS_METRICS})
