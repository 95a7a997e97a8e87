"""ggml's AVX2 dot product of Q8_0 / Q4_0 rows with int8-quantised activations, rebuilt as numba intrinsics.

llama.cpp quantises each op's activations to Q8_0 (ggml's `quantize_row_q8_0`: int8 and one float scale per
32-block) and dots them with `vec_dot_q8_0_q8_0` / `vec_dot_q4_0_q8_0` (ggml-cpu arch/x86/quants.c): per
block the weights as int8 (Q4_0's nibbles minus 8), |w| times sign(w) x with `vpmaddubsw`, the pair sums to
int32 by a `vpmaddwd` with ones (`mul_sum_i8_pairs_float`, AVX2 without VNNI), converted and fused-multiplied
with the two blocks' scales into one 8-lane accumulator, summed across lanes at the end. The codegen here
is that loop for `nr` rows against one token (nr = 1 is ggml's vec_dot; benchmarks/bench_int8_kernel.py
times nr = 4 against the executor's int16 kernel). The executor keeps int16 activations (executor/simd.py):
int8's 1e-2 relative error fails its logits bar, so this kernel only times ggml's prefill structures
(calibration.bench_ggml_prefill). AVX2 only: HAVE_AVX2 says whether the intrinsics exist.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from executor.simd import F32, HAVE_AVX2, I8, I16, I32, I64, V, _fn, _splat, hsum8


def rows_i8_codegen(q4: bool, nr: int, prefetch: bool):
    """Codegen: res[ro + k] = row_k . (x8 * dx), k < nr, for Q8_0 / Q4_0 rows at byte woff + k * rb of w
    (nb 32-blocks each); with `prefetch` the next nr-row group is prefetched a block ahead."""
    bs = 18 if q4 else 34

    def gen(context, builder, sig, args):
        wa, woff, rb, xa, da, nb, ra, roff = args
        data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        wd, xd, dd, rd = data(0, wa), data(3, xa), data(4, da), data(6, ra)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(V(F32, 8), [0.0] * 8)) for _ in range(nr)]
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        psign = _fn(builder, "llvm.x86.avx2.psign.b", V(I8, 32), [V(I8, 32)] * 2)
        maddubs = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", V(I16, 16), [V(I8, 32)] * 2)
        pmadd = _fn(builder, "llvm.x86.avx2.pmadd.wd", V(I32, 8), [V(I16, 16)] * 2)
        pref = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
        ones = ir.Constant(V(I16, 16), [1] * 16)
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        pfo = builder.add(woff, builder.mul(rb, i64(nr)))  # the next row group
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            if prefetch:
                pf = builder.gep(wd, [builder.add(pfo, builder.mul(b, i64(bs)))])
                for k in range(nr):
                    builder.call(pref, [builder.gep(pf, [builder.mul(rb, i64(k))]), ir.Constant(I32, 0),
                                        ir.Constant(I32, 3), ir.Constant(I32, 1)])
            xv = builder.load(builder.bitcast(builder.gep(xd, [builder.mul(b, i64(32))]), V(I8, 32).as_pointer()),
                              align=1)
            dxb = builder.load(builder.gep(dd, [b]))
            for k in range(nr):
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
        for k in range(nr):
            builder.store(hsum8(builder, builder.load(accs[k])), builder.gep(rd, [builder.add(roff, ir.Constant(I64, k))]))
        return context.get_dummy_value()

    return gen


if HAVE_AVX2:
    @intrinsic
    def vec_dot_q8_0(typingctx, w, wo, rb, x8, dx, nb, res, ro):
        """res[ro] = the Q8_0 row at byte wo of w . x8 * dx (ggml's ggml_vec_dot_q8_0_q8_0)."""
        return types.none(w, wo, rb, x8, dx, nb, res, ro), rows_i8_codegen(False, 1, False)

    @intrinsic
    def vec_dot_q4_0(typingctx, w, wo, rb, x8, dx, nb, res, ro):
        """res[ro] = the Q4_0 row at byte wo of w . x8 * dx (ggml's ggml_vec_dot_q4_0_q8_0)."""
        return types.none(w, wo, rb, x8, dx, nb, res, ro), rows_i8_codegen(True, 1, False)


@njit(fastmath=True, cache=True)
def quantize_row_q8_0(x, x8, dx):
    """x [n] -> x8 int8, dx [n/32] float32 with x ~= x8 * dx per 32-block (ggml's quantize_row_q8_0)."""
    for b in range(x.shape[0] // 32):
        m = np.float32(0.0)
        for j in range(32):
            m = max(m, abs(x[b * 32 + j]))
        d = m / np.float32(127.0)
        inv = np.float32(1.0) / d if m > 0 else np.float32(0.0)
        for j in range(32):
            x8[b * 32 + j] = np.int8(np.round(x[b * 32 + j] * inv))
        dx[b] = d
