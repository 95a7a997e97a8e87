"""How far ahead the decode rows prefetch (executor.simd.PREFETCH_AHEAD_BYTES) against the next row group only.

    python benchmarks/bench_prefetch_distance.py [--seconds 30] [--pairs 3] [--fmts Q8_0 Q4_0 Q4_K F16] [--bytes 0 8192]

The distance is compiled into the kernels, so each setting runs in its own process (MOE_OFFLOAD_PREFETCH_BYTES, its
kernels cached apart: nbcache), `pairs` pairs of processes alternating. Each process, for `seconds`, alternates a
2-thread read of 1 GiB (calibration.bench_memory's read) with 40 decode jobs of each format (8 experts of 2,048 x
768 a token from a 1 GiB pool, whole experts per thread as the executor's decode runs them, and the same with the
rows split over the threads; F16's rows one a pass, as an all-CPU decode's attention products), and prints each
job's GB/s binned by the read just before it: this VM's 2-thread read switches between ~45 and ~75 GB/s for tens of
seconds at a time, and a kernel whose prefetch runs out of distance does not follow it up. Medians per bin over the
pairs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BINS = ((0.0, 55.0, "read < 55 GB/s"), (55.0, 1e9, "read >= 55 GB/s"))


def child(seconds: float, fmts: list[str]) -> None:
    """Rounds of (read, each format's jobs whole and rows split) for `seconds`; one JSON line of the rounds."""
    import numpy as np

    from calibration.bench_kernel import executor_expert_job
    from calibration.bench_memory import _k_read
    a = np.ones((1 << 30) // 8)
    _k_read(a)
    jobs = {f"{f} {kind}": executor_expert_job(f, 2048, 768, 1 << 30, max_k=8, whole=kind == "whole")
            for f in fmts for kind in ("whole", "rows")}
    for job, _ in jobs.values():
        job(8, 0)
    rounds, i, end = [], 0, time.time() + seconds
    while time.time() < end:
        t = time.perf_counter()
        _k_read(a)
        row = {"read": a.nbytes / (time.perf_counter() - t) / 1e9}
        for key, (job, eb) in jobs.items():
            t = time.perf_counter()
            for j in range(40):
                job(8, (i * 40 + j) * 8)
            row[key] = 40 * 8 * eb / (time.perf_counter() - t) / 1e9
        rounds.append(row)
        i += 1
    print(json.dumps(rounds))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--fmts", nargs="+", default=["Q8_0", "Q4_0", "Q4_K"])
    ap.add_argument("--bytes", nargs="+", default=["0", "8192"])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.seconds, a.fmts)
        return 0
    got: dict[str, list[dict]] = {b: [] for b in a.bytes}
    for b in a.bytes:  # compile each setting's kernels first (cached apart), outside the timed runs
        subprocess.run([sys.executable, __file__, "--child", "--seconds", "0", "--fmts", *a.fmts], check=True,
                       env=dict(os.environ, MOE_OFFLOAD_PREFETCH_BYTES=b), capture_output=True)
    for p in range(a.pairs):
        for b in (a.bytes if p % 2 == 0 else a.bytes[::-1]):
            out = subprocess.run([sys.executable, __file__, "--child", "--seconds", str(a.seconds), "--fmts", *a.fmts],
                                 check=True, env=dict(os.environ, MOE_OFFLOAD_PREFETCH_BYTES=b), capture_output=True,
                                 text=True).stdout
            got[b] += json.loads(out.strip().splitlines()[-1])
            print(f"pair {p + 1}: MOE_OFFLOAD_PREFETCH_BYTES={b} done", file=sys.stderr, flush=True)
    keys = [k for k in next(iter(got.values()))[0] if k != "read"]
    for lo, hi, name in BINS:
        print(f"{name}:")
        for b, rows in got.items():
            sel = [r for r in rows if lo <= r["read"] < hi]
            if not sel:
                print(f"  bytes {b:>5}: no rounds")
                continue
            print(f"  bytes {b:>5}: {len(sel):4d} rounds, read {statistics.median(r['read'] for r in sel):5.1f}; "
                  + ", ".join(f"{k} {statistics.median(r[k] for r in sel):5.1f}" for k in keys) + " GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
