"""The records of an offline W&B run, read back from its ``run-*.wandb`` file.

wandb 0.31 writes the file from its Go core and ships no Python reader; the format is
LevelDB's log format (github.com/google/leveldb, doc/log_format.md: 32 KiB blocks, each record
a 7-byte header of checksum, little-endian length and type FULL/FIRST/MIDDLE/LAST) after a
7-byte file header (``:W&B``, magic ``0xBEE1``, version 0), each record one
``wandb.proto.wandb_internal_pb2.Record``: wandb's own datastore layout (``wandb/sdk/internal/
datastore.py`` in the releases that still had one).
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every record of a ``.wandb`` file, as ``wandb_internal_pb2.Record``.

    Raises:
        ValueError: the file does not start with W&B's header, or a record is cut.
    """
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:HEADER])
    if (ident, magic, version) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path}: not a W&B run file ({data[:HEADER]!r})")
    out, pending, at = [], b"", HEADER
    while at + HEADER <= len(data):
        if BLOCK - at % BLOCK < HEADER:  # the block's tail is padding
            at += BLOCK - at % BLOCK
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[at : at + HEADER])
        if kind == 0 and length == 0:  # zero-filled rest of the last block
            break
        chunk = data[at + HEADER : at + HEADER + length]
        if len(chunk) != length:
            raise ValueError(f"{path}: record at {at} is cut")
        at += HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        else:
            pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def finished(path: Path, timeout_s: float = 30.0) -> list[Any]:
    """The records of a finished run: polled until its ``exit`` record is in the file
    (wandb-core writes the file a moment after ``run.finish()`` returns: measured up to 0.2 s
    here, the file holding only its header before).

    Raises:
        AssertionError: no ``exit`` record within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = records(path) if path.stat().st_size > HEADER else []
        except ValueError:  # a record still being written
            found = []
        if any(r.WhichOneof("record_type") == "exit" for r in found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{path}: no exit record after {timeout_s} s ({len(found)} records)"
            )
        time.sleep(0.1)


def history(path: Path) -> dict[int, dict[str, Any]]:
    """A finished run's logged rows by step: ``{step: {key: value}}`` (values decoded from
    JSON)."""
    rows: dict[int, dict[str, Any]] = {}
    for record in finished(path):
        if record.WhichOneof("record_type") != "history":
            continue
        items = {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in record.history.item
        }
        step = int(items.get("_step", record.history.step.num))
        rows.setdefault(step, {}).update(items)
    return rows


def run_file(root: Path) -> Path:
    """The one ``run-*.wandb`` file under ``root`` (an offline run's folder or above it)."""
    (found,) = sorted(root.rglob("offline-run-*/run-*.wandb"))
    return found
