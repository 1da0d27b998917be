"""Claims of host uids for bwrap sandboxes: one uid per live runtime on a host, given back at
teardown, taken over from a dead owner."""

from __future__ import annotations

import json
import subprocess

import pytest

from rolloutd.errors import RuntimeStartError
from rolloutd.processes import process_start_ticks
from rolloutd.sandbox.runtimes import uids


def test_each_runtime_gets_its_own_uid_until_it_gives_it_back(tmp_path):
    claimed = [uids.claim_uid(f"rt-{i}", tmp_path) for i in range(50)]
    assert len(set(claimed)) == 50
    assert all(uids.FIRST_UID <= uid < uids.FIRST_UID + uids.NUM_UIDS for uid in claimed)
    uids.release_uid(claimed[0], "another-runtime", tmp_path)  # not its holder: kept
    assert (tmp_path / str(claimed[0])).exists()
    uids.release_uid(claimed[0], "rt-0", tmp_path)
    assert not (tmp_path / str(claimed[0])).exists()


def test_a_dead_owners_uid_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setattr(uids, "NUM_UIDS", 2)  # a range of two: both must be tried
    dead = subprocess.Popen(["true"])
    ticks = process_start_ticks(dead.pid)
    dead.wait()
    first = uids.claim_uid("live", tmp_path)
    other = uids.FIRST_UID + (1 - (first - uids.FIRST_UID))
    (tmp_path / str(other)).write_text(
        json.dumps({"pid": dead.pid, "start_ticks": ticks, "runtime_id": "gone"})
    )
    assert uids.claim_uid("next", tmp_path) == other
    assert json.loads((tmp_path / str(other)).read_text())["runtime_id"] == "next"


def test_a_full_range_refuses_to_start(tmp_path, monkeypatch):
    monkeypatch.setattr(uids, "NUM_UIDS", 2)
    uids.claim_uid("a", tmp_path)
    uids.claim_uid("b", tmp_path)
    with pytest.raises(RuntimeStartError, match="in use") as raised:
        uids.claim_uid("c", tmp_path)
    assert raised.value.retryable
