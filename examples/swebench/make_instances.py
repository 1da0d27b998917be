"""Make the SWE-bench-format example instances from real projects' PyPI sdists.

Each instance is a released project whose sdist ships its tests, with a bug the project once
fixed put back (``bug.patch``) and the regression test that came with the fix taken out
(``test.patch``, applied again at grading, as SWE-bench's test patches are)::

    more-itertools 10.5.0  partition(None, ...) no longer uses bool (fixed in 8.1.0:
                           "partition works with pred=None again")
    idna 3.10              decoding "xn--" raises IndexError, not IDNAError (3.3/3.4: "Throw
                           IDNAError exception correctly for some malformed input")
    boltons 24.0.0         daterange(d, d, inclusive=True) never ends (#302: "Bugfix for
                           infinite daterange issue when start and stop is the same")

For each one this script downloads the sdist (``pip download --no-binary :all: --no-deps``,
cached under ``~/.cache/rolloutd/sdists``), writes the instance's repository at its base state
into ``{instance}/environment/repo`` (the build context of its image, not committed), computes
the base commit the image's Dockerfile will make (fixed author, dates and message), builds the
image (podman) and runs the tests in it to find ``FAIL_TO_PASS`` (fail at the base with the test
patch, pass with the fix) and ``PASS_TO_PASS`` (pass both ways, in the test patch's files), and
writes
``instances.jsonl`` in SWE-bench's format (lists as JSON text, as its datasets hold them)::

    python examples/swebench/make_instances.py            # build contexts + instances.jsonl
    python examples/swebench/make_instances.py --contexts # build contexts only (tests do this)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("ROLLOUTD_CACHE", Path.home() / ".cache" / "rolloutd")) / "sdists"
#: instance id -> (PyPI requirement, repo as SWE-bench names it, problem statement)
INSTANCES = {
    "more-itertools__more-itertools-10.5.0-partition-none": (
        "more-itertools==10.5.0",
        "more-itertools/more-itertools",
        "`more_itertools.partition(None, iterable)` raises `TypeError: 'NoneType' object is "
        "not callable`. Its documentation says that when *pred* is None, `bool` is used: "
        "`partition(None, [0, 1, False, True, '', ' '])` should give `[0, False, '']` and "
        "`[1, True, ' ']`.",
    ),
    "kjd__idna-3.10-empty-alabel": (
        "idna==3.10",
        "kjd/idna",
        '`idna.decode(b"xn--")` raises `IndexError: string index out of range` instead of '
        "`idna.IDNAError`. An A-label with nothing after its `xn--` prefix is malformed "
        "input, and malformed input must raise `IDNAError` like every other invalid label.",
    ),
    "mahmoud__boltons-24.0.0-daterange-same-day": (
        "boltons==24.0.0",
        "mahmoud/boltons",
        "`boltons.timeutils.daterange(day, day, inclusive=True)` never ends: it yields `day`, "
        "then the next day, and so on forever. With the same start and stop it should yield "
        "`day` once when inclusive, and nothing when not inclusive.",
    ),
}
#: the base commit's identity: the image's Dockerfile commits with the same
GIT_ENV = {
    "GIT_AUTHOR_NAME": "rolloutd",
    "GIT_AUTHOR_EMAIL": "rolloutd@localhost",
    "GIT_COMMITTER_NAME": "rolloutd",
    "GIT_COMMITTER_EMAIL": "rolloutd@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
}
DOCKERFILE = """\
ARG BASE_IMAGE=localhost/rolloutd-base:bookworm
FROM ${{BASE_IMAGE}}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-pytest \\
    && rm -rf /var/lib/apt/lists/*
COPY repo /testbed
WORKDIR /testbed
RUN {commit}
"""


def git(cwd: Path, *args: str, stdin: str | None = None) -> str:
    """Run git in ``cwd`` with the base commit's identity; its stdout."""
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **GIT_ENV},
    ).stdout


def commit_command() -> str:
    """The shell command making the base commit (the same here and in the Dockerfile)."""
    env = " ".join(f"{k}={v}" for k, v in GIT_ENV.items())
    return f"git init -q -b main && git add -A && {env} git commit -q -m base"


def sdist(requirement: str) -> Path:
    """The requirement's sdist, downloaded once into the cache."""
    name, version = requirement.split("==")
    CACHE.mkdir(parents=True, exist_ok=True)
    found = [
        p
        for p in CACHE.glob("*.tar.gz")
        if p.name.lower().replace("_", "-") == f"{name}-{version}.tar.gz".lower()
    ]
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-binary",
                ":all:",
                "--no-deps",
                "-d",
                str(CACHE),
                requirement,
            ],
            check=True,
        )
        return sdist(requirement)
    return found[0]


def base_repo(instance_id: str, requirement: str, target: Path) -> None:
    """The instance's repository at its base state, in ``target``: the sdist's files without
    the regression test (test.patch reversed) and with the bug (bug.patch)."""
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(sdist(requirement)) as tar:
        tar.extractall(tmp, filter="data")
        (root,) = Path(tmp).iterdir()
        folder = HERE / instance_id
        for patch, reverse in (("test.patch", True), ("bug.patch", False)):
            subprocess.run(
                ["git", "apply", *(["-R"] if reverse else []), str(folder / patch)],
                cwd=root,
                check=True,
            )
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(root, target, symlinks=True)


def prepare(instance_id: str) -> Path:
    """Write the instance's build context (Dockerfile and repo); return its folder."""
    requirement = INSTANCES[instance_id][0]
    environment = HERE / instance_id / "environment"
    base_repo(instance_id, requirement, environment / "repo")
    (environment / "Dockerfile").write_text(DOCKERFILE.format(commit=commit_command()))
    return environment


def statuses(log: str) -> dict[str, str]:
    """test id -> PASSED / FAILED / ERROR from ``pytest -rA``'s summary lines."""
    return dict(
        (test_id, status)
        for status, test_id in re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", log, re.MULTILINE)
    )


def run_in_image(instance_id: str, files: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The statuses of the test patch's files at the base and with the fix, run in the
    instance's own image (built here with podman: Debian's pytest, as the evaluation has)."""
    folder = HERE / instance_id
    tag = f"localhost/rolloutd-example-{instance_id.lower()}"
    subprocess.run(
        ["podman", "build", "-q", "-t", tag, str(folder / "environment")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    pytest = f"python3 -m pytest -rA -p no:cacheprovider {' '.join(files)}"
    script = (
        f"git apply - <<'EOF'\n{(folder / 'test.patch').read_text()}\nEOF\n"
        f"{pytest}; echo '>>>>> FIXED'\n"
        f"git apply -R - <<'EOF'\n{(folder / 'bug.patch').read_text()}\nEOF\n{pytest}\n"
    )
    out = subprocess.run(
        ["podman", "run", "--rm", "-i", "--network", "none", tag, "bash", "-s"],
        input=script,
        capture_output=True,
        text=True,
        timeout=900,
    ).stdout
    before, _, after = out.partition(">>>>> FIXED")
    return statuses(before), statuses(after)


def instance_row(instance_id: str) -> dict[str, object]:
    """The instance in SWE-bench's format, with its test lists from runs of its tests."""
    requirement, repo_name, problem = INSTANCES[instance_id]
    folder = HERE / instance_id
    test_patch = (folder / "test.patch").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        shutil.copytree(folder / "environment" / "repo", repo, symlinks=True)
        subprocess.run(["sh", "-c", commit_command()], cwd=repo, check=True)
        base_commit = git(repo, "rev-parse", "HEAD").strip()
        git(repo, "apply", "-R", str(folder / "bug.patch"))
        fix = git(repo, "diff", "HEAD")
    files = re.findall(r"^diff --git a/\S+ b/(\S+)$", test_patch, re.MULTILINE)
    before, after = run_in_image(instance_id, files)
    fail_to_pass = sorted(
        t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED"
    )
    pass_to_pass = sorted(
        t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED"
    )
    assert fail_to_pass, f"{instance_id}: the test patch exposes nothing"
    return {
        "instance_id": instance_id,
        "repo": repo_name,
        "base_commit": base_commit,
        "patch": fix,
        "test_patch": test_patch,
        "problem_statement": problem,
        "hints_text": "",
        "created_at": "2026-11-27T00:00:00Z",
        "version": requirement.split("==")[1],
        "FAIL_TO_PASS": json.dumps(fail_to_pass),
        "PASS_TO_PASS": json.dumps(pass_to_pass),
        "environment_setup_commit": base_commit,
        "image_name": f"{instance_id}/environment",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", action="store_true", help="build contexts only")
    args = parser.parse_args()
    rows = []
    for instance_id in INSTANCES:
        prepare(instance_id)
        if not args.contexts:
            rows.append(instance_row(instance_id))
    if not args.contexts:
        with open(HERE / "instances.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        for row in rows:
            print(row["instance_id"], row["base_commit"][:12], row["FAIL_TO_PASS"])


if __name__ == "__main__":
    main()
