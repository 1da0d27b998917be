"""llama-server's lifecycle: a started server is the process this object spawned.

A weight load restarts llama-server on the same port; if another process took the port in
between, the health check would pass on that process and the trainer's weights would never be
served. ``start`` reads ``GET /props`` (``model_path``) and refuses a server that serves another
file.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import httpx
import pytest

from rolloutd.engine.server import LlamaServer
from rolloutd.errors import RolloutdError

pytestmark = [pytest.mark.engine]


def test_a_server_on_the_port_serving_another_file_is_refused(tmp_path: Path) -> None:
    first = LlamaServer("smollm2-135m", parallel=1, ctx_size=2048).start()
    try:
        copy = tmp_path / "weights.gguf"
        shutil.copyfile(first.files.gguf, copy)
        second = LlamaServer(dataclasses.replace(first.files, gguf=copy), port=first.port)
        with pytest.raises(RolloutdError, match="another process took the port"):
            second.start(timeout_s=30)
        assert second.process is not None and second.process.poll() is not None
        # the first server still answers, with its own file
        props = httpx.get(f"{first.url}/props", timeout=5).json()
        assert Path(props["model_path"]).resolve() == Path(first.files.gguf).resolve()
    finally:
        first.stop()


def test_rolloutd_engine_with_a_key_serves_only_who_sends_it(tmp_path: Path) -> None:
    """``rolloutd engine`` as the chart's engine pod runs it (``ROLLOUTD_ENGINE_API_KEY`` from
    a Secret): a chat completion without the key is refused, with it answered; /health stays
    open for probes; the key is on no command line."""
    import os
    import signal
    import subprocess
    import sys

    from rolloutd.processes import free_port

    key = "k-" + "7" * 40
    port = free_port("127.0.0.1")
    env = {**os.environ, "ROLLOUTD_ENGINE_API_KEY": key}
    argv = ["engine", "--model", "smollm2-135m", "--port", str(port), "--parallel", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rolloutd.cli", *argv, "--ctx-size", "2048"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once llama-server is healthy
        assert f":{port}" in line, line
        url = f"http://127.0.0.1:{port}"
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        refused = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)
        assert refused.status_code == 401
        headers = {"Authorization": f"Bearer {key}"}
        answered = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert answered.status_code == 200, answered.text
        children = subprocess.run(
            ["ps", "-ww", "-o", "args=", "--ppid", str(proc.pid)], capture_output=True, text=True
        ).stdout
        assert "llama-server" in children and key not in children
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
