"""The podman runtime on real podman: images (the Debian base made here, a task's Dockerfile
built once and cached by content hash, garbage collection), the workspace seeded from the image,
the user namespace, limits, the host's harness CLIs inside, and teardown and reclaim leaving no
container, volume or network. The behaviour every runtime shares runs on podman too
(tests/sandbox/test_runtime_common.py); escapes are tests/sandbox/test_escape_podman.py.

Every test here starts containers: ``acceptance``. The base image is made when missing
(mmdebstrap, about 2 minutes cold, then cached); each test takes 1-16 s after that (the
module 70 s here).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rolloutd.errors import HarnessError, RuntimeStartError
from rolloutd.sandbox import reclaim
from rolloutd.sandbox.config import tools_dir
from rolloutd.sandbox.harnesses.qwen_code import qwen_cli
from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.sandbox.runtimes import podman_images as images
from rolloutd.sandbox.runtimes.podman import RUNTIME_LABEL, USERNS_BASE, PodmanRuntime
from rolloutd.sandbox_policy import SandboxPolicy
from rolloutd.types import ImageBuild, RuntimeSpec
from tests.support.images import fresh_podman_store

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]


def podman(*args: str) -> str:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, check=True, timeout=120
    ).stdout


def containers_of(runtime_id: str) -> list[str]:
    return podman(
        "ps", "--all", "--filter", f"label={RUNTIME_LABEL}={runtime_id}", "--format", "{{.ID}}"
    ).split()


@pytest.fixture(scope="module")
def base_image() -> str:
    """The Debian base image, made here when missing (as every podman test needs it)."""
    return asyncio.run(images.ensure_base_image())


@pytest.fixture(scope="module", autouse=True)
def remove_built_images():
    """Images this module builds are removed when it ends (only those: other users' builds of
    the same store stay)."""

    def built() -> set[str]:
        listing = podman(
            "images", "--filter", f"label={images.MANAGED_LABEL}=build", "--format", "{{.ID}}"
        )
        return set(listing.split())

    before = built()
    yield
    for image in built() - before:
        subprocess.run(["podman", "rmi", "--force", image], capture_output=True, check=False)


@pytest.fixture
def context(tmp_path: Path, base_image: str) -> Path:
    """A build context: a Dockerfile FROM the base image that puts a repository at /app, sets
    a variable and declares a volume (podman makes an anonymous volume for it)."""
    ctx = tmp_path / f"ctx-{uuid.uuid4().hex[:6]}"
    (ctx / "app").mkdir(parents=True)
    (ctx / "app" / "main.py").write_text("print('from the image')\n")
    (ctx / "app" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (ctx / "app" / "run.sh").chmod(0o755)
    (ctx / "Dockerfile").write_text(
        f"ARG BASE_IMAGE={base_image}\nFROM ${{BASE_IMAGE}}\n"
        "COPY app /app\nENV GREETING=hello\nVOLUME /data\nWORKDIR /app\n"
    )
    return ctx


async def test_a_dockerfile_is_built_once_and_seeds_the_workspace(
    make_runtime, context: Path
) -> None:
    """A task's Dockerfile is built at the first start: the image's files at the workdir seed
    the workspace (the spec's files win over them) and its ENV reaches commands; the same
    context is not built again (same tag, cached by content hash), a changed one is. About 8 s
    here."""
    build = {"context": str(context)}
    first = await make_runtime("podman", build=build, workdir="/app", files={"main.py": "mine"})
    assert isinstance(first, PodmanRuntime) and first.built_image
    assert first.image.startswith(images.BUILT_REPOSITORY + ":")
    listing = await first.exec("ls; cat main.py; echo; ./run.sh; echo $GREETING")
    # the image's files are in the workspace, spec.files win over them
    assert listing.stdout.split() == ["main.py", "run.sh", "mine", "ran", "hello"], listing
    assert (first.workspace / "run.sh").read_text() == "#!/bin/sh\necho ran\n"
    again = await make_runtime("podman", build=build, workdir="/app")
    assert not again.built_image and again.image == first.image  # cached by content hash
    (context / "app" / "main.py").write_text("print('changed')\n")
    changed = await make_runtime("podman", build=build, workdir="/app")
    assert changed.built_image and changed.image != first.image


async def test_a_failing_build_is_not_retried(make_runtime, tmp_path: Path, base_image: str):
    """A Dockerfile whose RUN fails makes start raise a RuntimeStartError that is not retryable
    and names the image build. About 1 s here."""
    ctx = tmp_path / "bad"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(f"FROM {base_image}\nRUN exit 3\n")
    with pytest.raises(RuntimeStartError) as failed:
        await make_runtime("podman", build={"context": str(ctx)})
    assert not failed.value.retryable and "image build" in failed.value.message
    # a build without network says so, and which setting gives it one
    assert "the sandbox policy's build_network is off" in failed.value.message


async def test_a_dockerfile_naming_a_missing_base_image_has_it_made_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's Dockerfile ``FROM`` the base image, as the examples' are, in a podman store
    where no image was ever made (a fresh machine's: a store of the test's own, so the host's
    images are neither read nor removed): the sandbox host makes the base image (mmdebstrap,
    import), then builds. Control: podman alone, in the same fresh store, fails that build
    trying to pull the base image from a registry named ``localhost``. About 3-4 minutes
    here (mmdebstrap from the Debian mirror)."""
    ctx = tmp_path / "on-base"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"ARG BASE_IMAGE={images.BASE_IMAGE}\nFROM ${{BASE_IMAGE}}\n"
        "RUN git --version > /git-version\n"
    )
    with fresh_podman_store(tmp_path / "store") as conf:
        monkeypatch.setenv("CONTAINERS_STORAGE_CONF", conf)
        # what this process knows of the host's store does not hold for this one
        monkeypatch.setattr(images, "_configs", {})
        monkeypatch.setattr(images, "_from_ids", {})
        assert podman("images", "--quiet").split() == []
        alone = subprocess.run(
            ["podman", "build", "--network", "none", "-t", "localhost/alone:1", str(ctx)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert alone.returncode != 0 and "pinging container registry localhost" in alone.stderr

        spec = RuntimeSpec(type="podman", build=ImageBuild(context=str(ctx)))
        policy = SandboxPolicy(runtimes=["podman"], image_roots=[str(tmp_path)])
        runtime = create_runtime(spec, "on-base", tmp_path / "rt", policy=policy)
        try:
            await runtime.start()
            assert (await runtime.exec("cat /git-version")).stdout.startswith("git version")
        finally:
            await runtime.stop()
        made = podman("images", "--format", "{{.Repository}}:{{.Tag}}").split()
        assert {images.BASE_IMAGE, images.base_image_tag()} <= set(made)


async def test_builds_have_no_network_unless_the_policy_allows_it(
    tmp_path: Path, base_image: str
) -> None:
    """A build sees only loopback unless the sandbox policy's build_network allows it; then it
    has an ethernet interface too. About 6 s here."""
    ctx = tmp_path / "net"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\nRUN cat /proc/net/dev | tail -n +3 | cut -d: -f1 > /ifaces\n"
    )
    spec = RuntimeSpec(type="podman", build=ImageBuild(context=str(ctx)))
    for build_network, expected in ((False, {"lo"}), (True, {"lo", "eth0"})):
        policy = SandboxPolicy(runtimes=["podman"], image_roots=[str(tmp_path)])
        policy = policy.model_copy(update={"build_network": build_network})
        runtime = create_runtime(spec, f"bn-{build_network}", tmp_path / "rt", policy=policy)
        await runtime.start()
        try:
            found = (await runtime.exec("cat /ifaces")).stdout.split()
        finally:
            await runtime.stop()
        assert set(found) == expected, (build_network, found)


async def test_user_namespace_maps_root_to_an_unprivileged_host_uid(make_runtime) -> None:
    """Root in the container is an unprivileged uid of the host (the user namespace's base): it
    cannot mount, it edits an uploaded file, and what it makes is owned by that uid on the host.
    About 2 s here."""
    runtime = await make_runtime("podman")
    await runtime.upload("given.txt", b"from the worker")
    result = await runtime.exec(
        "id -u; head -1 /proc/self/uid_map; echo more >> given.txt; touch made.txt; "
        "mount -t tmpfs none /mnt"
    )
    uid, uid_map, *_ = result.stdout.splitlines()
    assert uid == "0" and uid_map.split() == ["0", str(USERNS_BASE), "65536"], result
    assert "permission denied" in result.stderr.lower()  # no mount: no CAP_SYS_ADMIN
    assert (runtime.workspace / "given.txt").read_text() == "from the workermore\n"
    assert (runtime.workspace / "made.txt").stat().st_uid == USERNS_BASE


async def test_limits_and_oom_are_reported(make_runtime) -> None:
    """Under memory_mb=128 a 512 MiB allocation is killed and the result says OOM; the pids
    limit of 32 is set, and where the pids cgroup (v1) is visible, as here, a fork bomb is
    refused past it. About 2 s here."""
    runtime = await make_runtime("podman", memory_mb=128, cpus=0.5, max_processes=32)
    grab = await runtime.exec("python3 -c 'b = bytearray(512 * 2**20); print(len(b))'")
    assert grab.exit_code != 0 and grab.oom_killed, grab
    cgroup = Path(f"/sys/fs/cgroup/pids/libpod_parent/libpod-{runtime.container_id}")
    if not cgroup.is_dir():  # cgroup v2 or systemd: the limit shows in the container's config
        (info,) = json.loads(podman("inspect", runtime.name))
        assert info["HostConfig"]["PidsLimit"] == 32
        return
    assert (cgroup / "pids.max").read_text().strip() == "32"
    bomb = await runtime.exec("for i in $(seq 64); do sleep 30 & done; wait", timeout_s=3)
    assert "fork" in bomb.stderr.lower() or "resource" in bomb.stderr.lower(), bomb
    assert int((cgroup / "pids.events").read_text().split()[-1]) > 0  # forks were refused
    assert int((cgroup / "pids.current").read_text()) <= 32


async def test_the_hosts_harness_clis_run_inside(make_runtime) -> None:
    """The host's node, rolloutd's Python (with openai), an npm harness CLI (qwen-code) and a
    Python harness CLI in its own environment (mini) run inside the container, each of the CLIs
    only when it is installed. About 16 s here."""
    if shutil.which("node") is None:
        pytest.skip("no node on this host")
    runtime = await make_runtime("podman")
    result = await runtime.exec("node -e 'console.log(process.version)'")
    assert result.exit_code == 0 and result.stdout.startswith("v"), result
    python = await runtime.exec([sys.executable, "-c", "import openai"])
    assert python.exit_code == 0, python  # rolloutd's own Python: the python harness's
    try:
        qwen = qwen_cli()
    except HarnessError:
        return  # no npm CLIs on this host
    version = await runtime.exec(["node", str(qwen), "--version"], timeout_s=120)
    assert version.exit_code == 0 and version.stdout.strip()[:1].isdigit(), version
    mini = tools_dir() / "bin" / "mini"
    if mini.exists():  # a Python harness CLI in its own environment (shebang: host Python)
        help_ = await runtime.exec([str(mini), "--help"], timeout_s=120)
        assert help_.exit_code == 0 and "mini" in help_.stdout.lower(), help_


async def test_teardown_leaves_no_container_volume_or_network(make_runtime, context: Path) -> None:
    """stop removes the container, the anonymous volume of the image's VOLUME, every network it
    made and the runtime's folder. About 3 s here."""
    networks = set(podman("network", "ls", "--format", "{{.Name}}").split())
    runtime = await make_runtime("podman", build={"context": str(context)}, workdir="/app")
    (info,) = json.loads(podman("inspect", runtime.name))
    volumes = [m["Name"] for m in info["Mounts"] if m.get("Type") == "volume"]
    assert volumes  # the image's VOLUME /data
    assert containers_of(runtime.runtime_id)
    await runtime.stop()
    assert containers_of(runtime.runtime_id) == []
    existing = set(podman("volume", "ls", "--format", "{{.Name}}").split())
    assert not existing & set(volumes)
    assert set(podman("network", "ls", "--format", "{{.Name}}").split()) <= networks
    assert not runtime.runtime_dir.exists()


async def test_a_dead_workers_containers_are_reclaimed_by_label(tmp_path: Path) -> None:
    """An owner record naming a process that is gone (a killed worker): the next worker's
    reclaim removes the container (found by its labels) and the folder."""
    root = tmp_path / "rt"
    runtime = create_runtime(RuntimeSpec(type="podman"), "orphan", root, host_id="h")
    reclaim.claim(root, "orphan", "h")
    await runtime.start()
    try:
        owner = reclaim.owner_path(root, "orphan")
        record = json.loads(owner.read_text())
        owner.write_text(json.dumps({**record, "pid": 2**22 + 1}))  # no such process
        assert containers_of("orphan")
        report = await asyncio.to_thread(reclaim.reclaim_orphans, root)
        assert report.num_containers == 1 and report.runtime_ids == ["orphan"]
        assert containers_of("orphan") == []
        assert not (root / "orphan").exists()
    finally:
        await runtime.stop()


async def test_built_images_are_collected_least_recently_used_first(
    tmp_path: Path, base_image: str
) -> None:
    """Garbage collection removes built images least recently used first and keeps the one a
    running container uses; once that container is gone, it goes too. About 13 s here."""
    root = tmp_path / "rt"
    tags = []
    for n in range(3):
        ctx = tmp_path / f"gc{n}"
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(f"FROM {base_image}\nRUN echo {uuid.uuid4().hex} > /id\n")
        tag, built = await images.ensure_built(
            "podman", ImageBuild(context=str(ctx)), network=False, root=root
        )
        assert built
        tags.append(tag)
    # the first is used again (newest), the second runs in a container: only the third goes
    runtime = create_runtime(RuntimeSpec(type="podman", image=tags[1]), "gc-user", root)
    await runtime.start()
    try:
        await images.ensure_built(
            "podman", ImageBuild(context=str(tmp_path / "gc0")), network=False, root=root
        )
        removed = await images.collect_garbage("podman", root, max_bytes=0)
    finally:
        await runtime.stop()
    # least recently used first; the one a container runs is kept
    assert removed == [tags[2], tags[0]]
    left = podman("images", "--format", "{{.Repository}}:{{.Tag}}").split()
    assert tags[1] in left and not {tags[0], tags[2]} & set(left)
    await images.collect_garbage("podman", root, max_bytes=0)
    assert not set(tags) & set(podman("images", "--format", "{{.Repository}}:{{.Tag}}").split())
