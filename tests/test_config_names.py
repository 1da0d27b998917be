"""Every ``ROLLOUTD_*`` name the repository reads, sets or tells a user to set is one a rolloutd
process accepts at start: a settings field's variable, or one of
:data:`rolloutd.settings.OTHER_VARIABLES` (docs/settings.md, "Other variables"). A name found
nowhere in that union would stop every process whose environment holds it."""

from __future__ import annotations

import re
from pathlib import Path

from rolloutd.settings import OTHER_VARIABLES, known_variables

ROOT = Path(__file__).resolve().parents[1]
#: where the names are looked for: the code, the scripts, the chart, the tests, the docs
PLACES = ["src", "scripts", "helm", "tests", "docs", "examples", "benchmarks", ".ci", "README.md"]
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".tpl", ".txt", ".md", ".toml", ".json", ".jsonl", ""}
NAME = re.compile(r"\bROLLOUTD_[A-Z0-9_]*[A-Z0-9]\b")
#: tokens that look like variables and are not: heredoc delimiters, a tokenizer probe's
#: sentinel, Python constants of a benchmark, values the runtime tests set in their own
#: process (never in a rolloutd process's environment) to see that they do not leak, and the
#: misspellings the refusal's tests and docs show
NOT_VARIABLES = {
    "ROLLOUTD_EOF": "a heredoc delimiter (swebench task sets, a test's command)",
    "ROLLOUTD_RUNNER_EOF": "a heredoc delimiter of the pytest verifier's script",
    "ROLLOUTD_END_OF_TURN_PROBE": "the chat-template probe's sentinel text",
    "ROLLOUTD_KINDS": "a constant of benchmarks/orchestration.py",
    "ROLLOUTD_PROCESSES": "a constant of benchmarks/orchestration.py",
    "ROLLOUTD_ESCAPE_SECRET": "set in the test process by the bwrap and podman escape tests",
    "ROLLOUTD_TEST_SECRET": "set in the test process by the runtime tests",
    # misspelt on purpose: the tests and docs of the refusal
    "ROLLOUTD_MAX_CONCURENT_SESSIONS": "tests/test_config_file.py",
    "ROLLOUTD_TEMPORAL_ADRESS": "docs/settings.md",
    "ROLLOUTD_GATEWAY_PRT": "tests/helm/test_chart_behaviour.py",
}


def names_in_repository() -> dict[str, list[str]]:
    """Every ``ROLLOUTD_*`` token of :data:`PLACES`, with the files it is in."""
    found: dict[str, list[str]] = {}
    for place in PLACES:
        path = ROOT / place
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if file.suffix not in SUFFIXES or "__pycache__" in file.parts:
                continue
            try:
                text = file.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            for name in set(NAME.findall(text)):
                found.setdefault(name, []).append(str(file.relative_to(ROOT)))
    return found


def test_every_name_in_the_repository_is_accepted() -> None:
    found = names_in_repository()
    assert "ROLLOUTD_TEMPORAL_ADDRESS" in found  # the control: the scan sees the code
    known = known_variables()
    unknown = {n: files for n, files in found.items() if n not in known and n not in NOT_VARIABLES}
    assert unknown == {}


def test_the_lists_name_only_what_is_used() -> None:
    """No stale entry: each listed name is still in the repository."""
    found = names_in_repository()
    assert [n for n in (*OTHER_VARIABLES, *NOT_VARIABLES) if n not in found] == []
