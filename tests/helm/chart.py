"""Rendering and validating helm/rolloutd offline, for the chart's tests.

Helm runs as a library (PyPI ``helm-python-sdk``: Helm v4's Go SDK behind a C ABI, no ``helm``
binary and no cluster); rendered manifests are checked against Kubernetes' own OpenAPI schemas
(PyPI ``kubernetes-validate``, strict: unknown fields refused) and KEDA's kinds against the
schemas vendored next to this module (their ``$comment`` says where they come from).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml
from helm_python import _native as helm_native

CHART = Path(__file__).resolve().parents[2] / "helm" / "rolloutd"
HERE = Path(__file__).resolve().parent
RELEASE = "rd"
NAMESPACE = "rl"
FULLNAME = f"{RELEASE}-rolloutd"
#: Kubernetes minor version the manifests are validated against: the newest kubernetes-validate
#: ships (1.37 with 1.37.0), so a current cluster's API, not the one the chart was written on
KUBE_VERSION = kubernetes_validate.utils.latest_version()

#: vendored JSON Schemas of kinds kubernetes-validate has none for (CRDs)
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): HERE / "keda_scaledobject_v1alpha1.schema.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): HERE
    / "keda_triggerauthentication_v1alpha1.schema.json",
}

#: value sets the chart is linted, rendered and validated with (name -> overrides)
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "keda": {"autoscaling": {"mode": "keda"}},
    "hpa": {"autoscaling": {"mode": "hpa"}, "rest": {"autoscaling": {"enabled": True}}},
    "off": {"autoscaling": {"mode": "off"}},
    "tls": {
        "autoscaling": {"mode": "keda"},
        "temporal": {
            "address": "temporal.example.com:7233",
            "tls": {"existingSecret": "temporal-client", "serverName": "temporal.example.com"},
        },
    },
    "api-key": {
        "autoscaling": {"mode": "keda"},
        "temporal": {
            "address": "ns.acct.tmprl.cloud:7233",
            "namespace": "ns.acct",
            "apiKey": {"existingSecret": "temporal-cloud"},
        },
    },
    "s3": {"store": {"url": "s3://rollouts/prod", "credentials": {"existingSecret": "s3-creds"}}},
    "dev": {
        "temporal": {"dev": {"enabled": True}},
        "engine": {"enabled": True},
        "autoscaling": {"mode": "off"},
        "sandbox": {"replicas": 2},
        "gateway": {"replicas": 2},
    },
    "dev-keda": {
        "temporal": {"dev": {"enabled": True}},
        "engine": {"enabled": True},
        "autoscaling": {"mode": "keda"},
        "networkPolicy": {
            "engine": {"extraFrom": [{"podSelector": {"matchLabels": {"app": "trainer"}}}]},
            "temporalDev": {"extraFrom": [{"podSelector": {"matchLabels": {"app": "trainer"}}}]},
        },
    },
    "existing-secret": {"secrets": {"existingSecret": "rolloutd-tokens"}},
    "no-rest": {"rest": {"enabled": False}},
    "tenant-tokens": {"rest": {"tenantTokens": {"existingSecret": "rolloutd-tenants"}}},
    "observability": {
        "metrics": {"serviceMonitor": {"enabled": True}},
        "codecServer": {"enabled": True, "origins": "https://temporal.example.com"},
        "backends": {
            "urls": ["http://vllm-0.vllm:8000", "http://vllm-1.vllm:8000"],
            "type": "vllm",
            "policyVersion": 3,
        },
    },
    "unprivileged": {
        "sandbox": {
            "privileged": False,
            "securityContext": {
                "capabilities": {"add": ["SYS_ADMIN"]},
                "seccompProfile": {"type": "Unconfined"},
            },
        }
    },
}


def merged(*overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge override dicts, later ones winning (Helm merges them onto values.yaml)."""
    out: dict[str, Any] = {}
    for o in overrides:
        _merge(out, copy.deepcopy(o))
    return out


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def rendered(
    values: dict[str, Any] | None = None, *, api_versions: list[str] | None = None
) -> dict[str, str]:
    """``helm template`` of the chart: ``{template path: text}``.

    Args:
        values: overrides of values.yaml.
        api_versions: APIs the cluster is said to serve, as ``helm template --api-versions``
            (e.g. ``["keda.sh/v1alpha1"]``). helm-python-sdk 0.2.2's ``Chart.render`` does not
            expose it; its C library's render options do (``api_versions``), so this calls the
            same entry point (``helm_render``) with it.

    Raises:
        helm_python.HelmError: the values break values.schema.json, or a template failed
            (``fail``/``required`` included).
    """
    chart = helm.Chart.load(CHART)
    try:
        if not api_versions:
            return chart.render(values or None, name=RELEASE, namespace=NAMESPACE, is_install=True)
        opts = {
            "name": RELEASE,
            "namespace": NAMESPACE,
            "is_install": True,
            "api_versions": api_versions,
        }
        out: dict[str, str] = json.loads(
            helm_native.call_string(
                "helm_render",
                chart._raw(),
                json.dumps(values) if values else None,
                json.dumps(opts),
            )
        )
        return out
    finally:
        chart.close()


def render(
    values: dict[str, Any] | None = None, *, api_versions: list[str] | None = None
) -> list[dict[str, Any]]:
    """The rendered manifests as dicts (NOTES.txt left out); arguments as :func:`rendered`."""
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered(values, api_versions=api_versions).items()):
        if not path.endswith("NOTES.txt"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def notes(values: dict[str, Any] | None = None, *, api_versions: list[str] | None = None) -> str:
    """The rendered NOTES.txt."""
    out = rendered(values, api_versions=api_versions)
    return next(text for path, text in out.items() if path.endswith("NOTES.txt"))


def validate(doc: dict[str, Any]) -> None:
    """Validate one manifest: Kubernetes kinds with kubernetes-validate (strict, at
    :data:`KUBE_VERSION`), KEDA's with the vendored schemas, the Prometheus Operator's
    ServiceMonitor by its required fields only (no schema is vendored for it).

    Raises:
        jsonschema.ValidationError: the manifest breaks its schema.
        AssertionError: a kind with no schema at all.
    """
    key = (doc["apiVersion"], doc["kind"])
    if key in CRD_SCHEMAS:
        schema = json.loads(CRD_SCHEMAS[key].read_text())
        jsonschema.Draft202012Validator(schema).validate(doc)
    elif key == ("monitoring.coreos.com/v1", "ServiceMonitor"):
        assert doc["spec"]["selector"] and doc["spec"]["endpoints"], doc
    else:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The rendered objects of one kind, by name."""
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(workload: dict[str, Any]) -> dict[str, Any]:
    """The one container of a Deployment or StatefulSet."""
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def env_of(workload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A workload's container env as ``{name: entry}``."""
    return {e["name"]: e for e in container(workload).get("env", [])}
