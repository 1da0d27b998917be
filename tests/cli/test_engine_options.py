"""An engine the user already runs: the options of ``rolloutd up`` and ``rolloutd demo``
(``--engine-url`` and its companions), and their refusals, each naming the flag to fix, before
anything is started. The checks that ask a server run against a real llama-server (the tests'
engine); the Hugging Face path reads a cache laid out as ``huggingface_hub`` lays it out, with
``HF_HUB_OFFLINE=1`` (the Hub is out of reach here)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rolloutd.cli import engine_options
from rolloutd.cli.parser import build_parser
from rolloutd.processes import free_port

#: a commit hash of the Hub-layout cache below (any 40 hex digits name a snapshot)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def parse(*argv: str) -> Any:
    return build_parser().parse_args(["up", *argv])


def test_no_engine_url_is_the_stacks_own_engine() -> None:
    args = parse()
    assert engine_options.external_engine(args) is None and args.model is None
    assert parse("--model", "smollm2-135m").model == "smollm2-135m"


def test_urls_given_again_or_comma_separated_make_one_pool() -> None:
    args = parse(
        "--engine-url",
        "http://a:1/, http://b:2",
        "--engine-url",
        "http://a:1",
        "--engine-kind",
        "vllm",
    )
    assert engine_options._urls(args.engine_url) == ["http://a:1", "http://b:2"]
    assert args.engine_kind == "vllm"
    for name in ("served_model_name", "tokenizer", "tokenizer_revision", "capture_mode"):
        assert getattr(args, name) is None


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--engine-kind", "vllm"], "--engine-kind needs --engine-url"),
        (["--tokenizer", "t", "--served-model-name", "m"], "--served-model-name, --tokenizer"),
        (["--engine-url", "http://a:1"], "--engine-url needs --engine-kind"),
        (
            ["--engine-url", "http://a:1", "--engine-kind", "vllm", "--model", "smollm2-135m"],
            "--model names the catalog model",
        ),
        (["--engine-url", "ftp://a", "--engine-kind", "vllm"], "--engine-url 'ftp://a': not an"),
        (
            ["--engine-url", "http://a:1", "--engine-kind", "openai", "--capture-mode", "tokens"],
            "--capture-mode tokens needs an engine of kind llama_cpp or vllm or sglang",
        ),
        (
            [
                "--engine-url",
                "http://a:1",
                "--engine-kind",
                "sglang",
                "--capture-mode",
                "passthrough",
            ],
            "--capture-mode passthrough needs an engine of kind vllm or openai",
        ),
    ],
)
def test_options_that_cannot_go_together_are_refused_naming_the_flag(
    argv: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as refused:
        engine_options.external_engine(parse(*argv))
    assert str(refused.value).startswith("rolloutd up: ") and says in str(refused.value)


def rolloutd(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_an_unknown_kind_is_refused_by_the_parser(tmp_path: Path) -> None:
    done = rolloutd(
        "up", "--home", str(tmp_path), "--engine-url", "http://a:1", "--engine-kind", "tgi"
    )
    assert done.returncode == 2
    assert "argument --engine-kind: invalid choice: 'tgi'" in done.stderr


def test_an_engine_that_does_not_answer_is_refused_before_anything_starts(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    done = rolloutd(
        "up", "--home", str(tmp_path / "home"), "--engine-url", url, "--engine-kind", "llama_cpp"
    )
    assert done.returncode == 1, done.stderr
    assert f"rolloutd up: the engine --engine-url gives is refused:\n  {url} does not answer" in (
        done.stderr
    )
    assert "start the engine, or fix --engine-url" in done.stderr
    assert not (tmp_path / "home" / "stack.json").exists()  # no stack was started


@pytest.mark.engine
@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_server_of_another_kind_is_refused_naming_the_kind(engine: Any, kind: str) -> None:
    with pytest.raises(SystemExit) as refused:
        engine_options.external_engine(parse("--engine-url", engine.url, "--engine-kind", kind))
    message = str(refused.value)
    assert f"{engine.url} answers, but not as {kind}" in message
    assert "check --engine-kind" in message and "does not answer" not in message


@pytest.mark.engine
def test_a_llama_server_is_taken_as_llama_cpp_or_as_an_openai_api(engine: Any) -> None:
    """Control of the refusals above: the same server, asked as what it is, is taken, with
    the model name it serves and the capture mode its kind can serve."""
    from rolloutd.engine.models import model_files

    tokenizer = str(model_files("qwen2.5-coder-0.5b").tokenizer)
    taken = engine_options.external_engine(
        parse("--engine-url", engine.url, "--engine-kind", "llama_cpp", "--tokenizer", tokenizer)
    )
    assert taken.urls == [engine.url] and taken.kind == "llama_cpp"
    assert taken.model == "Qwen2.5-Coder-0.5B-Instruct" and taken.capture_mode == "tokens"
    assert taken.tokenizer == tokenizer
    api = engine_options.external_engine(
        parse("--engine-url", engine.url, "--engine-kind", "openai", "--tokenizer", tokenizer)
    )
    assert api.kind == "openai" and api.capture_mode == "passthrough"
    with pytest.raises(SystemExit, match="--served-model-name 'gpt-x': the engine at .* serves"):
        engine_options.external_engine(
            parse(
                *("--engine-url", engine.url, "--engine-kind", "openai"),
                *("--tokenizer", tokenizer, "--served-model-name", "gpt-x"),
            )
        )
    with pytest.raises(SystemExit, match="--tokenizer: tokenizer '/no/tok': no such folder"):
        engine_options.external_engine(
            parse(
                "--engine-url", engine.url, "--engine-kind", "llama_cpp", "--tokenizer", "/no/tok"
            )
        )


@pytest.mark.engine
def test_a_tokenizer_without_a_chat_template_is_refused(engine: Any, tmp_path: Path) -> None:
    """The gateway renders every conversation with the tokenizer's chat template: the same
    folder without its template is refused (the folder with it is taken, above)."""
    from rolloutd.engine.models import model_files

    folder = tmp_path / "tok"
    shutil.copytree(model_files("qwen2.5-coder-0.5b").tokenizer, folder)
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(SystemExit, match=f"--tokenizer '{folder}' has no chat template"):
        engine_options.external_engine(
            parse(
                "--engine-url", engine.url, "--engine-kind", "llama_cpp", "--tokenizer", str(folder)
            )
        )


def hub_cache(root: Path, repo: str, tokenizer: Path) -> Path:
    """A Hugging Face cache holding ``tokenizer``'s files as ``repo`` at :data:`COMMIT`, laid
    out as huggingface_hub writes it (``models--org--name/snapshots/{commit}``, ``refs/main``),
    with the ``config.json`` a model repository carries."""
    folder = root / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for path in tokenizer.iterdir():
        shutil.copy(path, snapshot / path.name)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    return root


@pytest.mark.engine
def test_a_tokenizer_by_repo_id_at_a_revision_from_the_hugging_face_cache(
    engine: Any, tmp_path: Path
) -> None:
    """The repo-id path as the Hub's client reads it (in a process of its own: huggingface_hub
    reads its variables at import); a revision the cache does not hold is refused naming
    --tokenizer. Only the cache is read here: the Hub itself is out of reach."""
    from rolloutd.engine.models import model_files

    cache = hub_cache(
        tmp_path / "hub", "team/qwen-tok", model_files("qwen2.5-coder-0.5b").tokenizer
    )
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    # one process, both revisions: the one the cache holds, then one it does not
    script = (
        "import json, sys\n"
        "from rolloutd.cli.engine_options import external_engine\n"
        "from rolloutd.cli.parser import build_parser\n"
        "for revision in sys.argv[2:]:\n"
        "    args = build_parser().parse_args(['up', *sys.argv[1].split(), "
        "'--tokenizer-revision', revision])\n"
        "    try:\n"
        "        print(json.dumps({'taken': external_engine(args).model_dump()}))\n"
        "    except SystemExit as e:\n"
        "        print(json.dumps({'refused': str(e)}))\n"
    )
    argv = f"--engine-url {engine.url} --engine-kind llama_cpp --tokenizer team/qwen-tok"
    done = subprocess.run(
        [sys.executable, "-c", script, argv, COMMIT, "f" * 40],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    taken, refused = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert taken["taken"]["tokenizer"] == "team/qwen-tok"
    assert taken["taken"]["tokenizer_revision"] == COMMIT
    assert refused["refused"].startswith(
        f"rolloutd up: --tokenizer: tokenizer 'team/qwen-tok' at revision '{'f' * 40}'"
    )


@pytest.mark.engine
@pytest.mark.parametrize(("kind", "route"), [("vllm", "/v1/completions"), ("sglang", "/generate")])
def test_a_vllm_or_sglang_engine_is_taken_and_the_gateway_samples_on_it(
    engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, route: str
) -> None:
    """Control of the refusal of a server of another kind, and the path from ``up``'s options
    to a recorded completion for the two kinds that cannot run here (no GPU): a local server
    speaking vLLM's or SGLang's wire format (``tests.support.engine_fronts``: the real
    llama-server behind their interface, a double of the interface only) is taken as its
    kind under the name it lists; a gateway built from the variables ``up`` hands its fleets
    samples on it in ``tokens`` capture, streamed and not, through that kind's own route, and
    records the engine's ids and logprobs."""
    from rolloutd.engine.models import model_files
    from rolloutd.proxy.http.server import Gateway
    from rolloutd.settings import GatewaySettings
    from rolloutd.store import CompletionLog
    from tests.proxy.support import asgi_client
    from tests.support.engine_fronts import front_process, requests_seen

    tokenizer = str(model_files("qwen2.5-coder-0.5b").tokenizer)
    with front_process(kind, engine.url, "team/policy-7b", tmp_path) as url:
        taken = engine_options.external_engine(
            parse("--engine-url", url, "--engine-kind", kind, "--tokenizer", tokenizer)
        )
        assert (taken.kind, taken.model, taken.capture_mode) == (kind, "team/policy-7b", "tokens")
        for name, value in taken.env().items():
            monkeypatch.setenv(name, value)
        settings = GatewaySettings(
            store_url=str(tmp_path / "store"), gateway_public_url="http://gateway.test"
        )
        assert settings.backend_type == kind and settings.tokenizer == tokenizer

        async def sample() -> list[Any]:
            gateway = Gateway.from_settings(settings)
            info = await gateway.sessions.open_session("front/0", "front")
            body = {
                "model": "team/policy-7b",
                "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 12,
            }
            async with asgi_client(gateway) as http:
                for stream in (False, True):
                    answer = await http.post(
                        f"/s/{info.session_key}/v1/chat/completions",
                        json={**body, "stream": stream},
                    )
                    assert answer.status_code == 200, answer.text
            await gateway.aclose()
            return CompletionLog(gateway.store, "front/0").read_all()

        found = asyncio.run(sample())
    assert len(found) == 2
    for c in found:
        assert c.capture_mode.value == "tokens" and c.trainable and c.backend == url
        assert c.response_ids and len(c.response_logprobs) == len(c.response_ids)
        assert all(lp <= 0.0 for lp in c.response_logprobs)
    calls = [r for r in requests_seen(tmp_path, kind) if r["path"] == route]
    assert [bool(r["body"].get("stream")) for r in calls] == [False, True]
    prompt = "prompt" if kind == "vllm" else "input_ids"
    assert calls[0]["body"][prompt] == found[0].prompt_ids
