"""TensorBoard event files read back with TensorBoard's own reader (``event_accumulator``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any


def events(folder: Path) -> Any:
    """The event files directly in ``folder``, every scalar and tensor kept
    (``EventAccumulator``, reloaded)."""
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        str(folder), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    return accumulator


def scalars(root: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the event files under ``root`` (its folders included): tag ->
    ``[(step, value), ...]``.

    Raises:
        AssertionError: no event file under ``root``.
    """
    folders = sorted({p.parent for p in root.rglob("events.out.tfevents.*")})
    assert folders, f"no TensorBoard event file under {root}"
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for folder in folders:
        found = events(folder)
        for tag in found.Tags()["scalars"]:
            out[tag] += [(e.step, e.value) for e in found.Scalars(tag)]
    return dict(out)
