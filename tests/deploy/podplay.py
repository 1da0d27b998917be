"""helm/rolloutd played on real pods with podman 4.3's ``kube play``.

Used by tests/deploy/test_pods.py and benchmarks/pod_scaling.py. The chart is rendered with
helm-python-sdk (Helm's own Go template engine, no cluster) for a local run, then :func:`to_podman`
converts only what podman 4.3 cannot run (docs/decisions.md, "The pod test plays a local rendering":
``kube play`` takes Pod, Deployment, PersistentVolumeClaim, ConfigMap and Secret; no Service,
StatefulSet, HPA, ScaledObject; no ``$(VAR)`` expansion in env values; no gRPC probes):

- a **Service** in front of a one-replica Deployment (Temporal dev server, engine, REST
  facade) -> that Deployment's pod template as a Pod named after the Service. Pods on a
  ``podman network create`` network resolve each other by pod name (aardvark-dns), so the
  Service's name resolves to its one endpoint, as a ClusterIP Service's does; the ports are
  the same (asserted).
- the gateway **StatefulSet** -> one Pod per ordinal, named as the StatefulSet names its pods
  (``{name}-0``, ``{name}-1``), with the same env. The headless Service's per-pod DNS names
  (``{pod}.{service}.{namespace}.svc``) do not exist here, so each pod's
  ``ROLLOUTD_GATEWAY_PUBLIC_URL`` becomes ``http://{pod}:{port}``, which sandbox pods resolve.
- ``$(POD_NAME)`` in an env value (Kubernetes' dependent variables) -> the pod's name where
  it is known (the converted Pods), else the same ``fieldRef`` (``metadata.name``), which
  podman resolves per pod of a Deployment.
- pod annotations longer than 63 characters (the chart's ``checksum/config``) -> dropped:
  podman 4.3 refuses them ("value length exceeds Kubernetes max 63", a label's limit it
  applies to annotations too); they only roll pods when the config changes.
- the **Secret** -> a podman secret made before the play (``podman secret create``) holding
  the Secret's ``data`` as JSON: podman 4.3's ``kube play`` stores a played Secret as its YAML
  but reads ``secretKeyRef`` as a JSON map of base64 values ("secret ... is not valid JSON"),
  so a played Secret cannot be read back. Same keys, same generated values.
- ``emptyDir`` volumes (the sandbox's runtime root) -> left out, with their mounts: podman
  4.3 makes an emptyDir a *named* volume called after the volume, so every sandbox pod (of
  every release) would share one folder. The container's own writable layer is what an
  emptyDir is: per pod, gone with it.
- probes -> dropped: podman 4.3 runs no gRPC probes, and runs the others as healthchecks on
  systemd timers, which this machine has no systemd for (the workers' gRPC health service is
  tested in tests/workers/test_health.py).
- ``containerPort`` lists -> dropped: podman 4.3 publishes each on the host, so two pods with
  one port collide ("address already in use"); in Kubernetes they are informational, and
  pods reach each other on the pod network either way.
- what has no pod at all -> left out: the headless Service, the "any gateway" Service (two
  pods cannot share one DNS name here; it only serves the REST facade's backend-admin
  forwarding, which these runs do not use), PodDisruptionBudgets, autoscalers.

Everything else (ConfigMap, the generated tokens and codec keys, the store's
PersistentVolumeClaim, which podman makes a named volume every pod mounts, the workflows,
sandbox and eval Deployments with their replicas, privileged sandbox pods, env, resources) is
the chart's own output. No controller runs here: a pod that is deleted stays deleted, so
where Kubernetes would recreate a killed pod, the caller does (:meth:`PodDeployment.replace`).
"""

from __future__ import annotations

import base64
import copy
import json
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "rolloutd"
NAMESPACE = "rl"
#: commands that load the shared machine go through nice (benchmarks run next to CI)
NICE = ["nice", "-n", "10"]


def podman(
    *args: str, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``nice podman ARGS``; raise with its output when it fails and ``check``."""
    result = subprocess.run(
        [*NICE, "podman", *args], capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def local_values(
    images: dict[str, str],
    *,
    sandbox_replicas: int = 2,
    gateway_replicas: int = 2,
    max_sessions: int = 8,
    model: str = "smollm2-135m",
) -> dict[str, Any]:
    """Chart values for a local run: the dev Temporal server, the engine with ``model``, the
    local images (``{"rolloutd"|"engine": "localhost/name:tag"}``, build_images.sh's tags),
    fixed replicas (no autoscaler here), ``max_sessions`` concurrent sessions per sandbox
    pod, the store on the chart's PersistentVolumeClaim, REST on, tokens in the chart's
    generated Secret."""

    def split(ref: str) -> dict[str, str]:
        repo, tag = ref.rsplit(":", 1)
        return {"repository": repo, "tag": tag, "pullPolicy": "Never"}

    return {
        "image": split(images["rolloutd"]),
        "engineImage": split(images["engine"]),
        "temporal": {"dev": {"enabled": True}},
        "engine": {
            "enabled": True,
            "model": model,
            "env": [
                {"name": "ROLLOUTD_ENGINE_PARALLEL", "value": "4"},
                {"name": "ROLLOUTD_ENGINE_CTX_SIZE", "value": "8192"},
            ],
        },
        "backends": {"model": model},
        "autoscaling": {"mode": "off"},
        "sandbox": {"replicas": sandbox_replicas, "maxConcurrentSessions": max_sessions},
        "gateway": {"replicas": gateway_replicas},
        "rest": {"enabled": True},
        # the whole deployment drains within a test's patience
        "terminationGracePeriodSeconds": 30,
    }


def render(release: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    """``helm template`` of helm/rolloutd (helm-python-sdk) as manifests, NOTES left out."""
    chart = helm.Chart.load(CHART)
    try:
        out = chart.render(values, name=release, namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if not path.endswith("NOTES.txt"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def _matches(selector: dict[str, str], workload: dict[str, Any]) -> bool:
    labels = workload["spec"]["template"]["metadata"].get("labels", {})
    return all(labels.get(k) == v for k, v in selector.items())


def _short_annotations(meta: dict[str, Any]) -> None:
    if "annotations" in meta:
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if len(v) <= 63}


def _fix_env(spec: dict[str, Any], pod_name: str | None) -> None:
    """Expand ``$(VAR)`` env references (podman 4.3 passes them literally) and drop gRPC
    probes, in place."""
    for c in spec["containers"]:
        env = c.get("env", [])
        refs = {e["name"]: e["valueFrom"] for e in env if "valueFrom" in e}
        for e in env:
            value = e.get("value")
            if not isinstance(value, str) or "$(" not in value:
                continue
            names = re.findall(r"\$\((\w+)\)", value)
            if pod_name is not None:
                for name in names:
                    if refs.get(name) != {"fieldRef": {"fieldPath": "metadata.name"}}:
                        raise AssertionError(f"cannot expand $({name}) in {e['name']}")
                    value = value.replace(f"$({name})", pod_name)
                e["value"] = value
            elif len(names) == 1 and value == f"$({names[0]})" and names[0] in refs:
                del e["value"]
                e["valueFrom"] = copy.deepcopy(refs[names[0]])
            else:
                raise AssertionError(f"podman cannot expand {e['name']}={value!r}")
        for drop in ("startupProbe", "readinessProbe", "livenessProbe", "ports"):
            c.pop(drop, None)
    empty = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
    if empty:
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in empty]
        for c in spec["containers"]:
            c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if m["name"] not in empty]


def _pod(name: str, workload: dict[str, Any]) -> dict[str, Any]:
    template = copy.deepcopy(workload["spec"]["template"])
    meta = {
        "name": name,
        "labels": template["metadata"].get("labels", {}),
        "annotations": template["metadata"].get("annotations", {}),
    }
    _fix_env(template["spec"], name)
    _short_annotations(meta)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def to_podman(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifests podman 4.3's ``kube play`` runs, converted as the module says.

    Raises:
        AssertionError: a manifest the conversion does not know how to carry over (a Service
            whose port differs from its pod's, a ``$(VAR)`` it cannot expand).
    """
    out: list[dict[str, Any]] = []
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    as_pod: dict[str, str] = {}  # Deployment name -> the Service name its pod takes
    for svc in (d for d in docs if d["kind"] == "Service"):
        if svc["spec"].get("clusterIP") == "None":
            continue  # the StatefulSet's per-pod names, made below
        (target,) = [w for w in workloads if _matches(svc["spec"]["selector"], w)]
        if target["kind"] == "Deployment" and target["spec"].get("replicas", 1) == 1:
            ports = {
                p["name"]: p["containerPort"]
                for c in target["spec"]["template"]["spec"]["containers"]
                for p in c["ports"]
            }
            for p in svc["spec"]["ports"]:
                assert ports[p["targetPort"]] == p["port"], (svc["metadata"]["name"], p)
            as_pod[target["metadata"]["name"]] = svc["metadata"]["name"]
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind in ("ConfigMap", "PersistentVolumeClaim", "Secret"):
            out.append(d)
        elif kind == "Deployment" and name in as_pod:
            out.append(_pod(as_pod[name], d))
        elif kind == "Deployment":
            d = copy.deepcopy(d)
            _fix_env(d["spec"]["template"]["spec"], None)
            _short_annotations(d["spec"]["template"]["metadata"])
            out.append(d)
        elif kind == "StatefulSet":
            port = next(
                p["containerPort"]
                for c in d["spec"]["template"]["spec"]["containers"]
                for p in c["ports"]
                if p["name"] == "http"
            )
            for i in range(d["spec"]["replicas"]):
                pod = _pod(f"{name}-{i}", d)
                for c in pod["spec"]["containers"]:
                    for e in c.get("env", []):
                        if e["name"] == "ROLLOUTD_GATEWAY_PUBLIC_URL":
                            e["value"] = f"http://{name}-{i}:{port}"
                out.append(pod)
    # config first: a pod that names it needs it to exist
    order = {"Secret": 0, "ConfigMap": 0, "PersistentVolumeClaim": 1}
    return sorted(out, key=lambda d: order.get(d["kind"], 2))


def secrets_and_play(
    docs: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(Secrets, the rest)``: Secrets become podman secrets before the play (module doc)."""
    return ([d for d in docs if d["kind"] == "Secret"], [d for d in docs if d["kind"] != "Secret"])


class PodDeployment:
    """One release of the chart played on its own podman network; :meth:`down` removes every
    pod, container, volume, secret and the network it made (by name, nothing else).

    Args:
        release: the Helm release name (pods are ``{release}-rolloutd-*``).
        values: chart values (:func:`local_values`).
        workdir: where the rendered YAML files go.
    """

    def __init__(self, release: str, values: dict[str, Any], workdir: Path) -> None:
        self.release, self.workdir = release, workdir
        self.fullname = f"{release}-rolloutd"
        self.network = f"{release}-net"
        self.docs = to_podman(render(release, values))
        self.file = workdir / f"{release}.yaml"
        self.secrets, played = secrets_and_play(self.docs)
        self.file.write_text(yaml.safe_dump_all(played))
        self.extra_files: list[Path] = []
        self.extra_pods: list[str] = []

    # --- life cycle ---------------------------------------------------------------------
    def up(self) -> None:
        """Create the network (DNS on: netavark's aardvark) and ``kube play`` the release."""
        podman("network", "create", self.network)
        for doc in self.secrets:
            path = self.workdir / f"{doc['metadata']['name']}.json"
            path.write_text(json.dumps(doc["data"]))
            path.chmod(0o600)
            podman("secret", "create", doc["metadata"]["name"], str(path))
            path.unlink()
        podman("kube", "play", "--network", self.network, str(self.file), timeout=600)

    def down(self) -> list[str]:
        """Remove everything :meth:`up` and :meth:`replace` made; return what was left after
        (pods, volumes, networks of this release: [] when clean)."""
        for f in [*self.extra_files, self.file]:
            podman("kube", "down", str(f), timeout=300, check=False)
        for pod in self.extra_pods + self.pod_names():
            podman("pod", "rm", "-f", "-t", "5", pod, check=False)
        for d in self.docs:
            if d["kind"] == "Secret":
                podman("secret", "rm", d["metadata"]["name"], check=False)
            if d["kind"] == "PersistentVolumeClaim":
                podman("volume", "rm", "-f", d["metadata"]["name"], check=False)
        podman("network", "rm", "-f", self.network, check=False)
        left = self.pod_names()
        left += [
            v
            for v in podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
            if v.startswith(self.fullname)
        ]
        left += [
            n
            for n in podman("network", "ls", "--format", "{{.Name}}").stdout.split()
            if n == self.network
        ]
        return left

    # --- reading ------------------------------------------------------------------------
    def pod_names(self) -> list[str]:
        """This release's pods now (any state)."""
        out = podman("pod", "ps", "--format", "{{.Name}}").stdout.split()
        return sorted(p for p in out if p.startswith(self.fullname))

    def pods_of(self, component: str) -> list[str]:
        """The running pods of one component (``sandbox``, ``gateway``...)."""
        out = podman(
            "pod", "ps", "--filter", "status=running", "--format", "{{.Name}}"
        ).stdout.split()
        prefix = f"{self.fullname}-{component}"
        return sorted(p for p in out if p == prefix or p.startswith(f"{prefix}-"))

    def ip(self, pod: str) -> str:
        """The pod's address on the release's network (reachable from this host)."""
        infra = podman("pod", "inspect", pod, "--format", "{{.InfraContainerID}}").stdout
        nets = json.loads(
            podman(
                "inspect", infra.strip(), "--format", "{{json .NetworkSettings.Networks}}"
            ).stdout
        )
        return nets[self.network]["IPAddress"]

    def logs(self, pod: str) -> str:
        """Every container's output of one pod (infra left out)."""
        names = podman(
            "ps", "-a", "--filter", f"pod={pod}", "--format", "{{.Names}}"
        ).stdout.split()
        return "".join(
            (lambda r: r.stdout + r.stderr)(podman("logs", n, check=False))
            for n in names
            if not n.endswith("-infra")
        )

    def secret(self, key: str) -> str:
        """A value of the chart's generated Secret."""
        (doc,) = [d for d in self.docs if d["kind"] == "Secret"]
        return base64.b64decode(doc["data"][key]).decode()

    def store_path(self) -> Path:
        """The host folder of the store's volume (the chart's PersistentVolumeClaim)."""
        return Path(
            podman(
                "volume", "inspect", f"{self.fullname}-store", "--format", "{{.Mountpoint}}"
            ).stdout.strip()
        )

    def wait_started(self, timeout_s: float = 300) -> dict[str, float]:
        """Wait until every worker pod logged ``fleet_started`` and the REST facade answers
        its OpenAPI page; return seconds to each pod's start."""
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        started: dict[str, float] = {}
        workers = [
            p
            for p in self.pod_names()
            if any(
                p.startswith(f"{self.fullname}-{c}")
                for c in ("workflows", "sandbox", "eval", "gateway")
            )
        ]
        while True:
            for pod in workers:
                if pod not in started and '"fleet_started"' in self.logs(pod):
                    started[pod] = time.monotonic() - t0
            if len(started) == len(workers):
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"not started within {timeout_s} s: "
                    f"{sorted(set(workers) - set(started))}; "
                    + "".join(
                        f"\n--- {p}\n{self.logs(p)[-3000:]}" for p in workers if p not in started
                    )
                )
            time.sleep(3)
        return started

    # --- faults ---------------------------------------------------------------------------
    def kill(self, pod: str) -> None:
        """SIGKILL every container of ``pod`` and remove it (a lost host)."""
        podman("pod", "kill", "--signal", "KILL", pod)
        podman("pod", "rm", "-f", "-t", "0", pod)

    def replace(self, pod: str, new_name: str | None = None) -> str:
        """Play ``pod`` again as its controller would recreate it: a StatefulSet's pod under
        the same name, a Deployment's under ``new_name`` (a new pod). Returns its name."""
        config = [d for d in self.docs if d["kind"] == "ConfigMap"]
        if pod.startswith(f"{self.fullname}-gateway-"):
            doc = copy.deepcopy(
                next(d for d in self.docs if d["kind"] == "Pod" and d["metadata"]["name"] == pod)
            )
        else:
            deployment = next(
                d
                for d in self.docs
                if d["kind"] == "Deployment" and pod.startswith(f"{d['metadata']['name']}-pod-")
            )
            name = new_name or f"{deployment['metadata']['name']}-{uuid.uuid4().hex[:5]}"
            template = deployment["spec"]["template"]
            doc = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": template["metadata"]["labels"]},
                "spec": copy.deepcopy(template["spec"]),
            }
        path = self.workdir / f"{doc['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump_all([*config, doc]))
        self.extra_files.append(path)
        self.extra_pods.append(doc["metadata"]["name"])
        podman("kube", "play", "--network", self.network, str(path), timeout=300)
        return str(doc["metadata"]["name"])
