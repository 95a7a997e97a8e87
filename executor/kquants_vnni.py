"""Q4_K and Q6_K rows on int8 activations with AVX-512 VNNI (`vpdpbusd`): an int8 build's (`execute --gemm-int8`,
llama.cpp's precision) rows for the matrices of llama.cpp's Q4_K_M files, as vnni.py's are for Q4_0 and IQ4_NL.

A Q4_K super-block (144 bytes: fp16 d and dmin, twelve bytes of 6-bit scales and mins, 128 of nibbles) holds eight
32-value sub-blocks, each one 32-block of x: byte l of chunk j (32 bytes) has value l of sub-block 2j in its low nibble
and of 2j + 1 in its high one. One 64-byte load takes chunks j, j + 1; its low nibbles (a mask) are sub-blocks 2j
and 2j + 2, its high ones (a shift and a mask) 2j + 1 and 2j + 3, in order, as unsigned bytes. lanes8 writes each
token's x8 in order with blocks 4i and 4i + 2 in one 64-byte slot, 4i + 1 and 4i + 3 in the next (vnni.L8_KQ), so each
is one `vpdpbusd` against one load: four a row and super-block, where kquants.py's int16 rows take sixteen
`vpmaddwd` and their shifts. The four results' eight lanes a sub-block are summed across lanes (three levels of
two-register shuffles and adds: exact), then one convert and one fma with d sc dx8 a super-block, each lane its
sub-block's, and the mins' term, dmin m times sums8 (dx8 x the block's sum of x8, lanes8's), into a second
accumulator. A row is sum_c dx8_c (d sc_c sum q x8 - dmin m_c sum x8): llama.cpp's Q4_K x Q8_K product with a scale
a 32-block (Q8_0's) instead of one a super-block. Q6_K's rows (_rows_k_vnni's q6) are the same loop over its 6-bit
values, four lanes a 16-value run.
"""
from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils
from numba.extending import intrinsic

from .kquant_blocks import _q4_k_scales_ir
from .kquants import _prologue, _super_block
from .simd import F32, I16, I32, I64, V, _fadd, _fmul, _fn, _fsub, _qsig, _slice, _splat, h16x8, hsum8
from .vnni import L8_KQ, SPLIT_FLOATS, _dpbusd, _dx8_at_ir

_PAIRS = list(range(0, 32, 2))  # each pair of adjacent lanes of two <16 x i32>, the first's then the second's


def _pair_sums(builder, x, y, idx=_PAIRS):
    """Codegen: <16 x i32> lane i = lanes idx[i] + idx[i] + 1 of x then y (two-register shuffles and an add)."""
    p = builder.shuffle_vector(x, y, ir.Constant(V(I32, 16), idx))
    return builder.add(p, builder.shuffle_vector(x, y, ir.Constant(V(I32, 16), [i + 1 for i in idx])))


def _sub_block_sums(builder, a, b, c, d):
    """Codegen: four <16 x i32> vpdpbusd results of a Q4_K super-block, eight lanes a sub-block (a: sub-blocks 0, 2; b:
    1, 3; c: 4, 6; d: 5, 7) -> <8 x i32>, lane c the sum of sub-block c's lanes. Integer adds: exact."""
    ab, cd = _pair_sums(builder, a, b), _pair_sums(builder, c, d)  # lanes 4g .. 4g + 3: sub-blocks 0 2 1 3 (4 6 5 7)
    half = [0, 8, 4, 12, 16, 24, 20, 28]  # lanes c and c + 8: the halves of sub-block c's four
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


def _rows_k_vnni(NR: int, MT: int, q6: bool):
    """Codegen: res[k0 + t, ro + k] = row_k . x_t for NR Q4_K (q6: Q6_K) rows at byte woff + k * rb (nb 32-blocks each)
    and the MT tokens t of DX from k0, read as lanes8 wrote them (an int8 build): x8 at the K-quant places, dx8, sums8
    (Q4_K's mins), runs8 (Q6_K's - 32). A row's weights and scales are decoded once for all MT tokens; each token's
    products and adds are those of MT = 1, so a token gets the same bits in any row or token group.

    Q6_K (210 bytes: ql 128, qh 64, sixteen int8 run scales, fp16 d): half h of a super-block (128 values) is one
    64-byte load of ql and qh's 32 bytes broadcast to both halves of a register; ql's low nibbles are blocks 4h, 4h + 1
    with qh's bit pairs 0 and 2 (a shift of each 256-bit half by its own count, vpsllvd), its high ones blocks 4h + 2,
    4h + 3 with pairs 4 and 6 (vpsrlvd): q in 0..63, unsigned bytes against lanes8's natural pairs of blocks. A run's
    value is d sc (q - 32): the -32 x the run's x8 sum comes off in float, a second accumulator of d sc runs8.

    The default build's int16 activations, split as Q4_0's (x16 = 256 h + l: two vpdpbusd and a shift a load), gave
    kquants.py's int16 Q4_K rows their bits but not their speed (one core in L2, session 39: 1 / 2 / 4 tokens 34.4 /
    36.1 / 38.4 against 33.6 / 41.3 / 48.5 G token-weights/s: the lane sums cost as much as the products saved), so
    that build keeps kquants.py's."""
    bs = 210 if q6 else 144
    W = 16 if q6 else 8  # float lanes: a Q6_K super-block's 16 runs, a Q4_K one's 8 sub-blocks

    def gen(context, builder, sig, args):
        woff, nb, roff = args[1], args[6], args[8]
        i64, wd, _, dds, rds, rbk, pfo, nsb = _prologue(context, builder, sig, args, NR, MT)
        zero = ir.Constant(V(F32, W), [0.0] * W)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(MT)] for _ in range(NR)]
        corr = [[cgutils.alloca_once_value(builder, zero) for _ in range(MT)] for _ in range(NR)]
        fma = _fn(builder, f"llvm.fma.v{W}f32", V(F32, W), [V(F32, W)] * 3)
        c32 = lambda v: ir.Constant(V(I32, 16), v if isinstance(v, list) else [v] * 16)  # noqa: E731
        d8at = _dx8_at_ir(builder, nb)
        s8at = builder.add(d8at, nb)  # sums8; runs8 behind them
        kq = [builder.bitcast(dd, ir.IntType(8).as_pointer()) for dd in dds]
        kq = [builder.gep(p, [builder.add(builder.mul(nb, i64(8)), i64(64 * L8_KQ))]) for p in kq]  # block 0's slot
        with cgutils.for_range(builder, nsb) as loop:
            sb = loop.index
            ps = _super_block(builder, wd, woff, rbk, pfo, sb, bs)
            blk0 = builder.mul(sb, i64(8))
            xs, dx8s, s8s = [], [], []  # per token: the four 64-byte x8 pairs; dx8 a lane; sums8 (runs8) a lane
            for t, dd in enumerate(dds):
                def floats(at, n):
                    return builder.load(builder.bitcast(builder.gep(dd, [at]), V(F32, n).as_pointer()), align=4)
                v = floats(builder.add(d8at, blk0), 8)
                if q6:
                    dx8s.append(builder.shuffle_vector(v, v, ir.Constant(V(I32, 16), [r // 2 for r in range(16)])))
                    s8s.append(floats(builder.add(builder.add(s8at, nb), builder.add(blk0, blk0)), 16))
                    xs.append(_x8_slots(builder, kq[t], blk0, (2, 3, 6, 7)))
                else:
                    dx8s.append(v)
                    s8s.append(floats(builder.add(s8at, blk0), 8))
                    xs.append(_x8_slots(builder, kq[t], blk0, (0, 1, 4, 5)))
            for k, p in enumerate(ps):
                ws = []
                if q6:
                    sc = builder.load(builder.bitcast(builder.gep(p, [i64(192)]), V(ir.IntType(8), 16).as_pointer()),
                                      align=1)
                    d = h16x16(builder, builder.gep(p, [i64(208)]))
                    dsc = _fmul(builder, d, builder.sitofp(sc, V(F32, 16)))
                    dmn = _fmul(builder, dsc, ir.Constant(V(F32, 16), [32.0] * 16))
                    for h in (0, 1):
                        ql = builder.load(builder.bitcast(builder.gep(p, [i64(64 * h)]), V(I32, 16).as_pointer()),
                                          align=1)
                        qh = builder.load(builder.bitcast(builder.gep(p, [i64(128 + 32 * h)]), V(I32, 8).as_pointer()),
                                          align=1)
                        qh = builder.shuffle_vector(qh, qh, ir.Constant(V(I32, 16), list(range(8)) * 2))
                        lo = builder.or_(builder.and_(ql, c32(0x0F0F0F0F)),
                                         builder.and_(builder.shl(qh, c32([4] * 8 + [2] * 8)), c32(0x30303030)))
                        hi = builder.or_(builder.and_(builder.lshr(ql, c32(4)), c32(0x0F0F0F0F)),
                                         builder.and_(builder.lshr(qh, c32([0] * 8 + [2] * 8)), c32(0x30303030)))
                        ws += [lo, hi]
                else:
                    sc, mn = _q4_k_scales_ir(builder, p)
                    dsc = _fmul(builder, h16x8(builder, p), builder.sitofp(sc, V(F32, 8)))
                    dmn = _fmul(builder, h16x8(builder, builder.gep(p, [i64(2)])), builder.sitofp(mn, V(F32, 8)))
                    for j in (0, 1):  # chunks 2j, 2j + 1: low nibbles sub-blocks 4j, 4j + 2; high ones 4j + 1, 4j + 3
                        q = builder.load(builder.bitcast(builder.gep(p, [i64(16 + 64 * j)]), V(I32, 16).as_pointer()),
                                         align=1)
                        ws += [builder.and_(q, c32(0x0F0F0F0F)), builder.and_(builder.lshr(q, c32(4)), c32(0x0F0F0F0F))]
                for t in range(MT):
                    prods = [_dpbusd(builder, c32(0), w, x) for w, x in zip(ws, xs[t])]
                    s = _run_sums(builder, *prods) if q6 else _sub_block_sums(builder, *prods)
                    acc = builder.call(fma, [builder.sitofp(s, V(F32, W)), _fmul(builder, dsc, dx8s[t]),
                                             builder.load(accs[k][t])])
                    builder.store(acc, accs[k][t])
                    builder.store(builder.call(fma, [dmn, s8s[t], builder.load(corr[k][t])]), corr[k][t])
        for t in range(MT):
            for k in range(NR):
                a, c = builder.load(accs[k][t]), builder.load(corr[k][t])
                if q6:  # 16 lanes: halves added first
                    a, c = (_fadd(builder, _slice(builder, v, 0, 8), _slice(builder, v, 8, 8)) for v in (a, c))
                v = _fsub(builder, hsum8(builder, a), hsum8(builder, c))
                builder.store(v, builder.gep(rds[t], [builder.add(roff, i64(k))]))
        return context.get_dummy_value()

    return gen


def k_vnni_kernel(NR: int, MT: int = 1, q6: bool = False):
    """rows{NR}[x{MT}] for Q4_K (q6: Q6_K) on int8 activations (an int8 build with AVX-512 VNNI): simd._qkernel's
    signature, DX carrying lanes8's rows (kernels._quant_rows writes them)."""
    @intrinsic
    def kernel(typingctx, w, wo, rb, X16, DX, k0, nb, res, ro):
        return _qsig(w, wo, rb, X16, DX, k0, nb, res, ro), _rows_k_vnni(NR, MT, q6)
    return kernel


def h16x16(builder, p):
    """Codegen: the fp16 at byte pointer p as <16 x f32>."""
    h = builder.load(builder.bitcast(p, I16.as_pointer()), align=1)
    return builder.fpext(builder.bitcast(_splat(builder, h, 16), V(ir.HalfType(), 16)), V(F32, 16))
