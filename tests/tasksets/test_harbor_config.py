"""rolloutd's task.toml reader: both forms, refusals by name, and agreement with harbor's own
``TaskConfig`` on every example task (in harbor's environment of its own)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rolloutd.errors import ConfigError
from rolloutd.tasksets.harbor_config import HarborTaskConfig, parse_task_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "harbor"
#: Terminal-Bench 2.0's task.toml shape (schema 1.1 as written there; values made up here)
TB2 = """
schema_version = "1.1"
artifacts = []

[task]
name = "terminal-bench/some-task"
description = "d"
keywords = ["k"]
[[task.authors]]
name = "A"
email = "a@example.com"

[metadata]
difficulty = "medium"
expert_time_estimate_min = 60.0

[verifier]
timeout_sec = 900.0

[agent]
timeout_sec = 900.0

[environment]
build_timeout_sec = 600.0
docker_image = "example/some-task:20251031"
cpus = 1
memory_mb = 2048
storage_mb = 10240
gpus = 0
allow_internet = true
mcp_servers = []

[verifier.env]

[environment.env]

[solution.env]
"""


def normalized(config: HarborTaskConfig) -> dict:
    """The fields harbor_dump.py prints, as rolloutd reads them (Harbor's default network,
    public, where the file sets none)."""
    env = config.environment
    return {
        "schema_version": config.schema_version,
        "package": config.task.name if config.task else None,
        "metadata": config.metadata,
        "agent_timeout_sec": config.agent.timeout_sec,
        "agent_network": config.network("agent") or "public",
        "verifier_timeout_sec": config.verifier.timeout_sec,
        "verifier_env": config.verifier.env,
        "verifier_mode": config.verifier.environment_mode,
        "verifier_network": config.network("verifier") or "public",
        "docker_image": env.docker_image,
        "build_timeout_sec": env.build_timeout_sec,
        "cpus": env.cpus,
        "memory_mb": env.memory_mb,
        "storage_mb": env.storage_mb,
        "env": env.env,
        "workdir": env.workdir,
        "solution_env": config.solution.env,
    }


def test_terminal_bench_shape_reads():
    config = parse_task_config(TB2)
    assert config.schema_version == "1.1"
    assert config.task is not None and config.task.authors[0].email == "a@example.com"
    assert config.environment.docker_image == "example/some-task:20251031"
    assert (config.environment.memory_mb, config.environment.storage_mb) == (2048, 10240)
    assert config.network("agent") == "public"  # allow_internet = true


def test_version_1_0_form_migrates_sizes():
    config = parse_task_config(
        'version = "1.0"\n[environment]\nmemory = "4G"\nstorage = "512M"\ncpus = 2\n'
    )
    assert config.schema_version == "1.0"
    assert (config.environment.memory_mb, config.environment.storage_mb) == (4096, 512)


def test_phase_network_overrides_environment():
    config = parse_task_config(
        '[agent]\nnetwork_mode = "no-network"\n[environment]\nallow_internet = true\n'
    )
    assert config.network("agent") == "no-network"
    assert config.network("verifier") == "public"
    assert parse_task_config("").network("agent") is None


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[[steps]]\nname = "one"\n', "steps is not supported"),
        ("[environment]\ngpus = 1\n", "[environment] gpus is not supported"),
        ('[environment]\nmcp_servers = [{name = "m", url = "http://x"}]\n', "mcp_servers"),
        ('[environment.healthcheck]\ncommand = "true"\n', "healthcheck"),
        ('[environment]\nos = "windows"\n', "os = 'windows'"),
        ('[verifier.environment]\ndocker_image = "x"\n', "[verifier] environment"),
        ('[verifier]\nenvironment_mode = "separate"\n', "environment_mode = 'separate'"),
        ('[agent]\nuser = "agent"\n', "[agent] user"),
        ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n', "allowlist"),
        ('artifacts = ["/app/out"]\n', "artifacts is not supported"),
        ('[environment.env]\nTOKEN = "${HOST_TOKEN}"\n', "templates are not supported"),
        ("[environment]\nshiny = true\n", "environment.shiny: unknown field"),
        ("[agent]\ntimeout = 3\n", "agent.timeout: unknown field"),
        ('schema_version = "9.9"\n', "schema_version '9.9' is unknown"),
        ("[environment]\ncpus = -1\n", "environment.cpus"),
        ("[agent\n", "not TOML"),
    ],
)
def test_what_rolloutd_cannot_honour_is_refused_by_name(text, named):
    with pytest.raises(ConfigError) as caught:
        parse_task_config(text)
    assert named in caught.value.message


def test_harmless_forms_of_unsupported_fields_pass():
    config = parse_task_config(
        '[agent]\nuser = "root"\n[environment]\ngpus = 0\nmcp_servers = []\n'
        "[verifier]\ncollect = []\n"
    )
    assert config.environment.cpus is None


def test_every_example_reads_as_harbors_own_task_config():
    """Each examples/harbor task.toml, read here and by harbor 0.25's ``TaskConfig`` in its own
    Python 3.12 environment (built by scripts/harbor_env.sh on first use: about 1 min cold,
    5 s cached), gives the same budgets, limits, image, network and environments."""
    python = (
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "harbor_env.sh")],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "ROLLOUTD_VENV": sys.prefix},
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    folders = sorted(p for p in EXAMPLES.iterdir() if (p / "task.toml").is_file())
    assert len(folders) >= 6
    out = subprocess.run(
        [python, str(Path(__file__).with_name("harbor_dump.py")), *map(str, folders)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    theirs = json.loads(out)
    ours = {p.name: normalized(parse_task_config((p / "task.toml").read_text())) for p in folders}
    assert ours == theirs
