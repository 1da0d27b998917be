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
