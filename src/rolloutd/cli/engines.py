"""What ``up``, ``demo`` and ``rolloutd status`` print of the stack's engine: a line naming
it, then a table of its URLs and what each answered (:mod:`rolloutd.cli.tables`).

Apart from :mod:`rolloutd.cli.engine_options` (the options of an engine the user runs, whose
checks load a tokenizer): ``status`` runs with rolloutd's client install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rolloutd.stack.engine_check import EngineCheck
    from rolloutd.stack.state import StackState


def engine_view(
    state: StackState, checks: list[EngineCheck], busy_slots: int | None = None
) -> list[Any]:
    """What the stack says of its engine, as ``rich`` renderables for
    :func:`rolloutd.cli.tables.show`: a line naming the engine the stack runs (its catalog
    model, GGUF, policy version, slots and context) or the one it uses without running it
    (kind, served model, tokenizer, capture mode, pool size), then a table with a row per URL:
    its kind, whether it answers as that kind (``yes``/``NO``), its context window in tokens,
    and the models it serves or why it does not answer.

    Args:
        state: the stack's record.
        checks: what each URL answered (:func:`rolloutd.stack.status.check_engines`); empty:
            not asked, and no table.
        busy_slots: the stack's own llama-server's busy slots (None: not asked).
    """
    from rich.text import Text

    from rolloutd.cli import tables

    parts: list[Any] = []
    if (e := state.engine) is not None:
        slots = (
            f"{e.num_slots} slots"
            if busy_slots is None
            else f"slots {busy_slots}/{e.num_slots} busy"
        )
        parts.append(
            Text(
                f"engine {e.model} ({e.model_file}), run by this stack, policy version "
                f"{e.policy_version}, {slots}, context {e.ctx_size} tokens"
            )
        )
    elif (x := state.external_engine) is not None:
        revision = f" at revision {x.tokenizer_revision}" if x.tokenizer_revision else ""
        parts.append(
            Text(
                f"engine not run by this stack: {x.kind}, model {x.model}, tokenizer "
                f"{x.tokenizer}{revision}, capture mode {x.capture_mode}"
                + (f", a pool of {len(x.urls)}" if len(x.urls) > 1 else "")
            )
        )
    elif state.backend_url:
        parts.append(Text(f"backend {state.backend_url} (external)"))
    if checks:
        parts.append(
            tables.table(
                "engine url",
                "kind",
                "answers",
                tables.num("context"),
                "serves, or why not",
                rows=(
                    (
                        c.url,
                        c.kind,
                        c.is_kind,
                        c.context_size,
                        ", ".join(c.models) if c.is_kind else c.describe(),
                    )
                    for c in checks
                ),
            )
        )
    return parts
