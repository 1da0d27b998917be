"""A catalog model's GGUF from the Hugging Face Hub, checked against its pins before and after.

The download is ``huggingface_hub``'s own (``hf_hub_download``: a ``HEAD`` of
``{endpoint}/{repo_id}/resolve/{revision}/{filename}`` for the file's commit, ETag and size,
following the Hub's redirect of a large file to its storage, then a ``GET``); the endpoint is
the library's, so ``HF_ENDPOINT`` (a mirror) and ``HF_TOKEN`` work as they do for every Hub
client, and ``HF_HUB_OFFLINE=1`` counts as a Hub that cannot be reached. What rolloutd adds is
the trust: a catalog entry pins the repository, the file, its sha256 and size, and the commit
where one is known, and the file is refused, with nothing kept, when

- the Hub serves another commit than the pinned one (a mirror that answers for another);
- the size or the sha256 the Hub lists for it (an LFS file's ETag is its sha256) differ from the
  pins: refused before a byte is downloaded;
- the downloaded bytes' sha256 differs from the pin (a mirror that lists one hash and serves
  other bytes).

:func:`download_gguf` tells a Hub that cannot be reached (no connection, a proxy or DNS error,
offline mode, a 5xx) from one that refuses (an unknown repository, revision or file, a gated
repository): the first is a reason to fall back to the offline copy, the second an error.
Tested only against a local server in the Hub's layout (tests/engine/test_hub_download.py):
this machine cannot reach the Hub.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import structlog

from rolloutd.errors import ConfigError

log = structlog.get_logger(__name__)

#: seconds the metadata request may take before the Hub counts as not reachable
HUB_TIMEOUT_S = 10.0
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class HubFile:
    """Where the field keeps a catalog model's GGUF on the Hugging Face Hub.

    Attributes:
        repo_id: the model repository (``Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF``).
        filename: the GGUF's path in it.
        revision: the commit hash the catalog pins (40 hex digits), where one is known; None:
            the repository's ``main``, and then only the sha256 pins the bytes.
    """

    repo_id: str
    filename: str
    revision: str | None = None

    def describe(self) -> str:
        """``repo_id/filename@revision``, for messages."""
        return f"{self.repo_id}/{self.filename}@{self.revision or 'main'}"


def endpoint() -> str:
    """The Hub endpoint ``huggingface_hub`` uses (``HF_ENDPOINT``, else huggingface.co)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def download_gguf(
    hub: HubFile,
    dest: Path,
    *,
    name: str,
    sha256: str,
    size_bytes: int,
    hub_endpoint: str | None = None,
) -> str | None:
    """Download a pinned GGUF to ``dest`` (atomically), checked as the module docstring says.

    Args:
        hub: where the file lies.
        dest: the file to write (its folder exists); a staging folder ``.hub`` beside it holds
            the download (``huggingface_hub``'s cache layout) and is removed when it ends.
        name: the catalog name, for messages.
        sha256: the pinned hex digest of the file.
        size_bytes: the pinned size.
        hub_endpoint: the Hub's URL; None: :func:`endpoint` (``HF_ENDPOINT``).

    Returns:
        None when ``dest`` holds the checked file; else why the Hub could not be reached
        (nothing was written).

    Raises:
        ConfigError: the Hub refused (no such repository, revision or file; a gated
            repository; an endpoint that does not answer as the Hub does), or the served
            commit, size or sha256 differ from the pins (nothing is kept).
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    from huggingface_hub.utils import httpx as hub_http  # the HTTP library the Hub client uses

    unreachable = (hub_http.TransportError, ConnectionError, LocalEntryNotFoundError)
    url = hub_endpoint or endpoint()
    where = f"{hub.describe()} at {url}"
    try:
        meta = get_hf_file_metadata(
            hf_hub_url(hub.repo_id, hub.filename, revision=hub.revision or "main", endpoint=url),
            timeout=HUB_TIMEOUT_S,
            endpoint=url,
        )
    except unreachable as e:  # ConnectionError: huggingface_hub's OfflineModeIsEnabled
        return f"{type(e).__name__}: {e}"
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else 0
        if status >= 500:
            return f"HTTP {status} from {where}"
        raise ConfigError(f"{name}: the Hub refused {where} (HTTP {status}): {e}") from None
    if meta.commit_hash is None:
        raise ConfigError(
            f"{name}: {url} does not answer as the Hub does (no X-Repo-Commit header for "
            f"{hub.describe()}); check HF_ENDPOINT"
        )
    if hub.revision is not None and meta.commit_hash != hub.revision:
        raise ConfigError(
            f"{name}: {where} is commit {meta.commit_hash}, the catalog pins {hub.revision}: "
            "refused"
        )
    if meta.size is not None and meta.size != size_bytes:
        raise ConfigError(
            f"{name}: {where} is {meta.size} bytes, the catalog pins {size_bytes}: refused"
        )
    listed = (meta.etag or "").lower()
    if _SHA256.fullmatch(listed) and listed != sha256:
        raise ConfigError(
            f"{name}: {where} has sha256 {listed} (as the Hub lists it), the catalog pins "
            f"{sha256}: refused, nothing downloaded"
        )
    staging = dest.parent / ".hub"
    try:
        try:
            path = Path(
                hf_hub_download(
                    hub.repo_id,
                    hub.filename,
                    revision=meta.commit_hash,  # the commit just checked, whatever main is now
                    cache_dir=staging,
                    endpoint=url,
                    etag_timeout=HUB_TIMEOUT_S,
                )
            ).resolve()
        except unreachable as e:
            return f"{type(e).__name__} while downloading: {e}"
        actual = file_sha256(path)
        if actual != sha256:
            raise ConfigError(
                f"{name}: {where} downloaded with sha256 {actual}, the catalog pins {sha256}: "
                "refused, nothing kept"
            )
        os.replace(path, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("model_downloaded", model=name, source=where, size_bytes=size_bytes)
    return None


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file, read in 8 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * 2**20):
            digest.update(chunk)
    return digest.hexdigest()
