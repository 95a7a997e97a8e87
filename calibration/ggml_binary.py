"""ggml's elementwise multiply as llama.cpp's MoE layer runs it on the CPU, rebuilt: after the down products,
build_moe_ffn weights each expert's output by its router weight, `ggml_mul(experts, weights)` with experts
[n_embd, k, n] and weights [1, k, n] (llama-graph.cpp). ggml-cpu's binary-ops.cpp `apply_binary_op` splits the
k * n rows evenly over the threads (common.h get_thread_range) and, src1's rows being contiguous, walks each row in
n_embd / ne10 = n_embd repeats of `vec_binary_op_contiguous` over ne10 = 1 value: one scalar multiply a value.

What that costs is the loop GCC makes of it (12.2, -O3 -march=native, llama-cpp-python 0.3.36's ggml): short of
general registers in ggml_compute_forward_mul, it keeps the repeat loop's rebased src1 pointer in a vector register
(xmm7) and moves it to a general one and back twice a value (vmovq), a dependency chain of four moves and an add
that sets the pace, ~13 cycles a value where the multiply needs one. A plain loop compiled by LLVM runs 2-3x faster
than ggml's (1.1-1.4 ns a value on one Zen 4 core against test-backend-ops' 3.6), so the rebuild carries the same
chain: the pointer's offset through a vector register twice a value. perf of llama-bench
pp512 on a top-8 model of 2048-wide rows (Zen 4, 2026-12-06): 8.3% of the samples in ggml_compute_forward_mul.
Timed by calibrate into cpu.ggml_prefill_gflops['F32:weighting'] (giga-values a second a core); against ggml's own:
benchmarks/bench_ggml_binary.py."""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic


@intrinsic
def _via_vector_register(typingctx, v):
    """v (int64) moved to a vector register and back: its bits as a double through llvm.arithmetic.fence (which no
    pass sees through, and which keeps the value in a floating-point register), so two vmovq on x86-64: GCC's spill of
    a loop-carried pointer, whose latency the loop then waits on."""
    def codegen(context, builder, signature, args):
        dbl = ir.DoubleType()
        fence = builder.module.declare_intrinsic("llvm.arithmetic.fence", [dbl], ir.FunctionType(dbl, [dbl]))
        d = builder.call(fence, [builder.bitcast(args[0], dbl)])
        return builder.bitcast(d, ir.IntType(64))
    return types.int64(types.int64), codegen


@njit(inline="always")
def _contiguous(z, x, y, zo, xo, n):
    """vec_binary_op_contiguous<op_mul>: z[zo + i] = x[xo + i] * y[i] for i < n."""
    for i in range(n):
        z[zo + i] = x[xo + i] * y[i]


@njit(parallel=True, nogil=True, cache=True)
def _apply_mul(src0, src1, dst, ne10, nthr):
    """apply_binary_op<op_mul, float, float, float> with contiguous src1 rows: src0, dst [rows, ne00], src1
    [rows, ne10]; thread th takes rows [dr * th, dr * th + dr), dr = ceil(rows / nthr) (get_thread_range), each
    row in ne00 / ne10 calls over ne10 values."""
    rows, ne00 = src0.shape
    nr0 = ne00 // ne10
    dr = (rows + nthr - 1) // nthr
    for th in prange(nthr):
        i1 = min(dr * th + dr, rows)
        for row in range(dr * th, i1):
            x, z, y = src0[row], dst[row], src1[row]
            c = np.int64(0)  # src1's offset rebased by the repeat's (-r * ne10), as GCC keeps it
            for r in range(nr0):
                o = r * ne10
                _contiguous(z, x, y[c + o:], o, o, ne10)
                c = _via_vector_register(_via_vector_register(c) - ne10)  # the loop's pace: two round trips


def weight_expert_outputs(experts: np.ndarray, weights: np.ndarray, out: np.ndarray, nthr: int) -> None:
    """out [n, k, n_embd] = experts [n, k, n_embd] x weights [n, k] (broadcast over n_embd), float32, as ggml's MUL of
    build_moe_ffn runs it on `nthr` threads."""
    n, k, h = experts.shape
    if weights.shape != (n, k) or out.shape != experts.shape:
        raise ValueError(f"weights {weights.shape} and out {out.shape} against experts {experts.shape}")
    _apply_mul(experts.reshape(n * k, h), weights.reshape(n * k, 1), out.reshape(n * k, h), np.int64(1), nthr)


def weighting_job(hidden: int = 2048, top_k: int = 8, tokens: int = 512, seed: int = 0):
    """(run, values): one prefill batch's weighting of its expert outputs, `tokens` x `top_k` rows of `hidden`."""
    rng = np.random.default_rng(seed)
    experts = rng.standard_normal((tokens, top_k, hidden), dtype=np.float32)
    weights = rng.random((tokens, top_k), dtype=np.float32)
    out = np.empty_like(experts)

    def run():
        weight_expert_outputs(experts, weights, out, numba.get_num_threads())
    return run, tokens * top_k * hidden
