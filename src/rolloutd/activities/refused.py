"""Paths a collect step refused to open, and how they score.

The sandbox worker opens a runtime's files without following a link out of it
(:mod:`rolloutd.sandbox.runtimes.beneath`). A path it refuses (a link, a file where a folder
belongs, a FIFO) is what the session left in its runtime: the policy's doing. Failing the
collect step for it would make the session an infrastructure failure with no reward, which a
policy could use to trade a low reward for none. So the collect step records each refusal
(the artifact :data:`REFUSED_PATHS_ARTIFACT`, a :class:`~rolloutd.types.TamperReport`) and goes
on; the evaluate step scores a session with any refusal 0.0 with the path named, as it scores
a tamper, without asking the evaluator (whose check did not run).
"""

from __future__ import annotations

from typing import Any

from rolloutd.errors import PathRefusedError
from rolloutd.types import TamperFinding, TamperReport

#: the artifact holding the collect step's refusals (the check runtime's: with ``:check``).
REFUSED_PATHS_ARTIFACT = "refused_paths"
#: findings a report keeps (TamperReport's lists hold at most 50).
MAX_FINDINGS = 50


def refused_finding(error: PathRefusedError, path: str = "") -> TamperFinding:
    """The tamper finding of one refused path (category ``verifier_path``: a path the worker
    reads or writes for the verifier)."""
    return TamperFinding(
        path=error.path or path or "?",
        category="verifier_path",
        change="modified",
        detail=error.message[:500],
    )


def refused_paths(artifacts: dict[str, Any]) -> TamperReport | None:
    """The refusals recorded in a session's loaded artifacts (every collect step's), merged;
    None when there were none."""
    findings: list[TamperFinding] = []
    for name, value in sorted(artifacts.items()):
        if name.split(":", 1)[0] == REFUSED_PATHS_ARTIFACT and isinstance(value, dict):
            findings += TamperReport.model_validate(value).findings
    if not findings:
        return None
    return TamperReport(
        findings=findings[:MAX_FINDINGS],
        num_changed_paths=len(findings),
        truncated=len(findings) > MAX_FINDINGS,
    )


def merged(report: TamperReport | None, refused: TamperReport) -> TamperReport:
    """``report`` (an evaluator's, or None) with the refusals added to its findings."""
    if report is None:
        return refused
    findings = [*refused.findings, *report.findings]
    return report.model_copy(
        update={
            "findings": findings[:MAX_FINDINGS],
            "num_changed_paths": report.num_changed_paths + refused.num_changed_paths,
            "truncated": report.truncated or len(findings) > MAX_FINDINGS,
        }
    )
