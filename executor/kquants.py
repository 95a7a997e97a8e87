"""One-token products with llama.cpp's K-quant rows read in place (Q4_K, Q6_K: the types of its
Q4_K_M files), as AVX2 numba intrinsics on simd.py's scheme: int16 activations (simd.quant16, one
32-block of x per Q4_K sub-block, per two Q6_K 16-value runs), the weights' integers made int16 words
with in-lane shifts and masks, `vpmaddwd`, each run's int32 sums scaled in float. Layouts:
gemm._deq_q4_k / _deq_q6_k (ggml-quants.c dequantize_row_q4_K / _q6_K). One core, in cache (the
experts of `small-q4k`): Q4_K 14.4 G weights/s, Q6_K 10.0, against 6.6 and 4.2 for the same products
in float (LLVM-vectorised loops), 24 for simd.py's Q4_0.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils
from numba.extending import intrinsic

from .gemm import _deq_q6_k, h2f
from .simd import (F32, HAVE_AVX2, I8, I16, I32, I64, PREFETCH, V, _fadd, _fmul, _fn, _fsub, _pmadd, _qsig, _splat,
                   hsum8)

_U = np.uint64


@njit(fastmath=True, inline="always")
def _q4_k_scale_min(w, s, c):
    """(scale, min) of sub-block c (0..7) from the 12 packed bytes at s (ggml's get_scale_min_k4)."""
    if c < 4:
        return np.int32(w[s + _U(c)]) & 63, np.int32(w[s + _U(c + 4)]) & 63
    return ((np.int32(w[s + _U(c + 4)]) & 15) | ((np.int32(w[s + _U(c - 4)]) >> 6) << 4),
            (np.int32(w[s + _U(c + 4)]) >> 4) | ((np.int32(w[s + _U(c)]) >> 6) << 4))


def _rows_q4_k_ir(NR: int):
    """Codegen: res[k0, ro + k] = row_k . x for NR Q4_K rows at byte woff + k * rb (nb 32-blocks each) and token
    k0 of X16 / DX (simd.quant16's layout: each 32-block even values first, dx, then 8 x the block's x16 sum).

    A Q4_K sub-block is one 32-block of x. Byte chunk j (32 bytes) holds sub-blocks 2j (low nibbles) and 2j + 1
    (high): as 16 words w = q[2i] | q[2i+1] << 8, sub-block 2j's even / odd values are w & 15 and (w >> 8) & 15,
    2j + 1's (w >> 4) & 15 and w >> 12, each against x's even / odd half (vpmaddwd: no widening). A sub-block's
    int32 sums are scaled by d sc dx (float, one fma); its mins by dmin m dx sum(x16), a float per row."""
    def gen(context, builder, sig, args):
        wa, woff, rb, xa, da, k0, nb, ra, roff = args
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        i32 = lambda v: ir.Constant(I32, v)  # noqa: E731

        def row0(i, v, ty):  # token row k0 of 2-D array argument i, as a ty pointer
            ary = cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v)
            s0 = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
            p = builder.bitcast(ary.data, I8.as_pointer())
            return builder.bitcast(builder.gep(p, [builder.mul(k0, s0)]), ty.as_pointer())

        wd = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=wa).data
        xd, dd, rd = row0(3, xa, I16), row0(4, da, F32), row0(7, ra, F32)
        zero = ir.Constant(V(F32, 8), [0.0] * 8)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(NR)]
        corr = [cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in range(NR)]
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        pref = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
        c16 = lambda v: ir.Constant(V(I16, 16), [v] * 16)  # noqa: E731
        rbk = [builder.mul(rb, i64(k)) for k in range(NR)]
        pfo = builder.add(woff, builder.mul(rb, i64(NR)))  # the next row group
        nsb = builder.lshr(nb, i64(3))
        half = ir.HalfType()
        with cgutils.for_range(builder, nsb) as loop:
            sb = loop.index
            p0 = builder.gep(wd, [builder.add(woff, builder.mul(sb, i64(144)))])
            ps = [builder.gep(p0, [rbk[k]]) if k else p0 for k in range(NR)]
            if PREFETCH:  # the next row group, linearly: NR x 144 bytes per super-block
                pf = builder.gep(wd, [builder.add(pfo, builder.mul(sb, i64(NR * 144)))])
                for i in range((NR * 144 + 63) // 64):
                    builder.call(pref, [builder.gep(pf, [i64(64 * i)]), i32(0), i32(3), i32(1)])
            rows = []
            for p in ps:  # d, dmin and the eight 6-bit scales and mins (ggml's get_scale_min_k4)
                ld16 = lambda off: builder.fpext(builder.load(builder.bitcast(builder.gep(p, [i64(off)]),  # noqa: E731
                                                                              half.as_pointer()), align=1), F32)
                s = [builder.zext(builder.load(builder.gep(p, [i64(4 + i)])), I32) for i in range(12)]
                sc = [builder.and_(s[c], i32(63)) for c in range(4)] + [
                    builder.or_(builder.and_(s[c + 4], i32(15)), builder.shl(builder.lshr(s[c - 4], i32(6)), i32(4)))
                    for c in range(4, 8)]
                mn = [builder.and_(s[c + 4], i32(63)) for c in range(4)] + [
                    builder.or_(builder.lshr(s[c + 4], i32(4)), builder.shl(builder.lshr(s[c], i32(6)), i32(4)))
                    for c in range(4, 8)]
                rows.append((p, ld16(0), ld16(2), sc, mn))
            for j in range(4):
                xs = []
                for h in range(2):  # x block of sub-block 2j + h: even / odd halves, dx, 8 sum(x16)
                    blk = builder.add(builder.mul(sb, i64(8)), i64(2 * j + h))
                    px = builder.bitcast(builder.gep(xd, [builder.mul(blk, i64(32))]), V(I16, 16).as_pointer())
                    xs.append((builder.load(px, align=2), builder.load(builder.gep(px, [i64(1)]), align=2),
                               builder.load(builder.gep(dd, [blk])), builder.load(builder.gep(dd, [builder.add(nb, blk)]))))
                for k, (p, d, dmin, sc, mn) in enumerate(rows):
                    q = builder.load(builder.bitcast(builder.gep(p, [i64(16 + 32 * j)]), V(I16, 16).as_pointer()), align=1)
                    halves = ((builder.and_(q, c16(15)), builder.and_(builder.lshr(q, c16(8)), c16(15))),
                              (builder.and_(builder.lshr(q, c16(4)), c16(15)), builder.lshr(q, c16(12))))
                    for h, (we, wo) in enumerate(halves):
                        xe, xo, dx, s8 = xs[h]
                        c = 2 * j + h
                        m = builder.add(_pmadd(builder, we, xe), _pmadd(builder, wo, xo))  # [8] int32
                        f = _fmul(builder, _fmul(builder, d, builder.sitofp(sc[c], F32)), dx)
                        builder.store(builder.call(fma, [builder.sitofp(m, V(F32, 8)), _splat(builder, f, 8),
                                                         builder.load(accs[k])]), accs[k])
                        g = _fmul(builder, _fmul(builder, _fmul(builder, dmin, builder.sitofp(mn[c], F32)), dx),
                                  _fmul(builder, s8, ir.Constant(F32, 0.125)))
                        builder.store(_fadd(builder, builder.load(corr[k]), g), corr[k])
        for k in range(NR):
            v = _fsub(builder, hsum8(builder, builder.load(accs[k])), builder.load(corr[k]))
            builder.store(v, builder.gep(rd, [builder.add(roff, i64(k))]))
        return context.get_dummy_value()

    return gen


@njit(fastmath=True)
def _slow_q4_k(n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The Q4_K kernels' products without AVX2: each sub-block's integer sum, then its two scales."""
    x16, dx = X16[k0], DX[k0]
    for k in range(n):
        acc = np.float32(0.0)
        for sb in range(nb // 8):
            o = _U(wo + k * rb + sb * 144)
            d, dmin = h2f(w[o], w[o + _U(1)]), h2f(w[o + _U(2)], w[o + _U(3)])
            for c in range(8):
                sc, mn = _q4_k_scale_min(w, o + _U(4), c)
                blk = 8 * sb + c
                s = 0
                for i in range(32):  # value i of the sub-block against x16's even-first layout
                    q = (np.int32(w[o + _U(16 + 32 * (c // 2) + i)]) >> (4 * (c % 2))) & 15
                    s += q * np.int32(x16[32 * blk + (i % 2) * 16 + i // 2])
                acc += d * np.float32(sc) * dx[blk] * np.float32(s) - dmin * np.float32(mn) * dx[blk] * dx[nb + blk] / 8
        res[k0, ro + k] = acc


def _q4_k_kernel(NR: int):
    """rows{NR}_q4_k(w, wo, rb, X16, DX, k0, nb, res, ro): res[k0, ro:ro+NR] = NR Q4_K rows . token k0."""
    if HAVE_AVX2:
        @intrinsic
        def kernel(typingctx, w, wo, rb, X16, DX, k0, nb, res, ro):
            return _qsig(w, wo, rb, X16, DX, k0, nb, res, ro), _rows_q4_k_ir(NR)
    else:  # a portable fallback with the same signature
        @njit
        def kernel(w, wo, rb, X16, DX, k0, nb, res, ro):
            _slow_q4_k(NR, w, wo, rb, X16, DX, k0, nb, res, ro)
    return kernel


rows4_q4_k, rows1_q4_k = _q4_k_kernel(4), _q4_k_kernel(1)


def _rows_q6_k_ir(NR: int):
    """Codegen: res[k0, ro + k] = row_k . x for NR Q6_K rows at byte woff + k * rb and token k0 of X16 / DX, as
    _rows_q4_k_ir. The 32 values of block (h, i) of a super-block (one 32-block of x) take the nibbles of ql
    bytes 64h + 32(i % 2) + l (shifted by 4 for i >= 2) and bit pair i of qh bytes 32h + l: with words of two
    bytes, even values from the low bytes, odd from the high, each (nibble | pair << 4) - 32 in int16. A
    block's eight int32 lanes are its two 16-value runs (lanes 0-3, 4-7): one fma with [f0 x 4, f1 x 4],
    f = d sc dx of each run."""
    def gen(context, builder, sig, args):
        wa, woff, rb, xa, da, k0, nb, ra, roff = args
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        i32 = lambda v: ir.Constant(I32, v)  # noqa: E731

        def row0(i, v, ty):
            ary = cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v)
            s0 = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
            p = builder.bitcast(ary.data, I8.as_pointer())
            return builder.bitcast(builder.gep(p, [builder.mul(k0, s0)]), ty.as_pointer())

        wd = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=wa).data
        xd, dd, rd = row0(3, xa, I16), row0(4, da, F32), row0(7, ra, F32)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(V(F32, 8), [0.0] * 8)) for _ in range(NR)]
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        pref = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
        c16 = lambda v: ir.Constant(V(I16, 16), [v] * 16)  # noqa: E731
        rbk = [builder.mul(rb, i64(k)) for k in range(NR)]
        pfo = builder.add(woff, builder.mul(rb, i64(NR)))
        nsb = builder.lshr(nb, i64(3))
        vec16 = V(I16, 16).as_pointer()
        lanes = ir.Constant(V(I32, 8), [0, 0, 0, 0, 1, 1, 1, 1])
        with cgutils.for_range(builder, nsb) as loop:
            sb = loop.index
            p0 = builder.gep(wd, [builder.add(woff, builder.mul(sb, i64(210)))])
            ps = [builder.gep(p0, [rbk[k]]) if k else p0 for k in range(NR)]
            if PREFETCH:
                pf = builder.gep(wd, [builder.add(pfo, builder.mul(sb, i64(NR * 210)))])
                for i in range((NR * 210 + 63) // 64):
                    builder.call(pref, [builder.gep(pf, [i64(64 * i)]), i32(0), i32(3), i32(1)])
            ds = [builder.fpext(builder.load(builder.bitcast(builder.gep(p, [i64(208)]), ir.HalfType().as_pointer()),
                                             align=1), F32) for p in ps]
            for h in range(2):
                for i in range(4):
                    blk = builder.add(builder.mul(sb, i64(8)), i64(4 * h + i))
                    px = builder.bitcast(builder.gep(xd, [builder.mul(blk, i64(32))]), vec16)
                    xe, xo = builder.load(px, align=2), builder.load(builder.gep(px, [i64(1)]), align=2)
                    dx = builder.load(builder.gep(dd, [blk]))
                    s = 4 * (i // 2)
                    for k, p in enumerate(ps):
                        wl = builder.load(builder.bitcast(builder.gep(p, [i64(64 * h + 32 * (i % 2))]), vec16), align=1)
                        wh = builder.load(builder.bitcast(builder.gep(p, [i64(128 + 32 * h)]), vec16), align=1)
                        lo_e = builder.and_(builder.lshr(wl, c16(s)) if s else wl, c16(15))
                        lo_o = builder.and_(builder.lshr(wl, c16(8 + s)), c16(15))
                        hi_e = builder.and_(builder.shl(wh, c16(4 - 2 * i)) if i < 2 else
                                            (builder.lshr(wh, c16(2 * i - 4)) if i > 2 else wh), c16(0x30))
                        hi_o = builder.and_(builder.lshr(wh, c16(4 + 2 * i)), c16(0x30))
                        we = builder.sub(builder.or_(lo_e, hi_e), c16(32))
                        wo = builder.sub(builder.or_(lo_o, hi_o), c16(32))
                        m = builder.add(_pmadd(builder, we, xe), _pmadd(builder, wo, xo))  # [8] int32: runs 2i, 2i+1
                        scs = builder.gep(p, [i64(192 + 8 * h + 2 * i)])
                        f = [_fmul(builder, _fmul(builder, ds[k], builder.sitofp(builder.load(builder.gep(scs, [i64(t)])),
                                                                                 F32)), dx) for t in range(2)]
                        fv = builder.insert_element(builder.insert_element(ir.Constant(V(F32, 2), ir.Undefined), f[0],
                                                                           i32(0)), f[1], i32(1))
                        fv = builder.shuffle_vector(fv, fv, lanes)
                        builder.store(builder.call(fma, [builder.sitofp(m, V(F32, 8)), fv, builder.load(accs[k])]),
                                      accs[k])
        for k in range(NR):
            builder.store(hsum8(builder, builder.load(accs[k])), builder.gep(rd, [builder.add(roff, i64(k))]))
        return context.get_dummy_value()

    return gen


@njit(fastmath=True)
def _slow_q6_k(n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The Q6_K kernels' products without AVX2 (gemm._deq_q6_k's values against x16 dx)."""
    x16, dx = X16[k0], DX[k0]
    buf = np.empty(256, np.float32)
    for k in range(n):
        acc = np.float32(0.0)
        for sb in range(nb // 8):
            _deq_q6_k(w, _U(wo + k * rb + sb * 210), buf, 0, _U(32))
            for blk in range(8):
                for i in range(32):
                    acc += buf[32 * blk + i] * np.float32(x16[32 * (8 * sb + blk) + (i % 2) * 16 + i // 2]) \
                        * dx[8 * sb + blk]
        res[k0, ro + k] = acc


def _q6_k_kernel(NR: int):
    """rows{NR}_q6_k(w, wo, rb, X16, DX, k0, nb, res, ro): res[k0, ro:ro+NR] = NR Q6_K rows . token k0."""
    if HAVE_AVX2:
        @intrinsic
        def kernel(typingctx, w, wo, rb, X16, DX, k0, nb, res, ro):
            return _qsig(w, wo, rb, X16, DX, k0, nb, res, ro), _rows_q6_k_ir(NR)
    else:
        @njit
        def kernel(w, wo, rb, X16, DX, k0, nb, res, ro):
            _slow_q6_k(NR, w, wo, rb, X16, DX, k0, nb, res, ro)
    return kernel


rows4_q6_k, rows1_q6_k = _q6_k_kernel(4), _q6_k_kernel(1)
