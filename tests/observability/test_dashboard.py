"""The Grafana dashboard (helm/dashboards/rolloutd.json) is valid and built on exactly the
metrics the code exports (rolloutd.observability.names; tests/observability/
test_fleet_metrics.py checks that those names are in real scrapes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

from rolloutd.activities.sandbox import SandboxActivities
from rolloutd.observability import metrics, names
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.specs import make_backend
from rolloutd.settings import SandboxSettings
from rolloutd.store import BlobStore
from rolloutd.types import JudgeCost

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "dashboards" / "rolloutd.json"
ALERTS = Path(__file__).resolve().parents[2] / "helm" / "alerts" / "rolloutd.rules.yaml"

#: PromQL words that are not metric names (prometheus.io/docs/prometheus/latest/querying/)
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects.

    Drops string literals, range and subquery brackets (``[5m]``), label matchers
    (``{...}``) and the label lists of ``by``/``without``/``on``/``ignoring``/``group_*``;
    of the identifiers left, those followed by ``(`` are functions or aggregations, and
    keywords and numbers are not names.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', " ", expr)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", text)
    found = set()
    for m in re.finditer(r"(?<![0-9.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = m.group(0)
        if word.lower() in KEYWORDS or text[m.end() :].lstrip().startswith("("):
            continue
        found.add(word)
    return found


def test_metric_names_parses_promql():
    expr = (
        "histogram_quantile(0.95, sum by (le, phase) (rate(rolloutd_x_bucket"
        '{phase="run", a=~"b"}[$__rate_interval]))) / on(phase) group_left(h) '
        "sum without (le) (temporal_y offset 5m) > bool 2 or vector(1) and z"
    )
    assert metric_names(expr) == {"rolloutd_x_bucket", "temporal_y", "z"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_dashboard_is_a_valid_grafana_dashboard():
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    panels = board["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    datasources = {v["name"] for v in board["templating"]["list"] if v["type"] == "datasource"}
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["type"] == "timeseries" and panel["title"], panel
        assert panel["datasource"]["uid"].strip("${}") in datasources, panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")"), expr
            assert expr.count("{") == expr.count("}") and expr.count("[") == expr.count("]")
    # no two panels overlap
    cells = set()
    for panel in panels:
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))


def registry_names(tmp_path: Path) -> set[str]:
    """The sample names prometheus-client's registry exports in this process once each
    process metric has a sample, and the declared workflow and Temporal SDK series (their
    exporter lives in the SDK's Rust core; the fleet test finds each in a real scrape)."""
    metrics.count_call("openai_chat", 200)
    metrics.observe_added_latency("openai_chat", False, 0.001)
    metrics.count_tokens("dashboard-test", 1, 1)
    metrics.count_prefix_cache("dashboard-test", 2, 1, 1)
    metrics.observe_log_write(0.0001)
    metrics.set_fleet_alive("dashboard-test", True)
    metrics.observe_judge_call(0.5)
    metrics.set_judgings_running(0)
    metrics.count_judge_cost(JudgeCost(num_calls=1, num_prompt_tokens=1, num_response_tokens=1))
    pool = BackendPool([make_backend("llama_cpp", "dashboard-test", "http://127.0.0.1:9")])
    metrics.watch_pool(pool)
    acts = SandboxActivities(
        SandboxSettings(
            host_id="dashboard-test",
            runtime_root=str(tmp_path / "runtimes"),
            store_url=str(tmp_path / "store"),
        ),
        BlobStore(str(tmp_path / "store")),
    )
    exported = {s.name for family in REGISTRY.collect() for s in family.samples}
    del pool, acts
    return exported | names.series_names({**names.WORKFLOW_METRICS, **names.TEMPORAL_SDK_METRICS})


def test_dashboard_references_only_exported_metrics(tmp_path):
    exported = registry_names(tmp_path)
    assert names.series_names(names.PROCESS_METRICS) <= exported
    used: dict[str, set[str]] = {}
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            for name in metric_names(target["expr"]):
                used.setdefault(name, set()).add(panel["title"])
    unknown = {n: t for n, t in used.items() if n not in exported}
    assert not unknown, unknown
    # and only documented ones (docs/metrics.md lists rolloutd.observability.names)
    assert set(used) <= names.exported_series()
    # every rolloutd family shows on the dashboard
    families = {n for n in {**names.WORKFLOW_METRICS, **names.PROCESS_METRICS}}
    shown = {f for f in families if any(u == f or u.startswith(f + "_") for u in used)}
    assert shown == families, families - shown


@pytest.mark.parametrize(
    "panel", ["backlog", "phase", "added latency", "tokens", "backend", "prefix-cache hit rate"]
)
def test_dashboard_has_the_panels_the_issue_asks_for(panel):
    titles = " | ".join(p["title"].lower() for p in dashboard()["panels"])
    assert panel in titles


def test_alert_rules_use_exported_metrics_and_the_dashboards_collapse_line(tmp_path):
    """helm/alerts/rolloutd.rules.yaml has Prometheus's alerting-rule shape (groups of rules
    with ``alert``, ``expr``, ``for``, ``labels``, ``annotations``), selects only exported
    metrics, and its prefix-cache rule is the dashboard panel's reuse ratio below the panel's
    red/green line."""
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    exported = registry_names(tmp_path)
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", rule["alert"]), rule
        assert re.fullmatch(r"[0-9]+[smh]", rule["for"]) and rule["labels"]["severity"]
        assert metric_names(rule["expr"]) <= exported, rule["alert"]
    [rule] = [r for r in rules if r["alert"] == "RolloutdPrefixCacheCollapsed"]
    [panel] = [p for p in dashboard()["panels"] if "prefix-cache" in p["title"].lower()]
    [reuse] = [t["expr"] for t in panel["targets"] if "reusable" in t["expr"]]
    line = panel["fieldConfig"]["defaults"]["thresholds"]["steps"][-1]["value"]
    assert " ".join(rule["expr"].split()) == (
        reuse.replace("$__rate_interval", "10m") + f" < {line}"
    )
