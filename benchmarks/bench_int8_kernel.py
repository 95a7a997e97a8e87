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
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.bench_kernel import _ROW_BYTES, KernelBench, _synth_tensor, executor_expert_job  # noqa: E402
from executor.simd import F32, HAVE_AVX2, I8, I16, I32, I64, V, _fn, _splat, hsum8  # noqa: E402

Q4_0 = 3  # executor.kernels type code (Q8_0 = 2)
NR = 4  # rows per group


def _rows_i8(q4: bool):
    """Codegen: res[ro + k] = row_k . (x8 * dx) for NR Q8_0 / Q4_0 rows at byte woff + k * rb (ggml-cpu's
    AVX2 vec_dot_q{8,4}_0_q8_0: weights to int8, Q4_0's nibbles minus 8; |w| times sign(w) x with
    vpmaddubsw; pairs to int32 by a vpmaddwd with ones; convert; fma with the two block scales)."""
    bs = 18 if q4 else 34

    def gen(context, builder, sig, args):
        wa, woff, rb, xa, da, nb, ra, roff = args
        data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        wd, xd, dd, rd = data(0, wa), data(3, xa), data(4, da), data(6, ra)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(V(F32, 8), [0.0] * 8)) for _ in range(NR)]
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        psign = _fn(builder, "llvm.x86.avx2.psign.b", V(I8, 32), [V(I8, 32)] * 2)
        maddubs = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", V(I16, 16), [V(I8, 32)] * 2)
        pmadd = _fn(builder, "llvm.x86.avx2.pmadd.wd", V(I32, 8), [V(I16, 16)] * 2)
        pref = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
        ones = ir.Constant(V(I16, 16), [1] * 16)
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        pfo = builder.add(woff, builder.mul(rb, i64(NR)))  # the next row group
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            pf = builder.gep(wd, [builder.add(pfo, builder.mul(b, i64(bs)))])
            for k in range(NR):
                builder.call(pref, [builder.gep(pf, [builder.mul(rb, i64(k))]), ir.Constant(I32, 0),
                                    ir.Constant(I32, 3), ir.Constant(I32, 1)])
            xv = builder.load(builder.bitcast(builder.gep(xd, [builder.mul(b, i64(32))]), V(I8, 32).as_pointer()),
                              align=1)
            dxb = builder.load(builder.gep(dd, [b]))
            for k in range(NR):
                p = builder.gep(wd, [builder.add(builder.add(woff, builder.mul(rb, i64(k))), builder.mul(b, i64(bs)))])
                pq = builder.gep(p, [i64(2)])
                if q4:  # bytes_from_nibbles_32, minus 8
                    qv = builder.load(builder.bitcast(pq, V(I8, 16).as_pointer()), align=1)
                    lo = builder.and_(qv, ir.Constant(V(I8, 16), [0x0F] * 16))
                    hi = builder.lshr(qv, ir.Constant(V(I8, 16), [4] * 16))
                    w = builder.shuffle_vector(lo, hi, ir.Constant(V(I32, 32), list(range(32))))
                    w = builder.sub(w, ir.Constant(V(I8, 32), [8] * 32))
                else:
                    w = builder.load(builder.bitcast(pq, V(I8, 32).as_pointer()), align=1)
                dots = builder.call(maddubs, [builder.call(psign, [w, w]), builder.call(psign, [xv, w])])
                m = builder.call(pmadd, [dots, ones])  # [8] int32
                h = builder.load(builder.bitcast(p, ir.HalfType().as_pointer()), align=1)
                d = builder.fmul(builder.fpext(h, F32), dxb)
                builder.store(builder.call(fma, [builder.sitofp(m, V(F32, 8)), _splat(builder, d, 8),
                                                 builder.load(accs[k])]), accs[k])
        for k in range(NR):
            builder.store(hsum8(builder, builder.load(accs[k])), builder.gep(rd, [builder.add(roff, ir.Constant(I64, k))]))
        return context.get_dummy_value()

    return gen


if HAVE_AVX2:
    @intrinsic
    def rows_q8_i8(typingctx, w, wo, rb, x8, dx, nb, res, ro):
        return types.none(w, wo, rb, x8, dx, nb, res, ro), _rows_i8(False)

    @intrinsic
    def rows_q4_i8(typingctx, w, wo, rb, x8, dx, nb, res, ro):
        return types.none(w, wo, rb, x8, dx, nb, res, ro), _rows_i8(True)

    @njit(fastmath=True)
    def quant8(x, x8, dx):
        """x [n] -> x8 int8, dx [n/32] with x ~= x8 * dx per 32-block (ggml's quantize_row_q8_0)."""
        for b in range(x.shape[0] // 32):
            m = np.float32(0.0)
            for j in range(32):
                m = max(m, abs(x[b * 32 + j]))
            d = m / np.float32(127.0)
            inv = np.float32(1.0) / d if m > 0 else np.float32(0.0)
            for j in range(32):
                x8[b * 32 + j] = np.int8(np.round(x[b * 32 + j] * inv))
            dx[b] = d

    @njit(parallel=True, nogil=True, fastmath=True)
    def mul_mat_id(code, w, experts, rows, x, out):
        """out [n, rows] = W_{experts[i]} x[i]; x quantised to int8 once per row; (expert, 32-row chunk)
        items across the threads, as ggml's MUL_MAT_ID splits them. rows a multiple of NR."""
        n, cols = x.shape
        x8 = np.empty((n, cols), np.int8)
        dx = np.empty((n, cols // 32), np.float32)
        for i in range(n):
            quant8(x[i], x8[i], dx[i])
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
