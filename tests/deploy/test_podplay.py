"""The pod test's rendering step (tests/deploy/podplay.py) changes only what its docstring
lists: offline, no podman (marker ``helm``: helm-python-sdk renders the chart)."""

from __future__ import annotations

import base64
import json

import pytest
from podplay import local_values, render, secrets_and_play, to_podman

pytestmark = [pytest.mark.helm, pytest.mark.timeout(120)]

IMAGES = {"rolloutd": "localhost/rolloutd:abc", "engine": "localhost/rolloutd-engine:abc-m"}


@pytest.fixture(scope="module")
def rendered() -> tuple[list[dict], list[dict]]:
    docs = render("pp", local_values(IMAGES, sandbox_replicas=3, max_sessions=2))
    return docs, to_podman(docs)


def _by(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_only_what_podman_cannot_run_is_converted(rendered) -> None:
    docs, out = rendered
    # a Service in front of a one-replica Deployment: that pod, under the Service's name
    assert set(_by(out, "Pod")) == {
        "pp-rolloutd-temporal-dev",
        "pp-rolloutd-engine",
        "pp-rolloutd-rest",
        "pp-rolloutd-gateway-0",
        "pp-rolloutd-gateway-1",
    }
    # the fleets without a Service stay the chart's Deployments, replicas included
    deployments = _by(out, "Deployment")
    assert set(deployments) == {"pp-rolloutd-workflows", "pp-rolloutd-sandbox", "pp-rolloutd-eval"}
    assert deployments["pp-rolloutd-sandbox"]["spec"]["replicas"] == 3
    assert not {d["kind"] for d in out} & {
        "Service",
        "StatefulSet",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ScaledObject",
    }
    # ConfigMap, Secret and the store's claim are the chart's own
    for kind in ("ConfigMap", "Secret", "PersistentVolumeClaim"):
        assert _by(out, kind) == _by(docs, kind), kind
    config = _by(out, "ConfigMap")["pp-rolloutd-config"]["data"]
    assert config["ROLLOUTD_MAX_CONCURRENT_SESSIONS"] == "2"
    assert config["ROLLOUTD_TEMPORAL_ADDRESS"] == "pp-rolloutd-temporal-dev:7233"  # a pod name


def test_env_is_the_charts_with_pod_names_expanded(rendered) -> None:
    docs, out = rendered
    text = json.dumps(out)
    assert "$(" not in text  # podman 4.3 would pass these literally
    pods = _by(out, "Pod")
    for i in (0, 1):
        env = {
            e["name"]: e for e in pods[f"pp-rolloutd-gateway-{i}"]["spec"]["containers"][0]["env"]
        }
        assert env["ROLLOUTD_HOST_ID"]["value"] == f"pp-rolloutd-gateway-{i}"
        assert env["ROLLOUTD_GATEWAY_PUBLIC_URL"]["value"] == f"http://pp-rolloutd-gateway-{i}:8300"
        assert env["ROLLOUTD_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "admin-token"
    sandbox = _by(out, "Deployment")["pp-rolloutd-sandbox"]["spec"]["template"]["spec"]
    (container,) = sandbox["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["ROLLOUTD_HOST_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert container["securityContext"] == {"privileged": True}
    assert container["image"] == IMAGES["rolloutd"]
    # the runtime root's emptyDir is gone (podman shares a named one); the store stays
    assert [v["name"] for v in sandbox["volumes"]] == ["store"]
    assert [m["name"] for m in container["volumeMounts"]] == ["store"]
    assert "ports" not in container and "readinessProbe" not in container
    # the chart's sandbox container otherwise unchanged
    original = _by(docs, "Deployment")["pp-rolloutd-sandbox"]["spec"]["template"]["spec"]
    (before,) = original["containers"]
    assert before["command"] == container["command"]
    assert before["resources"] == container["resources"]


def test_the_secret_becomes_a_podman_secret_of_its_data(rendered) -> None:
    _, out = rendered
    secrets, played = secrets_and_play(out)
    assert [s["metadata"]["name"] for s in secrets] == ["pp-rolloutd-secrets"]
    assert all(d["kind"] != "Secret" for d in played)
    tokens = {k: base64.b64decode(v).decode() for k, v in secrets[0]["data"].items()}
    assert {"admin-token", "rest-token", "codec-keys"} <= set(tokens)
    assert all(len(v) >= 20 for v in tokens.values()), "generated tokens"
