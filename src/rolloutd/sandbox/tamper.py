"""What a session changed that a verifier must not trust: the findings of a tamper report
(:class:`rolloutd.types.TamperReport`).

Two kinds of change are examined, both from the host side (names from podman-diff(1), files
of host folders read without following links); nothing here runs inside a sandbox:

- **System paths** (outside the workdir: the agent's container's own file system),
  :func:`classify_system_path`: by name, a path is a program (``/usr/bin``, ``/bin``,
  ``/usr/local/bin``, the image's ``PATH``, ``/etc/alternatives``, ``/usr/lib/git-core``), a
  library (``*.so``, ``/lib``, ``/usr/lib``, ``/etc/ld.so.preload`` and the loader's
  configuration), an interpreter path (``*.pth``, ``sitecustomize``/``usercustomize``, Python's,
  Perl's, Ruby's and Node's module folders), a runner configuration (``conftest.py``, pytest's
  configuration files, a module named like a test runner), a shell profile (``/etc/profile``,
  ``.bashrc``, ...), git's configuration or hooks, or the verifier's own folders (``/tests``,
  ``/logs/verifier``). Other paths (data, caches, ``/tmp``) are counted, not listed.
- **The workdir** (:func:`examine_workdir`): the agent's final workspace against the task
  image's workdir (what the task shipped). A file that configures or extends the test runner
  or the interpreter and that the task did not ship, or shipped with other content, is a
  finding by the rules every test verifier shares (:mod:`rolloutd.security.tamper`:
  ``conftest.py``, pytest's configuration and the pytest sections of ``setup.cfg``/``tox.ini``/
  ``pyproject.toml``, ``sitecustomize.py``, ``usercustomize.py``, ``*.pth``, package metadata,
  bytecode outside ``__pycache__``, a module named like the runner or the standard library where
  pytest puts its folder first on ``sys.path``). So are a git hook, a git configuration key that
  runs a program (:data:`GIT_PROGRAM_KEYS`: ``core.fsmonitor``, ``core.hooksPath``, filters,
  aliases to commands, includes, ...) or a ``.git`` file pointing git elsewhere; a file in a
  folder of the workdir that is on the verifier's ``PATH``; and a module named like a
  standard-library module at the top of a ``PYTHONPATH`` folder inside the workdir.
  ``__pycache__`` folders are left out: the verifier never gets them.

A task whose honest solution is such a file (a task that asks for a ``conftest.py``) cannot be
verified under these rules: its honest answer is a finding too.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from rolloutd.records import TamperCategory, TamperFinding, TamperReport
from rolloutd.security.tamper import PYTEST_CONFIG_NAMES, capped, config_finding, path_finding

Change = Literal["added", "modified", "deleted"]
#: git configuration keys whose value is a program git runs, or more configuration
#: (git-config(1)); ``*`` stands for a subsection
GIT_PROGRAM_KEYS = (
    "core.fsmonitor",
    "core.hookspath",
    "core.sshcommand",
    "core.pager",
    "core.editor",
    "core.askpass",
    "core.gitproxy",
    "sequence.editor",
    "diff.external",
    "diff.*.command",
    "diff.*.textconv",
    "merge.*.driver",
    "filter.*.clean",
    "filter.*.smudge",
    "filter.*.process",
    "credential.helper",
    "credential.*.helper",
    "gpg.program",
    "gpg.*.program",
    "uploadpack.packobjectshook",
    "include.path",
    "includeif.*.path",
    "pager.*",
)
#: git hooks are files of a ``.git/hooks`` folder other than git's samples
_SAMPLE = ".sample"
#: values of ``core.fsmonitor`` that turn it off
_GIT_FALSE = frozenset({"", "false", "no", "off", "0"})
#: folders of programs (the Filesystem Hierarchy Standard 3.0, 4.4 and 4.7; Debian's
#: ``/etc/alternatives`` and git's ``git-core``)
EXECUTABLE_DIRS = (
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/usr/libexec",
    "/usr/local/libexec",
    "/usr/lib/git-core",
    "/usr/games",
    "/usr/local/games",
    "/etc/alternatives",
)
#: folders of shared libraries (FHS 3.0, 4.6 and 4.9.2)
LIBRARY_DIRS = (
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libx32",
    "/usr/local/lib",
)
#: the dynamic loader's configuration (ld.so(8)): a preloaded library runs in every program
LOADER_FILES = ("/etc/ld.so.preload", "/etc/ld.so.conf", "/etc/ld.so.cache", "/etc/nsswitch.conf")
#: folders an interpreter searches for modules (Python, Perl, Ruby, Node)
_INTERPRETER_DIR = re.compile(
    r"^/(?:usr/(?:local/)?(?:lib|lib64|share)/(?:python|pypy|perl|ruby|node_modules|nodejs)"
    r"|usr/lib/[^/]+/perl|etc/python|usr/local/share/perl|usr/share/perl)"
)
#: shell start-up files (bash(1) INVOCATION, dash(1), zsh(1) STARTUP/SHUTDOWN FILES)
SHELL_PROFILE_NAMES = frozenset(
    {
        ".bashrc",
        ".bash_profile",
        ".bash_login",
        ".bash_logout",
        ".profile",
        ".zshrc",
        ".zshenv",
        ".zprofile",
        ".zlogin",
        ".kshrc",
        ".mkshrc",
    }
)
SHELL_PROFILE_PATHS = (
    "/etc/profile",
    "/etc/profile.d",
    "/etc/bash.bashrc",
    "/etc/bashrc",
    "/etc/environment",
    "/etc/zsh",
    "/etc/skel",
)
#: bytes of a configuration file read to judge it (more: judged suspicious)
MAX_CONFIG_BYTES = 1 << 20
#: the verifier's own folders (Harbor's ``EnvironmentPaths``)
VERIFIER_PATHS = ("/tests", "/logs/verifier")
_SO = re.compile(r"\.so(?:\.[0-9]+)*$")


def _below(path: str, roots: tuple[str, ...] | list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def classify_system_path(
    path: str, change: Change = "added", *, path_dirs: tuple[str, ...] = ()
) -> tuple[TamperCategory, str] | None:
    """What a changed path outside the workdir is to a verifier, by name (see the module).

    Args:
        path: an absolute path inside the container.
        change: how the session changed it.
        path_dirs: the verifier's ``PATH`` folders (beyond :data:`EXECUTABLE_DIRS`).

    Returns:
        ``(category, why in words)``, or None for a path that is none of those (data).
    """
    name = PurePosixPath(path).name
    if _below(path, VERIFIER_PATHS):
        return "verifier_path", "the verifier's own folder"
    if runner := path_finding(path, change):
        return runner.category, runner.detail
    if name in PYTEST_CONFIG_NAMES:
        return "runner_config", "a file pytest may read its configuration from"
    if name in SHELL_PROFILE_NAMES or _below(path, SHELL_PROFILE_PATHS):
        return "shell_profile", "a shell start-up file"
    if (
        name in (".gitconfig", "gitconfig", "gitattributes")
        or "/.git/hooks/" in path
        or path.endswith("/.git/config")
        or "/.config/git/" in path
        or _below(path, ("/usr/share/git-core/templates",))
    ):
        return "git_config", "git's configuration or hooks"
    if _INTERPRETER_DIR.match(path) or "/site-packages/" in path or "/dist-packages/" in path:
        return "interpreter_path", "a folder an interpreter loads modules from"
    if _below(path, EXECUTABLE_DIRS) or _below(path, [d for d in path_dirs if d.startswith("/")]):
        return "executable", "a folder of programs (on PATH)"
    if path in LOADER_FILES or _below(path, ("/etc/ld.so.conf.d",)):
        return "library", "the dynamic loader's configuration (ld.so(8))"
    if _SO.search(name):
        return "library", "a shared library"
    if _below(path, LIBRARY_DIRS):
        return "library", "a folder of shared libraries"
    return None


def is_bytecode_cache(path: str) -> bool:
    """Whether ``path`` is a compiled module in a ``__pycache__`` folder (PEP 3147): Python
    writes them when it imports a module whose cache is missing, and compiles the source
    again when the cache is gone, so a verifier that does not carry them loses nothing."""
    inside = PurePosixPath(path)
    return inside.parent.name == "__pycache__" and inside.suffix == ".pyc"


def leaves(paths: list[str]) -> list[str]:
    """``paths`` without those that are a folder of another (a diff lists every folder above
    a changed file as changed too)."""
    ordered = sorted(set(paths))
    kept = []
    for n, path in enumerate(ordered):
        following = ordered[n + 1] if n + 1 < len(ordered) else ""
        if not following.startswith(path.rstrip("/") + "/"):
            kept.append(path)
    return kept


# --------------------------------------------------------------------------- the workdir


def _text(path: Path | None) -> str | None:
    """A regular file's text for a comparison (:func:`_read`; None: absent or unreadable)."""
    data = _read(path) if path is not None else None
    return data.decode("utf-8", errors="replace") if data is not None else None


def _read(path: Path) -> bytes | None:
    """A regular file's bytes, read without following a link; None when it is not a regular
    file or holds more than :data:`MAX_CONFIG_BYTES` (a caller treats that as suspicious)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        data = f.read(MAX_CONFIG_BYTES + 1)
    return data if len(data) <= MAX_CONFIG_BYTES else None


def git_program_keys(data: bytes) -> set[tuple[str, str]]:
    """The ``(key, value)`` pairs of a git configuration file that make git run a program or
    read more configuration (:data:`GIT_PROGRAM_KEYS`), keys lower-cased with their
    subsection as ``*``; ``core.fsmonitor`` only when it is not turned off.

    Read as git-config(1) describes the syntax (``[section "sub"]``, ``[section.sub]``,
    ``key = value`` also on the header's line); a line this reader cannot place is kept as
    ``("?", line)``, so that an unusual spelling is a finding rather than missed.
    """
    found: set[tuple[str, str]] = set()
    section = ""
    header = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(?:\s+"((?:[^"\\]|\\.)*)")?\s*\](.*)$')
    entry = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(?:=\s*(.*))?$")
    for raw in data.decode("utf-8", errors="replace").splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if m := header.match(line):
            name, sub, line = m.group(1).lower(), m.group(2), m.group(3).strip()
            if sub is None and "." in name:  # the old [section.sub] form
                name, _, sub = name.partition(".")
            section = name + (".*" if sub is not None else "")
            if not line or line[0] in "#;":
                continue
        if not (m := entry.match(line)):
            if section:
                found.add(("?", raw.strip()))
            continue
        key = f"{section}.{m.group(1).lower()}"
        value = (m.group(2) or "").strip().strip('"')
        if key == "core.fsmonitor" and value.lower() in _GIT_FALSE:
            continue
        if key.startswith("alias.") and not value.startswith("!"):
            continue
        if key.startswith("alias.") or any(_git_key_matches(key, k) for k in GIT_PROGRAM_KEYS):
            found.add((key, value))
    return found


def _git_key_matches(key: str, pattern: str) -> bool:
    if pattern.endswith(".*") and pattern.count(".") == 1:  # pager.*
        return key.startswith(pattern[:-1])
    return key == pattern


@dataclass
class _Entry:
    kind: str  # "file", "dir", "link", "other"
    size: int = 0
    mtime_ns: int = 0
    mode: int = 0
    target: str = ""


def _scan(root: Path) -> dict[str, _Entry]:
    """Every entry below ``root`` by its path relative to it, links not followed."""
    entries: dict[str, _Entry] = {}
    for folder, dirs, files in os.walk(root):
        base = Path(folder)
        for name in [*dirs, *files]:
            full = base / name
            try:
                st = full.lstat()
            except OSError:
                continue
            rel = str(full.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                entries[rel] = _Entry("link", target=os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                entries[rel] = _Entry("dir")
            elif stat.S_ISREG(st.st_mode):
                entries[rel] = _Entry("file", st.st_size, st.st_mtime_ns, st.st_mode & 0o7777)
            else:
                entries[rel] = _Entry("other")
    return entries


@dataclass
class WorkdirExamination:
    """What :func:`examine_workdir` found.

    Attributes:
        findings: the verdict-affecting paths (absolute inside the runtime).
        num_changed: paths added, modified or deleted in the workdir.
    """

    findings: list[TamperFinding] = field(default_factory=list)
    num_changed: int = 0


def examine_workdir(
    shipped: Path,
    final: Path,
    *,
    workdir: str,
    path_dirs: tuple[str, ...] = (),
    python_path_dirs: tuple[str, ...] = (),
) -> WorkdirExamination:
    """Compare the agent's final workspace with the workdir the task shipped (see the module).

    Args:
        shipped: host folder holding the task image's workdir (and the task's own files).
        final: host folder holding the agent's final workspace.
        workdir: the workdir's path inside the runtime (findings are named by it).
        path_dirs: the verifier's ``PATH`` folders (relative ones stand for the workdir, where
            test.sh runs).
        python_path_dirs: the verifier's ``PYTHONPATH`` folders.

    Returns:
        The :class:`WorkdirExamination`.
    """
    before, after = _scan(shipped), _scan(final)
    out = WorkdirExamination()
    changed: dict[str, Change] = {}
    for rel, now in after.items():
        was = before.get(rel)
        if was is None:
            changed[rel] = "added"
        elif was != now:
            changed[rel] = "modified"
    deleted = [rel for rel in before if rel not in after]
    out.num_changed = len(changed) + len(deleted)
    inside = PurePosixPath(workdir)

    def finding(rel: str, category: TamperCategory, detail: str) -> None:
        out.findings.append(
            TamperFinding(
                path=str(inside / rel),
                category=category,
                change=changed[rel],
                detail=detail,
            )
        )

    exec_dirs = {
        "" if not p or not p.startswith("/") else str(PurePosixPath(p).relative_to(inside))
        for p in path_dirs
        if not p.startswith("/") or PurePosixPath(p).is_relative_to(inside)
    }
    module_dirs = {
        str(PurePosixPath(p).relative_to(inside))
        for p in python_path_dirs
        if p.startswith("/") and PurePosixPath(p).is_relative_to(inside)
    }
    for rel in sorted(changed):
        entry, path = after[rel], PurePosixPath(rel)
        parent = str(path.parent) if str(path.parent) != "." else ""
        if "__pycache__" in path.parts:
            continue  # never carried: Python compiles the sources again
        shipped_file = shipped / rel if rel in before and before[rel].kind == "file" else None
        if why := _git_why(path, entry, final / rel, shipped_file):
            finding(rel, "git_config", why)
        elif entry.kind == "dir":
            continue
        elif runner := path_finding(rel, changed[rel]):
            finding(rel, runner.category, runner.detail)
        elif path.name in PYTEST_CONFIG_NAMES:
            now = _text(final / rel) if entry.kind == "file" else "(not a regular file)"
            if config := config_finding(rel, _text(shipped_file), now):
                finding(rel, config.category, config.detail)
        elif parent in exec_dirs:
            finding(rel, "executable", "a program in a folder on the verifier's PATH")
        elif (
            parent in module_dirs
            and path.suffix in (".py", ".so", ".pyc")
            and (path.name.partition(".")[0] in sys.stdlib_module_names)
        ):
            finding(rel, "interpreter_path", "shadows a standard-library module on PYTHONPATH")
    for rel in deleted:  # a deleted pytest configuration changes how pytest runs too
        if PurePosixPath(rel).name in PYTEST_CONFIG_NAMES and before[rel].kind == "file":
            if config := config_finding(rel, _text(shipped / rel), None):
                out.findings.append(config.model_copy(update={"path": str(inside / rel)}))
    return out


def _git_why(
    path: PurePosixPath, entry: _Entry, final_file: Path, shipped_file: Path | None
) -> str | None:
    """Why a changed workdir path is a git finding (in words), or None."""
    if path.name == ".git":
        return "a .git file (it points git at another repository)" if entry.kind != "dir" else None
    if ".git" not in path.parts[:-1]:
        return None
    parts = path.parts
    below = parts[len(parts) - parts[::-1].index(".git") :]
    if below == ("config",):
        data, shipped = _read(final_file), _read(shipped_file) if shipped_file else None
        new = git_program_keys(data) if data is not None else {("?", "not a readable file")}
        added = sorted(new - (git_program_keys(shipped) if shipped is not None else set()))
        if not added:
            return None
        return "git configuration that runs a program: " + ", ".join(
            f"{k} = {v}"[:120] for k, v in added[:5]
        )
    if len(below) >= 2 and below[0] == "hooks" and entry.kind != "dir":
        return None if path.name.endswith(_SAMPLE) else "a git hook"
    return None


# --------------------------------------------------------------------------- the report


def report(
    findings: list[TamperFinding],
    ignored: list[TamperFinding],
    *,
    num_changed_paths: int,
    carried_system_changes: bool,
) -> TamperReport:
    """The tamper report of these findings, each list one entry a path, cut to
    :data:`rolloutd.security.tamper.MAX_FINDINGS`."""
    kept, more = capped(findings)
    listed, more_listed = capped(ignored)
    return TamperReport(
        findings=kept,
        ignored=listed,
        num_changed_paths=num_changed_paths,
        truncated=more or more_listed,
        carried_system_changes=carried_system_changes,
    )
