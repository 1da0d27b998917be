"""``rolloutd up`` and ``rolloutd demo`` on an engine the user already runs.

Two llama-servers started by hand (the ``llama-server`` binary of the engine extra, on
SmolLM2-135M-Instruct: the catalog model the stack does not serve by default) stand in for a
team's engine. ``rolloutd up --engine-kind llama_cpp`` on both (a pool of two) with their
tokenizer folder runs the demo's tasks (``examples/tasks.jsonl``, through ``rolloutd submit``)
in ``tokens`` capture: every completion carries prompt ids, sampled ids and their logprobs,
rendered with SmolLM2's tokenizer (every id inside its 49,152-token vocabulary, where the
stack's default Qwen tokenizer has 151,665), and sessions went to both backends. ``rolloutd
demo --engine-kind openai`` on one of them (llama-server's own ``/v1/chat/completions`` as the
OpenAI-compatible API) runs the same tasks in ``passthrough`` capture: llama-server returns no
token ids, so every completion is recorded untrainable. Both print, and ``rolloutd status``
shows, each engine URL answering as its kind; neither starts an engine of its own.

Acceptance tier (the real qwen-code CLI in bubblewrap, a whole stack twice).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rolloutd.engine.models import model_files, pull_model
from rolloutd.engine.server import llama_server_binary
from rolloutd.processes import free_port, spawn, stop_process
from rolloutd.sandbox.config import npm_prefix
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.types import Completion
from tests.conftest import have_bwrap

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.harness,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(not have_bwrap(), reason="no bubblewrap"),
    pytest.mark.skipif(
        not (npm_prefix() / "node_modules/.bin/qwen").exists(),
        reason="qwen-code CLI not installed (scripts/setup.sh installs it)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
SERVED = "SmolLM2-135M-Instruct"
#: SmolLM2's vocabulary (its GGUF's n_vocab); Qwen2.5's tokenizer has 151,665 tokens
SMOLLM2_VOCAB = 49152


@pytest.fixture(scope="module")
def team_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two llama-servers on SmolLM2, started by hand as a team would (no rolloutd code
    starts them), each with 2 slots of 8,192 tokens; stopped by their pids."""
    gguf = pull_model("smollm2-135m").gguf
    logs = tmp_path_factory.mktemp("team-engines")
    procs, urls = [], []
    for i in range(2):
        port = free_port()
        command = [str(llama_server_binary()), "-m", str(gguf), "--host", "127.0.0.1"]
        command += ["--port", str(port), "--jinja", "--alias", SERVED, "--no-webui"]
        command += ["-c", "16384", "--parallel", "2"]
        procs.append(spawn(command, log_path=logs / f"engine-{i}.log"))
        urls.append(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 120
        for url in urls:
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"{url} not healthy"
                time.sleep(0.2)
        yield urls
    finally:
        for proc in procs:
            stop_process(proc)


def short_home() -> Path:
    return Path(tempfile.mkdtemp(prefix="oe-", dir="/tmp"))  # short: unix socket paths


def ports() -> list[str]:
    return [
        *("--temporal-port", str(free_port()), "--ui-port", str(free_port())),
        *("--gateway-port", str(free_port())),
    ]


def cells(shown: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first`` (cells stand 2+ spaces apart)."""
    row = next(line for line in shown.splitlines() if line.strip().startswith(first + " "))
    return re.split(r"\s{2,}", row.strip())


def completions(store_root: Path) -> list[Completion]:
    """Every completion of every session in a stack's store."""
    store = BlobStore(str(store_root))
    found = []
    for folder in sorted((store_root / "sessions").glob("**/completions")):
        session_id = str(folder.parent.relative_to(store_root / "sessions"))
        found += CompletionLog(store, session_id).read_all()
    return found


def rolloutd(*argv: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )


def test_up_on_a_pool_of_two_team_engines_runs_the_demo_in_tokens_mode(
    team_engines: list[str],
) -> None:
    home = short_home()
    tokenizer = str(model_files("smollm2-135m").tokenizer)
    temporal_port, gateway_port = free_port(), free_port()
    argv = ["up", "--home", str(home), "--metrics-port", "0", "--engine-kind", "llama_cpp"]
    argv += ["--engine-url", team_engines[0], "--engine-url", team_engines[1]]
    argv += ["--tokenizer", tokenizer, "--temporal-port", str(temporal_port)]
    argv += ["--ui-port", str(free_port()), "--gateway-port", str(gateway_port)]
    out = home / "up.out"
    t0 = time.monotonic()
    up = spawn([sys.executable, "-m", "rolloutd.cli", *argv], log_path=out)
    try:
        while "Ctrl-C drains" not in out.read_text():
            assert up.poll() is None, out.read_text()
            assert time.monotonic() - t0 < 300, out.read_text()
            time.sleep(0.5)
        print(f"up on the team's engines in {time.monotonic() - t0:.1f} s")
        printed = out.read_text()
        for url in team_engines:
            assert cells(printed, url) == [url, "llama_cpp", "yes", "8192", SERVED]
        assert "a pool of 2" in printed and not (home / "logs" / "engine.log").exists()

        status = rolloutd("status", "--home", str(home), timeout_s=60)
        assert status.returncode == 0, status.stderr
        assert "engine not run by this stack: llama_cpp, model SmolLM2-135M-Instruct" in (
            status.stdout
        )
        for url in team_engines:
            assert cells(status.stdout, url)[:3] == [url, "llama_cpp", "yes"]

        t1 = time.monotonic()
        submit = rolloutd(
            "submit",
            "examples/tasks.jsonl",
            *("--address", f"127.0.0.1:{temporal_port}", "--store-url", str(home / "store")),
            *("--gateway-url", f"http://127.0.0.1:{gateway_port}"),
            timeout_s=1200,
        )
        print(submit.stdout[-3000:], f"submit took {time.monotonic() - t1:.1f} s")
        assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=120)
        finally:
            stop_process(up)
    found = completions(home / "store")
    assert found
    for c in found:
        assert c.capture_mode.value == "tokens" and c.trainable and c.model == SERVED
        assert c.prompt_ids and c.response_ids
        assert len(c.response_logprobs) == len(c.response_ids)
        assert max(c.prompt_ids + c.response_ids) < SMOLLM2_VOCAB
    assert {c.backend for c in found} == set(team_engines)  # the pool's both backends
    by_backend = {u: sum(c.backend == u for c in found) for u in team_engines}
    print(f"{len(found)} completions, by backend:", by_backend)


def test_demo_on_an_openai_compatible_api_runs_in_passthrough(team_engines: list[str]) -> None:
    home = short_home()
    tokenizer = str(model_files("smollm2-135m").tokenizer)
    t0 = time.monotonic()
    demo = rolloutd(
        *("demo", "--home", str(home), "--engine-url", team_engines[0]),
        *("--engine-kind", "openai", "--tokenizer", tokenizer, *ports()),
        timeout_s=1500,
    )
    print(demo.stdout[-3000:], f"demo took {time.monotonic() - t0:.1f} s")
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert cells(demo.stdout, team_engines[0]) == [team_engines[0], "openai", "yes", "-", SERVED]
    assert "capture mode passthrough" in demo.stdout
    found = completions(home / "store")
    assert found
    for c in found:
        assert c.capture_mode.value == "passthrough" and c.backend == team_engines[0]
        assert not c.trainable and not c.response_ids  # llama-server's chat returns no ids
        assert c.response_message is not None and c.model == SERVED
    print(f"{len(found)} passthrough completions")


def test_demo_on_a_vllm_engine_runs_in_tokens_mode(team_engines: list[str], tmp_path: Path) -> None:
    """``rolloutd demo --engine-kind vllm`` on a local server speaking vLLM's wire format
    (``tests.support.engine_fronts``: the first team llama-server behind vLLM's interface; no
    vLLM runs here, there is no GPU): the gateway samples through ``POST /v1/completions``
    with token-id prompts and records the engine's ids and logprobs."""
    from tests.support.engine_fronts import front_process, requests_seen

    home = short_home()
    tokenizer = str(model_files("smollm2-135m").tokenizer)
    with front_process("vllm", team_engines[0], SERVED, tmp_path) as url:
        t0 = time.monotonic()
        demo = rolloutd(
            *("demo", "--home", str(home), "--engine-url", url),
            *("--engine-kind", "vllm", "--tokenizer", tokenizer, *ports()),
            timeout_s=1500,
        )
    print(demo.stdout[-3000:], f"demo took {time.monotonic() - t0:.1f} s")
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert cells(demo.stdout, url)[:3] == [url, "vllm", "yes"]
    found = completions(home / "store")
    assert found
    for c in found:
        assert c.capture_mode.value == "tokens" and c.trainable and c.backend == url
        assert c.response_ids and len(c.response_logprobs) == len(c.response_ids)
        assert max(c.prompt_ids + c.response_ids) < SMOLLM2_VOCAB
    calls = [r for r in requests_seen(tmp_path, "vllm") if r["path"] == "/v1/completions"]
    # every recorded completion was sampled through vLLM's route (a retry may be answered
    # from the log, so there may be fewer calls than completions, never none for a prompt)
    sent = [r["body"]["prompt"] for r in calls]
    assert all(c.prompt_ids in sent for c in found)
    print(f"{len(found)} completions through vLLM's /v1/completions")
