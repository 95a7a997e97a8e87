"""Quantised rows as integers for the integer GEMM (qgemm.py): n units (32-blocks, or K-quant / IQ4_XS super-blocks)
from byte o of flat bytes w into a16 [values] int16, each value's integer in natural order (Q8_0's byte, Q4_0's
nibble - 8, Q4_K's nibble, Q6_K's q - 32, IQ4's codebook byte ...), and per sub-block sc float32, its scale (d, d sc,
d (ls - 32)), and mn float32, its min negated (-dmin m: Q4_K, Q5_K, Q2_K only), so that value = scale x integer + min
(ggml-quants.c dequantize_row_*).

With AVX2 the integers come from the float dequantisers' own unpacking (kquant_blocks._super_block_ir, iquants._values_ir:
byte vectors), widened to int16 and stored 32 at a time, with no float work. One Zen 4 core (`python
benchmarks/bench_qgemm.py --decode`): 25-45 G weights/s, against 1.1-5.2 for the plain loops below, which LLVM does
not vectorise (they stay: without AVX2, and as the reference the intrinsics are tested against), and 6.7-13.3 for the
float dequantisers the float GEMM uses.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from .gemm import IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_0, Q4_K, Q5_K, Q6_K, Q8_0
from .iquants import KVALUES, _values_ir, _xs_scales_ir, iq4_xs_scale
from .kquant_blocks import MINS_SLOT, _BS, _q3_k_scale, _q4_k_scale_min, _super_block_ir
from .nbcache import drop_stale_cache
from .simd import F32, HAVE_AVX2, I8, I16, I32, I64, V, _fsub, h2f

drop_stale_cache(__file__)
_U = np.uint64
_KSUB = {"Q4_K": 8, "Q5_K": 8}  # sub-blocks a K-quant super-block (else 16 runs)


def _kquant16_ir(fmt: str):
    """Codegen: nsb K-quant super-blocks (kquant_blocks._super_block_ir's integers and slot of scales / mins)."""
    bs, mins, S = _BS[fmt], fmt in ("Q4_K", "Q5_K", "Q2_K"), _KSUB.get(fmt, 16)

    def gen(context, builder, sig, args):
        o, nsb = args[1], args[5]
        wd, ad, sd, md = (cgutils.create_struct_proxy(sig.args[i])(context, builder, value=args[i]).data
                          for i in (0, 2, 3, 4))
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        slot = builder.bitcast(cgutils.alloca_once(builder, V(F32, 32)), F32.as_pointer())
        zero = ir.Constant(V(F32, 8), [0.0] * 8)
        vec8 = lambda ptr, at: builder.bitcast(builder.gep(ptr, [at]), V(F32, 8).as_pointer())  # noqa: E731
        with cgutils.for_range(builder, nsb) as loop:
            sb = loop.index
            p = builder.gep(wd, [builder.add(o, builder.mul(sb, i64(bs)))])
            y0 = builder.mul(sb, i64(256))
            for v, signed, y, _ in _super_block_ir(fmt, builder, p, slot):
                _store16(builder, ad, builder.add(y0, i64(y)), v, signed)
            s0 = builder.mul(sb, i64(S))
            for u in range(S // 8):
                builder.store(builder.load(vec8(slot, i64(8 * u)), align=4), vec8(sd, builder.add(s0, i64(8 * u))), align=4)
                if mins:
                    m = builder.load(vec8(slot, i64(MINS_SLOT + 8 * u)), align=4)
                    builder.store(_fsub(builder, zero, m), vec8(md, builder.add(s0, i64(8 * u))), align=4)
        return context.get_dummy_value()
    return gen


def _store16(builder, ad, at, v, signed):
    """Codegen: the <32 x i8> v widened (sign or zero) to int16 at a16[at]."""
    w16 = (builder.sext if signed else builder.zext)(v, V(I16, 32))
    builder.store(w16, builder.bitcast(builder.gep(ad, [at]), V(I16, 32).as_pointer()), align=2)


def _blocks16_ir(fmt: str):
    """Codegen: n 32-blocks (Q8_0: 34 bytes, Q4_0 / IQ4_NL: 18) or IQ4_XS super-blocks (136): the fp16 d (IQ4_XS:
    iquants._xs_scales_ir's eight d (ls - 32)) to sc, the integers to a16."""
    bs = {"Q8_0": 34, "Q4_0": 18, "IQ4_NL": 18, "IQ4_XS": 136}[fmt]

    def gen(context, builder, sig, args):
        o, n = args[1], args[5]
        wd, ad, sd = (cgutils.create_struct_proxy(sig.args[i])(context, builder, value=args[i]).data for i in (0, 2, 3))
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        c8 = lambda v: ir.Constant(V(I8, 32), [v] * 32)  # noqa: E731
        with cgutils.for_range(builder, n) as loop:
            b = loop.index
            p = builder.gep(wd, [builder.add(o, builder.mul(b, i64(bs)))])
            if fmt == "IQ4_XS":
                builder.store(_xs_scales_ir(builder, p), builder.bitcast(builder.gep(sd, [builder.mul(b, i64(8))]),
                                                                         V(F32, 8).as_pointer()), align=4)
                for c in range(8):
                    _store16(builder, ad, builder.add(builder.mul(b, i64(256)), i64(32 * c)),
                             _values_ir(builder, builder.gep(p, [i64(8 + 16 * c)])), True)
            else:
                d = builder.fpext(builder.load(builder.bitcast(p, ir.HalfType().as_pointer()), align=1), F32)
                builder.store(d, builder.gep(sd, [b]))
                q = builder.gep(p, [i64(2)])
                if fmt == "Q8_0":
                    v = builder.load(builder.bitcast(q, V(I8, 32).as_pointer()), align=1)
                elif fmt == "IQ4_NL":
                    v = _values_ir(builder, q)
                else:  # Q4_0: low nibbles are values 0..15, high ones 16..31, minus 8
                    b16 = builder.load(builder.bitcast(q, V(I8, 16).as_pointer()), align=1)
                    both = builder.shuffle_vector(b16, b16, ir.Constant(V(I32, 32), list(range(16)) * 2))
                    sh = ir.Constant(V(I8, 32), [0] * 16 + [4] * 16)
                    v = builder.sub(builder.and_(builder.lshr(both, sh), c8(15)), c8(8))
                _store16(builder, ad, builder.mul(b, i64(32)), v, True)
        return context.get_dummy_value()
    return gen


def _intrinsic(codegen):
    @intrinsic
    def kernel(typingctx, w, o, a16, sc, mn, n):
        return types.none(w, o, a16, sc, mn, n), codegen
    return kernel


# The same in plain loops (ggml-quants.c dequantize_row_*): without AVX2, and the reference the intrinsics are
# tested against. qk is 32 opaque to LLVM (a constant trip count unrolls into gathers), as in gemm.py.

@njit(fastmath=True, inline="always")
def _slow16_q8_0(w, o, a16, sc, mn, n, qk):
    for b in range(n):
        ob = o + _U(34 * b)
        sc[b] = h2f(w[ob], w[ob + _U(1)])
        for l in range(qk):
            a16[32 * b + np.int64(l)] = np.int16(np.int8(w[ob + _U(2) + l]))


@njit(fastmath=True, inline="always")
def _slow16_q4_0(w, o, a16, sc, mn, n, qk):
    for b in range(n):
        ob = o + _U(18 * b)
        sc[b] = h2f(w[ob], w[ob + _U(1)])
        for l in range(qk // _U(2)):
            v = np.int16(w[ob + _U(2) + l])
            a16[32 * b + np.int64(l)] = (v & 15) - 8
            a16[32 * b + 16 + np.int64(l)] = (v >> 4) - 8


@njit(fastmath=True, inline="always")
def _slow16_q4_k(w, o, a16, sc, mn, n, qk, q5=False):
    bs = 176 if q5 else 144
    for s in range(n):
        ob = o + _U(bs * s)
        d, dmin = h2f(w[ob], w[ob + _U(1)]), h2f(w[ob + _U(2)], w[ob + _U(3)])
        for c in range(8):
            scv, mv = _q4_k_scale_min(w, ob + _U(4), c)
            sc[8 * s + c] = d * np.float32(scv)
            mn[8 * s + c] = -(dmin * np.float32(mv))
            q0 = ob + _U(48 if q5 else 16) + _U(32) * _U(c // 2)
            sh = np.int16(4 * (c % 2))
            y = 256 * s + 32 * c
            for l in range(qk):
                q = (np.int16(w[q0 + l]) >> sh) & 15
                if q5:
                    q |= ((np.int16(w[ob + _U(16) + l]) >> np.int16(c)) & 1) << 4
                a16[y + np.int64(l)] = q


@njit(fastmath=True, inline="always")
def _slow16_q5_k(w, o, a16, sc, mn, n, qk):
    _slow16_q4_k(w, o, a16, sc, mn, n, qk, True)


@njit(fastmath=True, inline="always")
def _slow16_q6_k(w, o, a16, sc, mn, n, qk):
    for s in range(n):
        ob = o + _U(210 * s)
        d = h2f(w[ob + _U(208)], w[ob + _U(209)])
        for h in range(2):
            for i in range(4):
                ql = ob + _U(64 * h + 32 * (i % 2))
                qh = ob + _U(128 + 32 * h)
                sl, sh = np.int16(4 * (i // 2)), np.int16(2 * i)
                for half in range(2):
                    r = 8 * h + 2 * i + half
                    sc[16 * s + r] = d * np.float32(np.int8(w[ob + _U(192 + r)]))
                    l0 = _U(16 * half)
                    y = 256 * s + 16 * r
                    for l in range(qk // _U(2)):
                        q = ((np.int16(w[ql + l0 + l]) >> sl) & 15) | (((np.int16(w[qh + l0 + l]) >> sh) & 3) << 4)
                        a16[y + np.int64(l)] = q - 32


@njit(fastmath=True, inline="always")
def _slow16_q3_k(w, o, a16, sc, mn, n, qk):
    for s in range(n):
        ob = o + _U(110 * s)
        d = h2f(w[ob + _U(108)], w[ob + _U(109)])
        for nn in range(2):
            for j in range(4):
                for half in range(2):
                    r = 8 * nn + 2 * j + half
                    sc[16 * s + r] = d * np.float32(_q3_k_scale(w, ob + _U(96), r))
                    y = 256 * s + 16 * r
                    for l in range(qk // _U(2)):
                        ll = _U(16 * half) + l
                        q = ((np.int16(w[ob + _U(32 + 32 * nn) + ll]) >> np.int16(2 * j)) & 3) - 4
                        q += 4 * ((np.int16(w[ob + ll]) >> np.int16(4 * nn + j)) & 1)
                        a16[y + np.int64(l)] = q


@njit(fastmath=True, inline="always")
def _slow16_q2_k(w, o, a16, sc, mn, n, qk):
    for s in range(n):
        ob = o + _U(84 * s)
        d, dmin = h2f(w[ob + _U(80)], w[ob + _U(81)]), h2f(w[ob + _U(82)], w[ob + _U(83)])
        for nn in range(2):
            for j in range(4):
                for half in range(2):
                    r = 8 * nn + 2 * j + half
                    v = np.int32(w[ob + _U(r)])
                    sc[16 * s + r] = d * np.float32(v & 15)
                    mn[16 * s + r] = -(dmin * np.float32(v >> 4))
                    y = 256 * s + 16 * r
                    for l in range(qk // _U(2)):
                        ll = _U(16 * half) + l
                        a16[y + np.int64(l)] = (np.int16(w[ob + _U(16 + 32 * nn) + ll]) >> np.int16(2 * j)) & 3


_KV16 = KVALUES.astype(np.int16)


@njit(fastmath=True, inline="always")
def _iq4_run16(w, q0, a16, y):
    for l in range(16):
        b = np.int32(w[q0 + _U(l)])
        a16[y + l] = _KV16[b & 15]
        a16[y + 16 + l] = _KV16[b >> 4]


@njit(fastmath=True, inline="always")
def _slow16_iq4_nl(w, o, a16, sc, mn, n, qk):
    for b in range(n):
        ob = o + _U(18 * b)
        sc[b] = h2f(w[ob], w[ob + _U(1)])
        _iq4_run16(w, ob + _U(2), a16, 32 * b)


@njit(fastmath=True, inline="always")
def _slow16_iq4_xs(w, o, a16, sc, mn, n, qk):
    for s in range(n):
        ob = o + _U(136 * s)
        for c in range(8):
            sc[8 * s + c] = iq4_xs_scale(w, ob, c)
            _iq4_run16(w, ob + _U(8 + 16 * c), a16, 256 * s + 32 * c)


_SLOW = {Q8_0: _slow16_q8_0, Q4_0: _slow16_q4_0, Q4_K: _slow16_q4_k, Q5_K: _slow16_q5_k, Q6_K: _slow16_q6_k,
         Q3_K: _slow16_q3_k, Q2_K: _slow16_q2_k, IQ4_NL: _slow16_iq4_nl, IQ4_XS: _slow16_iq4_xs}
_NAMES = {Q8_0: "Q8_0", Q4_0: "Q4_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K", Q3_K: "Q3_K", Q2_K: "Q2_K",
          IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS"}
_UNIT = {c: (32 if c in (Q8_0, Q4_0, IQ4_NL) else 256) for c in _NAMES}  # values a block / super-block
_FAST = {c: _intrinsic((_kquant16_ir if _NAMES[c] in _BS else _blocks16_ir)(_NAMES[c])) for c in _NAMES} \
    if HAVE_AVX2 else {}


def q_decode(code, w, o, a16, sc, mn, cols, fast=True):
    """Values [0, cols) of the row at byte o of flat bytes w (type `code`, a literal) into a16 / sc / mn (the module's
    docstring); fast: the intrinsics where AVX2 runs, else the plain loops. Numba code only."""
    raise TypeError("qdecode.q_decode runs inside numba code only")


@overload(q_decode, prefer_literal=True, jit_options={"fastmath": True})
def _q_decode_typed(code, w, o, a16, sc, mn, cols, fast=True):
    c = code.literal_value
    if c not in _UNIT:  # F16: no integers (rows_matmul types the integer path for every code; it never runs for F16)
        return lambda code, w, o, a16, sc, mn, cols, fast=True: None
    unit = _UNIT[c]
    fast = getattr(fast, "literal_value", fast) is not False and c in _FAST
    dec = _FAST[c] if fast else None
    slow = _SLOW[c]
    if fast:
        def impl(code, w, o, a16, sc, mn, cols, fast=True):
            dec(w, np.int64(o), a16, sc, mn, np.int64(cols // unit))
    else:
        def impl(code, w, o, a16, sc, mn, cols, fast=True):
            slow(w, _U(o), a16, sc, mn, np.int64(cols // unit), _U(cols // (cols // 32)))
    return impl
