"""Headless Debian Chromium driven over the DevTools protocol (aiohttp's WebSocket client).

A single-page app (the Temporal UI) renders after its scripts fetch data, so ``chromium
--dump-dom`` returns the empty shell; this waits for text to appear instead. The browser
is a real Chromium; the caller owns it through :func:`open_page` and it is stopped by its pid.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp


class Page:
    """One Chromium tab: navigate, read its text, click, screenshot."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (events are skipped)."""
        call_id = next(self._ids)
        await self.ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads((await self.ws.receive(timeout=60)).data)
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        return result.get("result", {}).get("value")

    async def text(self) -> str:
        """The page's visible text (``document.body.innerText``)."""
        return await self.evaluate("document.body ? document.body.innerText : ''") or ""

    async def wait_for_text(
        self, *needles: str, timeout_s: float = 60.0, max_reloads: int = 3
    ) -> str:
        """Poll the page's text until it holds every needle; returns the text.

        A page that shows the Temporal UI's error screen ("Uh oh. There's an error.", after a
        500 from one of its API calls; seen once on a loaded machine) is reloaded, at most
        ``max_reloads`` times, as a person would.

        Raises:
            AssertionError: the deadline passed; the message holds the page's last text.
        """
        deadline = time.monotonic() + timeout_s
        text = ""
        reloads = 0
        while time.monotonic() < deadline:
            text = await self.text()
            if all(n in text for n in needles):
                return text
            if "Uh oh. There's an error." in text and reloads < max_reloads:
                reloads += 1
                await self.call("Page.reload", ignoreCache=True)
            await asyncio.sleep(0.5)
        raise AssertionError(f"page never showed {needles}; its text:\n{text[:3000]}")

    async def screenshot(self, path: Path) -> None:
        """Save a PNG of the whole page."""
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))


def history_page_url(ui_url: str, workflow_id: str, run_id: str) -> str:
    """The Temporal UI's event-history page of one run of a workflow (namespace ``default``)."""
    return (
        f"{ui_url}/namespaces/default/workflows/"
        f"{urllib.parse.quote(workflow_id, safe='')}/{run_id}/history"
    )


@contextlib.asynccontextmanager
async def open_page(
    url: str, *, width: int = 1400, height: int = 1100, start_timeout_s: float = 60.0
) -> AsyncIterator[Page]:
    """Start headless Chromium, open ``url`` and yield its :class:`Page`; stops the browser.

    Raises:
        RuntimeError: no ``chromium`` on PATH, or its DevTools endpoint never appeared.
    """
    binary = shutil.which("chromium") or shutil.which("chromium-headless-shell")
    if binary is None:
        raise RuntimeError("no chromium on PATH (scripts/setup.sh installs Debian's)")
    profile = tempfile.mkdtemp(prefix="rolloutd-chromium-")
    proc = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            f"--window-size={width},{height}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        port = await asyncio.wait_for(asyncio.to_thread(_devtools_port, proc), start_timeout_s)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            page_ws = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with http.ws_connect(page_ws, max_msg_size=0) as ws:
                page = Page(ws)
                await page.call(
                    "Emulation.setDeviceMetricsOverride",
                    width=width,
                    height=height,
                    deviceScaleFactor=1,
                    mobile=False,
                )
                await page.call("Page.navigate", url=url)
                yield page
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


def _devtools_port(proc: subprocess.Popen[str]) -> int:
    assert proc.stderr is not None
    for line in proc.stderr:
        if match := re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line):
            # keep draining stderr so Chromium never blocks on a full pipe
            threading_drain(proc)
            return int(match.group(1))
    raise RuntimeError(f"chromium exited ({proc.wait()}) before its DevTools endpoint")


def threading_drain(proc: subprocess.Popen[str]) -> None:
    """Read the rest of Chromium's stderr in a daemon thread."""
    import threading

    assert proc.stderr is not None
    stream = proc.stderr
    threading.Thread(target=lambda: [None for _ in stream], daemon=True).start()
