"""llamafile's tinyBLAS F16 GEMM against its rebuild (calibration.ggml_sgemm), side by side, at test-backend-ops' own
MUL_MAT case (F16 weights 4096 x 14336, F32 activations, 512 tokens: the prefill batch of its perf list), then the
rebuild alone at a `small` model's attention products (calibrate's dense job: 2048 wide, 512 tokens).
test-backend-ops runs its CPU backend on half the hardware threads; the rebuild runs on as many. Rounds alternate
the two; medians of GFLOP/s and their ratio.

    python benchmarks/bench_ggml_sgemm.py --test-backend-ops PATH/test-backend-ops [--rounds 3]

Without --test-backend-ops only the rebuild runs. Needs AVX-512 F, or AVX2 and F16C (ggml_sgemm.HAVE_F16C)."""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration import ggml_sgemm as GS  # noqa: E402
from calibration.bench_ggml_prefill import ggml_dense_prefill_job  # noqa: E402
from bench_ggml_tiled import rebuild_gflops as gflops  # noqa: E402  (this folder: the same timing loop)

M, N, K = 4096, 512, 14336  # test-backend-ops make_test_cases_perf: test_mul_mat(F16, F32, 4096, bs 512, 14336)


def ggml_gflops(tbo: str) -> float | None:
    """test-backend-ops perf's GFLOPS for MUL_MAT of F16 weights at (M, N, K), or None where it has no such case."""
    p = f"type_a=f16,type_b=f32,m={M},n={N},k={K},"
    out = subprocess.run([tbo, "perf", "-b", "CPU", "-o", "MUL_MAT", "-p", re.escape(p)], capture_output=True,
                         text=True).stdout
    m = re.search(r"([0-9.]+) GFLOPS", out)
    return float(m.group(1)) if m else None


def rebuild_case():
    """(run, flops): the rebuild on test-backend-ops' case."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((M, K), dtype=np.float32).astype(np.float16).view(np.uint16)
    x = rng.standard_normal((N, K), dtype=np.float32)
    out, x16 = np.empty((N, M), np.float32), np.empty((N, K), np.uint16)

    def run():
        GS.sgemm(w, x, out, numba.get_num_threads(), x16)
    return run, 2.0 * M * N * K


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--test-backend-ops", dest="tbo", help="llama.cpp's test-backend-ops binary")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if not GS.HAVE_F16C:
        print("this CPU has neither AVX-512 F nor AVX2 with F16C: llamafile's F16 path is not what it runs",
              file=sys.stderr)
        return 2
    numba.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # as test-backend-ops sets its CPU backend
    print(f"{numba.get_num_threads()} thread(s), KN {GS.KN}; GFLOP/s, medians of {args.rounds} rounds")
    run, flops = rebuild_case()
    ours, theirs = [], []
    for _ in range(args.rounds):
        if args.tbo:
            g = ggml_gflops(args.tbo)
            if g is not None:
                theirs.append(g)
        ours.append(gflops(run, flops, reps=3))
    del run
    o, t = statistics.median(ours), statistics.median(theirs) if theirs else float("nan")
    print(f"F16 {M} x {K}, {N} tokens: ggml {t:.1f}, rebuild {o:.1f}, ratio {o / t:.2f}")
    run, flops = ggml_dense_prefill_job(2048, tokens=512)
    print(f"F16 attention block of 2048 (Q/K/V/output), 512 tokens: rebuild {gflops(run, flops):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
