"""Register tiles of prefill attention (attention.py's query blocks): a block of QB = 4 queries of one head against
16 keys at a time for the scores, and against 32 of the head's dimensions at a time for the weighted sum of values.

Attention one query at a time (attention._attend) loads each key and value row once per query, and its value sum
keeps the output row in memory: a load and a store per multiply-add. Four queries share each load here, and their
sums stay in registers: the scores as QB x 16 keys (the keys transposed, [hd, T], so that a head dimension's 16 keys
are one row: 2 loads, 4 broadcasts, 8 FMAs per dimension), the values as QB x 32 dimensions (4 loads, 4 broadcasts,
16 FMAs a key). The value sums add the keys in order, as _attend does; the scores sum the head dimensions in order
(_attend's dot_f32 in two interleaved halves), so they round apart from the decode path's.
Without AVX2, the same sums as plain loops.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from .nbcache import drop_stale_cache
from .simd import F32, HAVE_AVX2, I8, I64, V, _fn, _splat

drop_stale_cache(__file__)

QB = 4  # queries a block
KT_KEYS = 16  # keys a scores tile
PV_DIMS = 32  # head dimensions a value tile


def _row(builder, ary, i, stride):
    """Byte pointer to row i of a 2-D array (its first stride)."""
    return builder.gep(builder.bitcast(ary.data, I8.as_pointer()), [builder.mul(stride, i)])


def _vec(builder, p, off_floats):
    """<8 x float>* at float offset off_floats (an i64 value) from byte pointer p."""
    return builder.bitcast(builder.gep(builder.bitcast(p, F32.as_pointer()), [off_floats]), V(F32, 8).as_pointer())


def _scores_ir(context, builder, sig, args):
    """S[q, t0:t0 + 16] = sum over d of Q[q, d] KT[d, t0:t0 + 16], q < QB (Q [QB, hd], KT [hd, T], S [QB, T])."""
    Q, KT, S = (cgutils.create_struct_proxy(sig.args[i])(context, builder, value=args[i]) for i in (0, 1, 3))
    t0 = args[2]
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    hd = cgutils.unpack_tuple(builder, Q.shape, 2)[1]
    qs, ks, ss = (cgutils.unpack_tuple(builder, a.strides, 2)[0] for a in (Q, KT, S))
    fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
    zero = ir.Constant(V(F32, 8), [0.0] * 8)
    acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(2)] for _ in range(QB)]
    qrows = [builder.bitcast(_row(builder, Q, i64(q), qs), F32.as_pointer()) for q in range(QB)]
    with cgutils.for_range(builder, hd) as loop:
        d = loop.index
        krow = _row(builder, KT, d, ks)
        kv = [builder.load(_vec(builder, krow, builder.add(t0, i64(8 * j))), align=4) for j in range(2)]
        for q in range(QB):
            b = _splat(builder, builder.load(builder.gep(qrows[q], [d])), 8)
            for j in range(2):
                builder.store(builder.call(fma, [b, kv[j], builder.load(acc[q][j])]), acc[q][j])
    for q in range(QB):
        srow = _row(builder, S, i64(q), ss)
        for j in range(2):
            builder.store(builder.load(acc[q][j]), _vec(builder, srow, builder.add(t0, i64(8 * j))), align=4)
    return context.get_dummy_value()


def _values_ir(context, builder, sig, args):
    """O[q, d0:d0 + 32] += sum over t < tn of P[q, t] Vr[t, d0:d0 + 32], keys in order (P [QB, T], Vr [T, hd])."""
    P, Vr, O = (cgutils.create_struct_proxy(sig.args[i])(context, builder, value=args[i]) for i in (0, 1, 4))
    tn, d0 = args[2], args[3]
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    ps, vs, os_ = (cgutils.unpack_tuple(builder, a.strides, 2)[0] for a in (P, Vr, O))
    fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
    orows = [_row(builder, O, i64(q), os_) for q in range(QB)]
    acc = [[cgutils.alloca_once_value(builder, builder.load(_vec(builder, orows[q], builder.add(d0, i64(8 * j))),
                                                              align=4)) for j in range(4)] for q in range(QB)]
    prows = [builder.bitcast(_row(builder, P, i64(q), ps), F32.as_pointer()) for q in range(QB)]
    with cgutils.for_range(builder, tn) as loop:
        t = loop.index
        vrow = _row(builder, Vr, t, vs)
        vv = [builder.load(_vec(builder, vrow, builder.add(d0, i64(8 * j))), align=4) for j in range(4)]
        for q in range(QB):
            b = _splat(builder, builder.load(builder.gep(prows[q], [t])), 8)
            for j in range(4):
                builder.store(builder.call(fma, [b, vv[j], builder.load(acc[q][j])]), acc[q][j])
    for q in range(QB):
        for j in range(4):
            builder.store(builder.load(acc[q][j]), _vec(builder, orows[q], builder.add(d0, i64(8 * j))), align=4)
    return context.get_dummy_value()


if HAVE_AVX2:
    @intrinsic
    def scores_tile(typingctx, Q, KT, t0, S):
        """S[q, t0:t0 + 16] = Q[q] . KT[:, t0 + i] for the QB queries (Q [QB, hd], KT [hd, T] keys transposed)."""
        return types.none(Q, KT, t0, S), _scores_ir

    @intrinsic
    def values_tile(typingctx, P, Vr, tn, d0, O):
        """O[q, d0:d0 + 32] += sum over keys t < tn, in order, of P[q, t] Vr[t, d0:d0 + 32]."""
        return types.none(P, Vr, tn, d0, O), _values_ir
else:
    @njit(fastmath=True, inline="always")
    def scores_tile(Q, KT, t0, S):
        for q in range(QB):
            for i in range(KT_KEYS):
                a = np.float32(0.0)
                for d in range(Q.shape[1]):
                    a = np.float32(a + Q[q, d] * KT[d, t0 + i])
                S[q, t0 + i] = a

    @njit(fastmath=True, inline="always")
    def values_tile(P, Vr, tn, d0, O):
        for q in range(QB):
            for i in range(PV_DIMS):
                a = O[q, d0 + i]
                for t in range(tn):
                    a = np.float32(a + P[q, t] * Vr[t, d0 + i])
                O[q, d0 + i] = a
