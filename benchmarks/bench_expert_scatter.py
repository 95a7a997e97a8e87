"""Benchmark: a token's experts drawn apart in the pool against the same number side by side, in calibrate's jobs.

    python benchmarks/bench_expert_scatter.py [--formats Q8_0 Q6_K Q4_K:rp Q2_K:rp Q4_0:rp] [--threads 1] [--rounds 80]

A token routes k experts of each layer's tensors in index order, with other experts' rows between them; calibrate's
decode jobs read theirs as bench_kernel.token_experts routes them (positions of a shuffled pool order, ascending).
Until 2026-12-06 they read k neighbours (experts first .. first + k - 1), one stream a matrix for the prefetcher. This
times llama.cpp's rebuilt decode job (bench_rowwise; ':rp' its repacked layout) at k = 8 both ways in alternating
rounds and prints each way's median rate and the median of the rounds' time ratios (drawn / side by side): what each
new stream costs. Zen 4 VM, one thread, 2026-12-06 22:2x: 1.02-1.05 and 1.02-1.06 in two runs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import calibration.bench_rowwise as BR  # noqa: E402


def side_by_side(n: int, seed: int = 0):
    """routes(k, first): experts first .. first + k - 1 (mod n), calibrate's order before token_experts."""
    return lambda k, first: (np.arange(k, dtype=np.int64) + first) % n


def job(fmt: str, routes_of):
    """(run_job, expert_bytes) of `fmt`'s rebuilt decode job with its experts routed by routes_of(n)."""
    f, repacked = fmt.split(":")[0], fmt.endswith(":rp")
    drawn = BR.token_experts
    BR.token_experts = routes_of  # the jobs take their routes from this name when they are made
    try:
        return (BR.repacked_expert_job if repacked else BR.rowwise_expert_job)(f)
    finally:
        BR.token_experts = drawn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", nargs="+", default=["Q8_0", "Q6_K", "Q4_K:rp", "Q2_K:rp", "Q4_0:rp"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=80)
    a = ap.parse_args(argv)
    numba.set_num_threads(a.threads)
    for fmt in a.formats:
        jobs = {"side by side": job(fmt, side_by_side), "drawn": job(fmt, BR.token_experts)}
        times: dict[str, list[float]] = {k: [] for k in jobs}
        cursor = 0
        for run, _ in jobs.values():
            run(8, 0)  # compile and warm
        for i in range(a.rounds):
            name = list(jobs)[i % 2]
            run, _ = jobs[name]
            t0 = time.perf_counter()
            run(8, cursor)
            times[name].append(time.perf_counter() - t0)
            cursor += 8
        eb = jobs["drawn"][1]
        ratio = statistics.median(d / s for s, d in zip(times["side by side"], times["drawn"]))
        rates = "  ".join(f"{k} {8 * eb / statistics.median(v) / 1e9:5.1f} GB/s" for k, v in times.items())
        print(f"{fmt:8s} {rates}  drawn / side by side {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
