"""Headless Debian Chromium driven over the Chrome DevTools Protocol (CDP), with aiohttp's
websocket client: open a page, evaluate JavaScript in it, take a screenshot.

No selenium or playwright, nothing downloaded: the browser is the system's ``chromium``
(``apt-get install chromium``; scripts/setup.sh installs it). Every browser started here is
stopped by its process id.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp


def chromium_binary() -> str | None:
    """The system's headless-capable Chromium, or None."""
    return shutil.which("chromium") or shutil.which("chromium-headless-shell")


class Chromium:
    """One headless Chromium with one page, driven over CDP.

    Use ``async with Chromium() as browser: await browser.open(url)``.
    """

    def __init__(self, width: int = 1280, height: int = 900) -> None:
        binary = chromium_binary()
        if binary is None:
            raise RuntimeError("chromium is not installed (apt-get install -y chromium)")
        self._binary, self._size = binary, (width, height)
        self._ids = itertools.count(1)
        self._proc: subprocess.Popen[bytes] | None = None

    async def __aenter__(self) -> Chromium:
        self._profile = tempfile.TemporaryDirectory(prefix="rolloutd-chromium-")
        profile = Path(self._profile.name)
        self._proc = subprocess.Popen(
            [
                self._binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={self._size[0]},{self._size[1]}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its helpers (zygote, crashpad) are ended with it
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                await self.__aexit__(None, None, None)
                raise RuntimeError("chromium did not open its DevTools port")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as r:
            pages = [t for t in await r.json() if t["type"] == "page"]
        self._ws = await self._http.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if getattr(self, "_http", None) is not None:
            await self._http.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None:
            # helpers that outlive the browser still write to the profile while it is removed
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        for attempt in range(50):
            try:
                shutil.rmtree(self._profile.name)
                break
            except FileNotFoundError:
                break
            except OSError:
                if attempt == 49:
                    raise
                await asyncio.sleep(0.1)
        self._profile.cleanup()

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One CDP command; its result (events that arrive meanwhile are dropped)."""
        call_id = next(self._ids)
        await self._ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            msg = await self._ws.receive_json(timeout=120)
            if msg.get("id") == call_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def open(self, url: str) -> float:
        """Navigate and wait for the load event.

        Returns:
            Seconds from the navigation's start to the end of its load event, as the page's
            Navigation Timing reports it.
        """
        await self.send("Page.navigate", url=url)
        await self.wait_for("document.readyState === 'complete'")
        timing = await self.evaluate(
            "(() => { const n = performance.getEntriesByType('navigation')[0];"
            " return n.loadEventEnd - n.startTime; })()"
        )
        return float(timing) / 1000

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable)."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout_s: float = 60) -> None:
        """Poll a JavaScript condition until it holds."""
        deadline = time.monotonic() + timeout_s
        while not await self.evaluate(expression):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never satisfied {expression!r}")
            await asyncio.sleep(0.05)

    async def screenshot(
        self, path: Path, *, selector: str | None = None, max_height: int = 1200
    ) -> None:
        """Save a PNG of the viewport, or of the element ``selector`` matches (cut at
        ``max_height`` px)."""
        params: dict[str, Any] = {"format": "png"}
        if selector is not None:
            box = await self.evaluate(
                f"(() => {{ const r = document.querySelector({selector!r})"
                ".getBoundingClientRect(); return [r.left + window.scrollX, r.top + "
                "window.scrollY, r.width, r.height]; })()"
            )
            params["clip"] = {
                "x": max(0, box[0] - 8),
                "y": max(0, box[1] - 8),
                "width": box[2] + 16,
                "height": min(max_height, box[3] + 16),
                "scale": 1,
            }
            params["captureBeyondViewport"] = True
        shot = await self.send("Page.captureScreenshot", **params)
        path.write_bytes(base64.b64decode(shot["data"]))
