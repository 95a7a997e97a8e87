"""Would int8 activations make the CPU expert kernel faster? ggml's AVX2 kernel, rebuilt, beside the executor's.

    python benchmarks/bench_int8_kernel.py [--threads 2] [--rounds 15]

The executor dots int16 activations with `vpmaddwd` (executor/simd.py): 16 products an
instruction, two per row and 32-weight block. llama.cpp's ggml quantises activations to int8 and
multiplies with `vpmaddubsw` (32 products an instruction), but without VNNI it must widen the int16
pair sums with a `vpmaddwd` by ones and make the weights unsigned with two `vpsignb`
(`mul_sum_i8_pairs_float`): two multiply-pipe instructions per row and block, as many as the
executor's, and two more ALU ones. Here that kernel is built the same way as the executor's (AVX2
intrinsics in numba, 4-row groups, the next group prefetched) and both are timed on the same
synthetic decode jobs (k random experts of a pool larger than the caches, each matrix's rows split
across the threads, `calibration.bench_kernel.KernelBench`'s fit c_a + c_b k over the fastest clean
round, as `calibrate` takes it), in interleaved rounds. Without AVX2 there is nothing to compare and the script says so.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange
from numba.core import types
from numba.extending import intrinsic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.bench_kernel import _ROW_BYTES, KernelBench, _synth_tensor, executor_expert_job  # noqa: E402
from calibration.ggml_vec_dot import quantize_row_q8_0, rows_i8_codegen  # noqa: E402
from executor.simd import HAVE_AVX2  # noqa: E402

Q4_0 = 3  # executor.kernels type code (Q8_0 = 2)
NR = 4  # rows per group


if HAVE_AVX2:
    @intrinsic
    def rows_q8_i8(typingctx, w, wo, rb, x8, dx, nb, res, ro):
        return types.none(w, wo, rb, x8, dx, nb, res, ro), rows_i8_codegen(False, NR, True)

    @intrinsic
    def rows_q4_i8(typingctx, w, wo, rb, x8, dx, nb, res, ro):
        return types.none(w, wo, rb, x8, dx, nb, res, ro), rows_i8_codegen(True, NR, True)

    @njit(parallel=True, nogil=True, fastmath=True)
    def mul_mat_id(code, w, experts, rows, x, out):
        """out [n, rows] = W_{experts[i]} x[i]; x quantised to int8 once per row; (expert, 32-row chunk)
        items across the threads, as ggml's MUL_MAT_ID splits them. rows a multiple of NR."""
        n, cols = x.shape
        x8 = np.empty((n, cols), np.int8)
        dx = np.empty((n, cols // 32), np.float32)
        for i in range(n):
            quantize_row_q8_0(x[i], x8[i], dx[i])
        rb = w.shape[1] // rows
        nch = (rows + 31) // 32
        nb = np.int64(cols // 32)
        for it in prange(n * nch):
            i, c = it // nch, it % nch
            for r in range(c * 32, min(rows, c * 32 + 32), NR):
                if code == Q4_0:
                    rows_q4_i8(w[experts[i]], np.int64(r * rb), np.int64(rb), x8[i], dx[i], nb, out[i], np.int64(r))
                else:
                    rows_q8_i8(w[experts[i]], np.int64(r * rb), np.int64(rb), x8[i], dx[i], nb, out[i], np.int64(r))


def moe_i8(gate, up, down, x, experts, wts):
    """One token's SwiGLU experts with int8 activations -> [H]: gate, up, down each one MUL_MAT_ID."""
    flat = lambda t: t.data.reshape(t.data.shape[0], -1)  # noqa: E731
    n = experts.shape[0]
    xs = np.ascontiguousarray(np.broadcast_to(x, (n, x.shape[0])))
    g = np.empty((n, gate.rows), np.float32)
    u = np.empty((n, up.rows), np.float32)
    y = np.empty((n, down.rows), np.float32)
    mul_mat_id(gate.code, flat(gate), experts, gate.rows, xs, g)
    mul_mat_id(up.code, flat(up), experts, up.rows, xs, u)
    mul_mat_id(down.code, flat(down), experts, down.rows, (g / (1.0 + np.exp(-g)) * u).astype(np.float32), y)
    return wts @ y


def int8_expert_job(fmt: str, hidden: int, ffn: int, pool_bytes: int, max_k: int, seed: int = 0):
    """(run_job, expert_bytes): executor_expert_job's jobs through moe_i8."""
    rng = np.random.default_rng(seed)
    ebytes = 2 * ffn * _ROW_BYTES[fmt](hidden) + hidden * _ROW_BYTES[fmt](ffn)
    pool = max(max_k, int(pool_bytes // ebytes))
    gate, up = _synth_tensor(fmt, pool, ffn, hidden, rng), _synth_tensor(fmt, pool, ffn, hidden, rng)
    down = _synth_tensor(fmt, pool, hidden, ffn, rng)
    x = rng.standard_normal(hidden).astype(np.float32)

    def run_job(k: int, first: int):
        moe_i8(gate, up, down, x, ((np.arange(k) + first) % pool).astype(np.int32), np.full(k, 1.0 / k, np.float32))
    return run_job, ebytes, (gate, up, down, x)


def max_rel_error(fmt: str) -> tuple[float, float]:
    """Both kernels on 2 experts against the gguf package's dequantise-then-matmul: max |error| / max |ref|."""
    from gguf import dequantize

    from executor import cpu_experts
    run, _, (gate, up, down, x) = int8_expert_job(fmt, 2048, 768, 0, 4)
    ex, w = np.array([1, 3], np.int32), np.array([0.6, 0.4], np.float32)
    deq = lambda t, e: dequantize(t.data[e], t.qtype).reshape(t.rows, t.cols)  # noqa: E731
    ref = np.zeros(2048, np.float32)
    for e, wt in zip(ex, w):
        g, u = deq(gate, e) @ x, deq(up, e) @ x
        ref += wt * (deq(down, e) @ (g / (1 + np.exp(-g)) * u))
    i8 = moe_i8(gate, up, down, x, ex, w)
    route = cpu_experts.csr(ex[None].astype(np.int64), w[None])
    i16 = cpu_experts.moe_cpu(gate, up, down, x[None], *route, whole=False)[0]
    scale = np.abs(ref).max()
    return float(np.abs(i8 - ref).max() / scale), float(np.abs(i16 - ref).max() / scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    if not HAVE_AVX2:
        print("no AVX2 on this CPU: the int8 kernel is AVX2-only; nothing to compare")
        return
    numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))
    ks = (1, 2, 4, 6, 8)
    print(f"{a.threads} threads, SwiGLU 2048x768 experts, k = {ks}, {a.rounds} interleaved rounds")
    for fmt in ("Q4_0", "Q8_0"):
        e8, e16 = max_rel_error(fmt)
        i8_job, eb, _ = int8_expert_job(fmt, 2048, 768, 128 << 20, max(ks))
        i16_job, _ = executor_expert_job(fmt, 2048, 768, 128 << 20, max(ks))
        benches = {name: KernelBench(job, ks, eb, label=name, threads=a.threads)
                   for name, job in (("int8 (ggml)", i8_job), ("int16 (executor)", i16_job))}
        for _ in range(a.rounds):  # interleaved: both kernels see the same spells of the VM
            for kb in benches.values():
                kb.sample(1, 10.0)
        res = {name: kb.result() for name, kb in benches.items()}
        r8, r16 = res["int8 (ggml)"].expert_gbs, res["int16 (executor)"].expert_gbs
        print(f"{fmt}: int8 activations {r8:.1f} GB/s, int16 (executor) {r16:.1f} GB/s -> int8 / int16 = "
              f"{r8 / r16:.2f}x; max relative error against dequantise-then-matmul: int8 {e8:.1e}, int16 {e16:.1e}")


if __name__ == "__main__":
    main()
