"""The options of the commands that start the stack (``up``, ``demo``) for an engine the user
already runs, and their check before anything starts (docs/own_engine.md).

``--engine-url`` (again, or comma-separated, for a pool), ``--engine-kind``,
``--served-model-name``, ``--tokenizer`` and ``--tokenizer-revision`` become a
:class:`rolloutd.stack.state.ExternalEngine`. Each URL is asked whether it answers as its
kind (:func:`rolloutd.stack.engine_check.check_engine`), the served model name is
checked against what the engine lists, and the tokenizer is loaded with its chat template,
here, before the stack starts: a bad engine is refused with the flag to fix, and exit status
1, instead of a gateway that keeps failing at start under the supervisor.
"""

from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import urlsplit

from rolloutd.stack.engine_check import ENGINE_KINDS, check_engines, kind_route

#: the catalog model ``up`` and ``demo`` serve when no engine is given
DEFAULT_MODEL = "qwen2.5-coder-0.5b"
#: the kinds that can serve each capture mode (tokens: token-id prompts; passthrough: chat)
CAPTURE_KINDS = {"tokens": ("llama_cpp", "vllm", "sglang"), "passthrough": ("vllm", "openai")}
#: the options of an engine given by URL, each with its flag
_OPTIONS = {
    "engine_kind": "--engine-kind",
    "served_model_name": "--served-model-name",
    "tokenizer": "--tokenizer",
    "tokenizer_revision": "--tokenizer-revision",
    "capture_mode": "--capture-mode",
}


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--model`` and the options of an engine the user runs to ``parser``."""
    parser.add_argument(
        "--model",
        default=None,
        help="catalog model served by the llama-server the stack runs (rolloutd models "
        f"list); None: {DEFAULT_MODEL}. Not with --engine-url",
    )
    parser.add_argument(
        "--engine-url",
        action="append",
        default=None,
        metavar="URL",
        help="base URL of an engine you already run (vLLM, SGLang, llama-server, an "
        "OpenAI-compatible API); the stack then runs no llama-server and needs no model. "
        "Give it again, or several comma-separated, for a backend pool (docs/own_engine.md)",
    )
    parser.add_argument(
        "--engine-kind",
        choices=ENGINE_KINDS,
        default=None,
        help="with --engine-url: the engine's kind (openai: an OpenAI-compatible API, "
        "passthrough capture)",
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="with --engine-url: the name the engine serves the model under; None: the "
        "first model its GET /v1/models lists",
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="with --engine-url: the model's tokenizer with its chat template: a folder, or "
        "a Hugging Face repo id (HF_ENDPOINT and the Hugging Face cache apply; set "
        "HF_HUB_OFFLINE=1 where the Hub is out of reach); None: the served model name",
    )
    parser.add_argument(
        "--tokenizer-revision",
        default=None,
        help="with --tokenizer REPO_ID: its revision (a commit hash pins it); None: the "
        "repository's default branch",
    )
    parser.add_argument(
        "--capture-mode",
        choices=("tokens", "passthrough"),
        default=None,
        help="with --engine-url: tokens (the gateway renders and records token ids and "
        "logprobs: llama_cpp, vllm, sglang) or passthrough (the engine renders: vllm, "
        "openai); None: passthrough for openai, else tokens",
    )


def _urls(values: list[str]) -> list[str]:
    urls: list[str] = []
    for value in values:
        for url in value.split(","):
            url = url.strip().rstrip("/")
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"--engine-url {url!r}: not an http:// or https:// base URL")
            if url not in urls:
                urls.append(url)
    return urls


def external_engine(args: argparse.Namespace, api_key: str | None = None) -> Any:
    """The engine the user runs, as the options give it, checked (module docstring).

    Args:
        args: the parsed options of ``up`` or ``demo`` (:func:`add_engine_options`).
        api_key: what the gateway will send the engine (``ROLLOUTD_BACKEND_API_KEY``).

    Returns:
        An :class:`rolloutd.stack.state.ExternalEngine`, or None without ``--engine-url``.

    Raises:
        SystemExit: a refusal naming the flag to fix (an option without ``--engine-url``,
            ``--model`` with it, a URL that does not answer or not as its kind, a served name
            the engine does not list, a tokenizer that cannot be loaded or has no chat
            template, a capture mode the kind cannot serve).
    """
    command = f"rolloutd {args.command}"
    if not args.engine_url:
        given = [flag for name, flag in _OPTIONS.items() if getattr(args, name) is not None]
        if given:
            raise SystemExit(f"{command}: {', '.join(given)} needs --engine-url")
        return None
    if args.model is not None:
        raise SystemExit(
            f"{command}: --model names the catalog model of the llama-server the stack runs; "
            "with --engine-url, name the engine's model with --served-model-name"
        )
    if args.engine_kind is None:
        raise SystemExit(f"{command}: --engine-url needs --engine-kind ({', '.join(ENGINE_KINDS)})")
    kind = args.engine_kind
    mode = args.capture_mode or ("passthrough" if kind == "openai" else "tokens")
    if kind not in CAPTURE_KINDS[mode]:
        raise SystemExit(
            f"{command}: --capture-mode {mode} needs an engine of kind "
            f"{' or '.join(CAPTURE_KINDS[mode])}, not --engine-kind {kind}"
        )
    try:
        urls = _urls(args.engine_url)
    except ValueError as e:
        raise SystemExit(f"{command}: {e}") from None
    checks = _check(command, kind, urls, api_key)
    model = _served_model(command, kind, args.served_model_name, checks)
    tokenizer = args.tokenizer or model
    _check_tokenizer(command, tokenizer, args.tokenizer_revision, given=args.tokenizer is not None)
    from rolloutd.stack.state import ExternalEngine

    return ExternalEngine(
        urls=urls,
        kind=kind,
        model=model,
        tokenizer=tokenizer,
        tokenizer_revision=args.tokenizer_revision,
        capture_mode=mode,
    )


def _check(command: str, kind: str, urls: list[str], api_key: str | None) -> list[Any]:
    """Ask every URL (at once); refuse, naming each that failed and the flag to fix."""
    checks = check_engines([(kind, url, api_key) for url in urls])
    failed = [c for c in checks if not c.is_kind]
    if failed:
        lines = [f"  {c.url} {c.describe()}" for c in failed]
        hints = []
        if any(not c.answers for c in failed):
            hints.append("start the engine, or fix --engine-url")
        if any(c.answers for c in failed):
            hints.append(f"check --engine-kind: a {kind} server answers {kind_route(kind)}")
        if any(
            " answered 401" in (c.error or "") or " answered 403" in (c.error or "") for c in failed
        ):
            hints.append("set ROLLOUTD_BACKEND_API_KEY to the engine's API key")
        raise SystemExit(
            f"{command}: the engine --engine-url gives is refused:\n"
            + "\n".join(lines)
            + "\n"
            + "; ".join(hints)
        )
    return checks


def _served_model(command: str, kind: str, name: str | None, checks: list[Any]) -> str:
    """The served model name: the option's, checked against what the engines list (llama-server
    answers under any name, so not against its list), else the first one listed."""
    listed = checks[0].models
    if name is None:
        if not listed:
            raise SystemExit(
                f"{command}: the engine at {checks[0].url} lists no model on GET /v1/models; "
                "give its name with --served-model-name"
            )
        return str(listed[0])
    if kind != "llama_cpp":
        for check in checks:
            if check.models and name not in check.models:
                raise SystemExit(
                    f"{command}: --served-model-name {name!r}: the engine at {check.url} "
                    f"serves {', '.join(check.models)}"
                )
    return name


def _check_tokenizer(command: str, tokenizer: str, revision: str | None, *, given: bool) -> None:
    """Load the tokenizer as the gateway will, and check it has a chat template."""
    from rolloutd.engine.models import load_tokenizer
    from rolloutd.errors import ConfigError

    flag = "--tokenizer" if given else "--tokenizer (none given: the served model name)"
    try:
        loaded = load_tokenizer(tokenizer, revision=revision)
    except ConfigError as e:
        raise SystemExit(f"{command}: {flag}: {e}") from None
    if not getattr(loaded, "chat_template", None):
        raise SystemExit(
            f"{command}: {flag} {tokenizer!r} has no chat template; the gateway renders the "
            "model's conversations with it: give the model's own tokenizer"
        )
