"""The K-quants' rows (Q2_K .. Q6_K) and IQ4_XS's on int8 activations with AVX-512 VNNI (`vpdpbusd`): an int8
build's (`execute --gemm-int8`, llama.cpp's precision) rows for the matrices of llama.cpp's K-quant and IQ4_XS files,
as vnni.py's are for Q4_0 and IQ4_NL.

A super-block of 256 values is eight 32-blocks of x. Each type's weights (_weights) become four 64-byte vectors of
unsigned bytes, each two whole blocks in order, met by one 64-byte slot of lanes8's x8 (vnni.L8_KQ: blocks 4i and
4i + 2 side by side, or 4i and 4i + 1), so a row and super-block is four `vpdpbusd` where kquants.py's int16 rows
take sixteen `vpmaddwd` and their shifts:
- Q4_K (144 bytes: fp16 d and dmin, twelve bytes of 6-bit scales and mins, 128 of nibbles): byte l of chunk j (32
  bytes) has value l of sub-block 2j in its low nibble and of 2j + 1 in its high one, so one 64-byte load's low
  nibbles (a mask) are sub-blocks 2j and 2j + 2, its high ones (a shift and a mask) 2j + 1 and 2j + 3. Q5_K: the same
  with each sub-block's fifth bit from qh.
- Q6_K, Q3_K, Q2_K, IQ4_XS: blocks 2i and 2i + 1 (ql's nibbles with qh's bit pairs; bit pairs of a half of qs, Q3_K's
  with hmask's bits; IQ4_XS's codebook lookups, each block's halves side by side).
The lanes are summed per sub-block (eight lanes; Q6_K, Q3_K, Q2_K: per 16-value run, four) by two-register shuffles
and adds (exact), then one convert and one fma with d sc dx8 a super-block, each lane its sub-block's (run's), and
one fma of the offsets into a second accumulator: the mins (dmin m) or the bias (Q6_K's 32, Q3_K's 4, IQ4_XS's
codebook + 128, times d sc) times lanes8's sums8 (dx8 x a block's sum of x8) or runs8 (a run's). A Q4_K row is sum_c
dx8_c (d sc_c sum q x8 - dmin m_c sum x8): llama.cpp's Q4_K x Q8_K product with a scale a 32-block (Q8_0's) instead
of one a super-block.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils
from numba.extending import intrinsic

from .iquants import KVALUES, _xs_scales_ir
from .kquant_blocks import _q3_k_scales_ir, _q4_k_scales_ir
from .kquants import _prologue, _super_block
from .simd import F32, I8, I16, I32, I64, V, _fadd, _fmul, _fn, _fsub, _qsig, _slice, _splat, hsum8
from .vnni import HAVE_VBMI, L8_KQ, SPLIT_FLOATS, _dpbusd, _dx8_at_ir

_PAIRS = list(range(0, 32, 2))  # each pair of adjacent lanes of two <16 x i32>, the first's then the second's


def _pair_sums(builder, x, y, idx=_PAIRS):
    """Codegen: <16 x i32> lane i = lanes idx[i] + idx[i] + 1 of x then y (two-register shuffles and an add)."""
    p = builder.shuffle_vector(x, y, ir.Constant(V(I32, 16), idx))
    return builder.add(p, builder.shuffle_vector(x, y, ir.Constant(V(I32, 16), [i + 1 for i in idx])))


def _sub_block_sums(builder, a, b, c, d, natural: bool = False):
    """Codegen: four <16 x i32> vpdpbusd results of a Q4_K super-block, eight lanes a sub-block (a: sub-blocks 0, 2; b:
    1, 3; c: 4, 6; d: 5, 7; natural: 0, 1; 2, 3; 4, 5; 6, 7) -> <8 x i32>, lane c the sum of sub-block c's lanes.
    Integer adds: exact."""
    ab, cd = _pair_sums(builder, a, b), _pair_sums(builder, c, d)  # lanes 4g .. 4g + 3: sub-blocks 0 2 1 3 (4 6 5 7)
    # lanes c and c + 8: the halves of sub-block c's four
    half = [0, 4, 8, 12, 16, 20, 24, 28] if natural else [0, 8, 4, 12, 16, 24, 20, 28]
    s = _pair_sums(builder, ab, cd, half + [i + 2 for i in half])
    return builder.add(_slice(builder, s, 0, 8), _slice(builder, s, 8, 8))


def _run_sums(builder, v0, v1, v2, v3):
    """Codegen: four <16 x i32> vpdpbusd results of a Q6_K super-block, four lanes a 16-value run (v0: runs 0-3, ..
    v3: 12-15) -> <16 x i32>, lane r the sum of run r's lanes (two levels of pair sums: exact)."""
    return _pair_sums(builder, _pair_sums(builder, v0, v1), _pair_sums(builder, v2, v3))


def _x8_slots(builder, kq, blk0, slots):
    """Codegen: the 64-byte L8_KQ slots of blocks blk0 + q (q in slots) of one token's DX (kq: block 0's slot, i8*)."""
    return [builder.load(builder.bitcast(builder.gep(kq, [builder.mul(builder.add(blk0, ir.Constant(I64, q)),
                                                                      ir.Constant(I64, 4 * SPLIT_FLOATS))]),
                                         V(I32, 16).as_pointer()), align=1) for q in slots]


def _h16(builder, p, n):
    """Codegen: the fp16 at byte pointer p as <n x f32>."""
    h = builder.load(builder.bitcast(p, I16.as_pointer()), align=1)
    return builder.fpext(builder.bitcast(_splat(builder, h, n), V(ir.HalfType(), n)), V(F32, n))


def _bytes(builder, p, at, n):
    """Codegen: the n bytes at p + at as <n/4 x i32>."""
    return builder.load(builder.bitcast(builder.gep(p, [ir.Constant(I64, at)]), V(I32, n // 4).as_pointer()), align=1)


def _c32(v):
    """<16 x i32> constant: v in every lane, or the list v."""
    return ir.Constant(V(I32, 16), v if isinstance(v, list) else [v] * 16)


def _halves(builder, v32):
    """Codegen: <8 x i32> (32 bytes) in both 256-bit halves of a <16 x i32>."""
    return builder.shuffle_vector(v32, v32, _c32(list(range(8)) * 2))


def _shifted(builder, v, counts):
    """Codegen: v's dwords shifted by per-half counts (a, b): positive right, negative left (vpsrlvd / vpsllvd)."""
    a, b = counts
    if a <= 0 and b <= 0:
        return builder.shl(v, _c32([-a] * 8 + [-b] * 8))
    assert a >= 0 and b >= 0
    return builder.lshr(v, _c32([a] * 8 + [b] * 8))


def _q4_k_weights(builder, p, q5: bool):
    """Codegen: a Q4_K (q5: Q5_K) super-block's four unsigned-byte vectors (sub-blocks 0 2, 1 3, 4 6, 5 7), d sc
    and dmin m (<8 x f32>, sub-blocks in order). Q5_K's fifth bit of sub-block c is bit c of qh's byte l, moved to
    bit 4 by one shift of each half (qh broadcast to both) and a mask, or-ed in: q in 0..31."""
    sc, mn = _q4_k_scales_ir(builder, p)
    dsc = _fmul(builder, _h16(builder, p, 8), builder.sitofp(sc, V(F32, 8)))
    dmn = _fmul(builder, _h16(builder, builder.gep(p, [ir.Constant(I64, 2)]), 8), builder.sitofp(mn, V(F32, 8)))
    nib = _c32(0x0F0F0F0F)
    ws = []
    for j in (0, 1):  # chunks 2j, 2j + 1: low nibbles sub-blocks 4j, 4j + 2; high ones 4j + 1, 4j + 3
        q = _bytes(builder, p, (48 if q5 else 16) + 64 * j, 64)
        ws += [builder.and_(q, nib), builder.and_(builder.lshr(q, _c32(4)), nib)]
    if q5:
        qh = _halves(builder, _bytes(builder, p, 16, 32))
        for i, c in enumerate((0, 1, 4, 5)):  # the vector's sub-blocks c, c + 2: bits c, c + 2 of qh to bit 4
            five = builder.and_(_shifted(builder, qh, (c - 4, c - 2)), _c32(0x10101010))
            ws[i] = builder.or_(ws[i], five)
    return ws, dsc, dmn


def _q6_k_weights(builder, p):
    """Codegen: a Q6_K super-block's four unsigned-byte vectors (blocks 0 1, 2 3, 4 5, 6 7, q in 0..63), d sc and
    32 d sc (<16 x f32>, the runs in order). Half h is one 64-byte load of ql and qh's 32 bytes broadcast to both
    halves: ql's low nibbles are blocks 4h, 4h + 1 with qh's bit pairs 0 and 2 (vpsllvd by 4 and 2), its high ones
    blocks 4h + 2, 4h + 3 with pairs 4 and 6 (vpsrlvd by 0 and 2)."""
    sc = builder.load(builder.bitcast(builder.gep(p, [ir.Constant(I64, 192)]), V(I8, 16).as_pointer()), align=1)
    dsc = _fmul(builder, _h16(builder, builder.gep(p, [ir.Constant(I64, 208)]), 16), builder.sitofp(sc, V(F32, 16)))
    nib, pair = _c32(0x0F0F0F0F), _c32(0x30303030)
    ws = []
    for h in (0, 1):
        ql, qh = _bytes(builder, p, 64 * h, 64), _halves(builder, _bytes(builder, p, 128 + 32 * h, 32))
        ws += [builder.or_(builder.and_(ql, nib), builder.and_(_shifted(builder, qh, (-4, -2)), pair)),
               builder.or_(builder.and_(builder.lshr(ql, _c32(4)), nib), builder.and_(_shifted(builder, qh, (0, 2)), pair))]
    return ws, dsc, _fmul(builder, dsc, ir.Constant(V(F32, 16), [32.0] * 16))


def _q2_q3_k_weights(builder, p, q3: bool):
    """Codegen: a Q2_K (q3: Q3_K) super-block's four unsigned-byte vectors (blocks 0 1, 2 3, 4 5, 6 7), d sc and the
    offsets' scale (<16 x f32>, the runs in order): Q2_K's dmin m (a run's value d sc q - dmin m), Q3_K's 4 d sc (its
    value d sc (q - 4)). Block 4h + j is bit pair j of the 32 bytes of half h of qs (Q3_K: with bit 4h + j of hmask's
    bytes as bit 2), so a vector is that half broadcast to both halves, each shifted by its own count, and a mask."""
    qs_at, d_at = (32, 108) if q3 else (16, 80)
    if q3:
        s0, s1 = _q3_k_scales_ir(builder, p)  # (runs 0-7, 8-15) - 32
        sc = builder.shuffle_vector(s0, s1, _c32(list(range(16))))
    else:
        b = builder.load(builder.bitcast(p, V(I8, 16).as_pointer()), align=1)
        sc = builder.zext(b, V(I32, 16))
        mins = builder.lshr(sc, _c32(4))
        sc = builder.and_(sc, _c32(15))
    dsc = _fmul(builder, _h16(builder, builder.gep(p, [ir.Constant(I64, d_at)]), 16), builder.sitofp(sc, V(F32, 16)))
    if q3:
        off = _fmul(builder, dsc, ir.Constant(V(F32, 16), [4.0] * 16))
    else:
        off = _fmul(builder, _h16(builder, builder.gep(p, [ir.Constant(I64, 82)]), 16), builder.sitofp(mins, V(F32, 16)))
    ws = []
    hm = _halves(builder, _bytes(builder, p, 0, 32)) if q3 else None
    for h in (0, 1):
        qs = _halves(builder, _bytes(builder, p, qs_at + 32 * h, 32))
        for j in (0, 2):
            w = builder.and_(_shifted(builder, qs, (2 * j, 2 * j + 2)), _c32(0x03030303))
            if q3:  # bits 4h + j, 4h + j + 1 of hmask to bit 2
                hb = _shifted(builder, hm, (4 * h + j - 2, 4 * h + j - 1))
                w = builder.or_(w, builder.and_(hb, _c32(0x04040404)))
            ws.append(w)
    return ws, dsc, off


def _iq4_xs_weights(builder, p):
    """Codegen: an IQ4_XS super-block's four unsigned-byte vectors (blocks 0 1, 2 3, 4 5, 6 7: kvalues_iq4nl + 128), d
    (ls - 32) and 128 d (ls - 32) (<8 x f32>, the blocks in order: the +128 comes off as each block's x8 sum times its
    scale). A 64-byte load of qs is four blocks of 16 bytes, value l of a block the low nibble of its byte l, value 16 +
    l the high one: both looked up (vpermb in the 64-entry table, the 16 values four times over, with AVX-512 VBMI;
    else masked, then vpshufb), then each block's two 16-byte halves put side by side (two qword permutes)."""
    dsc = _xs_scales_ir(builder, p)
    lut = ir.Constant(V(I8, 64), [int(v) + 128 for v in KVALUES] * 4)
    vpermb = _fn(builder, "llvm.x86.avx512.permvar.qi.512", V(I8, 64), [V(I8, 64)] * 2)
    pshufb = _fn(builder, "llvm.x86.avx512.pshuf.b.512", V(I8, 64), [V(I8, 64)] * 2)

    def look(v):
        if HAVE_VBMI:  # bits 4-5 of an index pick the same value: no mask
            return builder.bitcast(builder.call(vpermb, [lut, builder.bitcast(v, V(I8, 64))]), V(I64, 8))
        idx = builder.bitcast(builder.and_(v, _c32(0x0F0F0F0F)), V(I8, 64))
        return builder.bitcast(builder.call(pshufb, [lut, idx]), V(I64, 8))
    ws = []
    for k in (0, 1):  # blocks 4k .. 4k + 3
        q = _bytes(builder, p, 8 + 64 * k, 64)
        lo, hi = look(q), look(builder.lshr(q, _c32(4)))
        for i in (0, 1):  # blocks 4k + 2i, 4k + 2i + 1: each one's low-nibble values, then its high ones
            idx = [4 * i, 4 * i + 1, 8 + 4 * i, 9 + 4 * i, 4 * i + 2, 4 * i + 3, 10 + 4 * i, 11 + 4 * i]
            ws.append(builder.bitcast(builder.shuffle_vector(lo, hi, ir.Constant(V(I32, 8), idx)), V(I32, 16)))
    return ws, dsc, _fmul(builder, dsc, ir.Constant(V(F32, 8), [128.0] * 8))


# Each type's super-block bytes, float lanes (8 sub-blocks or 16 runs) and the L8_KQ slots its four vectors meet
_KINDS = {"q4_k": (144, 8, (0, 1, 4, 5)), "q5_k": (176, 8, (0, 1, 4, 5)), "q6_k": (210, 16, (2, 3, 6, 7)),
          "q3_k": (110, 16, (2, 3, 6, 7)), "q2_k": (84, 16, (2, 3, 6, 7)), "iq4_xs": (136, 8, (2, 3, 6, 7))}


def _weights(builder, p, kind):
    """Codegen: the four unsigned-byte vectors of a super-block of type `kind`, its scales and its offsets' scales."""
    if kind in ("q4_k", "q5_k"):
        return _q4_k_weights(builder, p, kind == "q5_k")
    if kind == "q6_k":
        return _q6_k_weights(builder, p)
    if kind == "iq4_xs":
        return _iq4_xs_weights(builder, p)
    return _q2_q3_k_weights(builder, p, kind == "q3_k")


def _rows_k_vnni(NR: int, MT: int, kind: str):
    """Codegen: res[k0 + t, ro + k] = row_k . x_t for NR K-quant rows of type `kind` at byte woff + k * rb (nb 32-blocks
    each) and the MT tokens t of DX from k0, read as lanes8 wrote them (an int8 build): x8 at the K-quant places, dx8,
    sums8 (the mins of Q4_K and Q5_K), runs8 (Q6_K's - 32, Q3_K's - 4, Q2_K's mins). A row's weights and scales are
    decoded once for all MT tokens; each token's products and adds are those of MT = 1, so a token gets the same bits
    in any row or token group. Per token and super-block: four vpdpbusd, the lanes summed per sub-block (run), one
    convert and one fma with d sc dx8, and one fma of the offsets' scale and sums8 (runs8) into a second accumulator.

    The default build's int16 activations, split as Q4_0's (x16 = 256 h + l: two vpdpbusd and a shift a load), gave
    kquants.py's int16 Q4_K rows their bits but not their speed (one core in L2, session 39: 1 / 2 / 4 tokens 34.4 /
    36.1 / 38.4 against 33.6 / 41.3 / 48.5 G token-weights/s: the lane sums cost as much as the products saved), so
    that build keeps kquants.py's."""
    bs, W, slots = _KINDS[kind]

    def gen(context, builder, sig, args):
        woff, nb, roff = args[1], args[6], args[8]
        i64, wd, _, dds, rds, rbk, pfo, nsb = _prologue(context, builder, sig, args, NR, MT)
        zero = ir.Constant(V(F32, W), [0.0] * W)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(MT)] for _ in range(NR)]
        corr = [[cgutils.alloca_once_value(builder, zero) for _ in range(MT)] for _ in range(NR)]
        fma = _fn(builder, f"llvm.fma.v{W}f32", V(F32, W), [V(F32, W)] * 3)
        d8at = _dx8_at_ir(builder, nb)
        s8at = builder.add(d8at, nb) if W == 8 else builder.add(d8at, builder.add(nb, nb))  # sums8 / runs8
        kq = [builder.gep(builder.bitcast(dd, I8.as_pointer()), [builder.add(builder.mul(nb, i64(8)), i64(64 * L8_KQ))])
              for dd in dds]  # block 0's slot
        with cgutils.for_range(builder, nsb) as loop:
            sb = loop.index
            ps = _super_block(builder, wd, woff, rbk, pfo, sb, bs)
            blk0 = builder.mul(sb, i64(8))
            xs, dx8s, s8s = [], [], []  # per token: the four 64-byte x8 pairs; dx8 a lane; sums8 (runs8) a lane
            for t, dd in enumerate(dds):
                def floats(at, n):
                    return builder.load(builder.bitcast(builder.gep(dd, [at]), V(F32, n).as_pointer()), align=4)
                v = floats(builder.add(d8at, blk0), 8)
                dx8s.append(v if W == 8 else builder.shuffle_vector(v, v, _c32([r // 2 for r in range(16)])))
                s8s.append(floats(builder.add(s8at, builder.mul(blk0, i64(W // 8))), W))
                xs.append(_x8_slots(builder, kq[t], blk0, slots))
            for k, p in enumerate(ps):
                ws, dsc, dmn = _weights(builder, p, kind)
                for t in range(MT):
                    prods = [_dpbusd(builder, _c32(0), w, x) for w, x in zip(ws, xs[t])]
                    s = _run_sums(builder, *prods) if W == 16 else _sub_block_sums(builder, *prods, slots[0] == 2)
                    acc = builder.call(fma, [builder.sitofp(s, V(F32, W)), _fmul(builder, dsc, dx8s[t]),
                                             builder.load(accs[k][t])])
                    builder.store(acc, accs[k][t])
                    builder.store(builder.call(fma, [dmn, s8s[t], builder.load(corr[k][t])]), corr[k][t])
        for t in range(MT):
            for k in range(NR):
                a, c = builder.load(accs[k][t]), builder.load(corr[k][t])
                if W == 16:  # halves added first
                    a, c = (_fadd(builder, _slice(builder, v, 0, 8), _slice(builder, v, 8, 8)) for v in (a, c))
                v = _fsub(builder, hsum8(builder, a), hsum8(builder, c))
                builder.store(v, builder.gep(rds[t], [builder.add(roff, i64(k))]))
        return context.get_dummy_value()

    return gen


def k_vnni_kernel(NR: int, MT: int = 1, kind: str = "q4_k"):
    """rows{NR}[x{MT}] for K-quant rows of type `kind` (q2_k .. q6_k) on int8 activations (an int8 build with AVX-512
    VNNI): simd._qkernel's signature, DX carrying lanes8's rows (kernels._quant_rows writes them)."""
    @intrinsic
    def kernel(typingctx, w, wo, rb, X16, DX, k0, nb, res, ro):
        return _qsig(w, wo, rb, X16, DX, k0, nb, res, ro), _rows_k_vnni(NR, MT, kind)
    return kernel
