"""The simulator's executor prefill rate checked beyond the two batches calibrate times it at.

    python benchmarks/bench_prefill_extrapolation.py [--fmt Q4_0] [--tokens 64 512 2048] [--rounds 7]
    MOE_OFFLOAD_GEMM_INT8=1 python benchmarks/bench_prefill_extrapolation.py      # the int8 build

calibrate times the executor's prefill job (calibration.bench_kernel.executor_prefill_jobs: synthetic experts of
2,048 x 768, each token routed uniformly to 8 of 32) at 64 and 512 tokens (16 and 128 tokens an expert) and fits m0,
an expert product's cost beyond its multiply-adds, in its token groups (bench_kernel.prefill_fixed_tokens); the
simulator then prices any batch as m / (m + g m0) of the rate (simulator.resources.executor_prefill_gflops). Here the
same job runs at the three sizes in one process, rounds interleaved, and the rate at the last is set against the one
the simulator's function gives from the first two, on the medians and on the lower quintiles (calibrate's statistic).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numba  # noqa: E402

from calibration.bench_kernel import executor_prefill_jobs, prefill_fixed_tokens  # noqa: E402
from calibration.detect import cpu_info  # noqa: E402
from executor.cpu_caches import cache_bytes  # noqa: E402
from executor.qgemm import gemm_activations  # noqa: E402
from simulator.resources import Constants, executor_prefill_gflops  # noqa: E402
from specs.formats import executor_expert_groups, executor_prefill_group_bytes  # noqa: E402

HIDDEN, FFN, EXPERTS, TOP_K = 2048, 768, 32, 8  # calibrate's job (calibration.settings)


def rates(fmt: str, sizes: tuple[int, ...], rounds: int) -> dict[str, dict[int, float]]:
    """GFLOP/s a core of the job at each batch size: the median and the lower quintile of `rounds` interleaved
    rounds, after one warm-up call each."""
    jobs = executor_prefill_jobs(fmt, HIDDEN, FFN, EXPERTS, TOP_K, sizes)
    threads = numba.get_num_threads()
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for run, _ in jobs:
        run()
    for _ in range(rounds):
        for n, (run, _) in zip(sizes, jobs):
            t = time.perf_counter()
            run()
            times[n].append(time.perf_counter() - t)
    out: dict[str, dict[int, float]] = {"median": {}, "lower quintile": {}}
    for n, (_, flops) in zip(sizes, jobs):
        ts = sorted(times[n])
        out["median"][n] = flops / (statistics.median(ts) * 1e9 * threads)
        out["lower quintile"][n] = flops / (ts[len(ts) // 5] * 1e9 * threads)
    return out


def predicted(r: dict[int, float], sizes: tuple[int, ...], groups: list[float]) -> tuple[float, float]:
    """(m0, the simulator's rate at the last size) from the rates at the first two, as calibrate fits and the
    simulator prices them."""
    m = [n * TOP_K / EXPERTS for n in sizes]
    m0 = prefill_fixed_tokens(m[0], r[sizes[0]], m[1], r[sizes[1]], groups[0], groups[1])
    c = Constants(cpu_prefill_gflops_per_core=r[sizes[0]], cpu_prefill_ref_tokens=m[0], cpu_prefill_fixed_tokens=m0)
    # the simulator takes its reference batch in one group; rescaled where the first size took more
    return m0, executor_prefill_gflops(c, m[2], groups[2]) * (m[0] + groups[0] * m0) / (m[0] + m0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fmt", default="Q4_0")
    ap.add_argument("--tokens", type=int, nargs=3, default=[64, 512, 2048])
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    sizes = tuple(a.tokens)
    acts = gemm_activations()
    gb = executor_prefill_group_bytes(cache_bytes(2), cpu_info()["isa"])
    groups = [executor_expert_groups(HIDDEN, FFN, n * TOP_K / EXPERTS, gb, acts if acts != "float" else None)
              for n in sizes]
    print(f"{a.fmt}, {acts} activations, {numba.get_num_threads()} threads, token groups a product "
          f"{[round(g, 3) for g in groups]} at {[n * TOP_K // EXPERTS for n in sizes]} tokens an expert")
    for stat, r in rates(a.fmt, sizes, a.rounds).items():
        m0, pred = predicted(r, sizes, groups)
        print(f"{stat}: GFLOP/s a core " + ", ".join(f"{n} tokens {r[n]:.1f}" for n in sizes)
              + f"; m0 {m0:.1f} tokens; at {sizes[2]} the simulator's {pred:.1f}, measured {r[sizes[2]]:.1f} "
              f"({100 * (pred / r[sizes[2]] - 1):+.1f}% predicted rate)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
