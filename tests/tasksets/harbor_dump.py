"""Run by harbor's own environment (Python 3.12, scripts/harbor_env.sh), never by rolloutd's:
print each task.toml as harbor 0.25's ``TaskConfig`` reads it, in the shape of
``tests/tasksets/test_harbor_config.py``'s ``normalized``. Arguments: task folders."""

import json
import sys
from pathlib import Path

from harbor.models.task.config import TaskConfig


def phase_network(config, phase):
    own = getattr(config, phase).explicit_phase_policy()
    policy = own or config.environment.resolve_baseline()
    return policy.network_mode.value


def normalized(config):
    env = config.environment
    return {
        "schema_version": config.schema_version,
        "package": config.task.name if config.task else None,
        "metadata": config.metadata,
        "agent_timeout_sec": config.agent.timeout_sec,
        "agent_network": phase_network(config, "agent"),
        "verifier_timeout_sec": config.verifier.timeout_sec,
        "verifier_env": config.verifier.env,
        "verifier_mode": (
            config.verifier.environment_mode.value if config.verifier.environment_mode else None
        ),
        "verifier_network": phase_network(config, "verifier"),
        "docker_image": env.docker_image,
        "build_timeout_sec": env.build_timeout_sec,
        "cpus": None if env.cpus is None else float(env.cpus),
        "memory_mb": env.memory_mb,
        "storage_mb": env.storage_mb,
        "env": env.env,
        "workdir": env.workdir,
        "solution_env": config.solution.env,
    }


print(
    json.dumps(
        {
            Path(folder).name: normalized(
                TaskConfig.model_validate_toml((Path(folder) / "task.toml").read_text())
            )
            for folder in sys.argv[1:]
        }
    )
)
