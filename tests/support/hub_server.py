"""A local server in the Hugging Face Hub's layout, for the download path of the model catalog.

It answers what ``huggingface_hub.hf_hub_download`` (2.4) requests, read from its source
(``file_download.py``: ``get_hf_file_metadata``, ``_get_metadata_or_catch_error``,
``http_get``; ``utils/_http.py``: ``_httpx2_follow_hub_redirects_with_backoff``):

- ``HEAD {endpoint}/{repo_id}/resolve/{revision}/{filename}``: for a large (LFS) file the Hub
  answers ``302`` to its storage host with the file's metadata on that response:
  ``X-Repo-Commit`` (the commit the revision resolves to), ``X-Linked-Etag`` (the file's
  sha256, quoted) and ``X-Linked-Size``; the client follows no redirect off the Hub's origin, so
  here the storage URL names ``localhost`` while the endpoint is ``127.0.0.1`` (another origin,
  as ``cas-bridge.xethub.hf.co`` is for huggingface.co). An unknown revision is ``404`` with
  ``X-Error-Code: RevisionNotFound``, an unknown file ``404`` with ``EntryNotFound``, an unknown
  repository ``401`` with ``RepoNotFound`` (the Hub's answer to a repository a caller may not
  see);
- ``GET {storage}/blobs/{sha256}``: the bytes (``Range`` honoured, as a resumed download asks).

- ``GET {endpoint}/api/agent-harnesses``: the registry ``huggingface_hub`` reads, best effort,
  to name an AI agent in its user agent (``utils/_detect_agent.py``); answered ``404``, which it
  ignores (nothing of it is cached then).

No other ``api/`` route is asked for one file (``snapshot_download`` and ``model_info`` ask
theirs). Every request is recorded (method, path) for the tests.
A file may be set up to lie: another commit than the one asked for, a listed sha256 other than
its bytes'.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class HubEntry:
    """One file of one repository at one commit.

    Attributes:
        repo_id: ``org/name``.
        filename: its path in the repository.
        commit: the commit hash ``main`` and the commit itself resolve to.
        data: its bytes.
        answer_commit: the ``X-Repo-Commit`` sent (default ``commit``): a lying mirror's.
        listed_sha256: the ``X-Linked-Etag`` sent (default the bytes' sha256).
    """

    repo_id: str
    filename: str
    commit: str
    data: bytes
    answer_commit: str | None = None
    listed_sha256: str | None = None

    @property
    def sha256(self) -> str:
        """The bytes' sha256."""
        return hashlib.sha256(self.data).hexdigest()


@dataclass
class HubServer:
    """The running server: its endpoint (``HF_ENDPOINT``), its files, what it was asked."""

    endpoint: str
    entries: list[HubEntry]
    requests: list[tuple[str, str]] = field(default_factory=list)


def _handler(server: HubServer, storage: str) -> type[BaseHTTPRequestHandler]:
    blobs = {e.sha256: e.data for e in server.entries}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet
            return

        def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _resolve(self) -> None:
            parts = self.path.split("?")[0].lstrip("/").split("/")
            if parts[0] == "api" or len(parts) < 5 or parts[2] != "resolve":
                self._send(404, {"X-Error-Code": "EntryNotFound"})
                return
            repo_id, revision, filename = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            repo = [e for e in server.entries if e.repo_id == repo_id]
            if not repo:
                self._send(401, {"X-Error-Code": "RepoNotFound"}, b"Repository not found")
                return
            commits = {e.commit for e in repo}
            if revision != "main" and revision not in commits:
                self._send(404, {"X-Error-Code": "RevisionNotFound"}, b"Invalid rev id")
                return
            entry = next((e for e in repo if e.filename == filename), None)
            if entry is None:
                commit = next(iter(commits))
                self._send(404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit})
                return
            self._send(
                302,
                {
                    "Location": f"{storage}/blobs/{entry.sha256}",
                    "X-Repo-Commit": entry.answer_commit or entry.commit,
                    "X-Linked-Etag": f'"{entry.listed_sha256 or entry.sha256}"',
                    "X-Linked-Size": str(len(entry.data)),
                    "ETag": f'"{hashlib.sha1(entry.data).hexdigest()}"',
                },
            )

        def _blob(self) -> None:
            data = blobs.get(self.path.rsplit("/", 1)[-1])
            if data is None:
                self._send(404, {})
                return
            start = 0
            if (asked := self.headers.get("Range", "")).startswith("bytes="):
                start = int(asked.removeprefix("bytes=").split("-")[0] or 0)
            headers = {"Content-Type": "application/octet-stream"}
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._send(206 if start else 200, headers, data[start:])

        def _serve(self) -> None:
            server.requests.append((self.command, self.path))
            if self.path.startswith("/blobs/"):
                self._blob()
            else:
                self._resolve()

        do_HEAD = _serve
        do_GET = _serve

    return Handler


@contextmanager
def hub_server(entries: list[HubEntry]) -> Iterator[HubServer]:
    """Serve ``entries`` on a free port of 127.0.0.1 (the endpoint; storage on ``localhost``)
    until the block ends."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = httpd.server_address[1]
    server = HubServer(endpoint=f"http://127.0.0.1:{port}", entries=entries)
    httpd.RequestHandlerClass = _handler(server, f"http://localhost:{port}")
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
