"""What the payload codec costs per payload: encode (serialize + AES-256-GCM encrypt) and
decode, for payload sizes rolloutd writes (a session's input of a few KB up to Temporal's
2 MB payload limit), and the size it adds (12-byte nonce, 16-byte tag, metadata).

    python benchmarks/codec_overhead.py [--repeat 200]

Output: a markdown table on stdout (median of ``--repeat`` runs, microseconds, one thread).
On a loaded shared machine the absolute times move; the ratio to a Temporal round trip
(milliseconds) is what matters.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from temporalio.api.common.v1 import Payload

from rolloutd.security.codec import AesGcmCodec, generate_key, parse_keys

SIZES = (512, 4 * 1024, 64 * 1024, 2 * 1024 * 1024)


def measure(codec: AesGcmCodec, size: int, repeat: int) -> tuple[float, float, int]:
    payload = Payload(metadata={"encoding": b"json/plain"}, data=os.urandom(size))
    encoded = codec.encrypt(payload)
    enc, dec = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        encoded = codec.encrypt(payload)
        t1 = time.perf_counter()
        assert codec.decrypt(encoded) == payload
        t2 = time.perf_counter()
        enc.append(t1 - t0)
        dec.append(t2 - t1)
    added = encoded.ByteSize() - payload.ByteSize()
    return statistics.median(enc) * 1e6, statistics.median(dec) * 1e6, added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    codec = AesGcmCodec(parse_keys(f"bench:{generate_key()}", source="benchmark"))
    print("| payload | encode µs | decode µs | bytes added |")
    print("| --- | --- | --- | --- |")
    for size in SIZES:
        enc, dec, added = measure(codec, size, args.repeat if size < 2**20 else 20)
        print(
            f"| {size // 1024 or size} {'KiB' if size >= 1024 else 'B'} | {enc:.1f} | "
            f"{dec:.1f} | {added} |"
        )


if __name__ == "__main__":
    main()
