"""Settings in one place: docs/settings.md is what ``rolloutd settings --markdown`` prints
(regenerate it with ``rolloutd settings --markdown > docs/settings.md``), every settings field
is documented, and no module but settings.py reads a ``ROLLOUTD_*`` variable from the
environment (the variables rolloutd sets for the harnesses it runs aside)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import rolloutd
from rolloutd.settings import SETTINGS_CLASSES, settings_markdown

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(rolloutd.__file__).parent
#: variables rolloutd sets for harnesses (read on the harness's side, never settings)
HARNESS_VARIABLES = {
    "ROLLOUTD_RUNTIME_ID",
    "ROLLOUTD_INSTRUCTION_FILE",
    "ROLLOUTD_WORKDIR",
    "ROLLOUTD_MAX_TURNS",
    "ROLLOUTD_SESSION_KEY",
    "ROLLOUTD_FETCH_TIMEOUT_MS",
}
ENV_READ = re.compile(r"(?:os\.environ(?:\.get)?\s*[\[(]|getenv\s*\()\s*[\"'](ROLLOUTD_\w+)")


def test_docs_settings_md_is_up_to_date() -> None:
    page = (ROOT / "docs" / "settings.md").read_text()
    assert page == settings_markdown(), (
        "docs/settings.md is stale: rolloutd settings --markdown > docs/settings.md"
    )


def test_the_command_prints_the_page() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", "settings", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout == settings_markdown()


def test_every_settings_field_is_on_the_page_with_a_description() -> None:
    page = settings_markdown()
    for cls in SETTINGS_CLASSES:
        prefix = cls.model_config.get("env_prefix", "")
        assert f"## {cls.__name__}" in page
        for name, info in cls.model_fields.items():
            assert info.description, f"{cls.__name__}.{name} has no description"
            assert f"`{prefix}{name.upper()}`" in page


def test_the_page_shows_no_value_of_this_machine() -> None:
    page = settings_markdown()
    assert str(Path.home()) not in page


def test_no_module_but_settings_reads_a_rolloutd_variable() -> None:
    reads = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "settings.py" and path.parent == SRC:
            continue
        for number, line in enumerate(path.read_text().split("\n"), 1):
            for variable in ENV_READ.findall(line):
                if variable not in HARNESS_VARIABLES:
                    reads.append(f"{path.relative_to(SRC)}:{number} {variable}")
    assert reads == []
    assert ENV_READ.findall('os.environ.get("ROLLOUTD_HOME")') == ["ROLLOUTD_HOME"]
