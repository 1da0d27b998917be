"""A host uid of its own for each bwrap sandbox of a root worker.

A root worker runs every bwrap sandbox's commands as an unprivileged uid of the host (bwrap
makes no user namespace then: a file a sandbox writes is owned by that uid on the host too).
With one uid for all, a process that escaped one sandbox would own every other sandbox's files;
with one per runtime it owns only its own. Each runtime claims a free uid of
[:data:`FIRST_UID`, :data:`FIRST_UID` + :data:`NUM_UIDS`) (the same number as its gid) by
writing ``{CLAIMS_DIR}/{uid}`` under a lock: the folder is the host's, so two workers on one
host never hold one uid at once. A claim names its owner (pid and start time,
proc(5) field 22, as reclaim's owner records do); a claim whose owner is gone is taken over,
so a killed worker leaks none for long. A worker that is not root cannot give a process another
uid: its sandboxes share its own (docs/security.md).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
from pathlib import Path

from rolloutd.errors import RuntimeStartError
from rolloutd.processes import process_start_ticks

#: the host folder of uid claims (``/run`` is emptied at boot, when no runtime survives).
CLAIMS_DIR = Path("/run/rolloutd/uids")
#: the first uid runtimes get; no host user should own one of the range.
FIRST_UID = 200_000
#: uids in the range (runtimes alive at once on one host, at most).
NUM_UIDS = 65_536


def claim_uid(runtime_id: str, claims_dir: Path = CLAIMS_DIR) -> int:
    """Claim a free uid of the range for ``runtime_id``; :func:`release_uid` it at teardown.

    Claims are made one at a time on the host (flock(2) on ``{claims_dir}/.lock``, released by
    the kernel if the holder dies), so a dead owner's claim is taken over by one worker only.

    Raises:
        RuntimeStartError: every uid of the range is held by a live owner, or the claims
            folder cannot be written (retryable: another host may have room).
    """
    pid = os.getpid()
    owner = json.dumps(
        {"pid": pid, "start_ticks": process_start_ticks(pid), "runtime_id": runtime_id}
    ).encode()
    start = random.randrange(NUM_UIDS)  # spread: claims rarely meet a taken uid first
    try:
        claims_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(claims_dir / ".lock", "ab") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            for offset in range(NUM_UIDS):
                uid = FIRST_UID + (start + offset) % NUM_UIDS
                path = claims_dir / str(uid)
                if path.exists() and _owner_alive(path):
                    continue
                draft = claims_dir / f".{uid}.draft"
                draft.write_bytes(owner)
                draft.replace(path)  # whole, never seen half-written
                return uid
    except OSError as exc:
        raise RuntimeStartError(
            f"cannot claim a sandbox uid in {claims_dir}: {exc}", retryable=True
        ) from exc
    raise RuntimeStartError(
        f"every sandbox uid of {FIRST_UID}..{FIRST_UID + NUM_UIDS - 1} is in use", retryable=True
    )


def release_uid(uid: int, runtime_id: str, claims_dir: Path = CLAIMS_DIR) -> None:
    """Give ``uid`` back, if ``runtime_id`` of this process still holds it."""
    path = claims_dir / str(uid)
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if owner.get("pid") == os.getpid() and owner.get("runtime_id") == runtime_id:
        path.unlink(missing_ok=True)


def _owner_alive(path: Path) -> bool:
    """Whether the process that claimed ``path`` still runs."""
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    pid = owner.get("pid")
    return isinstance(pid, int) and process_start_ticks(pid) == owner.get("start_ticks")
