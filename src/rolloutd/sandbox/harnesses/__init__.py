"""Harness adapters: configure an agent harness for a session.

Use :func:`get_harness`; each adapter's ``prepare(runtime, ctx)`` writes the harness's config
into the runtime and returns the :class:`HarnessCommand` to spawn (docs/architecture.md, "One
session, step by step", step 5).
"""

from __future__ import annotations

from rolloutd.errors import HarnessError
from rolloutd.sandbox.harnesses.base import HarnessAdapter, HarnessCommand, HarnessContext
from rolloutd.sandbox.harnesses.qwen_code import QwenCodeHarness
from rolloutd.sandbox.harnesses.shell import ShellHarness
from rolloutd.types import HarnessSpec

__all__ = ["HARNESSES", "HarnessAdapter", "HarnessCommand", "HarnessContext", "get_harness"]

#: harness type -> adapter class; the other types of HarnessSpec are not built yet.
HARNESSES: dict[str, type[HarnessAdapter]] = {
    ShellHarness.type: ShellHarness,
    QwenCodeHarness.type: QwenCodeHarness,
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
