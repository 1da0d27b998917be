"""Benchmark of the trace viewer's session page on a long trace.

Bar: a 32K-token trace stays usable: the page is rendered by the server in well
under a second, weighs a few MB at most, and headless Chromium loads and lays it out in a few
seconds; hovering a token answers at once (one delegated handler, no per-token JS objects).

The trace: real text from this repository tokenized by the catalog model's tokenizer
(Qwen2.5-Coder-0.5B), cut to ``--tokens`` tokens: a 2K-token prompt, then turns of 200
sampled tokens (``loss_mask`` 1, logprobs spread over the shade buckets) and 300 tokens of
tool result (``loss_mask`` 0), a drift position every 5,000 tokens.

Run: ``python benchmarks/viewer_page.py`` (needs Debian ``chromium``); prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rolloutd.engine.models import load_tokenizer  # noqa: E402
from rolloutd.types import (  # noqa: E402
    Completion,
    SessionResult,
    SessionStatus,
    Trace,
    Trajectory,
)
from rolloutd.viewer import TokenText, session_page  # noqa: E402
from tests.support.browser import Chromium  # noqa: E402


def long_trajectory(tokenizer, num_tokens: int, prompt_tokens: int = 2048) -> Trajectory:
    """A one-trace trajectory of ``num_tokens`` real tokens (see the module docstring)."""
    text = "\n".join(p.read_text() for p in sorted((ROOT / "src").rglob("*.py")))
    ids = tokenizer.encode(text, add_special_tokens=False)
    while len(ids) < num_tokens:
        ids = ids + ids
    ids = ids[:num_tokens]
    prompt, response = ids[:prompt_tokens], ids[prompt_tokens:]
    rng = random.Random(0)
    loss_mask, logprobs, offsets, indices = [], [], [], []
    position = 0
    while position < len(response):
        offsets.append(position)
        indices.append(len(indices))
        sampled = min(200, len(response) - position)
        loss_mask += [1] * sampled
        logprobs += [-rng.expovariate(1.5) for _ in range(sampled)]
        position += sampled
        tool = min(300, len(response) - position)
        loss_mask += [0] * tool
        logprobs += [0.0] * tool
        position += tool
    drift = [p for p in range(0, len(response), 5000) if loss_mask[p]]
    trace = Trace(
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=loss_mask,
        response_logprobs=logprobs,
        response_offsets=offsets,
        completion_indices=indices,
        drift_positions=drift,
        reward=1.0,
        prompt_messages=[{"role": "user", "content": "benchmark"}],
    )
    return Trajectory(session_id="bench/0", task_id="bench", traces=[trace], reward=1.0)


async def measure(num_tokens: int, out: Path) -> dict[str, float]:
    tokenizer = load_tokenizer("qwen2.5-coder-0.5b")
    tokens = TokenText(tokenizer)
    trajectory = long_trajectory(tokenizer, num_tokens)
    session = SessionResult(
        session_id="bench/0",
        task_id="bench",
        status=SessionStatus.COMPLETED,
        reward=1.0,
        num_completions=len(trajectory.traces[0].response_offsets),
        num_traces=1,
    )
    completions = [
        Completion(session_id="bench/0", index=i) for i in range(session.num_completions)
    ]
    t0 = time.perf_counter()
    page = session_page(session, completions, trajectory, tokens)
    render_s = time.perf_counter() - t0
    out.write_text(page)
    async with Chromium() as browser:
        load_s = await browser.open(out.as_uri())
        t1 = time.perf_counter()
        await browser.evaluate(
            "(() => { const s = document.querySelector('[data-part=response] span:nth-of-type("
            "20000)'); s.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));"
            " return document.getElementById('hover').textContent; })()"
        )
        hover_s = time.perf_counter() - t1
        spans = await browser.evaluate("document.querySelectorAll('.toks span').length")
    return {
        "tokens": num_tokens,
        "spans": spans,
        "page_bytes": len(page.encode()),
        "server_render_s": round(render_s, 3),
        "chromium_load_s": round(load_s, 3),
        "first_hover_s": round(hover_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(asyncio.run(measure(args.tokens, Path(tmp) / "session.html"))))


if __name__ == "__main__":
    main()
