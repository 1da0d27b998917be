"""The container images: built, or reused from the cache, and run with podman.

``scripts/build_images.sh`` builds the base, rolloutd and engine images (tags are the hash of
uv.lock, the Containerfiles and src/, so a second run reuses them). The rolloutd image must run
the CLI, the ``temporal`` binary, bubblewrap (a real sandbox in a privileged container, as a
sandbox pod runs) and every harness CLI at the version its lock file pins; the engine image
must serve ``/health``, its model and a completion, and answer the engine control interface
(docs/decisions.md, "One engine control interface").

Acceptance tier (README's acceptance command): a cold build takes about 23 minutes on 2
cores, a cached one seconds. Skipped, with the reason, only where podman is absent
(scripts/setup.sh installs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rolloutd.processes import free_port
from tests.support.images import no_podman

ROOT = Path(__file__).resolve().parents[2]
NPM_PREFIX = "/opt/rolloutd/cache/npm"
TOOLS = "/opt/rolloutd/cache/tools"

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.deploy,
    pytest.mark.skipif(no_podman() is not None, reason=str(no_podman())),
    pytest.mark.timeout(3600),  # a cold build: base, wheels, npm ci, two images
]


def _podman(
    *args: str, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result


def build_images(timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run scripts/build_images.sh with this environment's venv (``ROLLOUTD_VENV``); its
    output captured as text."""
    return subprocess.run(
        [str(ROOT / "scripts" / "build_images.sh")],
        cwd=ROOT,
        env={**os.environ, "ROLLOUTD_VENV": sys.prefix},
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """``{"base"|"rolloutd"|"engine": tag}`` from scripts/build_images.sh (builds or reuses)."""
    result = build_images(timeout_s=3000)
    sys.stdout.write(result.stdout)
    assert result.returncode == 0, f"build_images.sh failed:\n{result.stdout}\n{result.stderr}"
    tags = {
        line.split("=", 1)[0][len("IMAGE_") :].lower(): line.split("=", 1)[1]
        for line in result.stdout.splitlines()
        if line.startswith("IMAGE_")
    }
    assert set(tags) == {"base", "rolloutd", "engine"}, result.stdout
    return tags


def test_a_second_run_reuses_every_image(images: dict[str, str]) -> None:
    """A second run of scripts/build_images.sh reports all three images cached, with the same
    rolloutd tag, and rebuilds nothing (under 120 s). This second run took 0.5 s here
    (docs/images.md), after the first run's build (about 23 minutes cold)."""
    t0 = time.monotonic()
    result = build_images(timeout_s=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(" cached") == 3, result.stdout
    assert f"IMAGE_ROLLOUTD={images['rolloutd']}" in result.stdout
    assert time.monotonic() - t0 < 120, "a cached run must not rebuild anything"


def test_rolloutd_image_runs_the_cli_and_temporal(images: dict[str, str]) -> None:
    """The rolloutd image runs the CLI (its version, help, the model catalog), the temporal
    binary, bubblewrap and Node 20 or later, imports every fleet's module, and loads the
    catalog's tokenizer without torch. One ``podman run``: seconds, once the images exist
    (building them cold takes about 23 minutes here, docs/images.md)."""
    script = (
        "rolloutd --version && rolloutd --help >/dev/null && rolloutd models list && "
        "temporal --version && bwrap --version && node --version && "
        "python -c 'import rolloutd.workers, rolloutd.rest, rolloutd.proxy.http.server, "
        'rolloutd.sandbox.runtimes.bwrap; print("fleets importable")\' && '
        "python -c 'from rolloutd.engine.models import load_tokenizer as t; "
        'print("tokenizer", len(t("qwen2.5-coder-0.5b")("def f():").input_ids))\''
    )
    out = _podman("run", "--rm", images["rolloutd"], "sh", "-c", script).stdout
    assert out.startswith("rolloutd "), out
    assert "qwen2.5-coder-0.5b" in out and "temporal version" in out, out
    assert "bubblewrap 0." in out, out
    assert "\nv20." in out, out  # Node >= 20: bookworm's own nodejs is 18
    assert "fleets importable" in out, out
    # the gateway's chat template: the catalog's tokenizer without its weights or torch
    assert "tokenizer " in out and "tokenizer 0" not in out, out


_CODE_HASH = (
    "import hashlib, pathlib, rolloutd; root = pathlib.Path(rolloutd.__file__).parent; "
    "h = hashlib.sha256(); "
    "[h.update(p.relative_to(root).as_posix().encode() + p.read_bytes()) "
    "for p in sorted(root.rglob('*.py'))]; print(h.hexdigest())"
)


@pytest.mark.parametrize("image", ["rolloutd", "engine"])
def test_images_hold_this_checkouts_code(images: dict[str, str], image: str) -> None:
    """A cached layer must never keep older code (a bind-mounted install is cached on its
    instruction's text and build arguments, not on the files it installs)."""
    local = subprocess.run(
        [sys.executable, "-c", _CODE_HASH],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    inside = _podman("run", "--rm", images[image], "python", "-c", _CODE_HASH).stdout
    assert inside.strip() == local.stdout.strip()


def _npm_version(package: str) -> str:
    lock = json.loads((ROOT / "images" / "rolloutd" / "package-lock.json").read_text())
    return lock["packages"][f"node_modules/{package}"]["version"]


def _tool_version(tool: str) -> str:
    pins = (ROOT / "images" / "rolloutd" / f"tool-{tool}.txt").read_text().splitlines()
    return next(line.split("==")[1] for line in pins if line.startswith(f"{tool}=="))


@pytest.mark.parametrize(
    ("command", "package"),
    [
        ("codex", "@openai/codex"),
        ("claude", "@anthropic-ai/claude-code"),
        ("gemini", "@google/gemini-cli"),
        ("qwen", "@qwen-code/qwen-code"),
        ("pi", "@mariozechner/pi-coding-agent"),
        ("opencode", "opencode-ai"),
    ],
)
def test_npm_harness_cli_answers_its_version(
    images: dict[str, str], command: str, package: str
) -> None:
    """Each npm harness CLI in the rolloutd image answers ``--version`` with the version
    images/rolloutd/package-lock.json pins. One ``podman run`` per CLI: seconds each, once the
    images exist (building them cold takes about 23 minutes here, docs/images.md)."""
    result = _podman(
        "run", "--rm", images["rolloutd"], f"{NPM_PREFIX}/node_modules/.bin/{command}", "--version"
    )
    out = result.stdout + result.stderr  # pi prints its version on stderr
    assert _npm_version(package) in out, out


def test_python_harness_clis_run_in_their_own_environments(images: dict[str, str]) -> None:
    """aider and mini-swe-agent run in the rolloutd image from their own environments, at the
    versions their pin files name. One ``podman run``: seconds, once the images exist (building
    them cold takes about 23 minutes here, docs/images.md)."""
    script = (
        f"{TOOLS}/bin/aider --version && {TOOLS}/bin/mini --help >/dev/null && "
        f"{TOOLS}/mini-swe-agent/bin/python -c 'import importlib.metadata as m; "
        f'print("mini-swe-agent", m.version("mini-swe-agent"))\''
    )
    out = _podman("run", "--rm", images["rolloutd"], "sh", "-c", script).stdout
    assert f"aider {_tool_version('aider-chat')}" in out, out
    assert f"mini-swe-agent {_tool_version('mini-swe-agent')}" in out, out


def test_bubblewrap_sandboxes_a_harness_in_a_privileged_container(images: dict[str, str]) -> None:
    """A sandbox pod runs privileged (user, mount, PID and network namespaces); /usr and /opt
    bound read-only as the bwrap runtime binds them, so node and the CLIs resolve inside."""
    script = (
        "bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --ro-bind /opt /opt "
        "--symlink usr/lib /lib --symlink usr/lib64 /lib64 --symlink usr/bin /bin "
        "--proc /proc --dev /dev --tmpfs /tmp "
        f"sh -c 'echo pid $$; node {NPM_PREFIX}/node_modules/.bin/pi --version 2>&1'"
    )
    out = _podman("run", "--rm", "--privileged", images["rolloutd"], "sh", "-c", script).stdout
    assert "pid 1\n" in out or "pid 2\n" in out, out  # its own PID namespace
    assert _npm_version("@mariozechner/pi-coding-agent") in out, out


@pytest.fixture
def engine_container(images: dict[str, str]) -> Iterator[tuple[str, str, str, str]]:
    """The engine image running with its ports published: (name, llama URL, control URL,
    control token)."""
    name = f"rolloutd-engine-test-{uuid.uuid4().hex[:8]}"
    port, control_port, token = free_port(), free_port(), uuid.uuid4().hex
    _podman(
        "run",
        "-d",
        "--name",
        name,
        "-e",
        f"ROLLOUTD_ENGINE_CONTROL_TOKEN={token}",
        "-e",
        "ROLLOUTD_ENGINE_PARALLEL=2",
        "-e",
        "ROLLOUTD_ENGINE_CTX_SIZE=4096",
        "-p",
        f"127.0.0.1:{port}:8400",
        "-p",
        f"127.0.0.1:{control_port}:8401",
        images["engine"],
    )
    try:
        yield name, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{control_port}", token
    finally:
        logs = _podman("logs", name, check=False)
        sys.stdout.write(logs.stdout[-4000:] + logs.stderr[-4000:])
        _podman("rm", "-f", "-t", "5", name, check=False)


def _wait_healthy(url: str, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url}/health did not answer 200 within {timeout_s}s")


def test_engine_image_serves_its_model_and_the_control_interface(
    engine_container: tuple[str, str, str, str],
) -> None:
    """The engine image serves /health, its one model and a completion; its control port refuses
    a request without the token, reports policy version 0, loads the baked-in GGUF again as
    version 1 (healthy after) and refuses an older version with 409. The engine's start and a
    load: up to a few minutes (180 s deadlines), once the images exist (building them cold takes
    about 23 minutes here, docs/images.md)."""
    name, url, control, token = engine_container
    _wait_healthy(url)
    served = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]]
    assert len(served) == 1 and served[0], served
    completion = httpx.post(
        f"{url}/completion", json={"prompt": "def add(a, b):", "n_predict": 4}, timeout=60
    ).json()
    assert completion["tokens_predicted"] > 0 and completion["content"], completion

    assert httpx.get(f"{control}/engine", timeout=10).status_code == 401
    auth = {"Authorization": f"Bearer {token}"}
    state = httpx.get(f"{control}/engine", headers=auth, timeout=10).json()
    assert state["policy_version"] == 0, state
    # "load this GGUF, answer when ready": the baked-in file again, as policy version 1
    model = _podman(
        "exec", name, "sh", "-c", "ls /opt/rolloutd/cache/models/*/model.gguf"
    ).stdout.strip()
    loaded = httpx.post(
        f"{control}/engine/load",
        headers=auth,
        timeout=180,
        json={"model_file": model, "policy_version": 1},
    )
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["policy_version"] == 1
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    older = httpx.post(
        f"{control}/engine/load",
        headers=auth,
        timeout=60,
        json={"model_file": model, "policy_version": 0},
    )
    assert older.status_code == 409, older.text


def test_a_fleet_runs_against_the_images_temporal_dev_server_in_a_pod(
    images: dict[str, str],
) -> None:
    """One pod (shared network namespace, as `podman kube play` makes): the image's
    ``temporal server start-dev`` with rolloutd's search attributes (the chart's dev mode) and
    the workflows and eval fleets polling it."""
    pod = f"rolloutd-test-{uuid.uuid4().hex[:8]}"
    dev = (
        "exec $(python -c 'from rolloutd.stack.processes import TemporalDevServer as T; "
        'print(" ".join(T(host="0.0.0.0", port=7233, ui_port=8233, '
        "headless=True).command()))')"
    )
    env = [
        "-e",
        "ROLLOUTD_TEMPORAL_ADDRESS=localhost:7233",
        "-e",
        "ROLLOUTD_STORE_URL=/var/lib/rolloutd/store",
    ]
    _podman("pod", "create", "--name", pod)
    try:
        _podman(
            "run",
            "-d",
            "--pod",
            pod,
            "--name",
            f"{pod}-temporal",
            images["rolloutd"],
            "sh",
            "-c",
            dev,
        )
        # workers retry their first connect (ROLLOUTD_TEMPORAL_CONNECT_WAIT_S); waiting here
        # keeps this test about the image, tests/workers/test_connect_retry.py is the wait's
        deadline = time.monotonic() + 120
        while (
            "SERVING"
            not in _podman(
                "exec",
                f"{pod}-temporal",
                "temporal",
                "operator",
                "cluster",
                "health",
                "--address",
                "localhost:7233",
                check=False,
            ).stdout
        ):
            assert time.monotonic() < deadline, "the dev server did not serve within 120 s"
            time.sleep(2)
        for fleet in ("workflows", "eval"):
            _podman(
                "run",
                "-d",
                "--pod",
                pod,
                "--name",
                f"{pod}-{fleet}",
                *env,
                images["rolloutd"],
                "rolloutd",
                "worker",
                "--fleet",
                fleet,
            )
        deadline = time.monotonic() + 120
        logs: dict[str, str] = {}
        while time.monotonic() < deadline:
            logs = {
                fleet: (lambda r: r.stdout + r.stderr)(
                    _podman("logs", f"{pod}-{fleet}", check=False)
                )
                for fleet in ("workflows", "eval")
            }
            if all('"fleet_started"' in text for text in logs.values()):
                break
            time.sleep(2)
        assert all('"fleet_started"' in text for text in logs.values()), logs
        # still polling after starting: a refused connection would have ended the process
        time.sleep(3)
        running = _podman("ps", "--filter", f"pod={pod}", "--format", "{{.Names}}").stdout
        assert f"{pod}-workflows" in running and f"{pod}-eval" in running, (running, logs)
    finally:
        _podman("pod", "rm", "-f", "-t", "5", pod, check=False)
