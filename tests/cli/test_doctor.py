"""``rolloutd doctor`` on this host: every check passes here (setup.sh's machine), and a host
without bwrap on PATH and with one of ``up``'s ports taken gets each miss named with its fix
and a non-zero exit. The Temporal, engine and store checks are probed against a real Temporal
dev server and llama-server, each beside a control that must fail."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rolloutd.cli import checks
from rolloutd.sandbox_policy import SandboxPolicy

pytestmark = pytest.mark.sandbox

ROOT = Path(__file__).resolve().parents[2]
#: the ports `rolloutd up` binds with its defaults (LocalStack, `up --metrics-port`)
UP_PORTS = {7233, 8233, 8300, 8400, 9300, 9301, 9302, 9303}


def _doctor(env: dict[str, str], *args: str) -> tuple[int, dict[str, tuple[str, str, str]]]:
    """Run `rolloutd doctor --json`; its exit status and its rows, name -> (status, detail,
    fix); a name seen again gets ``#n``."""
    done = subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", "doctor", "--json", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    rows: dict[str, tuple[str, str, str]] = {}
    for row in json.loads(done.stdout or "[]"):
        name = row["name"] if row["name"] not in rows else f"{row['name']} #{len(rows)}"
        rows[name] = (row["status"], row["detail"], row["fix"])
    assert rows, done.stdout + done.stderr
    return done.returncode, rows


@pytest.fixture
def host_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user on this host: no ROLLOUTD_* setting but a home of its own
    (the test suite's policy, which lists runtimes this host lacks, left out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTD_")}
    env["ROLLOUTD_HOME"] = str(tmp_path / "home")
    return env


def _port_rows(rows: dict[str, tuple[str, str, str]]) -> dict[int, str]:
    return {int(n.split()[1]): s for n, (s, _, _) in rows.items() if n.startswith("port ")}


def test_every_check_passes_on_this_host(host_env: dict[str, str]) -> None:
    code, rows = _doctor(host_env)
    ports = _port_rows(rows)
    assert set(ports) == UP_PORTS
    # the control for each port row: whether this test can bind it right now (another stack
    # on this shared machine may hold one)
    for port, status in ports.items():
        assert status == ("ok" if checks.port_free(port) else "miss"), (port, rows)
    others = {n: r for n, r in rows.items() if not n.startswith("port ")}
    assert {r[0] for r in others.values()} <= {"ok", "skipped"}, others
    # what a default policy on this host needs is checked, not skipped
    for name in ("bwrap", "user namespaces", "seccomp", "cgroups", "sized disks"):
        assert others[name][0] == "ok", others[name]
    assert others["bwrap sandbox"][0] == "ok" and "disk_mb=10240" in others["bwrap sandbox"][1]
    assert others["podman"][0] == "ok" and others["podman configuration"][0] == "ok"
    assert others["harness qwen_code"][0] == "ok" and others["node"][0] == "ok"
    assert others["temporal"][0] == "skipped"  # no address configured: `up` starts its own
    assert code == (1 if "miss" in ports.values() else 0)


@pytest.fixture
def path_without_bwrap(tmp_path: Path) -> Iterator[str]:
    """A PATH with every program of this one but bwrap (links in one folder)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for entry in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            target = os.path.join(entry, name)
            if name != "bwrap" and not (folder / name).exists() and os.access(target, os.X_OK):
                (folder / name).symlink_to(target)
    assert not (folder / "bwrap").exists()
    yield str(folder)


def test_bwrap_hidden_and_a_port_taken_are_each_named_with_a_fix(
    host_env: dict[str, str], path_without_bwrap: str
) -> None:
    port = next(p for p in sorted(UP_PORTS) if checks.port_free(p))
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen()
        code, rows = _doctor({**host_env, "PATH": path_without_bwrap})
    assert code == 1
    status, detail, fix = rows["bwrap"]
    assert status == "miss" and "not on PATH" in detail and "apt-get install bubblewrap" in fix
    assert rows["bwrap sandbox"][0] == "skipped"
    taken = next(r for n, r in rows.items() if n.startswith(f"port {port} "))
    assert taken[0] == "miss" and "taken by another process" in taken[1]
    assert f"sport = :{port}" in taken[2]
    # the rest still checked as on a whole host: the misses are these two, and ports others hold
    misses = {n for n, r in rows.items() if r[0] == "miss"}
    assert misses - {n for n in misses if n.startswith("port ")} == {"bwrap"}
    assert rows["podman"][0] == "ok" and rows["seccomp"][0] == "ok"


def _target(tmp_path: Path, **changes: object) -> checks.Target:
    fields: dict[str, object] = {
        "home": tmp_path,
        "cache": Path(os.path.expanduser("~/.cache/rolloutd")),
        "runtime_root": tmp_path / "runtimes",
        "policy": SandboxPolicy(),
        "address": None,
        "namespace": "default",
        "store_url": str(tmp_path / "store"),
        "engine_url": None,
        "engine_api_key": None,
        "model": "qwen2.5-coder-0.5b",
        "tokenizer": "qwen2.5-coder-0.5b",
        "ports": {},
    }
    fields.update(changes)
    return checks.Target(**fields)  # type: ignore[arg-type]


@pytest.mark.temporal
def test_temporal_is_checked_where_it_runs(tmp_path: Path, temporal_server) -> None:
    (row,) = checks.check_temporal(_target(tmp_path, address=temporal_server.address))
    assert row.status == "ok" and temporal_server.address in row.detail
    with socket.socket() as closed:  # control: an address nothing answers at
        closed.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{closed.getsockname()[1]}"
    (row,) = checks.check_temporal(_target(tmp_path, address=nowhere))
    assert row.status == "miss" and nowhere in row.detail and "rolloutd up" in row.fix


@pytest.mark.engine
def test_an_engine_is_checked_for_the_model_it_serves(tmp_path: Path, engine) -> None:
    rows = checks.check_engine(_target(tmp_path, engine_url=engine.url))
    assert [r.status for r in rows] == ["ok", "ok"], rows
    assert "serves Qwen2.5-Coder-0.5B-Instruct" in rows[0].detail
    # control: the same engine named for a model it does not serve
    rows = checks.check_engine(
        _target(tmp_path, engine_url=engine.url, model="smollm2-135m", tokenizer="smollm2-135m")
    )
    assert rows[0].status == "miss" and "not SmolLM2-135M-Instruct" in rows[0].detail


@pytest.mark.engine
def test_each_engine_of_a_pool_is_checked_as_its_kind(tmp_path: Path, engine) -> None:
    """An engine given by URL is asked as its kind, each URL of a pool on a row of its own:
    the real llama-server answers as ``llama_cpp`` (control) and not as ``vllm``; a URL where
    nothing listens is named with its fix."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    pool = checks.check_engine(_target(tmp_path, engine_url=f"{engine.url},{dead}"))
    rows = {r.name: r for r in pool}
    assert rows[f"engine {engine.url}"].status == "ok"
    assert "answers as llama_cpp and serves" in rows[f"engine {engine.url}"].detail
    assert (
        rows[f"engine {dead}"].status == "miss" and "start the engine" in rows[f"engine {dead}"].fix
    )
    (named, _) = checks.check_engine(_target(tmp_path, engine_url=engine.url, engine_kind="vllm"))
    assert named.status == "miss" and "answers, but not as vllm" in named.detail
    assert "ROLLOUTD_BACKEND_TYPE / --engine-kind" in named.fix


def test_the_store_is_checked_writable(tmp_path: Path) -> None:
    (row,) = checks.check_store(_target(tmp_path))
    assert row.status == "ok"
    assert [p for p in (tmp_path / "store").rglob("*") if p.is_file()] == []  # probe deleted
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")  # control: a store URL below a file
    (row,) = checks.check_store(_target(tmp_path, store_url=str(blocked / "store")))
    assert row.status == "miss" and "ROLLOUTD_STORE_URL" in row.fix
