"""The prefill GEMM (gemm.deq_matmul: 6-row x 16-token register tiles over 256-column slices of rows dequantised
in place) on one core, against this core's fp32 FMA peak measured beside it:

    python benchmarks/bench_gemm.py [--dir /tmp/moe-offload-bench] [--presets small small-q4 small-q4k] [--tokens 48 128 256]
    python benchmarks/bench_gemm.py --moe 512 [--threads 2]

For each preset, expert 0's gate and down matrices times m random tokens (packing included), the matrix in
cache after the first round; GFLOP/s (2 m rows cols / s, median of --rounds) and its share of the peak
(12 independent 8-lane FMA chains in registers: what the two FMA pipes can do). --moe T: a whole prefill
batch of T tokens through cpu_experts.moe_cpu instead (calibration's prefill job: `small`'s expert shape,
32 synthetic experts, top-8; Q8_0, Q4_0, Q4_K) on --threads threads: GFLOP/s of the batch.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.local import ensure_model  # noqa: E402
from executor import kernels as K  # noqa: E402
from executor import row_products as RP  # noqa: E402
from executor.gemm import pack_tokens  # noqa: E402
from executor.gguf_model import GGUFModel  # noqa: E402

_V8 = ir.VectorType(ir.FloatType(), 8)


@intrinsic
def _fma_chains(typingctx, n):
    """n steps of 12 independent <8 x float> FMA chains -> one lane of their sum (kept live)."""
    def gen(context, builder, sig, args):
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V8, [_V8] * 3), "llvm.fma.v8f32")
        acc = [cgutils.alloca_once_value(builder, ir.Constant(_V8, [float(i)] * 8)) for i in range(12)]
        a, b = ir.Constant(_V8, [1.0000001] * 8), ir.Constant(_V8, [0.9999999] * 8)
        with cgutils.for_range(builder, args[0]):
            for p in acc:
                builder.store(builder.call(fma, [builder.load(p), a, b]), p)
        s = builder.load(acc[0])
        for p in acc[1:]:
            s = builder.fadd(s, builder.load(p))
        return builder.extract_element(s, ir.Constant(ir.IntType(32), 0))
    return types.float32(n), gen


@njit
def _peak(n):
    return _fma_chains(n)


def fma_peak_gflops(steps: int = 100_000_000, rounds: int = 3) -> float:
    """This core's fp32 FMA peak, GFLOP/s (best of `rounds`)."""
    _peak(10)
    best = 0.0
    for _ in range(rounds):
        t = time.perf_counter()
        _peak(steps)
        best = max(best, 12 * 8 * 2 * steps / (time.perf_counter() - t) / 1e9)
    return best


def _gemm(code, w, R, rb, X, res, reps):
    """The packed GEMM (packing timed too), through row_products' entry point: the code a constant in it, as in the
    executor's C functions (a literal argument ran it ~15x slower)."""
    for _ in range(reps):
        RP.py_deq_matmul(code, w, 0, R, rb, pack_tokens(X), X.shape[0], res, 0)


def moe_batches(tokens: int, threads: int, rounds: int) -> int:
    """Print GFLOP/s of a `tokens`-token MoE prefill batch per expert format (median of `rounds`)."""
    from calibration.bench_kernel import executor_prefill_job
    K.set_threads(threads)
    for fmt in ("Q8_0", "Q4_0", "Q4_K"):
        run, flops = executor_prefill_job(fmt, tokens=tokens)
        run()
        ts = []
        for _ in range(rounds):
            t = time.perf_counter()
            run()
            ts.append(time.perf_counter() - t)
        dt = statistics.median(ts)
        print(f"{fmt} MoE prefill batch, {tokens} tokens, {threads} threads: {dt * 1e3:.0f} ms, "
              f"{flops / dt / 1e9:.1f} GFLOP/s", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/moe-offload-bench")
    ap.add_argument("--presets", nargs="+", default=["small", "small-q4", "small-q4k"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[48, 128, 256])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--moe", type=int, metavar="T", help="time a T-token MoE prefill batch instead")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a.moe:
        return moe_batches(a.moe, a.threads, a.rounds)
    K.set_threads(1)
    peak = fma_peak_gflops()
    print(f"fp32 FMA peak, one core: {peak:.1f} GFLOP/s")
    for preset in a.presets:
        model = GGUFModel(ensure_model(preset, a.dir, engram=False))
        for part in ("gate", "down"):
            W = model.experts(0, part)
            w, R = K.flat(W)[0], W.rows
            rb = w.shape[0] // R
            line = []
            for m in a.tokens:
                X = np.random.default_rng(m).standard_normal((m, W.cols)).astype(np.float32)
                res = np.empty((m, R), np.float32)
                _gemm(W.code, w, R, rb, X, res, 1)
                ts = []
                for _ in range(a.rounds):
                    t = time.perf_counter()
                    _gemm(W.code, w, R, rb, X, res, 1)
                    ts.append(time.perf_counter() - t)
                g = 2 * m * R * W.cols / statistics.median(ts) / 1e9
                line.append(f"m={m} {g:.1f} GFLOP/s ({g / peak:.0%})")
            print(f"{preset} {part} {R}x{W.cols} ({W.qtype.name}): " + "; ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
