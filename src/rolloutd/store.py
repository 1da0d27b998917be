"""The blob store (fsspec): completion logs, session state, artifacts and trajectories.

Layout below the store's root (``session_id`` is ``{task_id}/{sample_index}``)::

    sessions/{session_id}/session.json                 gateway session state
    sessions/{session_id}/completions/{index:08d}.json one object per completion, append-only
    sessions/{session_id}/artifacts/{name}.json        artifacts collected after the run
    sessions/{session_id}/trajectory.json              the built trajectory
    sessions/{session_id}/result.json                  the session's result
    sessions/{session_id}/final_state/manifest.json    its final state, when the task asks
                                                       (and workdir.tar, system.tar beside it)

One object per completion makes the log append-only on every fsspec backend (S3 and GCS have
no append): writes are create-exclusive, so a completion index is never written twice.

Durability of a local store (``sync``): ``always`` fsyncs every object (and its folder) before
the write returns; ``group`` (the gateway's default) returns once the object is in the
operating system (written, then given its name: it survives a kill of the writing process)
and fsyncs it within ``group_commit_s`` in a background thread, batching the writes of that
window (a machine crash or power loss can lose the objects of the last window);
``os`` leaves flushing to the operating system. :meth:`BlobStore.flush` fsyncs everything
written so far at once. Object stores (S3, GCS) have no such choice: a put returns when stored.

Completion records (:func:`encode_completion`): a completion that continues an earlier one
stores only what is new (format 2): its messages, tools, request lists and prompt ids are the
earlier completion's followed by the ones stored. :meth:`CompletionLog.read_all` rebuilds full
completions; records without ``format`` (format 1, every field in full) read as before.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import fsspec
import structlog
from pydantic import BaseModel

from rolloutd.errors import NotFoundError, RolloutdError
from rolloutd.types import Completion, TaskResult

M = TypeVar("M", bound=BaseModel)

log = structlog.get_logger(__name__)

SyncPolicy = Literal["always", "group", "os"]

#: a group-commit thread with nothing to sync for this long ends (a new write starts another)
_IDLE_EXIT_S = 30.0


def _fsync_path(path: str) -> None:
    """fsync a file or a folder by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GroupCommit:
    """fsyncs written paths in a background thread, one batch per ``delay_s`` window.

    Args:
        delay_s: how long a write may wait for its fsync (the window that groups writes).
    """

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._cond = threading.Condition()
        self._pending: list[str] = []
        self._num_added = 0
        self._num_synced = 0
        self._urgent = False
        self._thread: threading.Thread | None = None

    def add(self, *paths: str) -> None:
        """Queue ``paths`` (files, then their folder) for the next batch."""
        with self._cond:
            idle = not self._pending
            self._pending.extend(paths)
            self._num_added += len(paths)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="rolloutd-group-commit", daemon=True
                )
                self._thread.start()
            elif idle:
                # only the window's first write wakes the thread; the later ones wait with it
                self._cond.notify_all()

    def flush(self, timeout_s: float = 60.0) -> bool:
        """fsync everything queued so far now; True when done within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            target = self._num_added
            self._urgent = True
            self._cond.notify_all()
            while self._num_synced < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    if not self._cond.wait(_IDLE_EXIT_S) and not self._pending:
                        self._thread = None  # idle: add() starts a new one
                        return
                deadline = time.monotonic() + self.delay_s
                while not self._urgent and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)  # gather the window's writes; flush() cuts it short
                batch, self._pending, self._urgent = self._pending, [], False
            for path in dict.fromkeys(batch):
                try:
                    _fsync_path(path)
                except OSError as e:
                    log.error("group_commit_failed", error=repr(e))
            with self._cond:
                self._num_synced += len(batch)
                self._cond.notify_all()


class BlobExistsError(RolloutdError):
    """A create-exclusive write found the key already written."""


class BlobStore:
    """A key/value store of JSON documents over an fsspec URL.

    Args:
        url: a local folder path or an fsspec URL (``file://``, ``s3://bucket/prefix``, ...).
        sync: durability of a local write (module docstring): ``always`` (default: fsync
            before returning), ``group`` (in the OS before returning, fsynced within
            ``group_commit_s``), ``os`` (in the OS before returning).
        group_commit_s: the ``group`` window, seconds.
    """

    def __init__(
        self, url: str, *, sync: SyncPolicy = "always", group_commit_s: float = 0.05
    ) -> None:
        self.url = url
        self.sync = sync
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self._local = "file" in (
            self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        )
        self._group = GroupCommit(group_commit_s) if sync == "group" else None
        self._folders: set[str] = set()
        # temporary names unique per process and write (uuid4 reads the OS's random source)
        self._tmp_prefix = f"{uuid.uuid4().hex[:8]}-"
        self._tmp_counter = itertools.count()
        #: create-exclusive writes go through unnamed files (until the file system refuses)
        self._unnamed_writes = hasattr(os, "O_TMPFILE") and os.link in os.supports_dir_fd
        self._proc_fds: int | None = None
        self._proc_pid = 0
        if self._local:
            # the store holds every prompt and completion: a root it makes is its owner's
            # alone (mode 0700), whatever the umask; one that exists keeps its mode
            os.makedirs(self.root, mode=0o700, exist_ok=True)

    @property
    def fast_writes(self) -> bool:
        """A write returns in microseconds: a local store that does not fsync before
        returning (callers may write on the event loop instead of a thread)."""
        return self._local and self.sync != "always"

    def flush(self, timeout_s: float = 60.0) -> bool:
        """fsync every local write made so far (``group`` policy; a no-op otherwise).

        Returns:
            True when done within ``timeout_s``.
        """
        return self._group.flush(timeout_s) if self._group is not None else True

    def _path(self, key: str) -> str:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"invalid blob key {key!r}")
        return f"{self.root.rstrip('/')}/{key}"

    # -- bytes -------------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes, *, exclusive: bool = False) -> None:
        """Write ``data`` at ``key`` atomically.

        Raises:
            BlobExistsError: ``exclusive`` and the key exists already.
        """
        path = self._path(key)
        if self._local:
            folder = os.path.dirname(path)
            if folder not in self._folders:
                os.makedirs(folder, exist_ok=True)
                self._folders.add(folder)
            if exclusive and self._unnamed_writes and self._put_unnamed(key, path, folder, data):
                return
            tmp = f"{path}.{os.getpid()}-{self._tmp_prefix}{next(self._tmp_counter)}.tmp"
            # os-level calls: a buffered file object costs a third of a completion's write
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            try:
                self._write_whole(fd, data)
            finally:
                os.close(fd)
            if exclusive:
                try:
                    os.link(tmp, path)  # atomic create-if-absent
                except FileExistsError as e:
                    raise BlobExistsError(f"blob {key!r} exists") from e
                finally:
                    os.unlink(tmp)
            else:
                os.replace(tmp, path)
            self._named(path, folder)
            return
        if exclusive and self.fs.exists(path):
            raise BlobExistsError(f"blob {key!r} exists")
        self.fs.pipe_file(path, data)

    def _put_unnamed(self, key: str, path: str, folder: str, data: bytes) -> bool:
        """A create-exclusive local write as an unnamed file (``O_TMPFILE``) given its name
        once written (``linkat``): two names fewer to create and remove than a named
        temporary file (docs/measurements.md). False when the file system
        or kernel has no unnamed files, or ``/proc`` cannot name them: the caller writes a
        named temporary file, as every later write does.

        Raises:
            BlobExistsError: the key exists already.
        """
        if self._proc_fds is None or self._proc_pid != os.getpid():
            try:  # "self" is resolved when opened: a forked child opens its own
                self._proc_fds = os.open(
                    "/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
                )
            except OSError:
                self._unnamed_writes = False  # no /proc here
                return False
            self._proc_pid = os.getpid()
        try:
            fd = os.open(folder, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o666)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            self._unnamed_writes = False
            return False
        try:
            self._write_whole(fd, data)
            try:  # atomic create-if-absent of the written file's name
                os.link(str(fd), path, src_dir_fd=self._proc_fds, follow_symlinks=True)
            except FileExistsError as e:
                raise BlobExistsError(f"blob {key!r} exists") from e
            except OSError:
                self._unnamed_writes = False  # /proc that cannot link descriptors
                return False
        finally:
            os.close(fd)
        self._named(path, folder)
        return True

    def _write_whole(self, fd: int, data: bytes) -> None:
        """Write all of ``data`` to ``fd`` (fsynced under ``always``)."""
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if self.sync == "always":
            os.fsync(fd)

    def _named(self, path: str, folder: str) -> None:
        """A written file has its name: the name is made durable now (``always``: the folder
        fsynced) or within the window (``group``)."""
        if self.sync == "always":
            _fsync_path(folder)
        elif self._group is not None:
            self._group.add(path, folder)

    def get_bytes(self, key: str) -> bytes:
        """Read the bytes at ``key``.

        Raises:
            NotFoundError: the key does not exist.
        """
        try:
            return self.fs.cat_file(self._path(key))
        except FileNotFoundError as e:
            raise NotFoundError(f"blob {key!r} not found") from e

    def put_file(self, key: str, source: str | os.PathLike[str]) -> int:
        """Copy the local file ``source`` to ``key``, streamed in chunks (never whole in
        memory): a local store writes a temporary file and renames it (with the store's
        durability), an object store uploads it (fsspec ``put_file``: multipart on S3).

        Returns:
            The bytes copied.
        """
        path = self._path(key)
        size = os.path.getsize(source)
        if not self._local:
            self.fs.put_file(os.fspath(source), path)
            return size
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.{os.getpid()}-{self._tmp_prefix}{next(self._tmp_counter)}.tmp"
        try:
            with open(source, "rb") as src, open(tmp, "xb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
                if self.sync == "always":
                    dst.flush()
                    os.fsync(dst.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._named(path, folder)
        return size

    def get_file(self, key: str, target: str | os.PathLike[str]) -> int:
        """Copy ``key`` to the local file ``target``, streamed (fsspec ``get_file``).

        Returns:
            The bytes copied.

        Raises:
            NotFoundError: the key does not exist.
        """
        try:
            self.fs.get_file(self._path(key), os.fspath(target))
        except FileNotFoundError as e:
            raise NotFoundError(f"blob {key!r} not found") from e
        return os.path.getsize(target)

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists."""
        return bool(self.fs.exists(self._path(key)))

    def list(self, prefix: str) -> list[str]:
        """Keys directly below the folder ``prefix``, sorted; empty when it does not exist."""
        path = self._path(prefix.rstrip("/"))
        try:
            names = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        root = self.root.rstrip("/") + "/"
        return sorted(n.removeprefix(root) for n in names if not n.endswith(".tmp"))

    # -- JSON and models -----------------------------------------------------------------
    def put_json(self, key: str, obj: Any, *, exclusive: bool = False) -> None:
        """Write ``obj`` (JSON-serialisable or a pydantic model) at ``key``."""
        if isinstance(obj, BaseModel):
            data = obj.model_dump_json().encode()
        else:
            data = json.dumps(obj, separators=(",", ":")).encode()
        self.put_bytes(key, data, exclusive=exclusive)

    def get_json(self, key: str) -> Any:
        """Read and parse the JSON document at ``key``."""
        return json.loads(self.get_bytes(key))

    def get_model(self, key: str, model: type[M]) -> M:
        """Read the document at ``key`` as ``model``."""
        return model.model_validate_json(self.get_bytes(key))


def whole_group(store: BlobStore | None, result: TaskResult) -> TaskResult:
    """A task's result with every session: ``result`` itself when it is inline, else the
    whole group read from the blob store at ``result.stored_key`` (a task workflow returns a
    group over ``TaskRequest.inline_result_bytes`` by reference, under Temporal's 2 MB
    payload limit).

    Raises:
        RolloutdError: the group is stored and ``store`` is None (connect with a
            ``store_url``).
        NotFoundError: the stored group is gone (retention removed it).
    """
    if not result.stored_key:
        return result
    if store is None:
        raise RolloutdError(
            f"task {result.task_id}'s group ({result.num_sessions} sessions) is stored at "
            f"{result.stored_key!r}: reading it needs the blob store (connect with store_url)"
        )
    return store.get_model(result.stored_key, TaskResult)


def session_prefix(session_id: str) -> str:
    """Blob-store folder of a session."""
    return f"sessions/{session_id}"


def trajectory_key(session_id: str) -> str:
    """Blob-store key of a session's trajectory."""
    return f"{session_prefix(session_id)}/trajectory.json"


def artifact_key(session_id: str, name: str) -> str:
    """Blob-store key of one artifact of a session."""
    return f"{session_prefix(session_id)}/artifacts/{name}.json"


def final_state_key(session_id: str, part: str = "manifest.json") -> str:
    """Blob-store key of a part of a session's stored final state (``manifest.json``,
    ``workdir.tar``, ``system.tar``; :mod:`rolloutd.final_state`)."""
    return f"{session_prefix(session_id)}/final_state/{part}"


class CompletionLog:
    """The ordered, append-only completions of one session.

    Args:
        store: the blob store.
        session_id: the session.
    """

    def __init__(self, store: BlobStore, session_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.prefix = f"{session_prefix(session_id)}/completions"

    def key(self, index: int) -> str:
        """Key of completion ``index``."""
        return f"{self.prefix}/{index:08d}.json"

    def append(self, completion: Completion, base: Completion | None = None) -> None:
        """Write ``completion`` at its index before anyone sees its response, with the
        store's durability (:class:`BlobStore` ``sync``).

        Args:
            completion: the completion, in full.
            base: an earlier completion of this log (the one it continues, else the one
                before it): only what ``completion`` adds to it is stored
                (:func:`encode_completion`).

        Raises:
            BlobExistsError: that index is written already (the log is append-only).
        """
        self.store.put_bytes(
            self.key(completion.index), encode_completion(completion, base), exclusive=True
        )

    def indices(self) -> list[int]:
        """Indices written so far, sorted."""
        out = []
        for key in self.store.list(self.prefix):
            name = key.rsplit("/", 1)[-1]
            if name.endswith(".json"):
                out.append(int(name[:-5]))
        return sorted(out)

    def read_all(self) -> list[Completion]:
        """Every completion in index order, each in full (format 2 records rebuilt).

        Raises:
            ValueError: a record of an unknown format, or one whose base is missing.
        """
        by_index: dict[int, Completion] = {}

        def earlier(index: int) -> Completion:
            if index not in by_index:
                raise ValueError(
                    f"completion log of {self.session_id}: a record refers to "
                    f"completion {index}, which is not in the log"
                )
            return by_index[index]

        for i in self.indices():
            by_index[i] = decode_completion(self.store.get_bytes(self.key(i)), earlier)
        return list(by_index.values())

    def __len__(self) -> int:
        return len(self.indices())


# --------------------------------------------------------------------------- completion records

#: the completion record format written by :func:`encode_completion` when it stores a delta;
#: a record without ``format`` is format 1 (every field in full).
COMPLETION_FORMAT = 2

#: fields stored as a delta: ``field = source(base)[:n] + stored``.
_DELTA_FIELDS = ("messages", "tools", "prompt_ids")


def _delta_source(base: Completion, name: str) -> list[Any]:
    """What field ``name`` of a record continues in its base: ``prompt_ids`` continues the
    base's prompt and sampled tokens (the token chain), every other field the same field."""
    if name == "prompt_ids":
        return [*base.prompt_ids, *base.response_ids]
    if name.startswith("request."):
        value = base.request.get(name[len("request.") :])
        return value if isinstance(value, list) else []
    return getattr(base, name)


def _shared_prefix(value: list[Any], source: list[Any]) -> int:
    """``len(source)`` when ``value`` starts with the whole of a non-empty ``source``, else 0
    (a delta continues all of its base's field or none of it)."""
    n = len(source)
    return n if 0 < n <= len(value) and value[:n] == source else 0


def _prompt_prefix(prompt_ids: list[int], base: Completion) -> int:
    """How many ids ``prompt_ids`` shares with ``base``'s token chain: its prompt and sampled
    tokens, else its prompt alone, else 0. The chain is not built: prompts of thousands of
    tokens are compared on every call."""
    num_prompt = len(base.prompt_ids)
    if not num_prompt or prompt_ids[:num_prompt] != base.prompt_ids:
        return 0
    num_response = len(base.response_ids)
    if num_response and prompt_ids[num_prompt : num_prompt + num_response] == base.response_ids:
        return num_prompt + num_response
    return num_prompt


def encode_completion(completion: Completion, base: Completion | None = None) -> bytes:
    """The JSON record of ``completion``: in full (format 1), or as what it adds to ``base``.

    Format 2 adds ``format: 2``, ``delta_base`` (the base's index) and ``delta``, a map from a
    field (``messages``, ``tools``, ``prompt_ids``, ``request.<key>`` for a list in the raw
    request) to ``n``: the field is ``source[:n]`` followed by the stored value, where the
    source of ``prompt_ids`` is ``base.prompt_ids + base.response_ids`` and of any other field
    the base's same field. A harness resends its whole conversation on every call, so format 2
    makes a record's size, and the cost of writing it, independent of the conversation's
    length.

    Args:
        completion: the completion, in full.
        base: an earlier completion of the same log, or None.

    Returns:
        UTF-8 JSON bytes; :func:`decode_completion` reads them back to ``completion``.
    """
    if base is None or base.index >= completion.index:
        return completion.model_dump_json().encode()
    delta: dict[str, int] = {}
    update: dict[str, Any] = {}
    for name in _DELTA_FIELDS:
        value = getattr(completion, name)
        n = (
            _prompt_prefix(value, base)
            if name == "prompt_ids"
            else _shared_prefix(value, getattr(base, name))
        )
        if n:
            delta[name] = n
            update[name] = value[n:]
    request = completion.request
    for key, value in request.items():
        if isinstance(value, list):
            n = _shared_prefix(value, _delta_source(base, f"request.{key}"))
            if n:
                delta[f"request.{key}"] = n
                request = {**request, key: value[n:]}
    if not delta:
        return completion.model_dump_json().encode()
    if request is not completion.request:
        update["request"] = request
    body = completion.model_copy(update=update).model_dump_json().encode()
    header = json.dumps(
        {"format": COMPLETION_FORMAT, "delta_base": base.index, "delta": delta},
        separators=(",", ":"),
    ).encode()
    return header[:-1] + b"," + body[1:]


def decode_completion(data: bytes, earlier: Callable[[int], Completion]) -> Completion:
    """The completion of a record written by :func:`encode_completion` (any format).

    Args:
        data: the record's JSON bytes.
        earlier: the full completion of an earlier index of the same log (a format 2
            record's base).

    Raises:
        ValueError: an unknown format, or a delta longer than its base.
    """
    if b'"format"' not in data[:16]:
        return Completion.model_validate_json(data)
    obj = json.loads(data)
    version = obj.pop("format")
    if version != COMPLETION_FORMAT:
        raise ValueError(
            f"completion record format {version} is not known to this reader "
            f"(it reads 1 and {COMPLETION_FORMAT})"
        )
    base = earlier(obj.pop("delta_base"))
    for name, n in obj.pop("delta").items():
        source = _delta_source(base, name)
        if n > len(source):
            raise ValueError(
                f"completion record {obj.get('index')}: delta of {name} is "
                f"{n} items, its base has {len(source)}"
            )
        if name.startswith("request."):
            key = name[len("request.") :]
            obj["request"][key] = source[:n] + obj["request"].get(key, [])
        else:
            obj[name] = source[:n] + obj.get(name, [])
    return Completion.model_validate(obj)
