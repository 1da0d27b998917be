"""What helm/rolloutd's manifests do: each fleet runs its own worker and is scaled on its own
task queue (the queue names of rolloutd.task_queues), gateway pods get distinct host ids and
addresses, secrets are referenced and never inlined, KEDA or the HPA fallback, PDBs and the
drain's grace period, and every ROLLOUTD_* variable the chart sets is a real setting."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest

from rolloutd import settings as settings_mod
from rolloutd.security.codec import parse_keys
from rolloutd.task_queues import FLEET_QUEUES, host_queue
from rolloutd.workflows import search
from tests.helm.chart import (
    FULLNAME,
    NAMESPACE,
    VALUE_SETS,
    by_kind,
    container,
    env_of,
    merged,
    notes,
    render,
)

pytestmark = pytest.mark.helm

FLEETS = ["workflows", "sandbox", "gateway", "eval"]


def workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Deployments and StatefulSets by name."""
    return {**by_kind(docs, "Deployment"), **by_kind(docs, "StatefulSet")}


def test_each_fleet_runs_its_own_worker() -> None:
    docs = render()
    found = workloads(docs)
    for fleet in FLEETS:
        w = found[f"{FULLNAME}-{fleet}"]
        assert w["kind"] == ("StatefulSet" if fleet == "gateway" else "Deployment")
        assert container(w)["command"] == ["rolloutd", "worker", "--fleet", fleet]
        probe = container(w)["readinessProbe"]["grpc"]  # rolloutd.workers.health's service
        assert probe["service"] == FLEET_QUEUES[fleet]
    rest = container(found[f"{FULLNAME}-rest"])
    assert rest["command"][:2] == ["rolloutd", "rest"]
    assert f"http://{FULLNAME}-gateway:8300" in rest["command"]


def test_host_id_is_the_pod_name_and_gateway_pods_get_distinct_addresses() -> None:
    docs = render(VALUE_SETS["dev"])
    found = workloads(docs)
    for fleet in FLEETS:
        env = container(found[f"{FULLNAME}-{fleet}"])["env"]
        names = [e["name"] for e in env]
        # $(POD_NAME) expands only from a variable defined earlier in the list
        assert names.index("POD_NAME") < names.index("ROLLOUTD_HOST_ID")
        assert env[names.index("POD_NAME")]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.name"}
        }
        assert env[names.index("ROLLOUTD_HOST_ID")]["value"] == "$(POD_NAME)"

    gateway = found[f"{FULLNAME}-gateway"]
    headless = by_kind(docs, "Service")[gateway["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == gateway["spec"]["selector"]["matchLabels"]
    public = env_of(gateway)["ROLLOUTD_GATEWAY_PUBLIC_URL"]["value"]
    # a StatefulSet's pods are {name}-{ordinal}: expand the env as the kubelet does
    pods = [f"{gateway['metadata']['name']}-{i}" for i in range(gateway["spec"]["replicas"])]
    urls = {public.replace("$(POD_NAME)", pod) for pod in pods}
    queues = {host_queue("gateway", pod) for pod in pods}
    assert len(urls) == len(queues) == len(pods) == 2
    for pod in pods:
        assert f"http://{pod}.{headless['metadata']['name']}.{NAMESPACE}.svc:8300" in urls


def test_secrets_are_referenced_never_inlined() -> None:
    for name in ["default", "tls", "api-key", "s3", "observability", "dev"]:
        docs = render(VALUE_SETS[name])
        secret_values = [
            base64.b64decode(v).decode()
            for s in by_kind(docs, "Secret").values()
            for v in s["data"].values()
        ]
        assert secret_values
        others = json.dumps([d for d in docs if d["kind"] != "Secret"])
        for value in secret_values:
            assert value not in others
        for w in workloads(docs).values():
            for e in container(w).get("env", []):
                if re.search(r"TOKEN|KEY|PASSWORD|SECRET", e["name"]):
                    assert "secretKeyRef" in e.get("valueFrom", {}), (name, e)


def test_existing_secret_is_used_and_none_is_created() -> None:
    docs = render(VALUE_SETS["existing-secret"])
    assert by_kind(docs, "Secret") == {}
    refs = {
        e["valueFrom"]["secretKeyRef"]["name"]
        for w in workloads(docs).values()
        for e in container(w)["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    assert refs == {"rolloutd-tokens"}


def test_admin_token_reaches_only_the_gateway_and_rest() -> None:
    found = workloads(render())
    holders = {
        n.removeprefix(f"{FULLNAME}-")
        for n, w in found.items()
        if "ROLLOUTD_ADMIN_TOKEN" in env_of(w)
    }
    assert holders == {"gateway", "rest"}
    assert "ROLLOUTD_REST_TOKEN" in env_of(found[f"{FULLNAME}-rest"])


def test_generated_codec_key_is_one_rolloutd_accepts() -> None:
    (secret,) = by_kind(render(), "Secret").values()
    text = base64.b64decode(secret["data"]["codec-keys"]).decode()
    [(key_id, key)] = parse_keys(text, source="chart")
    assert key_id.startswith("key-helm-") and len(key) == 32


def test_keda_scales_each_fleet_on_its_own_queue() -> None:
    docs = render(VALUE_SETS["keda"])
    scaled = by_kind(docs, "ScaledObject")
    assert by_kind(docs, "HorizontalPodAutoscaler") == {}
    assert set(scaled) == {f"{FULLNAME}-{f}" for f in FLEETS}
    found = workloads(docs)
    for fleet in FLEETS:
        spec = scaled[f"{FULLNAME}-{fleet}"]["spec"]
        target = found[spec["scaleTargetRef"]["name"]]
        assert target["kind"] == spec["scaleTargetRef"]["kind"]
        assert container(target)["command"][-1] == fleet
        assert "replicas" not in target["spec"]  # the autoscaler owns it
        assert spec["minReplicaCount"] >= 1  # docs/decisions.md, "Dead versus saturated"
        # the eval fleet scales on its judgings' queue too (KEDA takes the larger need)
        queues = [FLEET_QUEUES[fleet]] + (["rolloutd-judge"] if fleet == "eval" else [])
        assert [t["metadata"]["taskQueue"] for t in spec["triggers"]] == queues
        for trigger in spec["triggers"]:
            assert trigger["type"] == "temporal"
            meta = trigger["metadata"]
            assert meta["queueTypes"] == ("workflow" if fleet == "workflows" else "activity")
            assert meta["endpoint"] == "temporal-frontend.temporal.svc.cluster.local:7233"
            assert "authenticationRef" not in trigger
        # the backlog omits running tasks: scale down slowly, one pod at a time
        down = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
        assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]


@pytest.mark.parametrize(
    ("name", "params"), [("tls", {"cert", "key", "ca"}), ("api-key", {"apiKey"})]
)
def test_keda_authenticates_to_temporal_like_the_fleets(name: str, params: set[str]) -> None:
    docs = render(VALUE_SETS[name])
    (auth,) = by_kind(docs, "TriggerAuthentication").values()
    assert {r["parameter"] for r in auth["spec"]["secretTargetRef"]} == params
    for so in by_kind(docs, "ScaledObject").values():
        for trigger in so["spec"]["triggers"]:
            assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]


def test_auto_picks_keda_when_the_cluster_serves_it() -> None:
    docs = render(api_versions=["keda.sh/v1alpha1"])  # autoscaling.mode: auto (default)
    assert by_kind(docs, "HorizontalPodAutoscaler") == {}
    scaled = by_kind(docs, "ScaledObject")
    assert {so["spec"]["triggers"][0]["metadata"]["taskQueue"] for so in scaled.values()} == {
        FLEET_QUEUES[f] for f in FLEETS
    }
    assert "Scaling:   keda (KEDA's temporal scaler" in notes(api_versions=["keda.sh/v1alpha1"])


def test_hpa_only_when_keda_is_absent() -> None:
    # helm template sees no keda.sh/v1alpha1 API: "auto" falls back to CPU HPAs
    for name in ["default", "hpa"]:
        docs = render(VALUE_SETS[name])
        assert by_kind(docs, "ScaledObject") == {}
        hpas = by_kind(docs, "HorizontalPodAutoscaler")
        assert {f"{FULLNAME}-{f}" for f in FLEETS} <= set(hpas)
        for hpa in hpas.values():
            assert hpa["spec"]["minReplicas"] >= 1
            assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
        for fleet in FLEETS:
            down = hpas[f"{FULLNAME}-{fleet}"]["spec"]["behavior"]["scaleDown"]
            assert down["stabilizationWindowSeconds"] == 600
    off = render(VALUE_SETS["off"])
    assert by_kind(off, "HorizontalPodAutoscaler") == by_kind(off, "ScaledObject") == {}
    assert all(w["spec"]["replicas"] >= 1 for w in workloads(off).values())


def test_pdbs_and_drain_grace_period() -> None:
    docs = render(merged({"sandbox": {"terminationGracePeriodSeconds": 900}}))
    pdbs = by_kind(docs, "PodDisruptionBudget")
    found = workloads(docs)
    for component in [*FLEETS, "rest"]:
        pdb = pdbs[f"{FULLNAME}-{component}"]
        labels = found[f"{FULLNAME}-{component}"]["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    grace = {
        n.removeprefix(f"{FULLNAME}-"): w["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"
        ]
        for n, w in found.items()
    }
    assert grace["sandbox"] == 900
    assert grace["workflows"] == grace["gateway"] == grace["eval"] == 120


RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_every_pod_runs_with_the_least_privilege_that_works(name: str) -> None:
    """Only the sandbox container is privileged (bubblewrap's namespaces, a cgroup per
    runtime, a loop device per runtime's disk: docs/cluster.md); every other container drops
    every capability, cannot gain privileges and runs under the runtime's default seccomp
    profile; no pod gets a service account token, the host's namespaces or a host path."""
    found = workloads(render(VALUE_SETS[name]))
    assert found
    for workload_name, w in found.items():
        pod = w["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, workload_name
        assert not any(pod.get(k) for k in ("hostPID", "hostNetwork", "hostIPC")), workload_name
        assert not any("hostPath" in v for v in pod.get("volumes", [])), workload_name
        for c in pod["containers"] + pod.get("initContainers", []):
            context = c.get("securityContext", {})
            if workload_name.endswith("-sandbox"):
                assert context.get("privileged", False) == (name != "unprivileged")
            else:
                assert context == RESTRICTED, (workload_name, c["name"])


def test_only_sandbox_pods_are_privileged() -> None:
    found = workloads(render())
    for name, w in found.items():
        privileged = container(w).get("securityContext", {}).get("privileged", False)
        assert privileged == name.endswith("-sandbox"), name
    strict = workloads(render(VALUE_SETS["unprivileged"]))[f"{FULLNAME}-sandbox"]
    assert container(strict)["securityContext"] == {
        "capabilities": {"add": ["SYS_ADMIN"]},
        "seccompProfile": {"type": "Unconfined"},
    }


def test_every_rolloutd_variable_is_a_setting() -> None:
    """The ConfigMap's and every pod's ROLLOUTD_* names are names a rolloutd process accepts
    (each is refused at start otherwise, with the nearest known name), and the ConfigMap's
    values parse (a bad value would be refused at start)."""
    classes = [
        settings_mod.GatewaySettings,
        settings_mod.SandboxSettings,
        settings_mod.EvalSettings,
        settings_mod.RestSettings,
        settings_mod.CodecServerSettings,
        settings_mod.EngineSettings,
    ]
    for name in VALUE_SETS:
        docs = render(VALUE_SETS[name])
        data = by_kind(docs, "ConfigMap")[f"{FULLNAME}-config"]["data"]
        for workload, w in workloads(docs).items():
            env = {**data, **{e["name"]: e.get("value", "") for e in container(w).get("env", [])}}
            assert settings_mod.environment_problems(env) == [], (name, workload)
        names = {n for n in data if n.startswith("ROLLOUTD_")}
        assert names <= settings_mod.known_variables() - set(settings_mod.OTHER_VARIABLES), name
        for cls in classes:
            prefix = cls.model_config["env_prefix"]
            cls.model_validate(
                {
                    k.removeprefix(prefix).lower(): v
                    for k, v in data.items()
                    if k.startswith(prefix) and k.removeprefix(prefix).lower() in cls.model_fields
                }
            )
    # the control: a misspelt name in a pod's environment is found
    assert settings_mod.environment_problems({"ROLLOUTD_GATEWAY_PRT": "8300"}) == [
        "unknown variable ROLLOUTD_GATEWAY_PRT; did you mean ROLLOUTD_GATEWAY_PORT?"
    ]


def test_malloc_settings_reach_every_rolloutd_pod_unless_turned_off() -> None:
    """``malloc`` becomes ``MALLOC_ARENA_MAX`` and ``MALLOC_MMAP_THRESHOLD_`` in the ConfigMap
    every rolloutd pod reads; 0 leaves glibc's default, so the variable is absent."""
    docs = render()
    data = by_kind(docs, "ConfigMap")[f"{FULLNAME}-config"]["data"]
    assert data["MALLOC_ARENA_MAX"] == "2" and data["MALLOC_MMAP_THRESHOLD_"] == "131072"
    for name, w in workloads(docs).items():
        if name.endswith("-engine") or name.endswith("-temporal"):
            continue
        refs = [e["configMapRef"]["name"] for e in container(w)["envFrom"] if "configMapRef" in e]
        assert f"{FULLNAME}-config" in refs, name
    off = render({"malloc": {"arenaMax": 0, "mmapThreshold": 0}})
    data = by_kind(off, "ConfigMap")[f"{FULLNAME}-config"]["data"]
    assert "MALLOC_ARENA_MAX" not in data and "MALLOC_MMAP_THRESHOLD_" not in data


def test_s3_store_takes_credentials_from_the_secret() -> None:
    docs = render(VALUE_SETS["s3"])
    config = by_kind(docs, "ConfigMap")[f"{FULLNAME}-config"]
    assert config["data"]["ROLLOUTD_STORE_URL"] == "s3://rollouts/prod"
    assert by_kind(docs, "PersistentVolumeClaim") == {}
    for w in workloads(docs).values():
        assert {"secretRef": {"name": "s3-creds"}} in container(w)["envFrom"]
        assert "store" not in {v["name"] for v in w["spec"]["template"]["spec"].get("volumes", [])}


def test_tls_files_come_from_the_secret_outside_etc() -> None:
    docs = render(VALUE_SETS["tls"])
    data = by_kind(docs, "ConfigMap")[f"{FULLNAME}-config"]["data"]
    cert = data["ROLLOUTD_TEMPORAL_TLS_CERT"]
    assert not cert.startswith("/etc/")  # bubblewrap binds /etc into every sandbox
    for w in workloads(docs).values():
        mount = next(m for m in container(w)["volumeMounts"] if m["name"] == "temporal-tls")
        assert cert.startswith(mount["mountPath"] + "/") and mount["readOnly"]
        vol = next(
            v for v in w["spec"]["template"]["spec"]["volumes"] if v["name"] == "temporal-tls"
        )
        assert vol["secret"]["secretName"] == "temporal-client"


def test_dev_temporal_runs_with_rolloutds_search_attributes() -> None:
    docs = render(VALUE_SETS["dev"])
    dev = workloads(docs)[f"{FULLNAME}-temporal-dev"]
    cmd = container(dev)["command"]
    assert cmd[:3] == ["temporal", "server", "start-dev"]
    attrs = dict(cmd[i + 1].split("=") for i, a in enumerate(cmd) if a == "--search-attribute")
    assert attrs == search.DEFINITIONS
    data = by_kind(docs, "ConfigMap")[f"{FULLNAME}-config"]["data"]
    assert data["ROLLOUTD_TEMPORAL_ADDRESS"] == f"{FULLNAME}-temporal-dev:7233"
    assert data["ROLLOUTD_BACKEND_URL"] == f"http://{FULLNAME}-engine:8400"
    assert f"{FULLNAME}-engine" in by_kind(docs, "Service")


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a label selector (matchLabels only: the chart writes no expressions) matches."""
    assert set(selector) <= {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _admitted(policy: dict[str, Any], docs: list[dict[str, Any]]) -> set[str]:
    """The release's workloads whose pods a NetworkPolicy's ingress peers admit (peers of this
    namespace: a podSelector alone)."""
    pods = {n: w["spec"]["template"]["metadata"]["labels"] for n, w in workloads(docs).items()}
    peers = [p for rule in policy["spec"]["ingress"] for p in rule["from"]]
    return {
        name
        for name, labels in pods.items()
        if any(set(p) == {"podSelector"} and _selects(p["podSelector"], labels) for p in peers)
    }


def test_the_engine_and_dev_temporal_admit_only_their_clients() -> None:
    """The engine (llama-server, no key) and the dev Temporal (no login) listened for every
    pod of the cluster. Each now has a NetworkPolicy selecting its pods: the engine admits the
    gateway pods alone on its port, the dev Temporal this release's pods on its two ports, KEDA's
    operator only when KEDA scales on it, and ``extraFrom`` what the operator adds."""
    docs = render(VALUE_SETS["dev"])
    policies = by_kind(docs, "NetworkPolicy")
    assert set(policies) == {f"{FULLNAME}-engine", f"{FULLNAME}-temporal-dev"}
    pods = {n: w["spec"]["template"]["metadata"]["labels"] for n, w in workloads(docs).items()}
    for name, policy in policies.items():
        selected = {
            n for n, labels in pods.items() if _selects(policy["spec"]["podSelector"], labels)
        }
        assert selected == {name}, name  # each selects exactly its own workload's pods
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    engine, temporal = policies[f"{FULLNAME}-engine"], policies[f"{FULLNAME}-temporal-dev"]
    assert _admitted(engine, docs) == {f"{FULLNAME}-gateway"}
    assert [p["port"] for r in engine["spec"]["ingress"] for p in r["ports"]] == [8400]
    assert _admitted(temporal, docs) == set(pods)  # every pod of the release, and no other
    assert [p["port"] for r in temporal["spec"]["ingress"] for p in r["ports"]] == [7233, 8233]
    assert all(set(p) == {"podSelector"} for r in temporal["spec"]["ingress"] for p in r["from"])

    trainer = {"podSelector": {"matchLabels": {"app": "trainer"}}}
    docs = render(VALUE_SETS["dev-keda"])
    policies = by_kind(docs, "NetworkPolicy")
    keda = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "keda-operator"}},
    }
    assert policies[f"{FULLNAME}-temporal-dev"]["spec"]["ingress"][0]["from"][1:] == [
        keda,
        trainer,
    ]
    assert policies[f"{FULLNAME}-engine"]["spec"]["ingress"][0]["from"][1:] == [trainer]

    off = merged(VALUE_SETS["dev"], {"networkPolicy": {"enabled": False}})
    assert by_kind(render(off), "NetworkPolicy") == {}


def test_backends_reach_the_gateway_settings() -> None:
    data = by_kind(render(VALUE_SETS["observability"]), "ConfigMap")[f"{FULLNAME}-config"]["data"]
    gateway = settings_mod.GatewaySettings.model_validate(
        {k.removeprefix("ROLLOUTD_").lower(): v for k, v in data.items()}
    )
    assert gateway.backend_url == "http://vllm-0.vllm:8000,http://vllm-1.vllm:8000"
    assert (gateway.backend_type, gateway.backend_policy_version) == ("vllm", 3)
    assert (gateway.gateway_host, gateway.gateway_port) == ("0.0.0.0", 8300)


def test_the_charts_engine_needs_its_key_and_only_the_gateway_has_it() -> None:
    docs = render(VALUE_SETS["dev"])
    secret = by_kind(docs, "Secret")[f"{FULLNAME}-secrets"]
    assert "engine-api-key" in secret["data"]
    holders = {
        name
        for name, w in workloads(docs).items()
        for e in container(w).get("env", [])
        if e.get("valueFrom", {}).get("secretKeyRef", {}).get("key") == "engine-api-key"
    }
    assert holders == {f"{FULLNAME}-engine", f"{FULLNAME}-gateway"}
    engine_env = {e["name"] for e in container(workloads(docs)[f"{FULLNAME}-engine"])["env"]}
    assert "ROLLOUTD_ENGINE_API_KEY" in engine_env
    gateway_env = {e["name"] for e in container(workloads(docs)[f"{FULLNAME}-gateway"])["env"]}
    assert "ROLLOUTD_BACKEND_API_KEY" in gateway_env
    # the engine's key reaches no gateway that talks to the operator's own engines
    own = merged(VALUE_SETS["dev"], {"backends": {"urls": ["http://vllm:8000"]}})
    gateway = workloads(render(own))[f"{FULLNAME}-gateway"]
    assert "ROLLOUTD_BACKEND_API_KEY" not in {e["name"] for e in container(gateway)["env"]}


def test_callback_hosts_reach_the_eval_settings(monkeypatch) -> None:
    values = merged(VALUE_SETS["dev"], {"eval": {"callbackAllowedHosts": ["trainer-*:8080"]}})
    data = by_kind(render(values), "ConfigMap")[f"{FULLNAME}-config"]["data"]
    monkeypatch.setenv("ROLLOUTD_CALLBACK_ALLOWED_HOSTS", data["ROLLOUTD_CALLBACK_ALLOWED_HOSTS"])
    assert settings_mod.EvalSettings().callback_allowed_hosts == ["trainer-*:8080"]
    # none listed: the variable is absent and every callback is refused
    data = by_kind(render(VALUE_SETS["dev"]), "ConfigMap")[f"{FULLNAME}-config"]["data"]
    assert "ROLLOUTD_CALLBACK_ALLOWED_HOSTS" not in data


def test_no_rest_facade() -> None:
    docs = render(VALUE_SETS["no-rest"])
    assert not [d for d in docs if d["metadata"]["name"].endswith("-rest")]


def test_metrics_are_scraped_and_the_dashboard_ships() -> None:
    docs = render(VALUE_SETS["observability"])
    for w in workloads(docs).values():
        if w["metadata"]["name"].split("-")[-1] in FLEETS:
            annotations = w["spec"]["template"]["metadata"]["annotations"]
            assert annotations["prometheus.io/port"] == "9300"
    (monitor,) = by_kind(docs, "ServiceMonitor").values()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    services = by_kind(docs, "Service")
    for fleet in ["workflows", "sandbox", "eval"]:
        assert services[f"{FULLNAME}-{fleet}-metrics"]["spec"]["ports"][0]["name"] == "metrics"
    dashboard = by_kind(docs, "ConfigMap")[f"{FULLNAME}-dashboard"]
    assert json.loads(dashboard["data"]["rolloutd.json"])["panels"]


def test_tenant_tokens_come_from_a_secret_mounted_into_the_rest_pod_only() -> None:
    docs = render(VALUE_SETS["tenant-tokens"])
    rest = workloads(docs)[f"{FULLNAME}-rest"]
    path = env_of(rest)["ROLLOUTD_TENANT_TOKENS_FILE"]["value"]
    mount = next(m for m in container(rest)["volumeMounts"] if m["name"] == "tenant-tokens")
    assert path == mount["mountPath"] + "/tenants.json" and mount["readOnly"]
    volume = next(
        v for v in rest["spec"]["template"]["spec"]["volumes"] if v["name"] == "tenant-tokens"
    )
    assert volume["secret"]["secretName"] == "rolloutd-tenants"
    others = [w for name, w in workloads(docs).items() if name != f"{FULLNAME}-rest"]
    assert others and not any("ROLLOUTD_TENANT_TOKENS_FILE" in env_of(w) for w in others)
    # without the Secret: no variable, no volume
    plain = workloads(render(VALUE_SETS["default"]))[f"{FULLNAME}-rest"]
    assert "ROLLOUTD_TENANT_TOKENS_FILE" not in env_of(plain)
