"""The config file (``rolloutd.toml``) and the names a process accepts, as a user meets them:
the ``rolloutd`` command in a subprocess, its exit code and its message (docs/settings.md).

A misspelt key in the file, a secret in the file and a misspelt ``ROLLOUTD_*`` variable each
stop every process at start, naming the nearest known name; the right names pass (the
controls). ``rolloutd settings`` shows where each value came from. examples/rolloutd.toml
loads, and a fleet of ``rolloutd worker`` processes built from it publishes its sandbox
policy, refuses what that policy forbids and scores with its evaluator registry.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from rolloutd.cli.submission import read_task_set
from rolloutd.errors import ConfigError
from rolloutd.generation.commands import load_spec
from rolloutd.settings import (
    SECRETS,
    CommonSettings,
    EngineSettings,
    GatewaySettings,
    SandboxSettings,
    check_startup,
    config_problems,
    setting_keys,
)
from rolloutd.stack import free_port, stop_process
from rolloutd.trainer_client import RolloutClient, validate_task
from rolloutd.trainer_client.client import InvalidTaskError
from tests.conftest import have_bwrap
from tests.support.namespaces import fresh_namespace

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "rolloutd.toml"
#: what tests/conftest.py sets for every process the tests start; a test of the file takes
#: them away so that the file's tables are what a process reads
CONFTEST_VARIABLES = ("ROLLOUTD_SANDBOX_POLICY", "ROLLOUTD_EVALUATORS")


def environment(**variables: str) -> dict[str, str]:
    """This process's environment without :data:`CONFTEST_VARIABLES` or a config file, plus
    ``variables``."""
    env = {k: v for k, v in os.environ.items() if k not in (*CONFTEST_VARIABLES, "ROLLOUTD_CONFIG")}
    return {**env, "PYTHONPATH": os.pathsep.join(sys.path), **variables}


def rolloutd(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``rolloutd ARGS`` as a user runs it (this checkout's, not one first on PATH)."""
    return subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


@contextlib.contextmanager
def config_variable(path: Path | None) -> Iterator[None]:
    """``ROLLOUTD_CONFIG`` names ``path`` in this process, and :data:`CONFTEST_VARIABLES` are
    unset, for the block."""
    saved = {k: os.environ.get(k) for k in ("ROLLOUTD_CONFIG", *CONFTEST_VARIABLES)}
    for name in CONFTEST_VARIABLES:
        os.environ.pop(name, None)
    if path is None:
        os.environ.pop("ROLLOUTD_CONFIG", None)
    else:
        os.environ["ROLLOUTD_CONFIG"] = str(path)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


#: the commands that start a process of the stack, each refused before it starts anything
STARTS = [
    ["worker", "--fleet", "sandbox"],
    ["up"],
    ["rest"],
    ["codec-server"],
    ["status"],
    ["settings"],
]


@pytest.mark.parametrize("command", STARTS, ids=lambda c: c[0])
def test_a_misspelt_key_in_the_file_stops_the_process(command: list[str], tmp_path: Path) -> None:
    config = tmp_path / "rolloutd.toml"
    config.write_text("max_concurent_sessions = 4\n")
    done = rolloutd(*command, "--config", str(config), env=environment())
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"rolloutd {command[0]}: {config}: unknown key 'max_concurent_sessions'; "
        "did you mean 'max_concurrent_sessions'?"
    ) in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", STARTS, ids=lambda c: c[0])
def test_a_misspelt_variable_stops_the_process(command: list[str], tmp_path: Path) -> None:
    env = environment(ROLLOUTD_MAX_CONCURENT_SESSIONS="4", ROLLOUTD_HOME=str(tmp_path))
    done = rolloutd(*command, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"rolloutd {command[0]}: unknown variable ROLLOUTD_MAX_CONCURENT_SESSIONS; "
        "did you mean ROLLOUTD_MAX_CONCURRENT_SESSIONS?"
    ) in done.stderr
    assert "Traceback" not in done.stderr


def test_the_right_names_pass_and_settings_shows_where_each_value_came_from(
    tmp_path: Path,
) -> None:
    """The control of the two tests above, and ``rolloutd settings``: a key from the file, a
    variable over the file, a default; a secret masked."""
    config = tmp_path / "rolloutd.toml"
    config.write_text('max_concurrent_sessions = 4\ntemporal_namespace = "from-file"\n')
    env = environment(
        ROLLOUTD_TEMPORAL_NAMESPACE="from-env",
        ROLLOUTD_ADMIN_TOKEN="not-shown-1234",
        ROLLOUTD_CONFIG=str(config),
        ROLLOUTD_HOME=str(tmp_path),
    )
    done = rolloutd("settings", env=env)
    assert done.returncode == 0, done.stderr
    keys = setting_keys()
    rows = {
        line.split()[0]: [part.strip() for part in line.split(maxsplit=2)[1:]]
        for line in done.stdout.splitlines()
        if line.split() and line.split()[0] in keys
    }
    assert rows["max_concurrent_sessions"] == ["file", "4"]
    assert rows["temporal_namespace"] == ["environment", '"from-env"']
    assert rows["gateway_port"] == ["default", "8300"]
    assert rows["admin_token"] == ["environment", "***"]
    assert rows["rest_token"] == ["default", "unset"]
    assert "not-shown-1234" not in done.stdout
    assert done.stdout.startswith(f"config file: {config} (ROLLOUTD_CONFIG)")
    assert set(rows) == set(keys)


def test_a_secret_in_the_file_is_refused_naming_where_it_goes(tmp_path: Path) -> None:
    config = tmp_path / "rolloutd.toml"
    config.write_text('admin_token = "s3cret"\n')
    done = rolloutd("settings", "--config", str(config), env=environment())
    assert done.returncode == 1
    assert "'admin_token' is a secret and never goes in the config file: ROLLOUTD_ADMIN_TOKEN" in (
        done.stderr
    )
    assert "s3cret" not in done.stdout + done.stderr
    for key in SECRETS:  # every secret, each with its variable
        (problem,) = config_problems({key: "x"})
        assert f"ROLLOUTD_{key.upper()}" in problem


def test_every_problem_of_the_file_is_named_at_once() -> None:
    """Unknown keys (also one written as its variable), a bad value, a table's unknown field
    (with its dotted path), a variable that is no setting; a right file has none."""
    assert config_problems(
        {
            "ROLLOUTD_STORE_URL": "/srv/store",
            "gateway_port": "eighty",
            "sandbox_policy": {"runtime": ["bwrap"], "max_limits": {"cpu": 2}},
            "ui_codec_endpoint": "http://codec",
            "evaluators": {"mine": "pkg:Mine"},
        }
    ) == [
        "unknown key 'ROLLOUTD_STORE_URL'; did you mean 'store_url'?",
        "gateway_port: Input should be a valid integer, unable to parse string as an integer",
        "sandbox_policy.runtime: unknown field 'runtime'; did you mean 'runtimes'?",
        "sandbox_policy.max_limits.cpu: unknown field 'cpu'; did you mean 'cpus'?",
        "'ui_codec_endpoint' is no setting (set ROLLOUTD_UI_CODEC_ENDPOINT in the environment: "
        "`rolloutd up`: the codec server the Temporal UI decodes through, the operator's own "
        "(default: one `up` runs on loopback))",
    ]
    assert config_problems({"store_url": "/srv/store", "sandbox_policy": {"runtimes": []}}) == []


def test_a_value_its_setting_refuses_stops_the_process(tmp_path: Path) -> None:
    """A bad value in the file names its key; one in the environment its variable (every
    class's, not only the one the command reads)."""
    config = tmp_path / "rolloutd.toml"
    config.write_text('gateway_port = "eighty"\n')
    done = rolloutd("status", "--config", str(config), env=environment())
    assert done.returncode == 1
    assert f"{config}: gateway_port: Input should be a valid integer" in done.stderr
    env = environment(ROLLOUTD_ENGINE_PARALLEL="many", ROLLOUTD_HOME=str(tmp_path))
    done = rolloutd("status", env=env)
    assert done.returncode == 1
    assert "rolloutd status: ROLLOUTD_ENGINE_PARALLEL: Input should be a valid integer" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    done = rolloutd("status", "--config", str(tmp_path / "nope.toml"), env=environment())
    assert done.returncode == 1
    assert f"ROLLOUTD_CONFIG={tmp_path / 'nope.toml'}: no such file" in done.stderr


def test_a_variable_overrides_its_key_whole(tmp_path: Path) -> None:
    """``ROLLOUTD_SANDBOX_POLICY`` replaces the file's table; it is not merged with it."""
    config = tmp_path / "rolloutd.toml"
    config.write_text(
        'gateway_port = 9000\n[sandbox_policy]\nruntimes = ["bwrap"]\nimage_roots = ["/srv"]\n'
    )
    with config_variable(config):
        assert SandboxSettings().sandbox_policy.image_roots == ["/srv"]
        os.environ["ROLLOUTD_SANDBOX_POLICY"] = '{"runtimes": ["podman"]}'
        policy = SandboxSettings().sandbox_policy
        assert (policy.runtimes, policy.image_roots) == (["podman"], [])
        assert GatewaySettings().gateway_port == 9000
        assert GatewaySettings(gateway_port=9001).gateway_port == 9001  # the code's argument


def test_the_example_file_loads() -> None:
    with config_variable(EXAMPLE):
        check_startup()
        sandbox = SandboxSettings()
        assert sandbox.sandbox_policy.runtimes == ["bwrap", "podman"]
        assert sandbox.sandbox_policy.max_limits.memory_mb == 16384
        assert sandbox.max_concurrent_provisions == 4
        assert CommonSettings().evaluators == {"grpo_loop_reply_reward": "grpo_loop:ReplyReward"}
        assert EngineSettings().parallel == 4
    done = rolloutd("settings", "--config", str(EXAMPLE), env=environment())
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- specs and options


def test_a_generation_spec_may_be_toml_and_is_read_strictly(tmp_path: Path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi"}\n')
    spec = tmp_path / "spec.toml"
    text = (
        'name = "g"\n'
        f'[source]\ntype = "jsonl"\npath = "{rows}"\n'
        f'[outputs]\ndir = "{tmp_path / "out"}"\n'
        '[template]\ninstruction = "{prompt}"\nnum_samples = 3\n'
        '[template.harness]\ntype = "shell"\ncommand = "true"\n'
    )
    spec.write_text(text)
    loaded = load_spec(spec)
    assert (loaded.name, loaded.template.num_samples) == ("g", 3)
    spec.write_text(text.replace("num_samples", "num_sampels"))
    with pytest.raises(ValidationError, match="did you mean 'num_samples'"):
        load_spec(spec)
    spec.write_text("name = \n")
    with pytest.raises(ConfigError, match="not TOML"):
        load_spec(spec)


def test_task_set_options_may_be_toml_and_are_read_strictly(tmp_path: Path) -> None:
    options = tmp_path / "options.toml"
    options.write_text('num_samples = 2\ntask_id_prefix = "t-"\n[sampling]\nmax_tokens = 64\n')
    harbor = ROOT / "examples" / "harbor" / "fix-word-count"
    (task,) = read_task_set(harbor, "harbor", "oracle", str(options))
    assert (task["num_samples"], task["task_id"]) == (2, "t-fix-word-count")
    assert task["sampling"]["max_tokens"] == 64
    options.write_text("num_sample = 2\n")
    with pytest.raises(SystemExit, match="unknown field 'num_sample'; did you mean 'num_samples'"):
        read_task_set(harbor, "harbor", "oracle", str(options))
    written = '{"num_samples": 2, "task_id_prefix": "t-"}'
    as_json = read_task_set(harbor, "harbor", "oracle", written)
    assert (as_json[0]["num_samples"], as_json[0]["task_id"]) == (2, "t-fix-word-count")


# --------------------------------------------------------------------------- a fleet from a file


def reply_task(task_id: str, reply: str, runtime: str) -> dict:
    """A session that writes ``reply`` without a model call, scored by the example file's
    evaluator (examples/grpo_loop.py's ReplyReward: 1 / words of the reply)."""
    return {
        "task_id": task_id,
        "instruction": "reply",
        "harness": {"type": "shell", "command": f"printf '{reply}' > reply.txt"},
        "runtime": {"type": runtime},
        "evaluator": {"type": "grpo_loop_reply_reward", "command": "cat reply.txt"},
        "max_replacements": 0,
    }


@pytest.mark.temporal
@pytest.mark.engine
@pytest.mark.sandbox
@pytest.mark.timeout(300)
async def test_a_fleet_built_from_the_example_file(temporal_server, engine, tmp_path: Path) -> None:
    """Four ``rolloutd worker`` processes read examples/rolloutd.toml (and, over it, the
    variables that place them in a namespace of their own): the sandbox host publishes the
    file's policy, submit refuses a ``local`` task that policy forbids (the stack the other
    tests build allows it) and scores sessions with the file's evaluator."""
    if not have_bwrap():
        pytest.skip("bwrap is not usable here")
    namespace = await fresh_namespace(temporal_server.address, "cfgfile")
    store = tmp_path / "store"
    root = Path(tempfile.mkdtemp(prefix="cfg-"))  # short: runtimes' unix sockets live below
    port = free_port()
    env = environment(
        ROLLOUTD_CONFIG=str(EXAMPLE),
        ROLLOUTD_TEMPORAL_ADDRESS=temporal_server.address,
        ROLLOUTD_TEMPORAL_NAMESPACE=namespace,
        ROLLOUTD_HOME=str(tmp_path),
        ROLLOUTD_STORE_URL=str(store),
        ROLLOUTD_HOST_ID=f"cfg-{uuid.uuid4().hex[:6]}",
        ROLLOUTD_GATEWAY_PORT=str(port),
        ROLLOUTD_BACKEND_URL=engine.url,
        ROLLOUTD_RUNTIME_ROOT=str(root),
        ROLLOUTD_LOG_JSON="false",
        PYTHONPATH=os.pathsep.join([*sys.path, str(ROOT / "examples")]),
    )
    workers = {}
    try:
        for fleet in ("workflows", "gateway", "sandbox", "eval"):
            workers[fleet] = subprocess.Popen(
                [sys.executable, "-m", "rolloutd.cli", "worker", "--fleet", fleet],
                env=env,
                cwd=tmp_path,
                stdout=open(tmp_path / f"{fleet}.log", "wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        client = await RolloutClient.connect(
            temporal_server.address, namespace=namespace, store_url=str(store)
        )
        client.registry_wait_s = 120
        ok, longer = (
            validate_task(reply_task("cfg-one", "Plum.", "bwrap")),
            validate_task(reply_task("cfg-two", "A plum", "bwrap")),
        )
        await client.check_tasks([ok])  # waits for the sandbox and eval hosts to register

        fleets = await client.capabilities()
        (host,) = fleets.of("sandbox")
        assert host.policy is not None
        assert host.policy.runtimes == ["bwrap", "podman"]
        assert host.policy.image_roots == ["/srv/rolloutd/images"]
        assert host.policy.images == ["localhost/*", "docker.io/library/*"]
        assert (host.policy.default_limits.cpus, host.policy.max_limits.memory_mb) == (2.0, 16384)
        assert "grpo_loop_reply_reward" in fleets.evaluator_names()

        with pytest.raises(InvalidTaskError, match="runtime.type") as refused:
            await client.check_tasks([reply_task("cfg-local", "Plum.", "local")])
        assert "outside the sandbox policy" in str(refused.value)

        results = [await (await client.submit(t)).result() for t in (ok, longer)]
        rewards = [[s.reward for s in r.sessions] for r in results]
        logs = "".join((tmp_path / f"{f}.log").read_text()[-2000:] for f in workers)
        assert rewards == [[1.0], [0.5]], logs
        for fleet, proc in workers.items():
            assert proc.poll() is None, f"{fleet}: {(tmp_path / f'{fleet}.log').read_text()}"
    finally:
        for proc in workers.values():
            stop_process(proc)
        shutil.rmtree(root, ignore_errors=True)
