"""Weight syncs under load abort nothing: ``benchmarks/weight_sync_load.py`` through
``rolloutd up`` (real Temporal, the four fleets, llama-server on SmolLM2-135M, the ``python``
harness in the local runtime), 16 multi-turn sessions of 8 turns while the trainer's side syncs
weights every 3 s; its figures and the stack's store are then checked here.

Checked: no call aborted (the gateway answered every model call 200, no session recorded a
failed call), no session failed or was replaced; every completion ran inside the window where
the engine served the version stamped on it (after that version's load, before the next
sync's drain ended: no call ran across a load), with llama.cpp's log-prob mode (``raw``), its
backend kind and the task's sampling parameters; a session that spans 3 versions has them per
token in its trajectory, and its token-weighted version is the mean over its trainable
tokens; the buffer keeps the group one version past its token-weighted version (where a rule
on the start version would drop it) and drops it as stale one version later; the pause per
sync is reported (p50, p95). A load here restarts llama-server on the same GGUF (llama.cpp
cannot update in place): the weights do not change, the versions and the pause are real.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rolloutd.store import BlobStore, CompletionLog
from rolloutd.trajectory.versions import token_policy_versions
from rolloutd.types import Trajectory

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.timeout(1800),
]

REPO = Path(__file__).resolve().parents[3]
SESSIONS, TURNS, MAX_TOKENS = 16, 8, 24


def test_weight_syncs_under_load_abort_no_call_and_stamp_every_completion(tmp_path: Path):
    figures_file = tmp_path / "figures.json"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "weight_sync_load.py"),
            f"--sessions={SESSIONS}",
            f"--turns={TURNS}",
            f"--max-tokens={MAX_TOKENS}",
            "--sync-every=3",
            f"--home={tmp_path / 'home'}",
            f"--json={figures_file}",
        ],
        check=True,
        timeout=1700,
    )
    figures = json.loads(figures_file.read_text())
    syncs = figures["syncs"]
    assert len(syncs) >= 3, figures
    # nothing aborted, failed or replaced
    assert figures["aborted_calls_gateway"] == 0
    assert figures["failed_calls_sessions"] == 0
    assert (figures["failed_sessions"], figures["replaced_sessions"]) == (0, 0)
    assert len(figures["trajectory_refs"]) == SESSIONS
    for key in ("pause_s", "drain_s", "load_s"):
        assert all(math.isfinite(figures[key][q]) for q in ("p50", "p95")), figures[key]

    store = BlobStore(figures["store_url"])
    spanning = 0
    for session_id, trajectory_ref in figures["trajectory_refs"].items():
        completions = CompletionLog(store, session_id).read_all()
        assert len(completions) == TURNS, session_id
        for c in completions:
            # sampled by the version stamped on it: it ran between that version's load and
            # the end of the next sync's drain
            v = c.policy_version
            start = syncs[v - 1]["loaded_at"] if v > 0 else -math.inf
            end = syncs[v]["drained_at"] if v < len(syncs) else math.inf
            assert start <= c.timings.started_at, (session_id, c.index, v)
            assert c.timings.started_at + c.timings.duration_s <= end, (session_id, c.index, v)
            # what its log-probs are, and the sampling in force
            assert (c.logprob_mode, c.backend_type) == ("raw", "llama_cpp"), c.index
            assert c.sampling is not None and c.sampling.temperature == 1.0
            assert c.sampling.max_tokens is not None and c.sampling.max_tokens <= MAX_TOKENS
            assert len(c.response_logprobs) == len(c.response_ids) > 0
        versions = [c.policy_version for c in completions]
        assert versions == sorted(versions)  # a session never goes back to older weights
        if len(set(versions)) < 3:
            continue
        spanning += 1
        trajectory = store.get_model(trajectory_ref, Trajectory)
        by_index = {c.index: c for c in completions}
        total = weighted = 0
        for trace in trajectory.traces:
            per_token = token_policy_versions(trace)
            assert len(per_token) == len(trace.response_ids)
            for index, offset in zip(trace.completion_indices, trace.response_offsets):
                sampled = by_index[index]
                span = slice(offset, offset + len(sampled.response_ids))
                assert trace.response_ids[span] == sampled.response_ids
                assert set(per_token[span]) == {sampled.policy_version}
                trained = sum(trace.loss_mask[span])
                total += trained
                weighted += trained * sampled.policy_version
        stats = trajectory.stats
        assert stats.token_weighted_policy_version == pytest.approx(weighted / total)
        assert (stats.min_policy_version, stats.max_policy_version) == (versions[0], versions[-1])
    assert spanning >= 1, "no session spanned 3 versions"

    # the buffer's token-weighted rule on this group
    buffer = figures["buffer"]
    weighted_version = figures["token_weighted_policy_version"]
    assert weighted_version is not None and weighted_version >= 1
    assert buffer["kept_on_arrival"] and buffer["kept_at_that_version"]
    keep_at = buffer["keep_at_version"]
    assert keep_at - weighted_version <= 1 < keep_at - 0  # the start-version rule would drop
    dropped = buffer["dropped_one_version_later"]
    assert dropped is not None and dropped["reason"] == "stale"
    assert dropped["staleness"] == pytest.approx(keep_at + 1 - weighted_version)
