"""The blob store (fsspec): completion logs, session state, artifacts and trajectories.

Layout below the store's root (``session_id`` is ``{task_id}/{sample_index}``)::

    sessions/{session_id}/session.json                 gateway session state
    sessions/{session_id}/completions/{index:08d}.json one object per completion, append-only
    sessions/{session_id}/artifacts/{name}.json        artifacts collected after the run
    sessions/{session_id}/trajectory.json              the built trajectory
    sessions/{session_id}/result.json                  the session's result

One object per completion makes the log append-only on every fsspec backend (S3 and GCS have
no append): writes are create-exclusive, so a completion index is never written twice.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, TypeVar

import fsspec
from pydantic import BaseModel

from rolloutd.errors import NotFoundError, RolloutdError
from rolloutd.types import Completion

M = TypeVar("M", bound=BaseModel)


class BlobExistsError(RolloutdError):
    """A create-exclusive write found the key already written."""


class BlobStore:
    """A key/value store of JSON documents over an fsspec URL.

    Args:
        url: a local folder path or an fsspec URL (``file://``, ``s3://bucket/prefix``, ...).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url)
        self._local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple)
                                 else (self.fs.protocol,))
        if self._local:
            self.fs.makedirs(self.root, exist_ok=True)

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
            os.makedirs(folder, exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if exclusive:
                try:
                    os.link(tmp, path)  # atomic create-if-absent
                except FileExistsError as e:
                    raise BlobExistsError(f"blob {key!r} exists") from e
                finally:
                    os.unlink(tmp)
            else:
                os.replace(tmp, path)
            return
        if exclusive and self.fs.exists(path):
            raise BlobExistsError(f"blob {key!r} exists")
        self.fs.pipe_file(path, data)

    def get_bytes(self, key: str) -> bytes:
        """Read the bytes at ``key``.

        Raises:
            NotFoundError: the key does not exist.
        """
        try:
            return self.fs.cat_file(self._path(key))
        except FileNotFoundError as e:
            raise NotFoundError(f"blob {key!r} not found") from e

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
        return sorted(n[len(root):] if n.startswith(root) else n for n in names
                      if not n.endswith(".tmp"))

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


def session_prefix(session_id: str) -> str:
    """Blob-store folder of a session."""
    return f"sessions/{session_id}"


def trajectory_key(session_id: str) -> str:
    """Blob-store key of a session's trajectory."""
    return f"{session_prefix(session_id)}/trajectory.json"


def artifact_key(session_id: str, name: str) -> str:
    """Blob-store key of one artifact of a session."""
    return f"{session_prefix(session_id)}/artifacts/{name}.json"


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

    def append(self, completion: Completion) -> None:
        """Durably write ``completion`` at its index before anyone sees its response.

        Raises:
            BlobExistsError: that index is written already (the log is append-only).
        """
        self.store.put_json(self.key(completion.index), completion, exclusive=True)

    def indices(self) -> list[int]:
        """Indices written so far, sorted."""
        out = []
        for key in self.store.list(self.prefix):
            name = key.rsplit("/", 1)[-1]
            if name.endswith(".json"):
                out.append(int(name[:-5]))
        return sorted(out)

    def read_all(self) -> list[Completion]:
        """Every completion in index order."""
        return [self.store.get_model(self.key(i), Completion) for i in self.indices()]

    def __len__(self) -> int:
        return len(self.indices())
