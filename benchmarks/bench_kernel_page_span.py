"""How the executor's cost from a file in short page runs grows with the memory the file spans, on 1 and 2 threads.

For each span, the executor's kernel jobs (calibration.bench_kernel.executor_expert_job; on 2 threads whole experts
per thread, as its decode runs them) on a pool in a file in 2 MiB folios (calibrate's contiguous reference) and on one
in 4 KiB runs, sampled in turn, a window each, `--rounds` times; prints each rate and the excess (reference over 4 KiB
rate, minus one). calibrate times the executor at one span (Settings.page_runs_pool_bytes' second: 384 MiB, 496 in
whole repetitions of a 124 MiB Q8_0 pool); a GGUF's experts span more. Session 52 (Zen 4 VM, Q8_0, three runs): at
384 MiB +0.15 / +0.18 / +0.16 on one thread, +0.03 / +0.05 / +0.08 on two; at 1536 MiB +0.26 / +0.27 / +0.21 on one
and +0.10 / +0.10 / +0.195 on two, the last with the bus in its fast state (59 GB/s from the reference on two threads
against 36-37): the cost shows on two threads where the bus does not bind them.

    python benchmarks/bench_kernel_page_span.py [--format Q8_0] [--spans-mib 384 1536] [--rounds 4] [--folder .]
"""
from __future__ import annotations

import argparse
import gc

import numba

from calibration.bench_kernel import KernelBench, executor_expert_job
from calibration.page_runs import REFERENCE_KIB
from calibration.settings import QUICK
from simulator.policies import whole_experts_per_thread


def excess_at(fmt: str, span: int, rounds: int, folder: str) -> dict[tuple[int, int], float]:
    """{(KiB a run, threads): GB/s} of the executor's `fmt` jobs on pools in files spanning `span` bytes."""
    benches = []
    for kib in (REFERENCE_KIB, 4):
        for t in (2, 1):
            numba.set_num_threads(min(t, numba.config.NUMBA_NUM_THREADS))
            even = [k for k in QUICK.kernel_ks if whole_experts_per_thread([1] * k, t)]
            whole = t > 1 and len(even) > 1
            job, eb = executor_expert_job(fmt, QUICK.kernel_hidden, QUICK.kernel_ffn, QUICK.kernel_pool_bytes,
                                          max_k=max(QUICK.kernel_ks), whole=whole, file_runs=kib << 10,
                                          folder=folder, file_bytes=span)
            ks = (min(even), max(even)) if whole else (min(QUICK.kernel_ks), max(QUICK.kernel_ks))
            benches.append((kib, t, KernelBench(job, ks, eb, threads=t)))
            del job
    for _ in range(rounds):
        for _, t, kb in benches:
            numba.set_num_threads(min(t, numba.config.NUMBA_NUM_THREADS))
            kb.sample(1, 1.0)
    rates = {(kib, t): kb.result().expert_gbs for kib, t, kb in benches}
    del benches
    gc.collect()  # a KernelBench's job refers to the bench: the collector frees the pools before the next span's
    return rates


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="Q8_0")
    ap.add_argument("--spans-mib", type=int, nargs="+", default=[384, 1536])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--folder", default=".", help="where the files go (a disk's, as a GGUF's; unlinked once mapped)")
    a = ap.parse_args(argv)
    for mib in a.spans_mib:
        r = excess_at(a.format, mib << 20, a.rounds, a.folder)
        print(f"{a.format} span {mib} MiB: " + " | ".join(
            f"{t} thread(s): reference {r[(REFERENCE_KIB, t)]:.1f} GB/s, 4 KiB runs {r[(4, t)]:.1f}, "
            f"excess {r[(REFERENCE_KIB, t)] / r[(4, t)] - 1:+.3f}" for t in (1, 2)), flush=True)


if __name__ == "__main__":
    main()
