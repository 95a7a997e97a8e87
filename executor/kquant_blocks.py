"""llama.cpp's K-quant super-blocks (Q2_K 84 bytes, Q3_K 110, Q4_K 144, Q5_K 176, Q6_K 210, 256 weights each) and
their values. Plain numba loops of ggml-quants.c's dequantize_row_q2_K .. _q6_K (_q4_k_block / _q6_k_block /
_q3_k_block / _q2_k_block; Q5_K is Q4_K with a fifth bit per weight in 32 bytes before the nibbles): the reference
the kernels fall back to without AVX2. Codegen that unpacks a super-block's scales (_q4_k_scales_ir, ggml's kmask
arithmetic; _q3_k_scales_ir) and its integers (_super_block_ir: the row products in kquants.py, the integer GEMM's
row decode in qdecode.py). Whole super-blocks to float32 (deq_q*_k_row), for dequantise-then-GEMM (gemm.py) and
embeddings.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from .simd import F32, HAVE_AVX2, I8, I32, I64, V, _fmul, _fsub, _splat, h2f

_U = np.uint64


@njit(fastmath=True, inline="always")
def _q4_k_scale_min(w, s, c):
    """(scale, min) of sub-block c (0..7) from the 12 packed bytes at s (ggml's get_scale_min_k4)."""
    if c < 4:
        return np.int32(w[s + _U(c)]) & 63, np.int32(w[s + _U(c + 4)]) & 63
    return ((np.int32(w[s + _U(c + 4)]) & 15) | ((np.int32(w[s + _U(c - 4)]) >> 6) << 4),
            (np.int32(w[s + _U(c + 4)]) >> 4) | ((np.int32(w[s + _U(c)]) >> 6) << 4))


@njit(fastmath=True, inline="always")
def _q4_k_block(w, o, buf, y0, qk, q5=False):
    """One Q4_K super-block (144 bytes at o: d, dmin fp16, 12 bytes of 6-bit scales and mins for its eight
    32-weight sub-blocks, 128 bytes of nibbles) into buf[y0:y0 + 256]: sub-block c = 2j + h holds the low
    (h = 0) or high (h = 1) nibbles of bytes 32j..32j+31, value d sc_c q - dmin m_c (qk: 32, opaque).
    q5: a Q5_K super-block (176 bytes: 32 bytes qh after the scales, then the nibbles), q = nibble | 16 x bit c
    of qh[l] (ggml's dequantize_row_q5_K)."""
    d, dmin = h2f(w[o], w[o + _U(1)]), h2f(w[o + _U(2)], w[o + _U(3)])
    for c in range(8):
        sc, mn = _q4_k_scale_min(w, o + _U(4), c)
        a, m = d * np.float32(sc), dmin * np.float32(mn)
        q0 = o + _U(48 if q5 else 16) + _U(32) * _U(c // 2)
        sh = np.int32(4 * (c % 2))
        for l in range(qk):
            q = (np.int32(w[q0 + l]) >> sh) & 15
            if q5:
                q |= ((np.int32(w[o + _U(16) + l]) >> np.int32(c)) & 1) << 4
            buf[y0 + 32 * c + np.int64(l)] = a * np.float32(q) - m


@njit(fastmath=True, inline="always")
def _q6_k_block(w, o, buf, y0, qk):
    """One Q6_K super-block (210 bytes at o: 128 of low nibbles ql, 64 of high bit pairs qh, 16 int8 scales,
    d fp16) into buf[y0:y0 + 256]: value 128 h + 32 i + l is ((ql[64 h + 32 (i % 2) + l] >> 4 (i // 2)) & 15
    | ((qh[32 h + l] >> 2 i) & 3) << 4) - 32, times d x scale[value // 16]."""
    d = h2f(w[o + _U(208)], w[o + _U(209)])
    for h in range(2):
        for i in range(4):
            ql = o + _U(64 * h + 32 * (i % 2))
            qh = o + _U(128 + 32 * h)
            sl, sh = np.int32(4 * (i // 2)), np.int32(2 * i)
            base = 128 * h + 32 * i
            for half in range(2):  # two 16-value runs, a scale each
                a = d * np.float32(np.int8(w[o + _U(192 + base // 16 + half)]))
                l0 = _U(16 * half)
                for l in range(qk // _U(2)):
                    q = ((np.int32(w[ql + l0 + l]) >> sl) & 15) | (((np.int32(w[qh + l0 + l]) >> sh) & 3) << 4)
                    buf[y0 + base + 16 * half + np.int64(l)] = a * np.float32(q - 32)


@njit(fastmath=True, inline="always")
def _q3_k_scale(w, s, r):
    """The 6-bit scale of run r (0..15) of the 12 packed bytes at s, minus 32 (ggml's dequantize_row_q3_K: low
    nibbles of bytes 0..7 for runs 0..7, their high nibbles for runs 8..15; bit pair r // 4 of byte 8 + r % 4 on top)."""
    lo = (np.int32(w[s + _U(r % 8)]) >> (4 * (r // 8))) & 15
    hi = (np.int32(w[s + _U(8 + r % 4)]) >> (2 * (r // 4))) & 3
    return (lo | (hi << 4)) - 32


@njit(fastmath=True, inline="always")
def _q3_k_block(w, o, buf, y0, qk):
    """One Q3_K super-block (110 bytes at o: 32 bytes hmask, 64 of bit pairs qs, 12 of packed 6-bit scales, d fp16)
    into buf[y0:y0 + 256]: value 128 n + 32 j + l is ((qs[32 n + l] >> 2 j) & 3) - 4 + 4 x bit 4 n + j of hmask[l],
    times d x (scale[8 n + 2 j + l // 16] - 32) (ggml's dequantize_row_q3_K)."""
    d = h2f(w[o + _U(108)], w[o + _U(109)])
    for n in range(2):
        for j in range(4):
            for half in range(2):
                a = d * np.float32(_q3_k_scale(w, o + _U(96), 8 * n + 2 * j + half))
                for l in range(qk // _U(2)):
                    ll = _U(16 * half) + l
                    q = ((np.int32(w[o + _U(32 + 32 * n) + ll]) >> (2 * j)) & 3) - 4
                    q += 4 * ((np.int32(w[o + ll]) >> (4 * n + j)) & 1)
                    buf[y0 + 128 * n + 32 * j + np.int64(ll)] = a * np.float32(q)


@njit(fastmath=True, inline="always")
def _q2_k_block(w, o, buf, y0, qk):
    """One Q2_K super-block (84 bytes at o: 16 bytes of run scales (low nibble) and mins (high), 64 of bit pairs
    qs, d and dmin fp16) into buf[y0:y0 + 256]: value 128 n + 32 j + l is (d sc_r) ((qs[16 + 32 n + l] >> 2 j) & 3)
    - (dmin m_r), r = 8 n + 2 j + l // 16 (ggml's dequantize_row_q2_K)."""
    d, dmin = h2f(w[o + _U(80)], w[o + _U(81)]), h2f(w[o + _U(82)], w[o + _U(83)])
    for n in range(2):
        for j in range(4):
            for half in range(2):
                sc = np.int32(w[o + _U(8 * n + 2 * j + half)])
                a, m = d * np.float32(sc & 15), dmin * np.float32(sc >> 4)
                for l in range(qk // _U(2)):
                    ll = _U(16 * half) + l
                    q = (np.int32(w[o + _U(16 + 32 * n) + ll]) >> (2 * j)) & 3
                    buf[y0 + 128 * n + 32 * j + np.int64(ll)] = a * np.float32(q) - m


def _q4_k_scales_ir(builder, p):
    """Codegen: the eight 6-bit scales and mins of the Q4_K super-block at p as two <8 x i32>, unpacked in general
    registers as ggml's AVX2 dot product does (its utmp and kmask1-3: sub-blocks 0-3 from bytes 0-3 / 4-7 of the 12,
    4-7 from the nibbles of bytes 8-11 and the top two bits of bytes 0-3 / 4-7), then one byte widening each. Done
    with byte shuffles and lane shifts in vectors instead (session 14), it took ~30% of the row loop's time: the
    vector pipes are what the products need, the integer ones idle (one core, in L2, with _rows_q4_k_ir's lane
    sums: 30.3 -> 33.1 G weights/s)."""
    i32 = lambda v: ir.Constant(I32, v)  # noqa: E731
    u = [builder.load(builder.bitcast(builder.gep(p, [ir.Constant(I64, 4 + 4 * i)]), I32.as_pointer()), align=1)
         for i in range(3)]
    k1, k2, k3 = i32(0x3F3F3F3F), i32(0x0F0F0F0F), i32(0x03030303)
    top = lambda v: builder.shl(builder.and_(builder.lshr(v, i32(6)), k3), i32(4))  # noqa: E731

    def widened(lo, hi):  # eight bytes (lo's four, then hi's) -> <8 x i32>, through one 64-bit move
        q = builder.or_(builder.zext(lo, I64), builder.shl(builder.zext(hi, I64), ir.Constant(I64, 32)))
        v = builder.bitcast(builder.insert_element(ir.Constant(V(I64, 2), [0, 0]), q, i32(0)), V(I8, 16))
        return builder.zext(builder.shuffle_vector(v, v, ir.Constant(V(I32, 8), list(range(8)))), V(I32, 8))
    return (widened(builder.and_(u[0], k1), builder.or_(builder.and_(u[2], k2), top(u[0]))),
            widened(builder.and_(u[1], k1), builder.or_(builder.and_(builder.lshr(u[2], i32(4)), k2), top(u[1]))))


def _q3_k_scales_ir(builder, p):
    """Codegen: the sixteen 6-bit run scales of the Q3_K super-block at p, minus 32, as two <8 x i32> (runs 0-7,
    8-15; _q3_k_scale on eight lanes: byte shuffles and lane shifts), from the 16 bytes at 94 (the scales at 96..107:
    the load stays inside the block)."""
    b16 = builder.load(builder.bitcast(builder.gep(p, [ir.Constant(I64, 94)]), V(I8, 16).as_pointer()), align=1)
    pick = lambda idx: builder.zext(builder.shuffle_vector(b16, b16, ir.Constant(V(I32, 8), idx)), V(I32, 8))  # noqa: E731
    c32 = lambda vals: ir.Constant(V(I32, 8), vals)  # noqa: E731
    out = []
    for u in range(2):  # runs 8u .. 8u + 7
        lo = builder.and_(builder.lshr(pick(list(range(2, 10))), c32([4 * u] * 8)), c32([15] * 8))
        hi = builder.and_(builder.lshr(pick([10, 11, 12, 13] * 2), c32([4 * u] * 4 + [4 * u + 2] * 4)), c32([3] * 8))
        out.append(builder.sub(builder.or_(lo, builder.shl(hi, c32([4] * 8))), c32([32] * 8)))
    return out


@njit(fastmath=True, inline="always")
def _block(bs, w, o, buf, y0):
    """The K-quant super-block of bs bytes (Q2_K 84, Q3_K 110, Q4_K 144, Q5_K 176, Q6_K 210) at o into buf[y0:y0 + 256]."""
    if bs == 210:
        _q6_k_block(w, o, buf, y0, _U(32))
    elif bs == 110:
        _q3_k_block(w, o, buf, y0, _U(32))
    elif bs == 84:
        _q2_k_block(w, o, buf, y0, _U(32))
    else:
        _q4_k_block(w, o, buf, y0, _U(32), bs == 176)


# ---------------------------------------------------------------------------------------------
# whole super-blocks to float32 (prefill's dequantise-then-GEMM, embeddings): the values of
# _q4_k_block / _q6_k_block, the same float multiplies and subtractions, eight lanes at a time
# ---------------------------------------------------------------------------------------------

_BS = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}  # bytes a super-block
MINS_SLOT = 16  # where _super_block_ir's slot holds the mins


def _super_block_ir(fmt: str, builder, p, slot) -> list:
    """Codegen: the K-quant super-block at p, unpacked. Each sub-block's float scale d sc (Q4_K, Q5_K: eight of 32
    values; Q6_K, Q3_K, Q2_K: sixteen runs of 16) to slot[0:16], and its min dmin m (Q4_K, Q5_K, Q2_K) to
    slot[16:32]; returns [(v, signed, y, runs)]: v the <32 x i8> integers of values y .. y + 31 in natural order
    (nibbles, bit pairs, Q5_K's fifth bits, Q6_K's q - 32 ...), signed or not, and the sub-block or run of each
    eight of them. A chunk's bytes split into nibbles (and bit pairs, or Q5_K's fifth bits) as byte vectors."""
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    c8 = lambda v: ir.Constant(V(I8, 32), [v] * 32)  # noqa: E731
    half = ir.HalfType()
    ld16 = lambda off: builder.fpext(builder.load(builder.bitcast(builder.gep(p, [i64(off)]),  # noqa: E731
                                                                  half.as_pointer()), align=1), F32)
    ld32 = lambda off: builder.load(builder.bitcast(builder.gep(p, [i64(off)]), V(I8, 32).as_pointer()), align=1)
    sv = builder.bitcast(slot, V(F32, 8).as_pointer())
    out = []
    if fmt in ("Q4_K", "Q5_K"):  # the row kernels' unpacking of the 6-bit fields
        sc, mn = _q4_k_scales_ir(builder, p)
        builder.store(_fmul(builder, _splat(builder, ld16(0), 8), builder.sitofp(sc, V(F32, 8))), sv, align=4)
        builder.store(_fmul(builder, _splat(builder, ld16(2), 8), builder.sitofp(mn, V(F32, 8))),
                      builder.gep(sv, [i64(2)]), align=4)
        qh = ld32(16) if fmt == "Q5_K" else None
        for j in range(4):
            q = ld32((48 if qh is not None else 16) + 32 * j)
            for h, v in enumerate((builder.and_(q, c8(15)), builder.lshr(q, c8(4)))):
                c = 2 * j + h
                if qh is not None:  # bit c of qh[l] -> 16, by a byte compare (x86 has no byte shifts)
                    bit = builder.icmp_unsigned("==", builder.and_(qh, c8(1 << c)), c8(1 << c))
                    v = builder.or_(v, builder.and_(builder.sext(bit, V(I8, 32)), c8(16)))
                out.append((v, False, 32 * c, [c] * 4))
    elif fmt == "Q2_K":  # values pair
        sc = builder.load(builder.bitcast(p, V(I8, 16).as_pointer()), align=1)
        for u in range(2):
            v = builder.zext(builder.shuffle_vector(sc, sc, ir.Constant(V(I32, 8), list(range(8 * u, 8 * u + 8)))),
                             V(I32, 8))
            lo = builder.and_(v, ir.Constant(V(I32, 8), [15] * 8))
            hi = builder.lshr(v, ir.Constant(V(I32, 8), [4] * 8))
            builder.store(_fmul(builder, _splat(builder, ld16(80), 8), builder.sitofp(lo, V(F32, 8))),
                          builder.gep(sv, [i64(u)]), align=4)
            builder.store(_fmul(builder, _splat(builder, ld16(82), 8), builder.sitofp(hi, V(F32, 8))),
                          builder.gep(sv, [i64(2 + u)]), align=4)
        for n in range(2):
            q = ld32(16 + 32 * n)
            for j in range(4):
                out.append((builder.and_(builder.lshr(q, c8(2 * j)) if j else q, c8(3)), False, 128 * n + 32 * j,
                            [8 * n + 2 * j + g // 2 for g in range(4)]))
    elif fmt == "Q3_K":  # d (sc - 32) of the sixteen runs; values (pair | hmask bit << 2) - 4
        d = _splat(builder, ld16(108), 8)
        for u, sc in enumerate(_q3_k_scales_ir(builder, p)):
            builder.store(_fmul(builder, d, builder.sitofp(sc, V(F32, 8))), builder.gep(sv, [i64(u)]), align=4)
        hm = ld32(0)
        for n in range(2):
            q = ld32(32 + 32 * n)
            for j in range(4):
                pair = builder.and_(builder.lshr(q, c8(2 * j)) if j else q, c8(3))
                bit = builder.icmp_unsigned("==", builder.and_(hm, c8(1 << (4 * n + j))), c8(1 << (4 * n + j)))
                v = builder.sub(builder.or_(pair, builder.and_(builder.sext(bit, V(I8, 32)), c8(4))), c8(4))
                out.append((v, True, 128 * n + 32 * j, [8 * n + 2 * j + g // 2 for g in range(4)]))
    else:  # Q6_K: d sc of the sixteen runs
        sc = builder.load(builder.bitcast(builder.gep(p, [i64(192)]), V(I8, 16).as_pointer()), align=1)
        d = _splat(builder, ld16(208), 8)
        for u in range(2):
            s8 = builder.shuffle_vector(sc, sc, ir.Constant(V(I32, 8), list(range(8 * u, 8 * u + 8))))
            builder.store(_fmul(builder, d, builder.sitofp(s8, V(F32, 8))), builder.gep(sv, [i64(u)]), align=4)
        for h in range(2):
            qh = ld32(128 + 32 * h)
            for i in range(4):
                ql = ld32(64 * h + 32 * (i % 2))
                nib = builder.and_(ql, c8(15)) if i < 2 else builder.lshr(ql, c8(4))
                pair = builder.and_(builder.lshr(qh, c8(2 * i)) if i else qh, c8(3))
                q = builder.sub(builder.or_(nib, builder.shl(pair, c8(4))), c8(32))  # -32 .. 31 as i8
                out.append((q, True, 128 * h + 32 * i, [8 * h + 2 * i + g // 2 for g in range(4)]))
    return out


def _deq_ir(fmt: str):
    """Codegen: buf[0 : 256 nsb] = the nsb K-quant super-blocks at byte o of w, as gguf.dequantize
    gives them (Q4_K, Q5_K: (d sc) q - (dmin m); Q6_K: (d sc) (q - 32)): _super_block_ir's integers widened eight at
    a time (vpmovzxbd / vpmovsxbd), converted and scaled."""
    bs, mins = _BS[fmt], fmt in ("Q4_K", "Q5_K", "Q2_K")

    def gen(context, builder, sig, args):
        wa, o, ba, nsb = args
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        i32 = lambda v: ir.Constant(I32, v)  # noqa: E731
        wd = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=wa).data
        bd = cgutils.create_struct_proxy(sig.args[2])(context, builder, value=ba).data
        slot = builder.bitcast(cgutils.alloca_once(builder, V(F32, 32)), F32.as_pointer())

        def eight(v, g, signed):  # <8 x f32> of bytes 8g .. 8g + 7 of the <32 x i8> v
            b8 = builder.shuffle_vector(v, v, ir.Constant(V(I32, 8), list(range(8 * g, 8 * g + 8))))
            return builder.sitofp((builder.sext if signed else builder.zext)(b8, V(I32, 8)), V(F32, 8))

        with cgutils.for_range(builder, nsb) as loop:
            sb = loop.index
            p = builder.gep(wd, [builder.add(o, builder.mul(sb, i64(bs)))])
            y0 = builder.mul(sb, i64(256))
            for v, signed, y, runs in _super_block_ir(fmt, builder, p, slot):
                for g in range(4):
                    f = _splat(builder, builder.load(builder.gep(slot, [i32(runs[g])]), align=4), 8)
                    val = _fmul(builder, f, eight(v, g, signed))
                    if mins:
                        m = _splat(builder, builder.load(builder.gep(slot, [i32(MINS_SLOT + runs[g])]), align=4), 8)
                        val = _fsub(builder, val, m)
                    builder.store(val, builder.bitcast(builder.gep(bd, [builder.add(y0, i64(y + 8 * g))]),
                                                       V(F32, 8).as_pointer()), align=4)
        return context.get_dummy_value()

    return gen


def _deq_kernel(fmt: str):
    """deq_q4_k_row / deq_q5_k_row / deq_q6_k_row(w, o, buf, nsb): buf[0 : 256 nsb] = nsb super-blocks at byte o
    of w."""
    if HAVE_AVX2:
        @intrinsic
        def kernel(typingctx, w, o, buf, nsb):
            return types.none(w, o, buf, nsb), _deq_ir(fmt)
    else:
        bs = _BS[fmt]

        @njit
        def kernel(w, o, buf, nsb):
            for b in range(nsb):
                _block(bs, w, _U(o + bs * b), buf, 256 * b)
    return kernel


deq_q2_k_row, deq_q3_k_row, deq_q4_k_row, deq_q5_k_row, deq_q6_k_row = (_deq_kernel(f) for f in
                                                                        ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"))
