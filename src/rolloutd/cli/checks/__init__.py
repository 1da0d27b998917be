"""What ``rolloutd doctor`` checks on this host: each thing rolloutd needs, found or not, and how
to fix what is missing.

Every check returns :class:`Check` rows: ``ok`` (found, with what was found), ``miss`` (with
what is wrong and the fix) or ``skipped`` (with why: the setting that makes it unneeded here).
The checks run what a session runs where they can (a bwrap sandbox started with the sandbox
policy's default limits, a container of the base image, a cgroup made and removed, a probe
object written to the store), so a row says what works, not only what is installed:

- **sandboxes**: ``bwrap`` and user namespaces (``user.max_user_namespaces``, Debian's
  ``kernel.unprivileged_userns_clone`` and Ubuntu's AppArmor switch
  ``kernel.apparmor_restrict_unprivileged_userns``, which confine an unprivileged user's
  namespaces: the kernel's Documentation/admin-guide/sysctl/kernel.rst and Ubuntu 24.04's
  release notes), the seccomp filter (libseccomp), the ceilings' cgroups (v2 delegated, or v1
  writable controllers) and sized disks (root, a free loop device, ``mkfs.ext4``), then one
  real bwrap sandbox (docs/runtimes.md, "Ceilings");
- **containers**: podman, ``podman info``, the configuration docs/setup.md gives
  (``/etc/containers/containers.conf``: no default ulimits, runc), the base image or what
  makes it (``mmdebstrap``), and one container of it when it exists;
- **harnesses**: Node (>= 20: qwen-code, gemini-cli and pi need it) and each harness CLI with
  its version (what a sandbox host publishes:
  :func:`rolloutd.sandbox.harnesses.harness_capabilities`);
- **the stack**: the ports ``rolloutd up`` binds (its defaults), Temporal (when an address is
  configured or a stack runs), the store (writable), the engine (reachable, serving the named
  model; or what ``up`` starts: llama-server and the pulled model) and its tokenizer, and free
  disk space where rolloutd writes.

Which runtimes are checked follows the sandbox policy (``ROLLOUTD_SANDBOX_POLICY``): the
runtimes the operator lists, or bwrap and podman when the policy is the default (the isolating
runtimes rolloutd verifies itself). Nothing here changes the host but a probe cgroup, a probe
sandbox and container (all removed) and a probe object in the store (deleted).

The checks live in :mod:`.host` (the sandbox host) and :mod:`.stack` (what the stack needs),
their rows and target in :mod:`.rows`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rolloutd.cli import tables
from rolloutd.cli.checks.host import (
    check_bwrap,
    check_harnesses,
    check_other_runtimes,
    check_platform,
    check_podman,
)
from rolloutd.cli.checks.rows import Check, Target, miss, ok, skipped
from rolloutd.cli.checks.stack import (
    check_disk_space,
    check_engine,
    check_ports,
    check_store,
    check_temporal,
    port_free,
)

__all__ = [
    "Check",
    "Target",
    "check_disk_space",
    "check_engine",
    "check_ports",
    "check_store",
    "check_temporal",
    "miss",
    "ok",
    "port_free",
    "render",
    "run_checks",
    "skipped",
]


def run_checks(target: Target) -> list[Check]:
    """Every check, in the table's order.

    Returns:
        The rows; a check that raised an error nobody expected is a ``miss`` naming it.
    """
    groups: list[Callable[[Target], Iterable[Check]]] = [
        check_platform,
        check_bwrap,
        check_podman,
        check_other_runtimes,
        check_harnesses,
        check_ports,
        check_temporal,
        check_store,
        check_engine,
        check_disk_space,
    ]
    rows: list[Check] = []
    for group in groups:
        try:
            rows.extend(group(target))
        except Exception as exc:  # noqa: BLE001 - a check's own failure is a row, not a crash
            rows.append(
                miss(group.__name__.removeprefix("check_"), f"the check failed: {exc!r}", "")
            )
    return rows


def render(rows: list[Check]) -> tables.Table:
    """The rows as a table (status, check, detail, fix), captioned with a count of each
    status; a miss's status is upper case, to stand out."""
    counts = {s: sum(r.status == s for r in rows) for s in ("ok", "miss", "skipped")}
    return tables.table(
        "status",
        "check",
        "detail",
        "fix",
        caption=f"{len(rows)} checks: {counts['ok']} ok, {counts['miss']} missing, "
        f"{counts['skipped']} skipped",
        rows=(
            (r.status.upper() if r.status == "miss" else r.status, r.name, r.detail, r.fix)
            for r in rows
        ),
    )
