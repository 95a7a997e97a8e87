"""ggml's tiled K-quant GEMM against its rebuild (calibration.ggml_tiled), side by side, at test-backend-ops' own
MUL_MAT_ID case: 4 of 32 experts of 1792 x 2048, n = 128 tokens (16 an expert: the narrow path) and 512 (64 an
expert: 256-wide slabs). test-backend-ops runs its CPU backend on half the hardware threads; the rebuild runs on as
many. Rounds alternate the two; medians of GFLOP/s and their ratio. `--case qwen3` takes its qwen3-30b-a3b case
instead: 8 of 128 experts of 768 x 2048 (a `small` model's gate / up), n = 512 tokens, 32 an expert, every expert
routed to, as ggml's random routing does there. `--case small-gate` / `small-down`: make-model's `small` at pp512, 8 of
32 experts of 768 x 2048 (gate / up) and of 2048 x 768 (down), n / 4 tokens an expert (pp512: 128); test-backend-ops
has no such case: add, in make_test_cases_perf,

    for (ggml_type type_a : {GGML_TYPE_Q4_K, GGML_TYPE_IQ4_XS, GGML_TYPE_Q6_K, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
                             GGML_TYPE_Q5_K}) {
      for (int n : {128, 256, 512, 1024}) {
        test_cases.emplace_back(new test_mul_mat_id(type_a, GGML_TYPE_F32, 32, 8, false, 768, n, 2048));
        test_cases.emplace_back(new test_mul_mat_id(type_a, GGML_TYPE_F32, 32, 8, false, 2048, n, 768));
      }
    }

    python benchmarks/bench_ggml_tiled.py --test-backend-ops PATH/test-backend-ops [--types q4_K q6_K iq4_xs] [--rounds 3]
    python benchmarks/bench_ggml_tiled.py --test-backend-ops PATH/test-backend-ops --case qwen3 --tokens 512
    python benchmarks/bench_ggml_tiled.py --test-backend-ops PATH/test-backend-ops --case small-down --tokens 512
    python benchmarks/bench_ggml_tiled.py --test-backend-ops PATH --case small-gate --tokens 128 256 512 1024 \
        --types Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS   (the rate against tokens an expert: ggml's window shared)

Without --test-backend-ops only the rebuild runs. Needs AVX-512 VNNI (ggml_tiled.HAVE_TILED)."""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration import ggml_tiled as GT  # noqa: E402
from calibration.bench_kernel import _synth_tensor  # noqa: E402

CASES = {"4x32": (32, 4, 1792, 2048), "qwen3": (128, 8, 768, 2048),  # (experts, used, rows, k)
         "small-gate": (32, 8, 768, 2048), "small-down": (32, 8, 2048, 768)}
GGML_NAMES = {"Q2_K": "q2_K", "Q3_K": "q3_K", "Q4_K": "q4_K", "Q5_K": "q5_K", "Q6_K": "q6_K", "IQ4_XS": "iq4_xs"}


def ggml_gflops(tbo: str, name: str, n: int, case: str = "4x32") -> float | None:
    """test-backend-ops perf's GFLOPS for MUL_MAT_ID of `name` at n tokens, or None where it has no such case."""
    experts, used, rows, k = CASES[case]
    p = f"type_a={name},type_b=f32,n_mats={experts},n_used={used},b=0,m={rows},n={n},k={k},"
    out = subprocess.run([tbo, "perf", "-b", "CPU", "-o", "MUL_MAT_ID", "-p", re.escape(p)], capture_output=True,
                         text=True).stdout
    m = re.search(r"([0-9.]+) GFLOPS", out)
    return float(m.group(1)) if m else None


def rebuild_job(fmt: str, n: int, rng, case: str = "4x32"):
    """(run, flops): the rebuild on the same case, n x used (token, expert) pairs spread evenly: over the `used`
    experts (4x32), or over all of them (the others)."""
    experts, used, rows, k = CASES[case]
    per = n * used // experts
    active = used if case == "4x32" else experts
    w = _synth_tensor(fmt, active, rows, k, rng).data.reshape(active, -1)
    a = rng.standard_normal((active, per, k)).astype(np.float32)
    out = np.zeros((active, per, rows), np.float32)
    threads = numba.get_num_threads()

    def run():
        GT.tiled_matrix(GT.CODES[fmt], w, rows, *GT.quantize_q8_k(a), out, threads)
    return run, 2.0 * rows * k * per * active


def rebuild_gflops(run, flops: float, reps: int = 9) -> float:
    run()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
    return flops / statistics.median(ts) / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--test-backend-ops", dest="tbo", help="llama.cpp's test-backend-ops binary")
    ap.add_argument("--types", nargs="+", default=["Q4_K", "Q6_K", "IQ4_XS"], choices=list(GGML_NAMES))
    ap.add_argument("--tokens", nargs="+", type=int, default=[128, 512])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--case", choices=list(CASES), default="4x32")
    args = ap.parse_args(argv)
    if not GT.HAVE_TILED:
        print("this CPU has no AVX-512 VNNI: ggml's VNNI microtile is not what it runs", file=sys.stderr)
        return 2
    numba.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # as test-backend-ops sets its CPU backend
    rng = np.random.default_rng(0)
    experts, used, rows, k = CASES[args.case]
    print(f"{numba.get_num_threads()} thread(s); MUL_MAT_ID {used} of {experts} experts {rows} x {k}")
    print(f"{'type':7s} {'n':>4s} {'tok/exp':>7s} {'ggml':>8s} {'rebuild':>8s} {'ratio':>6s}")
    for fmt in args.types:
        for n in args.tokens:
            run, flops = rebuild_job(fmt, n, rng, args.case)
            ours, theirs = [], []
            for _ in range(args.rounds):
                if args.tbo:
                    g = ggml_gflops(args.tbo, GGML_NAMES[fmt], n, args.case)
                    if g is not None:
                        theirs.append(g)
                ours.append(rebuild_gflops(run, flops))
            o = statistics.median(ours)
            t = statistics.median(theirs) if theirs else float("nan")
            print(f"{fmt:7s} {n:4d} {n * used // experts:7d} {t:8.1f} {o:8.1f} {o / t:6.2f}", flush=True)
            del run
    return 0


if __name__ == "__main__":
    sys.exit(main())
