"""Secure by default: ``rolloutd up`` generates a codec key as it generates the admin token,
runs the codec server and points the Temporal UI at it without putting a token on a command
line; its home, store and runtimes are their owner's alone; its llama-server answers only the
holder of a key only the gateway gets; health and metrics bind to loopback unless configured;
no secret setting shows in a ``repr``. Each test fails when its guard is removed.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import time
from pathlib import Path

import httpx
import pytest

from rolloutd.activities.sandbox import SandboxActivities
from rolloutd.cli.parser import build_parser
from rolloutd.errors import BackendError
from rolloutd.processes import free_port
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.security.connection import payload_codec
from rolloutd.settings import (
    SETTINGS_CLASSES,
    CommonSettings,
    GatewaySettings,
    SandboxSettings,
    codec_key_file,
    codec_server_token_file,
    engine_api_key_file,
)
from rolloutd.stack import TemporalDevServer
from rolloutd.stack.local import LocalStack, _port_open
from rolloutd.stack.status import busy_slots
from rolloutd.store import BlobStore

#: settings fields holding a secret (a file path naming where one is, is not one)
SECRET_FIELD = re.compile(r"(token|secret|password|api_key|codec_keys|tls_key)$")

ROOT = Path(__file__).resolve().parents[2]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def no_codec_env(monkeypatch, tmp_path):
    """No codec key configured (as on a fresh machine), home in the test's folder."""
    monkeypatch.delenv("ROLLOUTD_CODEC_KEYS", raising=False)
    monkeypatch.delenv("ROLLOUTD_CODEC_KEY_FILE", raising=False)
    monkeypatch.delenv("ROLLOUTD_UI_CODEC_ENDPOINT", raising=False)
    monkeypatch.setenv("ROLLOUTD_HOME", str(tmp_path))
    return tmp_path


def test_up_generates_a_codec_key_once_and_reuses_it(no_codec_env: Path) -> None:
    stack = LocalStack(home=no_codec_env, fleets=())
    stack._make_codec_key()
    path = codec_key_file(no_codec_env)
    assert stack.codec_key_file == path and mode(path) == 0o600
    first = path.read_text()
    assert stack.env()["ROLLOUTD_CODEC_KEY_FILE"] == str(path)
    # a later `up` on this home keeps the key: the histories it wrote stay readable
    LocalStack(home=no_codec_env, fleets=())._make_codec_key()
    assert path.read_text() == first
    # a process on this machine with no key configured finds it, as it finds the admin token
    codec = payload_codec(CommonSettings())
    assert codec is not None and first.startswith(codec.key_id + ":")


def test_configured_keys_or_an_explicit_off_are_left_alone(no_codec_env, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTD_CODEC_KEYS", "")
    stack = LocalStack(home=no_codec_env, fleets=())
    stack._make_codec_key()
    assert stack.codec_key_file is None and not codec_key_file(no_codec_env).exists()
    assert payload_codec(CommonSettings()) is None


def test_the_temporal_ui_codec_endpoint_never_goes_on_a_command_line(tmp_path: Path) -> None:
    endpoint = "http://127.0.0.1:9/secret-codec-token"
    server = TemporalDevServer(
        tmp_path / "t.db", log_path=tmp_path / "t.log", ui_codec_endpoint=endpoint
    )
    command = server.command()
    assert not any("secret-codec-token" in part for part in command)
    assert server.ui_env_file is not None and mode(server.ui_env_file) == 0o600
    assert "secret-codec-token" in server.ui_env_file.read_text()


@pytest.mark.temporal
def test_the_temporal_ui_reads_the_codec_endpoint_from_its_file(tmp_path: Path) -> None:
    """A real dev server with its UI (about 3 s): the UI's settings name the endpoint."""
    endpoint = "http://127.0.0.1:9/secret-codec-token"
    server = TemporalDevServer(log_path=tmp_path / "t.log", ui_codec_endpoint=endpoint).start()
    try:
        settings = httpx.get(f"{server.ui_url}/api/v1/settings", timeout=30).json()
        assert settings["Codec"]["Endpoint"] == endpoint
    finally:
        server.stop()


def test_up_adds_a_codec_server_child_with_its_token_in_a_file(no_codec_env: Path) -> None:
    stack = LocalStack(home=no_codec_env, fleets=(), engine_url="http://127.0.0.1:9")
    stack.logs.mkdir(parents=True)
    stack._make_codec_key()
    stack._add_children()
    assert list(stack.supervisor.children)[:2] == ["codec-server", "temporal"]
    token_file = codec_server_token_file(no_codec_env)
    token = token_file.read_text().strip()
    assert mode(token_file) == 0o600 and len(token) >= 32
    assert stack.ui_codec_endpoint == f"{stack.codec_url}/{token}"
    assert (
        stack.temporal is not None and stack.temporal.ui_codec_endpoint == stack.ui_codec_endpoint
    )
    proc = stack.supervisor.children["codec-server"].spec.spawn()
    try:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
        assert token.encode() not in b" ".join(argv)
        # it answers the UI's form (the token as the first path segment) and nothing else
        deadline = time.monotonic() + 30
        while not _port_open("127.0.0.1", stack.codec_port):
            assert proc.poll() is None and time.monotonic() < deadline, (
                no_codec_env / "logs" / "codec-server.log"
            ).read_text()
            time.sleep(0.05)
        body = {"payloads": []}
        assert httpx.post(f"{stack.ui_codec_endpoint}/decode", json=body).status_code == 200
        assert httpx.post(f"{stack.codec_url}/decode", json=body).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_no_codec_server_without_keys(no_codec_env, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTD_CODEC_KEYS", "")
    stack = LocalStack(home=no_codec_env, fleets=(), engine_url="http://127.0.0.1:9")
    stack._make_codec_key()
    stack._add_children()
    assert "codec-server" not in stack.supervisor.children and stack.ui_codec_endpoint is None


def test_health_and_metrics_bind_to_loopback_unless_configured(monkeypatch) -> None:
    for name in ("ROLLOUTD_HEALTH_HOST", "ROLLOUTD_METRICS_HOST"):
        monkeypatch.delenv(name, raising=False)
    settings = CommonSettings()
    assert (settings.health_host, settings.metrics_host) == ("127.0.0.1", "127.0.0.1")
    # the chart configures all interfaces (probes come from the node)
    configmap = (ROOT / "helm" / "rolloutd" / "templates" / "configmap.yaml").read_text()
    assert 'ROLLOUTD_HEALTH_HOST: "0.0.0.0"' in configmap
    assert 'ROLLOUTD_METRICS_HOST: "0.0.0.0"' in configmap


def test_no_secret_setting_shows_in_a_repr() -> None:
    secret = "s3cr3t-value-in-repr"
    checked = 0
    for cls in SETTINGS_CLASSES:
        for name, field in cls.model_fields.items():
            if SECRET_FIELD.search(name):
                assert field.repr is False, f"{cls.__name__}.{name} shows in repr"
                checked += 1
    assert checked >= 8
    gateway = GatewaySettings(admin_token=secret, engine_control_token=secret)
    assert secret not in repr(gateway) and secret not in str(gateway)


def test_no_command_takes_a_token_argument() -> None:
    parser = build_parser()
    flags = [
        option
        for action in parser._subparsers._group_actions  # type: ignore[union-attr]
        for sub in action.choices.values()
        for a in sub._actions
        for option in a.option_strings
    ]
    # A secret is named as one (``--admin-token``, ``--api-key``, ``--secret-file``); a flag
    # about tokenization (``--tokenizer``) is not.
    secret = re.compile(r"[-_](token|secret|password)([-_]|$)|key$")
    assert "--tokenizer" in flags and not secret.search("--tokenizer")
    assert secret.search("--admin-token") and secret.search("--api-key")
    assert flags and not [f for f in flags if secret.search(f)]


def test_up_makes_its_home_store_and_runtimes_their_owners_alone(tmp_path: Path) -> None:
    """Below the home lie the store (every prompt and completion), the runtimes, the logs and
    Temporal's database: with the default umask (022) another local user reads them all. The
    home is made 0700, also one an earlier version made 0755; a store or runtime root the
    fleets make elsewhere is 0700 too."""
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)  # as an earlier `up` left it
    stack = LocalStack(home=home, fleets=())
    stack._make_home()
    assert mode(home) == 0o700 and mode(stack.logs) == 0o700
    old = os.umask(0o022)
    try:
        BlobStore(str(tmp_path / "elsewhere" / "store"))
        settings = SandboxSettings(runtime_root=str(tmp_path / "elsewhere" / "runtimes"))
        SandboxActivities(settings, BlobStore(str(tmp_path / "elsewhere" / "store")))
    finally:
        os.umask(old)
    assert mode(tmp_path / "elsewhere" / "store") == 0o700
    assert mode(tmp_path / "elsewhere" / "runtimes") == 0o700
    assert mode(tmp_path / "elsewhere") == 0o755  # control: the umask was the default's


@pytest.mark.engine
def test_up_gives_its_engine_an_api_key_that_only_the_gateway_holds(tmp_path: Path) -> None:
    """A real llama-server as ``up`` starts it (about 5 s): it answers no model call without
    the key, which sits in a 0600 file (never on its command line) and reaches the gateway's
    process alone; the gateway's backend client and ``rolloutd status`` send it."""
    home = tmp_path / "home"
    stack = LocalStack(
        home=home,
        fleets=("gateway", "sandbox"),
        engine_port=free_port(),
        engine_parallel=1,
        engine_ctx_size=2048,
    )
    stack._make_home()
    stack._add_children()
    engine = stack.engine
    assert engine is not None and engine.api_key_file == engine_api_key_file(home)
    key = engine.api_key_file.read_text().strip()
    assert len(key) >= 32 and mode(engine.api_key_file) == 0o600
    assert key not in " ".join(engine.command())
    assert stack.worker_env("gateway")["ROLLOUTD_BACKEND_API_KEY"] == key
    assert "ROLLOUTD_BACKEND_API_KEY" not in stack.worker_env("sandbox")
    body = {"prompt": "Hello", "n_predict": 1}
    engine.start()  # its own check reads /props with the key
    try:
        assert httpx.get(f"{engine.url}/health").status_code == 200
        assert httpx.post(f"{engine.url}/completion", json=body).status_code == 401
        assert httpx.get(f"{engine.url}/props").status_code == 401
        bearer = {"Authorization": f"Bearer {key}"}
        assert httpx.post(f"{engine.url}/completion", json=body, headers=bearer).status_code == 200

        async def context_sizes() -> list[object]:
            out: list[object] = []
            for api_key in (key, None):
                settings = GatewaySettings(backend_url=engine.url, backend_api_key=api_key)
                pool = BackendPool.from_settings(settings)
                (name,) = pool.names()
                try:
                    out.append(await pool.get(name).context_size())
                except BackendError as e:
                    out.append(e)
                finally:
                    await pool.aclose()
            return out

        keyed, keyless = asyncio.run(context_sizes())
        assert keyed == 2048 and isinstance(keyless, BackendError) and "401" in str(keyless)
        assert busy_slots(engine.url, home) == 0
        assert busy_slots(engine.url, tmp_path) is None  # control: without the key
    finally:
        engine.stop()
