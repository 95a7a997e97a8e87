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


def _tile_ir(nv: int, accumulate: bool):
    """Codegen: Out[q, at:at + 8 nv] (+)= sum over k < K, in order, of A[q, k] B[k, at:at + 8 nv] for the QB rows q
    (A [QB, >= K], B [>= K, ...], Out [QB, ...], float32 with unit inner strides): one broadcast of A[q, k] and nv
    FMAs a row q, B's nv vectors loaded once for all QB; the QB x nv sums in registers."""
    def gen(context, builder, sig, args):
        A, B, Out = (cgutils.create_struct_proxy(sig.args[i])(context, builder, value=args[i]) for i in (0, 1, 4))
        K, at = args[2], args[3]
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        a_s, b_s, o_s = (cgutils.unpack_tuple(builder, x.strides, 2)[0] for x in (A, B, Out))
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        orows = [_row(builder, Out, i64(q), o_s) for q in range(QB)]
        outv = [[_vec(builder, orows[q], builder.add(at, i64(8 * j))) for j in range(nv)] for q in range(QB)]
        zero = ir.Constant(V(F32, 8), [0.0] * 8)
        acc = [[cgutils.alloca_once_value(builder, builder.load(outv[q][j], align=4) if accumulate else zero)
                for j in range(nv)] for q in range(QB)]
        arows = [builder.bitcast(_row(builder, A, i64(q), a_s), F32.as_pointer()) for q in range(QB)]
        with cgutils.for_range(builder, K) as loop:
            k = loop.index
            brow = _row(builder, B, k, b_s)
            bv = [builder.load(_vec(builder, brow, builder.add(at, i64(8 * j))), align=4) for j in range(nv)]
            for q in range(QB):
                a = _splat(builder, builder.load(builder.gep(arows[q], [k])), 8)
                for j in range(nv):
                    builder.store(builder.call(fma, [a, bv[j], builder.load(acc[q][j])]), acc[q][j])
        for q in range(QB):
            for j in range(nv):
                builder.store(builder.load(acc[q][j]), outv[q][j], align=4)
        return context.get_dummy_value()
    return gen


@njit(fastmath=True)
def scores_plain(Q, KT, t0, S):
    """scores_tile as plain loops (CPUs without AVX2; the reference the tile is tested against)."""
    for q in range(QB):
        for i in range(KT_KEYS):
            a = np.float32(0.0)
            for d in range(Q.shape[1]):
                a = np.float32(a + Q[q, d] * KT[d, t0 + i])
            S[q, t0 + i] = a


@njit(fastmath=True)
def values_plain(P, Vr, tn, d0, O):
    """values_tile as plain loops."""
    for q in range(QB):
        for i in range(PV_DIMS):
            a = O[q, d0 + i]
            for t in range(tn):
                a = np.float32(a + P[q, t] * Vr[t, d0 + i])
            O[q, d0 + i] = a


if HAVE_AVX2:
    @intrinsic
    def _scores(typingctx, Q, KT, hd, t0, S):
        return types.none(Q, KT, hd, t0, S), _tile_ir(KT_KEYS // 8, False)

    @njit(inline="always")
    def scores_tile(Q, KT, t0, S):
        """S[q, t0:t0 + 16] = Q[q] . KT[:, t0 + i] for the QB queries (Q [QB, hd], KT [hd, T] keys transposed)."""
        _scores(Q, KT, np.int64(Q.shape[1]), t0, S)

    @intrinsic
    def values_tile(typingctx, P, Vr, tn, d0, O):
        """O[q, d0:d0 + 32] += sum over keys t < tn, in order, of P[q, t] Vr[t, d0:d0 + 32]."""
        return types.none(P, Vr, tn, d0, O), _tile_ir(PV_DIMS // 8, True)
else:
    scores_tile, values_tile = scores_plain, values_plain
