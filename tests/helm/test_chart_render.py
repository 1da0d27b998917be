"""helm/rolloutd lints clean and every manifest it renders is valid Kubernetes (or KEDA), over
the default values and the value sets of :data:`tests.helm.chart.VALUE_SETS`; values the chart
must refuse fail the render with a message naming the value. No cluster: Helm as a library."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from tests.helm.chart import CHART, KUBE_VERSION, VALUE_SETS, merged, notes, render, validate

pytestmark = pytest.mark.helm


def test_validates_against_a_current_kubernetes() -> None:
    major, minor = (int(p) for p in KUBE_VERSION.split(".")[:2])
    assert (major, minor) >= (1, 33), KUBE_VERSION


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_lint_is_clean(name: str) -> None:
    report = helm.lint(
        CHART,
        VALUE_SETS[name] or None,
        strict=True,
        namespace="rl",
        kube_version=f"v{KUBE_VERSION}.0",
    )
    assert report["errors"] == [], report
    # severity 2 = warning, 3 = error ("icon is recommended" is 1, info)
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_every_manifest_validates(name: str) -> None:
    docs = render(VALUE_SETS[name])
    assert docs
    for doc in docs:
        validate(doc)


def test_validation_refuses_a_broken_manifest() -> None:
    """The validators are not vacuous: an unknown field, a wrong type and a number where KEDA
    wants a string are each refused."""
    import jsonschema

    docs = render(VALUE_SETS["keda"])
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["comand"] = ["typo"]
    with pytest.raises(jsonschema.ValidationError):
        validate(deployment)
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    pdb["spec"]["maxUnavailable"] = [1]
    with pytest.raises(jsonschema.ValidationError):
        validate(pdb)
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    scaled["spec"]["triggers"][0]["metadata"]["targetQueueSize"] = 8
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        # values.schema.json: Helm refuses before rendering, naming the value
        (
            {"workflows": {"autoscaling": {"minReplicas": 0}}},
            "/workflows/autoscaling/minReplicas': minimum: got 0, want 1",
        ),
        ({"autoscaling": {"mode": "sometimes"}}, "/autoscaling/mode': value must be one of"),
        ({"temporal": {"adress": "x:7233"}}, "additional properties 'adress' not allowed"),
        ({"backends": {"type": "tgi"}}, "/backends/type"),
        # the templates' own checks (the schema cannot compare two values)
        (
            {"temporal": {"tls": {"existingSecret": "a"}, "apiKey": {"existingSecret": "b"}}},
            "not both",
        ),
        ({"store": {"url": "", "persistence": {"enabled": False}}}, "shared blob store"),
        ({"temporal": {"address": ""}}, "temporal.address is required"),
    ],
)
def test_refuses_bad_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"workflows": {"autoscaling": {"minReplicas": 0}}}, "a fleet with no poller is dead"),
        ({"autoscaling": {"mode": "sometimes"}}, "autoscaling.mode must be"),
    ],
)
def test_templates_refuse_bad_values_without_the_schema(
    values: dict[str, Any], message: str, tmp_path: Path
) -> None:
    """Without values.schema.json (``--skip-schema-validation``) the templates still refuse
    (helm lint cannot show it: in lint mode ``fail`` only logs)."""
    bare = tmp_path / "rolloutd"
    shutil.copytree(CHART, bare)  # the dashboard link becomes a copy
    (bare / "values.schema.json").unlink()
    chart = helm.Chart.load(bare)
    try:
        with pytest.raises(helm.HelmError, match=message):
            chart.render(values, name="rd", namespace="rl")
    finally:
        chart.close()


def test_notes_say_where_things_are() -> None:
    text = notes(VALUE_SETS["dev"])
    assert "rd-rolloutd-temporal-dev:7233" in text
    assert "rd-rolloutd-gateway-hosts.rl.svc:8300" in text
    assert "port-forward svc/rd-rolloutd-rest 8080" in text
    assert "WARNING" not in text  # the engine is the backend, the codec is on
    bare = notes(merged({"secrets": {"codec": {"enabled": False}}}))
    assert "no backends.urls" in bare and "in clear" in bare


def test_packaged_chart_carries_the_dashboard(tmp_path) -> None:
    """``helm package`` follows the chart's link to helm/dashboards/rolloutd.json: the archive
    renders the dashboard ConfigMap on its own."""
    import yaml

    archive = helm.package(CHART, destination=tmp_path)
    chart = helm.Chart.load_archive(Path(archive).read_bytes())
    try:
        out = chart.render(None, name="rd", namespace="rl")
    finally:
        chart.close()
    docs = [
        d
        for path, text in out.items()
        if not path.endswith("NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    ]
    dashboard = next(d for d in docs if d["metadata"]["name"] == "rd-rolloutd-dashboard")
    assert '"panels"' in dashboard["data"]["rolloutd.json"]
