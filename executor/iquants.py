"""llama.cpp's non-linear 4-bit types read in place: IQ4_NL (32-weight blocks: fp16 d, 16 bytes of nibbles) and
IQ4_XS (256-weight super-blocks: fp16 d, eight 6-bit sub-block scales, the same nibbles), the expert types of its
IQ4_NL / IQ4_XS files. A nibble indexes a 16-entry int8 codebook (kvalues_iq4nl, ggml-common.h); value l of a
32-block is K[qs[l] & 15], value 16 + l is K[qs[l] >> 4] (ggml-quants.c dequantize_row_iq4_nl / _iq4_xs).

Row kernels on kquants.py's scheme: int16 activations (simd.quant16's even / odd halves of each 32-block),
`vpmaddwd`, each block's int32 sums scaled in float. The 16 nibble bytes go to both 128-bit lanes, the high
lane's shifted down a nibble (one `vpsrlvd`), and one `vpshufb` looks the 32 nibbles up in the codebook: bytes in
value order, which become quant16's even / odd int16 words by shifts, as Q8_0's bytes do (simd._rows). IQ4_XS's
eight sub-block scales d (ls - 32) are unpacked in one vector a super-block (kquants' Q4_K scheme, no mins).
Also whole rows to float32 (deq_iq4_*_row, for gemm.py) and portable loops without AVX2.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from .kquants import _k_kernel, _prologue, _super_block
from .simd import F32, HAVE_AVX2, I8, I16, I32, I64, V, _fmul, _fn, _pmadd, _splat, h2f, hsum8, x_halves

_U = np.uint64
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)  # kvalues_iq4nl
_K = KVALUES.astype(np.float32)
UNIT = {False: (18, 1), True: (136, 8)}  # xs -> (bytes, 32-blocks) of a block (IQ4_NL) or super-block (IQ4_XS)


@njit(fastmath=True, inline="always")
def iq4_xs_scale(w, o, c):
    """d (ls_c - 32) of sub-block c (0..7) of the IQ4_XS super-block at byte o: ls_c is nibble c % 2 of scales_l[c // 2]
    (bytes 4..7) with bits 2c, 2c + 1 of scales_h (the u16 at 2) on top."""
    lo = (np.int32(w[o + _U(4 + c // 2)]) >> (4 * (c % 2))) & 15
    hi = ((np.int32(w[o + _U(2)]) | (np.int32(w[o + _U(3)]) << 8)) >> (2 * c)) & 3
    return h2f(w[o], w[o + _U(1)]) * np.float32((lo | (hi << 4)) - 32)


@njit(fastmath=True, inline="always")
def _iq4_run(w, q0, a, buf, y0):
    """The 32 values a K[nibble] of the 16 bytes at q0 into buf[y0:y0 + 32] (low nibbles first)."""
    for l in range(16):
        b = np.int32(w[q0 + _U(l)])
        buf[y0 + l] = a * _K[b & 15]
        buf[y0 + 16 + l] = a * _K[b >> 4]


@njit(fastmath=True, inline="always")
def iq4_unit(xs, w, o, buf, y0):
    """The IQ4_XS super-block (xs; 256 values) or IQ4_NL block (32) at byte o into buf[y0:]."""
    if xs:
        for c in range(8):
            _iq4_run(w, o + _U(8 + 16 * c), iq4_xs_scale(w, o, c), buf, y0 + 32 * c)
    else:
        _iq4_run(w, o + _U(2), h2f(w[o], w[o + _U(1)]), buf, y0)


@njit(fastmath=True)
def _slow_iq4(xs, n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The products of n IQ4_NL / IQ4_XS rows without AVX2 (iq4_unit's values against x16 dx)."""
    x16, dx = X16[k0], DX[k0]
    g, bs = (8, 136) if xs else (1, 18)
    buf = np.empty(32 * g, np.float32)
    for k in range(n):
        acc = np.float32(0.0)
        for u in range(nb // g):
            iq4_unit(xs, w, _U(wo + k * rb + u * bs), buf, 0)
            for blk in range(g):
                b = g * u + blk
                for i in range(32):
                    acc += buf[32 * blk + i] * np.float32(x16[32 * b + (i % 2) * 16 + i // 2]) * dx[b]
        res[k0, ro + k] = acc


@njit(fastmath=True)
def _slow_iq4_nl(n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The IQ4_NL kernels' products without AVX2."""
    _slow_iq4(False, n, w, wo, rb, X16, DX, k0, nb, res, ro)


@njit(fastmath=True)
def _slow_iq4_xs(n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The IQ4_XS kernels' products without AVX2."""
    _slow_iq4(True, n, w, wo, rb, X16, DX, k0, nb, res, ro)


def _values_ir(builder, p):
    """Codegen: <32 x i8> the codebook values of the 32 nibbles of the 16 bytes at p, in value order (lane 0 the low
    nibbles, lane 1 the high ones): vbroadcasti128, vpsrlvd by [0 x 4, 4 x 4], vpand, vpshufb."""
    q = builder.load(builder.bitcast(p, V(I8, 16).as_pointer()), align=1)
    b = builder.bitcast(builder.shuffle_vector(q, q, ir.Constant(V(I32, 32), list(range(16)) * 2)), V(I32, 8))
    n = builder.bitcast(builder.lshr(b, ir.Constant(V(I32, 8), [0] * 4 + [4] * 4)), V(I8, 32))
    n = builder.and_(n, ir.Constant(V(I8, 32), [15] * 32))
    pshufb = _fn(builder, "llvm.x86.avx2.pshuf.b", V(I8, 32), [V(I8, 32)] * 2)
    return builder.call(pshufb, [ir.Constant(V(I8, 32), [int(v) for v in KVALUES] * 2), n])


def _xs_scales_ir(builder, p):
    """Codegen: <8 x f32> d (ls_c - 32) of the eight sub-blocks of the IQ4_XS super-block at p (iq4_xs_scale on eight
    lanes: byte shuffles and lane shifts)."""
    b8 = builder.load(builder.bitcast(p, V(I8, 8).as_pointer()), align=1)
    pick = lambda idx: builder.zext(builder.shuffle_vector(b8, b8, ir.Constant(V(I32, 8), idx)), V(I32, 8))  # noqa: E731
    c32 = lambda vals: ir.Constant(V(I32, 8), vals)  # noqa: E731
    lo = builder.and_(builder.lshr(pick([4, 4, 5, 5, 6, 6, 7, 7]), c32([0, 4] * 4)), c32([15] * 8))
    sh = builder.or_(pick([2] * 8), builder.shl(pick([3] * 8), c32([8] * 8)))
    hi = builder.and_(builder.lshr(sh, c32([2 * c for c in range(8)])), c32([3] * 8))
    ls = builder.sub(builder.or_(lo, builder.shl(hi, c32([4] * 8))), c32([32] * 8))
    d = builder.fpext(builder.load(builder.bitcast(p, ir.HalfType().as_pointer()), align=1), F32)
    return _fmul(builder, _splat(builder, d, 8), builder.sitofp(ls, V(F32, 8)))


def _rows_iq4_ir(NR: int, MT: int = 1, prefetch: bool = True, xs: bool = False):
    """Codegen: res[k0 + t, ro + k] = row_k . x_t for NR IQ4_NL (xs: IQ4_XS) rows at byte woff + k * rb and the MT
    tokens from k0 of X16 / DX, as kquants._rows_q4_k_ir. A 32-block's values (_values_ir, as int16 words w of two
    bytes: even values (w << 8) >> 8, odd ones w >> 8) against x's even / odd halves, two `vpmaddwd`; the int32
    sums times the block's d dx (IQ4_NL: one fp16 d a block; IQ4_XS: d (ls - 32) dx for the eight sub-blocks at
    once, to stack slots), one fma. With MT tokens a row's values are decoded once for all of them; each token's
    products and adds are those of MT = 1."""
    bs, G = UNIT[xs]

    def gen(context, builder, sig, args):
        woff, nb, roff = args[1], args[6], args[8]
        i64, wd, xds, dds, rds, rbk, pfo, nsb = _prologue(context, builder, sig, args, NR, MT)
        i32 = lambda v: ir.Constant(I32, v)  # noqa: E731
        c16 = lambda v: ir.Constant(V(I16, 16), [v] * 16)  # noqa: E731
        zero = ir.Constant(V(F32, 8), [0.0] * 8)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(MT)] for _ in range(NR)]
        slots = [[cgutils.alloca_once(builder, V(F32, 8)) for _ in range(MT)] for _ in range(NR)]  # d sc dx
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        half = ir.HalfType()
        with cgutils.for_range(builder, nsb if xs else nb) as loop:
            u = loop.index
            ps = _super_block(builder, wd, woff, rbk, pfo, u, bs, prefetch)
            blk0 = builder.mul(u, i64(G))
            if xs:  # each row's eight d sc dx, per token, to its slots
                dxv = [builder.load(builder.bitcast(builder.gep(dd, [blk0]), V(F32, 8).as_pointer()), align=4)
                       for dd in dds]
                for k, p in enumerate(ps):
                    f = _xs_scales_ir(builder, p)
                    for t in range(MT):
                        builder.store(_fmul(builder, f, dxv[t]), slots[k][t])
            else:
                dxs = [builder.load(builder.gep(dd, [u]), align=4) for dd in dds]
            for c in range(G):
                xh = [x_halves(builder, xd, builder.add(blk0, i64(c))) for xd in xds]
                for k, p in enumerate(ps):
                    w = builder.bitcast(_values_ir(builder, builder.gep(p, [i64(8 + 16 * c if xs else 2)])), V(I16, 16))
                    we, wo = builder.ashr(builder.shl(w, c16(8)), c16(8)), builder.ashr(w, c16(8))
                    if not xs:
                        d = builder.fpext(builder.load(builder.bitcast(p, half.as_pointer()), align=1), F32)
                    for t, (xe, xo) in enumerate(xh):
                        m = builder.add(_pmadd(builder, we, xe), _pmadd(builder, wo, xo))  # [8] int32
                        if xs:
                            fs = builder.bitcast(slots[k][t], F32.as_pointer())
                            f = _splat(builder, builder.load(builder.gep(fs, [i32(c)]), align=4), 8)
                        else:
                            f = _splat(builder, builder.fmul(d, dxs[t]), 8)
                        builder.store(builder.call(fma, [builder.sitofp(m, V(F32, 8)), f, builder.load(accs[k][t])]),
                                      accs[k][t])
        for t in range(MT):
            for k in range(NR):
                builder.store(hsum8(builder, builder.load(accs[k][t])), builder.gep(rds[t], [builder.add(roff, i64(k))]))
        return context.get_dummy_value()

    return gen


def _rows_iq4_xs_ir(NR: int, MT: int = 1, prefetch: bool = True):
    """_rows_iq4_ir for IQ4_XS rows."""
    return _rows_iq4_ir(NR, MT, prefetch, xs=True)


rows2_iq4_nl, rows1_iq4_nl, rows2x2_iq4_nl, rows2x4_iq4_nl = (_k_kernel(_rows_iq4_ir, _slow_iq4_nl, n, t)
                                                              for n, t in ((2, 1), (1, 1), (2, 2), (2, 4)))
rows2_iq4_xs, rows1_iq4_xs, rows2x2_iq4_xs, rows2x4_iq4_xs = (_k_kernel(_rows_iq4_xs_ir, _slow_iq4_xs, n, t)
                                                              for n, t in ((2, 1), (1, 1), (2, 2), (2, 4)))
# one row per call, no software prefetch: ggml's structure (calibration.bench_rowwise)
row_iq4_nl_noprefetch = _k_kernel(_rows_iq4_ir, _slow_iq4_nl, 1, 1, prefetch=False)
row_iq4_xs_noprefetch = _k_kernel(_rows_iq4_xs_ir, _slow_iq4_xs, 1, 1, prefetch=False)


def _deq_ir(xs: bool):
    """Codegen: buf[0 : 32 G n] = the n IQ4_NL blocks (G = 1) / IQ4_XS super-blocks (G = 8) at byte o of w, as
    gguf.dequantize gives them: each 32-block's codebook values (_values_ir), widened eight at a time
    (vpmovsxbd), converted, times the block's d (IQ4_XS: d (ls - 32))."""
    bs, G = UNIT[xs]

    def gen(context, builder, sig, args):
        wa, o, ba, n = args
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        wd = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=wa).data
        bd = cgutils.create_struct_proxy(sig.args[2])(context, builder, value=ba).data
        with cgutils.for_range(builder, n) as loop:
            p = builder.gep(wd, [builder.add(o, builder.mul(loop.index, i64(bs)))])
            y0 = builder.mul(loop.index, i64(32 * G))
            if xs:
                f = _xs_scales_ir(builder, p)
            else:
                d = _splat(builder, builder.fpext(builder.load(builder.bitcast(p, ir.HalfType().as_pointer()), align=1),
                                                  F32), 8)
            for c in range(G):
                v = _values_ir(builder, builder.gep(p, [i64(8 + 16 * c if xs else 2)]))
                a = builder.shuffle_vector(f, f, ir.Constant(V(I32, 8), [c] * 8)) if xs else d
                for g in range(4):
                    b8 = builder.shuffle_vector(v, v, ir.Constant(V(I32, 8), list(range(8 * g, 8 * g + 8))))
                    val = _fmul(builder, a, builder.sitofp(builder.sext(b8, V(I32, 8)), V(F32, 8)))
                    at = builder.add(y0, i64(32 * c + 8 * g))
                    builder.store(val, builder.bitcast(builder.gep(bd, [at]), V(F32, 8).as_pointer()), align=4)
        return context.get_dummy_value()

    return gen


def _deq_kernel(xs: bool):
    """deq_iq4_nl_row / deq_iq4_xs_row(w, o, buf, n): buf[0 : 32 G n] = n blocks / super-blocks at byte o of w."""
    if HAVE_AVX2:
        @intrinsic
        def kernel(typingctx, w, o, buf, n):
            return types.none(w, o, buf, n), _deq_ir(xs)
    else:
        bs, G = UNIT[xs]

        @njit
        def kernel(w, o, buf, n):
            for b in range(n):
                iq4_unit(xs, w, _U(o + bs * b), buf, 32 * G * b)
    return kernel


deq_iq4_nl_row, deq_iq4_xs_row = _deq_kernel(False), _deq_kernel(True)
