"""A minimal trainer process for the crash test: takes batches with the sync client, records
each event as a JSON line (fsynced), and acks after "training" unless told to hang.

    python buffer_trainer.py ADDRESS BUFFER_ID OUT_FILE hang|train NUM_GROUPS LEASE_S

``hang``: take one batch, record it, then wait to be killed (SIGKILL by the test).
``train``: take batches of one group and ack each until NUM_GROUPS groups are acked.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from rolloutd.trainer_client import SyncRolloutClient


def record(out: str, event: dict) -> None:
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps(event) + "\n")
        f.flush()
        os.fsync(f.fileno())


def main() -> int:
    address, buffer_id, out, mode, num_groups, lease_s = sys.argv[1:7]
    client = SyncRolloutClient.connect(address)
    buffer = client.get_buffer(buffer_id)
    acked = 0
    while acked < int(num_groups):
        batch = buffer.take(1, lease_s=float(lease_s), timeout_s=120)
        record(
            out,
            {
                "event": "taken",
                "pid": os.getpid(),
                "batch_id": batch.batch_id,
                "num_offers": batch.num_offers,
                "task_ids": [g.group.task_id for g in batch.groups],
            },
        )
        if mode == "hang":
            threading.Event().wait()  # killed here, between take_batch and ack
        buffer.ack(batch.batch_id)
        record(
            out,
            {
                "event": "acked",
                "pid": os.getpid(),
                "batch_id": batch.batch_id,
                "task_ids": [g.group.task_id for g in batch.groups],
            },
        )
        acked += len(batch.groups)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
