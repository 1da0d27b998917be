"""Harness adapters: configure an agent harness for a session.

Use :func:`get_harness`; each adapter's ``prepare(runtime, ctx)`` writes the harness's config
into the runtime and returns the :class:`HarnessCommand` to spawn (docs/architecture.md, "One
session, step by step", step 5).
"""

from __future__ import annotations

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses.aider import AiderHarness
from rolloutd.sandbox.harnesses.base import HarnessAdapter, HarnessCommand, HarnessContext
from rolloutd.sandbox.harnesses.claude_code import ClaudeCodeHarness
from rolloutd.sandbox.harnesses.cli import CliHarness, CliRecipe
from rolloutd.sandbox.harnesses.codex import CodexHarness
from rolloutd.sandbox.harnesses.gemini_cli import GeminiCliHarness
from rolloutd.sandbox.harnesses.mini_swe_agent import MiniSweAgentHarness
from rolloutd.sandbox.harnesses.opencode import OpencodeHarness
from rolloutd.sandbox.harnesses.oracle import OracleHarness
from rolloutd.sandbox.harnesses.pi import PiHarness
from rolloutd.sandbox.harnesses.python import PythonHarness
from rolloutd.sandbox.harnesses.qwen_code import QwenCodeHarness
from rolloutd.sandbox.harnesses.shell import ShellHarness
from rolloutd.types import HarnessSpec

__all__ = [
    "HARNESSES",
    "CliHarness",
    "CliRecipe",
    "HarnessAdapter",
    "HarnessCommand",
    "HarnessContext",
    "get_harness",
    "harness_capabilities",
]

#: harness type -> adapter class; the other types of HarnessSpec are not built yet. A sandbox
#: host publishes every type listed here whose CLI it has (:func:`harness_capabilities`), so an
#: adapter added here is accepted at submit once the hosts run the new code.
HARNESSES: dict[str, type[HarnessAdapter]] = {
    ShellHarness.type: ShellHarness,
    CliHarness.type: CliHarness,
    QwenCodeHarness.type: QwenCodeHarness,
    CodexHarness.type: CodexHarness,
    ClaudeCodeHarness.type: ClaudeCodeHarness,
    GeminiCliHarness.type: GeminiCliHarness,
    OpencodeHarness.type: OpencodeHarness,
    PiHarness.type: PiHarness,
    MiniSweAgentHarness.type: MiniSweAgentHarness,
    AiderHarness.type: AiderHarness,
    PythonHarness.type: PythonHarness,
    OracleHarness.type: OracleHarness,
}


def get_harness(spec: HarnessSpec) -> HarnessAdapter:
    """The adapter of ``spec.type``.

    Args:
        spec: the task's harness spec.

    Returns:
        A fresh adapter bound to ``spec``.

    Raises:
        HarnessError: no adapter is built for ``spec.type`` yet.
    """
    try:
        cls = HARNESSES[spec.type]
    except KeyError:
        raise HarnessError(
            f"harness.type={spec.type!r} is not built yet; available: {', '.join(HARNESSES)}"
        ) from None
    return cls(spec)


def harness_capabilities() -> tuple[dict[str, str | None], dict[str, str]]:
    """What this host can run, for the fleet registry (:mod:`rolloutd.capabilities`).

    Returns:
        ``(harnesses, missing)``: harness type -> its CLI's version (None: no CLI needed) for
        every adapter whose CLI is installed here; harness type -> why not for the others.
    """
    harnesses: dict[str, str | None] = {}
    missing: dict[str, str] = {}
    for name, cls in HARNESSES.items():
        try:
            harnesses[name] = cls.cli_version()
        except HarnessError as e:
            missing[name] = str(e)
    return harnesses, missing
