"""Which changed paths a test verifier must not trust: files that configure or extend the test
runner or the interpreter (the tamper report's findings, :class:`rolloutd.types.TamperFinding`).

A verifier that runs tests on what a session changed runs code the session wrote; that is the
point of it. What it must not do is let the session decide *how* the tests run or how their
result is read. By name alone (:func:`path_finding`):

- ``conftest.py`` anywhere: pytest imports every ``conftest.py`` from the rootdir down to a
  test's folder, and its hooks can rewrite any report (``pytest_runtest_makereport``); pytest's
  documentation, "Writing hook functions";
- ``pytest.ini`` / ``.pytest.ini``: pytest's own configuration file (even empty, it sets the
  rootdir); ``setup.cfg``, ``tox.ini`` and ``pyproject.toml`` count when their pytest section
  changes (:func:`pytest_section`; pytest's "Configuration file formats");
- ``sitecustomize.py`` / ``usercustomize.py`` (imported by every interpreter at start when on
  ``sys.path``) and ``*.pth`` files (their ``import`` lines run at start in a site folder);
  Python's :mod:`site` documentation;
- ``entry_points.txt`` below ``*.egg-info`` / ``*.dist-info``: installed-package metadata
  that registers pytest plugins (group ``pytest11``) pytest loads by itself, and ``*.egg-link``
  files that put a folder on ``sys.path`` (setuptools' development installs); the metadata's
  other files load nothing, so an honest ``pip install -e .`` that rewrites them is not one;
- compiled bytecode (``*.pyc``, ``__pycache__/``): loaded in place of its source (PEP 552's
  unchecked hash-based files are never compared with it);
- an added module named like the test runner (``pytest``, ``_pytest``, ``pluggy``, ``py``,
  ``iniconfig``), or like a standard-library module at the top of the tree or in a test folder
  (``tests``, ``test``, ``testing``): pytest puts those folders first on ``sys.path`` while it
  collects (its default ``prepend`` import mode), so such a file shadows what the tests import
  next (a ``unittest.py`` whose ``TestCase`` never fails).

Paths are relative to the tree the verifier runs in (a repository's root, a task's workdir).
"""

from __future__ import annotations

import configparser
import dataclasses
import sys
import tomllib
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any, Literal

from rolloutd.records import TamperFinding

Change = Literal["added", "modified", "deleted"]

#: top-level modules of pytest and what it imports at start.
RUNNER_MODULES = frozenset({"pytest", "_pytest", "pluggy", "py", "iniconfig"})
#: folders pytest inserts into ``sys.path`` when a test file sits in them without a package.
TEST_FOLDERS = frozenset({"tests", "test", "testing"})
#: pytest's own configuration files.
PYTEST_INI_NAMES = frozenset({"pytest.ini", ".pytest.ini"})
#: files holding a pytest section among other settings: name -> where pytest reads it.
PYTEST_SECTIONS = {
    "setup.cfg": "[tool:pytest]",
    "tox.ini": "[pytest]",
    "pyproject.toml": "[tool.pytest.ini_options] / [tool.pytest]",
}
#: every name that may configure pytest (for a listing of a tree).
PYTEST_CONFIG_NAMES = PYTEST_INI_NAMES | frozenset(PYTEST_SECTIONS)
#: at most this many findings are kept (the report says when more were found).
MAX_FINDINGS = 50


def module_name(path: PurePosixPath) -> str | None:
    """The import name a file defines at its folder's level: ``x`` for ``x.py`` and
    ``x/__init__.py``; None for anything else."""
    if path.name == "__init__.py" and len(path.parts) >= 2:
        return path.parts[-2]
    if path.suffix == ".py":
        return path.stem
    return None


def path_finding(path: str, change: Change) -> TamperFinding | None:
    """The finding a changed path is by its name alone (see the module docstring), or None.

    Args:
        path: relative to the verifier's tree (``a/b/conftest.py``), ``/``-separated.
        change: how the session changed it.
    """
    p = PurePosixPath(path)
    name, parts = p.name, p.parts

    def found(category: Any, detail: str) -> TamperFinding:
        return TamperFinding(path=path, category=category, change=change, detail=detail)

    if name == "conftest.py":
        return found("runner_config", "a pytest conftest.py: its hooks and fixtures run in pytest")
    if name in PYTEST_INI_NAMES:
        return found("runner_config", "pytest's configuration file")
    if name in ("sitecustomize.py", "usercustomize.py"):
        return found("interpreter_path", f"{name}: imported by every Python at start")
    if name.endswith(".pth"):
        return found("interpreter_path", "a path file: its import lines run at Python's start")
    if name == "entry_points.txt" and any(
        part.endswith((".egg-info", ".dist-info")) for part in parts[:-1]
    ):
        return found("runner_config", "installed-package entry points (they load pytest plugins)")
    if name.endswith(".egg-link"):
        return found("interpreter_path", "a development-install link: a folder on sys.path")
    if p.suffix in (".pyc", ".pyo") or "__pycache__" in parts:
        return found("library", "compiled bytecode, loaded in place of its source")
    module = module_name(p)
    if change == "added" and module is not None:
        folder = parts[:-2] if name == "__init__.py" else parts[:-1]
        if module in RUNNER_MODULES:
            return found("library", f"a module named like the test runner ({module})")
        if module in sys.stdlib_module_names and (not folder or folder[-1] in TEST_FOLDERS):
            return found(
                "library",
                f"a module named like the standard library's {module!r} where pytest puts "
                "the folder first on sys.path",
            )
    return None


def pytest_section(name: str, text: str | None) -> Any:
    """What configures pytest in a file named ``name`` (a ``PYTEST_SECTIONS`` name) with
    contents ``text``: the pytest section as a dict, None when the file (or its section) is
    absent, or the whole text when it does not parse (then any change counts)."""
    if text is None:
        return None
    if name == "pyproject.toml":
        try:
            tool = tomllib.loads(text).get("tool", {})
        except tomllib.TOMLDecodeError:
            return text
        pytest = tool.get("pytest") if isinstance(tool, dict) else None
        return pytest or None
    section = "tool:pytest" if name == "setup.cfg" else "pytest"
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return text
    return dict(parser.items(section)) if parser.has_section(section) else None


def config_finding(path: str, before: str | None, after: str | None) -> TamperFinding | None:
    """The finding a change of a file that may configure pytest is, or None: any change of
    ``pytest.ini`` / ``.pytest.ini``; a changed pytest section of ``setup.cfg``, ``tox.ini``
    or ``pyproject.toml`` (other sections are not the runner's).

    Args:
        path: relative to the verifier's tree.
        before, after: the file's text before and after the session (None: absent).
    """
    if before == after:
        return None
    change: Change = "added" if before is None else "deleted" if after is None else "modified"
    name = PurePosixPath(path).name
    if name in PYTEST_INI_NAMES:
        return path_finding(path, change)
    where = PYTEST_SECTIONS.get(name)
    if where is None or pytest_section(name, before) == pytest_section(name, after):
        return None
    return TamperFinding(
        path=path,
        category="runner_config",
        change=change,
        detail=f"pytest's section {where} changed",
    )


def capped(findings: Iterable[TamperFinding]) -> tuple[list[TamperFinding], bool]:
    """The first :data:`MAX_FINDINGS` findings, one per path, and whether more were found."""
    unique = list({f.path: f for f in findings}.values())
    return unique[:MAX_FINDINGS], len(unique) > MAX_FINDINGS


@dataclasses.dataclass(frozen=True)
class PatchedFile:
    """One file a ``git diff`` changes.

    Attributes:
        path: the file's path (for a rename: the new one; the old one is a ``deleted`` entry).
        change: how the patch changes it.
        text: an added text file's whole contents (its ``+`` lines); None otherwise.
    """

    path: str
    change: Change
    text: str | None = None


def patched_files(patch: str) -> list[PatchedFile]:
    """The files a ``git diff`` (``--binary`` included) adds, modifies or deletes, in order.

    Paths come from each section's ``diff --git`` header, ``rename from`` / ``rename to`` and
    ``---`` / ``+++`` lines, unquoted as git quotes them (``core.quotePath``: C escapes and
    octal bytes; git-config(1)).

    Args:
        patch: the diff's text.
    """
    files: list[PatchedFile] = []
    for section in _sections(patch):
        header, lines = section[0], section[1:]
        old, new = _header_paths(header)
        change: Change = "modified"
        renamed_from: str | None = None
        plus: list[str] = []
        in_hunks = False
        for line in lines:
            if in_hunks:
                if line.startswith("+"):
                    plus.append(line[1:])
                continue
            if line.startswith("new file mode"):
                change = "added"
            elif line.startswith("deleted file mode"):
                change = "deleted"
            elif line.startswith("rename from "):
                renamed_from = _unquote(line[len("rename from ") :])
            elif line.startswith("rename to "):
                new = _unquote(line[len("rename to ") :])
            elif line.startswith("--- ") and line[4:] != "/dev/null":
                old = _strip_prefix(_unquote(line[4:]), "a/")
            elif line.startswith("+++ ") and line[4:] != "/dev/null":
                new = _strip_prefix(_unquote(line[4:]), "b/")
            elif line.startswith(("@@ ", "GIT binary patch")):
                in_hunks = line.startswith("@@ ")
        if renamed_from is not None:
            files.append(PatchedFile(renamed_from, "deleted"))
            change = "added"
        path = old if change == "deleted" else new
        text = "\n".join(plus) + "\n" if change == "added" and in_hunks else None
        files.append(PatchedFile(path, change, text))
    return files


def _sections(patch: str) -> list[list[str]]:
    """The patch split at its ``diff --git`` lines (text before the first is dropped)."""
    sections: list[list[str]] = []
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    return sections


def _header_paths(header: str) -> tuple[str, str]:
    """``(a path, b path)`` of a ``diff --git a/X b/Y`` line."""
    rest = header[len("diff --git ") :]
    if rest.startswith('"'):
        end = _quoted_end(rest)
        a, b = rest[: end + 1], rest[end + 2 :]
    else:
        # unquoted paths hold no '"', tab or newline; " b/" splits them unless a path holds it
        a, sep, b = rest.partition(" b/")
        b = "b/" + b if sep else b
    return _strip_prefix(_unquote(a), "a/"), _strip_prefix(_unquote(b), "b/")


def _quoted_end(text: str) -> int:
    """Index of the closing quote of the C-quoted string ``text`` starts with."""
    i = 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i


_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(text: str) -> str:
    """A path as git writes it: as is, or C-quoted with octal bytes (UTF-8)."""
    text = text.rstrip("\t")  # git may end a ---/+++ name with a tab when it has spaces
    if not (text.startswith('"') and text.endswith('"') and len(text) >= 2):
        return text
    out = bytearray()
    body, i = text[1:-1], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "01234567" and i + 3 < len(body) + 1:
                out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
                i += 4
                continue
            out.append(_ESCAPES.get(nxt, ord(nxt)))
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", "replace")


def _strip_prefix(path: str, prefix: str) -> str:
    return path[len(prefix) :] if path.startswith(prefix) else path
