"""Gateway cost per model call in instructions (valgrind's callgrind): a figure that does not
move with the machine's load, unlike latency and CPU time on a shared 2-core machine.

The gateway runs under ``valgrind --tool=callgrind --instr-atstart=no`` against the instant
fake backend of ``gateway_overhead.py``; instrumentation is switched on (``callgrind_control
-i on``) only around the measured calls, after warm-up calls, and each window is dumped on its
own. Counted: every instruction the gateway process runs in user space for those calls (all
its threads: event loop, group commit); not counted: the kernel's work (socket and file system
calls). Windows (each the mean over its calls):

- passthrough and tokens mode: fresh single-turn conversations (as ``gateway_overhead.py``'s
  rows at concurrency 1);
- tokens mode, one conversation growing to ``--turns`` turns: its first and last 20 calls
  past turn 10, against fresh single-turn calls in another session (the growth slope).

Each window also shows the instructions spent in glibc's memcpy, memmove and memset: valgrind
counts their ``rep movsb``/``rep stosb`` once per byte (copying 200 MB more adds 200 M
instructions), so a larger request body inflates the count far beyond what the copies cost;
and those of garbage collections, which fall in a window of 20 calls or not.

    python benchmarks/gateway_instructions.py [--calls 100] [--turns 200]

Needs valgrind (Debian package ``valgrind``). Takes about 3 minutes here: the gateway runs
about 50 times slower under callgrind. Output: a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
import gateway_overhead as overhead

WARMUP = 20


def _total(dump: str) -> int:
    """Instructions counted in one callgrind dump file (its ``totals:``/``summary:`` line)."""
    totals = [
        int(line.split()[1])
        for line in Path(dump).read_text().splitlines()
        if line.startswith(("summary:", "totals:"))
    ]
    if not totals:
        raise RuntimeError(f"{dump}: no totals line")
    return max(totals)


_COPY = re.compile(r"__mem(cpy|move|set)_\w*(erms|unaligned)")


def _copies(dump: str) -> int:
    """Instructions of one dump spent in glibc's memcpy, memmove and memset: valgrind counts
    their ``rep movsb``/``rep stosb`` once per byte (measured here: copying 200 MB more added
    200 M instructions), a cost the hardware pays 16 to 32 bytes at a time."""
    out = subprocess.run(
        ["callgrind_annotate", "--threshold=100", dump],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    total = 0
    for line in out.splitlines():
        fields = line.split()
        if fields and fields[0][0].isdigit() and _COPY.search(line):
            total += int(fields[0].replace(",", ""))
    return total


def _collections(dump: str) -> int:
    """Instructions of one dump spent in the cyclic garbage collector (``gc_collect_main``
    and what it calls): a window of 20 calls either holds a collection or not, and a full
    one walks every long-lived object (the sessions' conversations and token ids)."""
    out = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    counts = [
        int(line.split()[0].replace(",", ""))
        for line in out.splitlines()
        if "gcmodule.c:gc_collect_main " in line and line.split()[0][0].isdigit()
    ]
    return max(counts, default=0)


class Counter:
    """The gateway under callgrind: windows of counted calls, each dumped on its own."""

    def __init__(self, fake_url: str, kind: str, mode: str, folder: Path) -> None:
        self.out = str(folder / f"callgrind-{mode}.out")
        self.proc = overhead._start(
            ["gateway", fake_url, kind, mode, "3", str(folder / f"store-{mode}")],
            timeout_s=900,
            prefix=(
                "valgrind",
                "--quiet",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={self.out}",
            ),
        )
        self.url = f"http://127.0.0.1:{self.proc.ready['port']}"
        self.keys: list[str] = self.proc.ready["keys"]
        self.windows: list[tuple[str, int]] = []

    def _control(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(self.proc.popen.pid)],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def start(self) -> None:
        self._control("--zero")
        self._control("--instr=on")

    def stop(self, name: str, calls: int) -> None:
        self._control("--instr=off")
        self._control("--dump")
        self.windows.append((name, calls))

    def results(self) -> list[tuple[str, int, int, int]]:
        """(window, instructions per call, of which byte copies, of which garbage
        collection), in the order measured."""
        self.proc.stop()
        dumps = sorted(glob.glob(self.out + ".*"), key=lambda f: int(f.rsplit(".", 1)[1]))
        if len(dumps) != len(self.windows):
            raise RuntimeError(f"{len(self.windows)} windows but {len(dumps)} dumps")
        return [
            (name, _total(dump) // calls, _copies(dump) // calls, _collections(dump) // calls)
            for (name, calls), dump in zip(self.windows, dumps, strict=True)
        ]


async def _post(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(
        url, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code}: {response.text}")
    return response.json()


async def _fresh(
    counter: Counter, client: httpx.AsyncClient, key: str, calls: int, name: str, first: int = 0
) -> None:
    url = f"{counter.url}/s/{key}/v1/chat/completions"
    path = overhead.Path_("x", "", [], "chat")
    for call in range(WARMUP):
        await _post(client, url, overhead._body(path, 0, first + call))
    counter.start()
    for call in range(calls):
        await _post(client, url, overhead._body(path, 0, first + WARMUP + call))
    counter.stop(name, calls)


async def _growth(counter: Counter, client: httpx.AsyncClient, turns: int) -> None:
    url = f"{counter.url}/s/{counter.keys[1]}/v1/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    windows = {
        10: "growing conversation, turns 11-30",
        turns - 20: f"growing conversation, turns {turns - 19}-{turns}",
    }
    for turn in range(turns):
        if turn in windows:
            counter.start()
        messages.append({"role": "user", "content": f"Turn {turn}: say hello."})
        answer = await _post(client, url, {"model": "bench", "messages": messages})
        messages.append(answer["choices"][0]["message"])
        if turn - 19 in windows:
            counter.stop(windows[turn - 19], 20)


async def _main(args: argparse.Namespace) -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    if args.turns < 40:
        sys.exit("--turns must be at least 40")
    from rolloutd.engine.models import load_tokenizer

    tokenizer = load_tokenizer(overhead.MODEL)
    ids = list(tokenizer.encode(overhead.ANSWER, add_special_tokens=False)) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>")
    ]
    folder = Path(tempfile.mkdtemp(prefix="rolloutd-bench-instr-"))
    fake = overhead._start(["fake", json.dumps(ids)])
    fake_url = f"http://127.0.0.1:{fake.ready['port']}"
    rows: list[tuple[str, str, int, int, int]] = []
    try:
        async with httpx.AsyncClient(timeout=600) as client:
            for kind, mode in (("openai", "passthrough"), ("llama_cpp", "tokens")):
                counter = Counter(fake_url, kind, mode, folder)
                try:
                    await _fresh(
                        counter,
                        client,
                        counter.keys[0],
                        args.calls,
                        "fresh single-turn conversations",
                    )
                    if mode == "tokens":
                        await _growth(counter, client, args.turns)
                        await _fresh(
                            counter,
                            client,
                            counter.keys[2],
                            20,
                            "fresh single-turn conversations, after the growth",
                            first=10_000,
                        )
                finally:
                    results = counter.results()
                rows += [(mode, *result) for result in results]
    finally:
        fake.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print("\n### Gateway instructions per call (callgrind, user space, all threads)\n")
    print(
        "| mode | calls | instructions/call | of which memcpy/memmove/memset "
        "| of which garbage collection | the rest |"
    )
    print("|---|---|---|---|---|---|")
    for mode, name, count, copies, collections in rows:
        print(
            f"| {mode} | {name} | {count / 1e6:.2f} M | {copies / 1e6:.2f} M "
            f"| {collections / 1e6:.2f} M | {(count - copies - collections) / 1e6:.2f} M |"
        )
    print(
        "\nvalgrind counts a `rep movsb`/`rep stosb` (glibc's copies of more than a few KB) "
        "once per byte; the hardware moves 16 to 32 bytes a cycle. A garbage collection "
        "falls in a window of calls or not: its instructions are shown apart."
    )
    growth = {
        name: (count, count - copies - collections)
        for mode, name, count, copies, collections in rows
        if mode == "tokens"
    }
    early = growth.get("growing conversation, turns 11-30")
    late = growth.get(f"growing conversation, turns {args.turns - 19}-{args.turns}")
    base = growth.get("fresh single-turn conversations")
    if early and late and base:
        for what, i in (
            ("all instructions", 0),
            ("without byte copies and garbage collections", 1),
        ):
            print(
                f"\nGrowth, {what}: turns {args.turns - 19}-{args.turns} cost "
                f"{late[i] / early[i]:.2f}x turns 11-30 ({late[i] / base[i]:.2f}x and "
                f"{early[i] / base[i]:.2f}x a fresh single-turn call)."
            )


def main() -> None:
    """Entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100, help="fresh calls counted per mode")
    parser.add_argument("--turns", type=int, default=200)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
