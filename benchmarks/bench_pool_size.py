"""calibrate's whole-expert job (a token's k experts through executor.cpu_experts.moe_cpu, whole experts per thread)
on pools of synthetic experts of several sizes, interleaved: how large a pool must be, against the last-level cache,
before its jobs read DRAM as a model's experts do (settings.Settings.kernel_pool_llc_times; its comment has session 54's
figures and why quick's pools stayed at 2x the LLC).

    python benchmarks/bench_pool_size.py [--fmt Q8_0] [--pools-mib 64 128 256 512 1024] [--rounds 15] [--k 8]

The jobs cycle through each pool as calibrate's do (bench_kernel.token_experts: no expert again before the whole pool
has been read). Each round times 5 jobs on every pool in turn; printed: each pool's size in multiples of the LLC, its
median GB/s of expert bytes (median job of a round, median of rounds) and best round, and numba's read beside them.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import executor  # noqa: E402,F401  (first: sets OMP_WAIT_POLICY before torch loads OpenMP)
from calibration.bench_kernel import executor_expert_job  # noqa: E402
from calibration.detect import llc_bytes  # noqa: E402
from executor import kernels as K  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", default="Q8_0")
    ap.add_argument("--pools-mib", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--k", type=int, default=8, help="experts a job (a token's top-k)")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    K.set_threads(a.threads)
    jobs = {mib: executor_expert_job(a.fmt, 2048, 768, mib << 20, max_k=a.k, whole=True) for mib in a.pools_mib}
    cursor = dict.fromkeys(jobs, 0)
    rates: dict[int, list[float]] = {mib: [] for mib in jobs}

    def run(mib: int) -> float:
        job, _ = jobs[mib]
        t = time.perf_counter()
        job(a.k, cursor[mib])
        cursor[mib] += a.k
        return time.perf_counter() - t

    for mib in jobs:  # warm-up: compile, touch the pool
        for _ in range(3):
            run(mib)
    for _ in range(a.rounds):
        for mib, (_, eb) in jobs.items():
            rates[mib].append(a.k * eb / float(np.median([run(mib) for _ in range(5)])) / 1e9)
    llc = llc_bytes()
    cache = f"{llc / 2**20:.0f} MiB" if llc else "unknown"
    print(f"numba read ({a.threads} threads): {K.read_bandwidth():.1f} GB/s; last-level cache {cache}")
    for mib, v in rates.items():
        times = f" ({(mib << 20) / llc:.0f}x the LLC)" if llc else ""
        print(f"{a.fmt} whole-expert job, k={a.k}, {mib} MiB pool{times}: median {np.median(v):.1f} GB/s, "
              f"best round {max(v):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
