"""Benchmark of trajectory reconstruction (the builders of rolloutd.trajectory).

Bar: ``prefix_merging`` on 500 completions of 32K-token prompts in <= 200 ms; time linear in
total tokens; ``per_request`` vs ``prefix_merging`` trace counts on a synthetic session.

The synthetic session: ``num_agents`` agents (a main agent and sub-agents) share a long system
prefix, each with its own task; their turns interleave; every turn samples ``response_tokens``
tokens and gets ``tool_tokens`` of tool result back; every 7th turn ends by length (the next
prompt carries the inserted end-of-turn token); every 50th completion is an identical retry.
Token lists are materialised with fresh int objects (as after a JSON round trip from the blob
store), so list comparisons cannot take CPython's identity shortcut.

Run: ``python benchmarks/reconstruction.py`` (``--quick`` for the 32K row only).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from array import array
from pathlib import Path

from rolloutd.trajectory import build_traces, check_invariants
from rolloutd.types import BuilderSpec, CaptureMode, Completion

EOT = 151645  # Qwen2.5 <|im_end|>


def _fresh(ids: list[int]) -> list[int]:
    """A copy with new int objects (what a JSON decoder hands back)."""
    return array("i", ids).tolist()


def synthetic_session(
    num_completions: int,
    prompt_tokens: int,
    *,
    num_agents: int = 8,
    response_tokens: int = 16,
    tool_tokens: int = 16,
    mode: CaptureMode = CaptureMode.TOKENS,
    seed: int = 0,
) -> list[Completion]:
    """A completion log whose prompts average ``prompt_tokens`` tokens (see module docstring)."""
    rng = random.Random(seed)
    turns_per_agent = max(1, num_completions // num_agents)
    growth = turns_per_agent * (response_tokens + tool_tokens + 1)
    base = max(64, prompt_tokens - growth // 2)
    system = [rng.randrange(151_000) for _ in range(base - 32)]
    contexts = [system + [rng.randrange(151_000) for _ in range(32)] for _ in range(num_agents)]
    last: list[int | None] = [None] * num_agents
    log: list[Completion] = []
    turn = 0
    while len(log) < num_completions:
        agent = turn % num_agents
        ended_by_length = turn % 7 == 6
        body = [rng.randrange(151_000) for _ in range(response_tokens)]
        response = body if ended_by_length else body + [EOT]
        prompt = contexts[agent]
        log.append(
            Completion(
                session_id="bench",
                index=len(log),
                capture_mode=mode,
                prompt_ids=_fresh(prompt),
                response_ids=_fresh(response),
                response_logprobs=[-0.5] * len(response),
                finish_reason="length" if ended_by_length else "stop",
                end_of_turn_sampled=not ended_by_length,
                extends=last[agent] if mode == CaptureMode.TOKENS else None,
            )
        )
        if len(log) % 50 == 0 and len(log) < num_completions:  # an identical retry
            log.append(log[-1].model_copy(update={"index": len(log)}))
        last[agent] = log[-1].index
        tool = [rng.randrange(151_000) for _ in range(tool_tokens)]
        contexts[agent] = prompt + response + ([EOT] if ended_by_length else []) + tool
        turn += 1
    return log[:num_completions]


def _time_ms(log: list[Completion], spec: BuilderSpec, verify: str, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        build_traces(log, spec, end_of_turn_id=EOT, verify=verify)
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 500 x 32K row")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    merging = BuilderSpec(type="prefix_merging")
    rows = (
        [(500, 32_768)]
        if args.quick
        else [
            (500, 4_096),
            (500, 8_192),
            (500, 16_384),
            (500, 32_768),
            (125, 32_768),
            (250, 32_768),
            (1000, 32_768),
        ]
    )
    print(
        "| completions | prompt tokens | total tokens | sampled ms | full ms | full ns/token "
        "| passthrough ms |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    bar_ms = None
    for num_completions, prompt_tokens in rows:
        log = synthetic_session(num_completions, prompt_tokens)
        total = sum(len(c.prompt_ids) + len(c.response_ids) for c in log)
        sampled = _time_ms(log, merging, "sampled", args.repeats)
        full = _time_ms(log, merging, "full", args.repeats)
        passthrough_log = synthetic_session(
            num_completions, prompt_tokens, mode=CaptureMode.PASSTHROUGH
        )
        passthrough = _time_ms(passthrough_log, merging, "full", args.repeats)
        if (num_completions, prompt_tokens) == (500, 32_768):
            bar_ms = sampled
        print(
            f"| {num_completions} | {prompt_tokens} | {total:,} | {sampled:.1f} | {full:.1f} "
            f"| {full * 1e6 / total:.1f} | {passthrough:.1f} |"
        )

    log = synthetic_session(500, 32_768)
    merged, merged_stats = build_traces(log, merging, end_of_turn_id=EOT)
    per_request, _ = build_traces(log, BuilderSpec(type="per_request"), end_of_turn_id=EOT)
    check_invariants(merged, log)
    print()
    print("| builder | traces | trainable tokens | retries collapsed | length turns |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print(
        f"| per_request | {len(per_request)} | {sum(sum(t.loss_mask) for t in per_request):,} "
        "| 0 | - |"
    )
    print(
        f"| prefix_merging | {len(merged)} | {merged_stats.num_trainable_tokens:,} "
        f"| {merged_stats.num_retries_collapsed} | {merged_stats.num_length_turns} |"
    )
    recorded = Path(__file__).resolve().parents[1] / "tests" / "trajectory" / "fixtures"
    if recorded.is_dir():
        print("\nrecorded real sessions (qwen-code via the gateway, tests/trajectory/fixtures):")
        print(
            "| session | completions | per_request traces | prefix_merging traces | "
            "prefix_merging response tokens | trainable tokens |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for folder in sorted(p for p in recorded.iterdir() if p.is_dir()):
            real = [
                Completion.model_validate_json(f.read_text())
                for f in sorted((folder / "completions").glob("*.json"))
            ]
            chained, chained_stats = build_traces(real, merging, end_of_turn_id=EOT)
            single, _ = build_traces(real, BuilderSpec(type="per_request"), end_of_turn_id=EOT)
            print(
                f"| {folder.name} | {len(real)} | {len(single)} | {len(chained)} | "
                f"{sum(len(t.response_ids) for t in chained)} | "
                f"{chained_stats.num_trainable_tokens} |"
            )
    if bar_ms is not None:
        verdict = "PASS" if bar_ms <= 200 else "FAIL"
        print(f"\nbar: prefix_merging 500 x 32K in {bar_ms:.1f} ms (<= 200 ms): {verdict}")
        return 0 if bar_ms <= 200 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
