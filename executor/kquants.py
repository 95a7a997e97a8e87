"""One-token products with llama.cpp's K-quant rows read in place (Q4_K, Q6_K: the types of its Q4_K_M files;
Q5_K, with Q6_K those of its Q5_K_M files; Q3_K and Q2_K, of its Q3_K_M and Q2_K files), as AVX2 numba intrinsics
on simd.py's scheme: int16 activations (simd.quant16, one 32-block of x per Q4_K / Q5_K sub-block, per two 16-value
runs of Q6_K, Q3_K, Q2_K), the weights' integers made int16 words with in-lane shifts and masks, `vpmaddwd`, each
run's int32 sums scaled in float. The layouts and their plain decode: kquant_blocks.py; tokens in pairs as
simd._rows.
One core, in cache, one token (`benchmarks/bench_token_pairs.py --presets small-q4k --parts gate down`):
Q4_K 20-21 G weights/s, Q6_K 14, against simd.py's Q4_0 at 24-25 (session 12, Zen 3); the same products in float
(LLVM-vectorised loops) ran at 6.6 and 4.2. Session 33 (Zen 4, `python benchmarks/bench_q8_rows.py --fmt F --l2`):
Q4_K 34.8, Q6_K 23.9, each super-block's sub-block sums reduced across lanes before one float step (simd.lane_sums,
run_sums). Without AVX2: plain numba loops of the same signatures.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils
from numba.extending import intrinsic

from .kquant_blocks import _U, _block, _q3_k_scales_ir, _q4_k_scales_ir
from .simd import (F32, HAVE_AVX2, I8, I16, I32, I64, V, _fmul, _fn, _fsub, _pmadd, _qsig, h16x8, hsum8,
                   lane_sums, prefetch_lines, prefetch_offset, run_sums, token_rows, x_halves)
from .vnni import RUN_SUMS_AT

def _prologue(context, builder, sig, args, NR: int, MT: int):
    """The K-quant kernels' common set-up: i64 constant maker, weight bytes, per token t the X16 / DX / res
    row pointers of token k0 + t, the NR row offsets, the next row group's offset, super-blocks per row."""
    wa, woff, rb, nb = args[0], args[1], args[2], args[6]
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    wd = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=wa).data
    return (i64, wd, *token_rows(context, builder, sig, args, MT),
            [builder.mul(rb, i64(k)) for k in range(NR)], prefetch_offset(builder, woff, rb, NR),
            builder.lshr(nb, i64(3)))


def _super_block(builder, wd, woff, rbk, pfo, sb, bs: int, prefetch: bool = True) -> list:
    """Codegen: pointers to super-block sb (bs bytes) of each row of the group (row offsets rbk from byte woff
    of wd), the next row group's same super-blocks prefetched (linearly from byte pfo: len(rbk) x bs) unless
    `prefetch` is false."""
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    p0 = builder.gep(wd, [builder.add(woff, builder.mul(sb, i64(bs)))])
    nr = len(rbk)
    prefetch_lines(builder, builder.gep(wd, [builder.add(pfo, builder.mul(sb, i64(nr * bs)))]), nr * bs, prefetch)
    return [builder.gep(p0, [rbk[k]]) if k else p0 for k in range(nr)]


def _rows_q4_k_ir(NR: int, MT: int = 1, prefetch: bool = True, q5: bool = False):
    """Codegen: res[k0 + t, ro + k] = row_k . x_t for NR Q4_K rows at byte woff + k * rb (nb 32-blocks each) and
    the MT tokens t of X16 / DX from k0 (simd.quant16's layout: each 32-block even values first; dx, then 8 x
    the block's x16 sum).

    A Q4_K sub-block is one 32-block of x. Byte chunk j (32 bytes) holds sub-blocks 2j (low nibbles) and 2j + 1
    (high): as 16 words w = q[2i] | q[2i+1] << 8, sub-block 2j's even / odd values are w & 15 and (w >> 8) & 15,
    2j + 1's (w >> 4) & 15 and w >> 12, each against x's even / odd half (vpmaddwd: no widening), eight int32 lanes
    a sub-block. The eight sub-blocks' vectors are summed across their lanes at once (simd.lane_sums: lane c the
    sum of sub-block c, exact), then one convert and one fma a super-block with d sc dx (each lane its sub-block's);
    the mins, dmin m dx sum(x16), into a second accumulator. Until session 33 each sub-block's eight lanes were
    converted and scaled by a broadcast of its own d sc dx (an fma each, the broadcasts by shuffles): one core, in
    L2, 30.5 against 34.8 G weights/s now (2 rows x 4 tokens 42.3 -> 48.6 G token-weights/s), with the scales
    unpacked in general registers (_q4_k_scales_ir; the sums times the scales in int32, vpmulld, ran 33.7-34.4).
    With MT tokens a row's weights and scales are decoded once for all of them; each token's products and adds
    are those of MT = 1.
    q5: Q5_K rows (176-byte super-blocks: qh's 32 bytes at 16, the nibbles at 48): qh as 16 words v, loaded
    once a super-block, gives sub-block c's fifth bits at 16 (0x10) by one shift and one and per half
    (even values: bit c of the low byte, odd ones: bit 8 + c), or-ed into the nibbles: q in 0..31 (25.4 -> 28.8
    G weights/s, the same core)."""
    bs, q0 = (176, 48) if q5 else (144, 16)

    def gen(context, builder, sig, args):
        woff, nb, roff = args[1], args[6], args[8]
        i64, wd, xds, dds, rds, rbk, pfo, nsb = _prologue(context, builder, sig, args, NR, MT)
        zero = ir.Constant(V(F32, 8), [0.0] * 8)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(MT)] for _ in range(NR)]
        corr = [[cgutils.alloca_once_value(builder, zero) for _ in range(MT)] for _ in range(NR)]
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        c16 = lambda v: ir.Constant(V(I16, 16), [v] * 16)  # noqa: E731
        with cgutils.for_range(builder, nsb) as loop:
            sb = loop.index
            ps = _super_block(builder, wd, woff, rbk, pfo, sb, bs, prefetch)
            # per token, the eight sub-blocks' x scales dx and dx sum(x16), a vector each (contiguous in DX)
            blk0 = builder.mul(sb, i64(8))
            dxv, s8v = [], []
            for dd in dds:
                v = builder.load(builder.bitcast(builder.gep(dd, [blk0]), V(F32, 8).as_pointer()), align=4)
                s8 = builder.load(builder.bitcast(builder.gep(dd, [builder.add(nb, blk0)]), V(F32, 8).as_pointer()), align=4)
                dxv.append(v)
                s8v.append(_fmul(builder, _fmul(builder, s8, ir.Constant(V(F32, 8), [0.125] * 8)), v))
            # [t][c]: x halves (even, odd) of sub-block c
            xs = [[x_halves(builder, xd, builder.add(blk0, i64(c))) for c in range(8)] for xd in xds]
            for k, p in enumerate(ps):
                sc, mn = _q4_k_scales_ir(builder, p)
                d8 = h16x8(builder, p)
                dmn = _fmul(builder, h16x8(builder, builder.gep(p, [i64(2)])), builder.sitofp(mn, V(F32, 8)))
                qh = builder.load(builder.bitcast(builder.gep(p, [i64(16)]), V(I16, 16).as_pointer()), align=1) \
                    if q5 else None
                sums = [[None] * 8 for _ in range(MT)]  # [t][c]: <8 x i32>
                for j in range(4):
                    q = builder.load(builder.bitcast(builder.gep(p, [i64(q0 + 32 * j)]), V(I16, 16).as_pointer()), align=1)
                    if q5:  # sub-block c = 2j + h: its nibbles of both bytes of a word (& 0x0F0F), its fifth bits
                        # (bit c of both bytes of qh's word) moved to bit 4 of each byte by one shift, or-ed in;
                        # then the low byte (even values) and the high one (odd): 7 ops a half where or-ing each
                        # half's bits into Q4_K's values took 9 (one core, in L2: 1.2x)
                        def five(c, nib):
                            hb = builder.shl(qh, c16(4 - c)) if c < 4 else builder.lshr(qh, c16(c - 4)) if c > 4 else qh
                            x = builder.or_(builder.and_(nib, c16(0x0F0F)), builder.and_(hb, c16(0x1010)))
                            return builder.and_(x, c16(0xFF)), builder.lshr(x, c16(8))
                        halves = (five(2 * j, q), five(2 * j + 1, builder.lshr(q, c16(4))))
                    else:
                        halves = ((builder.and_(q, c16(15)), builder.and_(builder.lshr(q, c16(8)), c16(15))),
                                  (builder.and_(builder.lshr(q, c16(4)), c16(15)), builder.lshr(q, c16(12))))
                    for h, (we, wo) in enumerate(halves):
                        for t in range(MT):
                            xe, xo = xs[t][2 * j + h]
                            sums[t][2 * j + h] = builder.add(_pmadd(builder, we, xe), _pmadd(builder, wo, xo))
                dsc = _fmul(builder, d8, builder.sitofp(sc, V(F32, 8)))
                for t in range(MT):
                    s = builder.sitofp(lane_sums(builder, sums[t]), V(F32, 8))
                    builder.store(builder.call(fma, [s, _fmul(builder, dsc, dxv[t]), builder.load(accs[k][t])]), accs[k][t])
                    builder.store(builder.call(fma, [dmn, s8v[t], builder.load(corr[k][t])]), corr[k][t])
        for t in range(MT):
            for k in range(NR):
                v = _fsub(builder, hsum8(builder, builder.load(accs[k][t])), hsum8(builder, builder.load(corr[k][t])))
                builder.store(v, builder.gep(rds[t], [builder.add(roff, i64(k))]))
        return context.get_dummy_value()

    return gen


def _rows_q6_k_ir(NR: int, MT: int = 1, prefetch: bool = True, q3: bool = False, q2: bool = False):
    """Codegen: res[k0 + t, ro + k] = row_k . x_t for NR Q6_K rows at byte woff + k * rb and the MT tokens from
    k0 of X16 / DX, as _rows_q4_k_ir. The 32 values of block (h, i) of a super-block (one 32-block of x) take the
    nibbles of ql bytes 64h + 32(i % 2) + l (the high ones for i >= 2) and bit pair i of qh bytes 32h + l: with
    words of two bytes, even values from the low bytes, odd from the high, each nibble | pair << 4 in int16; the
    - 32 is taken off each run's int32 sum as 32 times the run's x16 sum (DX's, simd.run_sums16), once a row and
    super-block, where it took two subtractions a block (one core in L2, 2 rows a pass: Q6_K 23.8 -> 26.3 G
    weights/s, Q3_K's - 4 likewise 23.4 -> 25.3; the same bits). A block's eight int32 lanes are its two 16-value
    runs (lanes 0-3, 4-7); four blocks' vectors are summed across lanes at once (simd.run_sums: runs 0 2 4 6 1 3 5 7
    of the four, in eight lanes, exact), then one convert and one fma with d sc dx (each lane its run's), twice a
    super-block. Until session 33 each block took a convert
    and an fma with [f0 x 4, f1 x 4], f = d sc dx of its runs, broadcast by shuffles. One core, in L2, 2 rows a
    pass: Q6_K 23.7 -> 23.9 G weights/s, Q3_K 22.7 -> 23.2, Q2_K 21.6 -> 23.0 (one row 17.0 -> 19.3); 2 rows x 4
    tokens 38.5 -> 47.3, 37.7 -> 43.8, 27.1 -> 28.9 G token-weights/s (the sums times the scales in int32 instead,
    vpmulld: Q2_K 19.8).
    q3: Q3_K rows (110 bytes: hmask 32, qs 64, 12 bytes of packed scales, d), in the same runs and slots: block
    (n, j) takes bit pair j of qs bytes 32 + 32n + l and bit 4n + j of hmask byte l, both bytes of a word at once
    (the pairs at bits 0-1 and 8-9, the hmask bits moved to 2 and 10); each byte's - 4 as Q6_K's - 32.
    q2: Q2_K rows (84 bytes: 16 of run scales and mins, qs 64, d, dmin), block (n, j) the bit pairs j of qs bytes
    16 + 32n + l, each run's value (d sc) q - (dmin m): the mins' term is (dmin m dx) times the run's sum of x16, the
    token's sixteen run sums read from DX (written once a token by simd.run_sums16; summed here for each row pair,
    `vpmaddwd` with ones and `vphaddd`, until session 33: one core in L2, 2 rows a pass 23.2 -> 28.0 G weights/s, one
    row 19.1 -> 27.9), and two fmas a row and super-block into a second accumulator (one a block, the first version:
    one core in L2 0.7x)."""
    bs, d_at = (84, 80) if q2 else (110, 108) if q3 else (210, 208)

    def gen(context, builder, sig, args):
        woff, nb, roff = args[1], args[6], args[8]
        i64, wd, xds, dds, rds, rbk, pfo, nsb = _prologue(context, builder, sig, args, NR, MT)
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(V(F32, 8), [0.0] * 8)) for _ in range(MT)]
                for _ in range(NR)]
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        c16 = lambda v: ir.Constant(V(I16, 16), [v] * 16)  # noqa: E731
        vec16 = V(I16, 16).as_pointer()
        if q2:  # the mins' accumulators
            corr = [[cgutils.alloca_once_value(builder, ir.Constant(V(F32, 8), [0.0] * 8)) for _ in range(MT)]
                    for _ in range(NR)]
        odd_even = [0, 2, 4, 6, 1, 3, 5, 7]  # the runs (of eight) in the order run_sums gives their sums
        with cgutils.for_range(builder, nsb) as loop:
            sb = loop.index
            ps = _super_block(builder, wd, woff, rbk, pfo, sb, bs, prefetch)
            # per token, dx of each run (its 32-block's: two runs a block), as two vectors
            blk0 = builder.mul(sb, i64(8))
            dxs = []  # per token, each run's dx, runs 8u .. 8u + 7 in run_sums' order
            for dd in dds:
                dxv = builder.load(builder.bitcast(builder.gep(dd, [blk0]), V(F32, 8).as_pointer()), align=4)
                dxs.append([builder.shuffle_vector(dxv, dxv, ir.Constant(V(I32, 8), [4 * u + b % 4 for b in range(8)]))
                            for u in range(2)])
            # each token's sixteen run sums of x16 (DX's, simd.run_sums16): [8 x f32] runs 0 2 4 6 1 3 5 7, + 8
            r0 = builder.add(builder.mul(nb, i64(RUN_SUMS_AT)), builder.mul(sb, i64(16)))
            rsums = [[builder.load(builder.bitcast(builder.gep(dd, [builder.add(r0, i64(8 * u))]), V(F32, 8).as_pointer()),
                                   align=4) for u in range(2)] for dd in dds]
            if not q2:  # Q6_K's q - 32, Q3_K's q - 4: the offset times the run's sum, taken off its int32 sum
                sh = ir.Constant(V(I32, 8), [2 if q3 else 5] * 8)
                offs = [[builder.shl(builder.fptosi(r, V(I32, 8)), sh) for r in rs] for rs in rsums]
            ds, isc = [], []  # per row: d on eight lanes; [u] the run scales of runs 8u .. 8u + 7, in run_sums' order
            for k, p in enumerate(ps):
                d = h16x8(builder, builder.gep(p, [i64(d_at)]))
                ds.append(d)
                if q2:
                    sc = builder.load(builder.bitcast(p, V(I8, 16).as_pointer()), align=1)
                    dmin = h16x8(builder, builder.gep(p, [i64(82)]))
                    half = [builder.zext(builder.shuffle_vector(sc, sc, ir.Constant(V(I32, 8), [8 * u + r for r in odd_even])),
                                         V(I32, 8)) for u in range(2)]  # runs 8u .. 8u + 7 in run_sums' order
                    c32 = lambda v: ir.Constant(V(I32, 8), [v] * 8)  # noqa: E731
                    isc.append([builder.and_(v, c32(15)) for v in half])
                    dmn = [_fmul(builder, dmin, builder.sitofp(builder.lshr(v, c32(4)), V(F32, 8))) for v in half]
                    for t in range(MT):  # the mins' term: (dmin m dx) . (run sums), a super-block at a time
                        for u in range(2):
                            g = _fmul(builder, dmn[u], dxs[t][u])
                            builder.store(builder.call(fma, [rsums[t][u], g, builder.load(corr[k][t])]), corr[k][t])
                elif q3:
                    isc.append([builder.shuffle_vector(v, v, ir.Constant(V(I32, 8), odd_even))
                                for v in _q3_k_scales_ir(builder, p)])
                else:  # int8 scales at 192, picked in run_sums' order
                    sc = builder.load(builder.bitcast(builder.gep(p, [i64(192)]), V(I8, 16).as_pointer()), align=1)
                    isc.append([builder.sext(builder.shuffle_vector(sc, sc, ir.Constant(V(I32, 8), [8 * u + r for r in odd_even])),
                                             V(I32, 8)) for u in range(2)])
            hm = [builder.load(builder.bitcast(p, vec16), align=1) for p in ps] if q3 else None
            for h in range(2):
                sums = [[[] for _ in range(MT)] for _ in range(NR)]  # [k][t]: blocks (h, 0..3), <8 x i32> each
                for i in range(4):
                    xs = [x_halves(builder, xd, builder.add(blk0, i64(4 * h + i))) for xd in xds]
                    s = 4 * (i // 2)
                    for k, p in enumerate(ps):
                        if q2:  # bit pairs j of both bytes of a word
                            wq = builder.load(builder.bitcast(builder.gep(p, [i64(16 + 32 * h)]), vec16), align=1)
                            v = builder.and_(builder.lshr(wq, c16(2 * i)) if i else wq, c16(0x0303))
                            we, wo = builder.and_(v, c16(0xFF)), builder.lshr(v, c16(8))
                        elif q3:  # (n, j) = (h, i)
                            wq = builder.load(builder.bitcast(builder.gep(p, [i64(32 + 32 * h)]), vec16), align=1)
                            b = 4 * h + i  # the hmask bit, to bit 2 (and 8 + b to 10)
                            hb = builder.shl(hm[k], c16(2 - b)) if b < 2 else builder.lshr(hm[k], c16(b - 2)) if b > 2 else hm[k]
                            v = builder.or_(builder.and_(builder.lshr(wq, c16(2 * i)) if i else wq, c16(0x0303)),
                                            builder.and_(hb, c16(0x0404)))
                            we, wo = builder.and_(v, c16(0xFF)), builder.lshr(v, c16(8))  # q + 4 (offs)
                        else:
                            wl = builder.load(builder.bitcast(builder.gep(p, [i64(64 * h + 32 * (i % 2))]), vec16), align=1)
                            wh = builder.load(builder.bitcast(builder.gep(p, [i64(128 + 32 * h)]), vec16), align=1)
                            lo_e = builder.and_(builder.lshr(wl, c16(s)) if s else wl, c16(15))
                            lo_o = builder.and_(builder.lshr(wl, c16(8 + s)), c16(15))
                            hi_e = builder.and_(builder.shl(wh, c16(4 - 2 * i)) if i < 2 else
                                                (builder.lshr(wh, c16(2 * i - 4)) if i > 2 else wh), c16(0x30))
                            hi_o = builder.and_(builder.lshr(wh, c16(4 + 2 * i)), c16(0x30))
                            we, wo = builder.or_(lo_e, hi_e), builder.or_(lo_o, hi_o)  # q + 32 (offs)
                        for t, (xe, xo) in enumerate(xs):  # [8] int32: two runs
                            sums[k][t].append(builder.add(_pmadd(builder, we, xe), _pmadd(builder, wo, xo)))
                for k in range(NR):  # runs 8h .. 8h + 7
                    dsc = _fmul(builder, ds[k], builder.sitofp(isc[k][h], V(F32, 8)))
                    for t in range(MT):
                        rs = run_sums(builder, sums[k][t])
                        v = builder.sitofp(rs if q2 else builder.sub(rs, offs[t][h]), V(F32, 8))
                        builder.store(builder.call(fma, [v, _fmul(builder, dsc, dxs[t][h]), builder.load(accs[k][t])]),
                                      accs[k][t])
        for t in range(MT):
            for k in range(NR):
                v = hsum8(builder, builder.load(accs[k][t]))
                if q2:
                    v = _fsub(builder, v, hsum8(builder, builder.load(corr[k][t])))
                builder.store(v, builder.gep(rds[t], [builder.add(roff, i64(k))]))
        return context.get_dummy_value()

    return gen


@njit(fastmath=True)
def _slow_runs(bs, n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The products of n rows of bs-byte super-blocks without AVX2 (_block's values against x16 dx)."""
    x16, dx = X16[k0], DX[k0]
    buf = np.empty(256, np.float32)
    for k in range(n):
        acc = np.float32(0.0)
        for sb in range(nb // 8):
            _block(bs, w, _U(wo + k * rb + sb * bs), buf, 0)
            for blk in range(8):
                for i in range(32):
                    acc += buf[32 * blk + i] * np.float32(x16[32 * (8 * sb + blk) + (i % 2) * 16 + i // 2]) \
                        * dx[8 * sb + blk]
        res[k0, ro + k] = acc


@njit(fastmath=True)
def _slow_q4_k(n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The Q4_K kernels' products without AVX2."""
    _slow_runs(144, n, w, wo, rb, X16, DX, k0, nb, res, ro)


@njit(fastmath=True)
def _slow_q6_k(n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The Q6_K kernels' products without AVX2."""
    _slow_runs(210, n, w, wo, rb, X16, DX, k0, nb, res, ro)


@njit(fastmath=True)
def _slow_q3_k(n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The Q3_K kernels' products without AVX2."""
    _slow_runs(110, n, w, wo, rb, X16, DX, k0, nb, res, ro)


@njit(fastmath=True)
def _slow_q2_k(n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The Q2_K kernels' products without AVX2."""
    _slow_runs(84, n, w, wo, rb, X16, DX, k0, nb, res, ro)


def _k_kernel(codegen, slow, NR: int, MT: int = 1, prefetch: bool = True):
    """rows{NR}[x{MT}]_q4_k / _q6_k(w, wo, rb, X16, DX, k0, nb, res, ro): res[k0:k0+MT, ro:ro+NR] = NR rows (the
    intrinsic `codegen` makes, or the portable `slow` loops without AVX2) . tokens k0.. of X16 * DX."""
    if HAVE_AVX2:
        @intrinsic
        def kernel(typingctx, w, wo, rb, X16, DX, k0, nb, res, ro):
            return _qsig(w, wo, rb, X16, DX, k0, nb, res, ro), codegen(NR, MT, prefetch)
    else:  # a portable fallback with the same signature
        @njit
        def kernel(w, wo, rb, X16, DX, k0, nb, res, ro):
            for t in range(MT):
                slow(NR, w, wo, rb, X16, DX, k0 + t, nb, res, ro)
    return kernel


def _rows_q5_k_ir(NR: int, MT: int = 1, prefetch: bool = True):
    """_rows_q4_k_ir for Q5_K rows."""
    return _rows_q4_k_ir(NR, MT, prefetch, q5=True)


@njit(fastmath=True)
def _slow_q5_k(n, w, wo, rb, X16, DX, k0, nb, res, ro):
    """The Q5_K kernels' products without AVX2."""
    _slow_runs(176, n, w, wo, rb, X16, DX, k0, nb, res, ro)


rows2_q4_k, rows1_q4_k, rows2x2_q4_k = (_k_kernel(_rows_q4_k_ir, _slow_q4_k, n, t) for n, t in ((2, 1), (1, 1), (2, 2)))
rows2_q5_k, rows1_q5_k, rows2x2_q5_k = (_k_kernel(_rows_q5_k_ir, _slow_q5_k, n, t) for n, t in ((2, 1), (1, 1), (2, 2)))


def _rows_q3_k_ir(NR: int, MT: int = 1, prefetch: bool = True):
    """_rows_q6_k_ir for Q3_K rows."""
    return _rows_q6_k_ir(NR, MT, prefetch, q3=True)


def _rows_q2_k_ir(NR: int, MT: int = 1, prefetch: bool = True):
    """_rows_q6_k_ir for Q2_K rows."""
    return _rows_q6_k_ir(NR, MT, prefetch, q2=True)


rows2_q6_k, rows1_q6_k, rows2x2_q6_k = (_k_kernel(_rows_q6_k_ir, _slow_q6_k, n, t) for n, t in ((2, 1), (1, 1), (2, 2)))
rows2_q3_k, rows1_q3_k, rows2x2_q3_k = (_k_kernel(_rows_q3_k_ir, _slow_q3_k, n, t) for n, t in ((2, 1), (1, 1), (2, 2)))
rows2_q2_k, rows1_q2_k, rows2x2_q2_k = (_k_kernel(_rows_q2_k_ir, _slow_q2_k, n, t) for n, t in ((2, 1), (1, 1), (2, 2)))
# four tokens a pass, 2 rows (row_products.rows_quad: one core, in L2, against two 4-row pairs Q4_K 1.16x, Q6_K 1.20x;
# 4 rows 1.15x / 0.95x, 8 rows 0.95x / 0.89x)
rows2x4_q4_k, rows2x4_q6_k = _k_kernel(_rows_q4_k_ir, _slow_q4_k, 2, 4), _k_kernel(_rows_q6_k_ir, _slow_q6_k, 2, 4)
rows2x4_q5_k, rows2x4_q3_k = _k_kernel(_rows_q5_k_ir, _slow_q5_k, 2, 4), _k_kernel(_rows_q3_k_ir, _slow_q3_k, 2, 4)
rows2x4_q2_k = _k_kernel(_rows_q2_k_ir, _slow_q2_k, 2, 4)
# one row per call, no software prefetch: ggml's structure (calibration.bench_rowwise)
row_q4_k_noprefetch = _k_kernel(_rows_q4_k_ir, _slow_q4_k, 1, 1, prefetch=False)
row_q5_k_noprefetch = _k_kernel(_rows_q5_k_ir, _slow_q5_k, 1, 1, prefetch=False)
row_q6_k_noprefetch = _k_kernel(_rows_q6_k_ir, _slow_q6_k, 1, 1, prefetch=False)
row_q3_k_noprefetch = _k_kernel(_rows_q3_k_ir, _slow_q3_k, 1, 1, prefetch=False)
row_q2_k_noprefetch = _k_kernel(_rows_q2_k_ir, _slow_q2_k, 1, 1, prefetch=False)
