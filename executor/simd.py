"""AVX2 dot products of Q8_0 / Q4_0 rows with int16-quantised activations, as numba intrinsics.

Activations are quantised per 32-block to int16 (x ~= x16 * dx, relative error <= 1.54e-5 of the
block's largest value; llama.cpp uses int8 here), stored even elements first (see _rows). Weights
stay in place: each block is loaded from the mmap, turned into int16 words with in-lane ops and
multiplied with `vpmaddwd`; block sums are scaled in float vectors (8 lanes), so there is no
horizontal reduction per block; a later row group (the first at least 8 KiB ahead) is prefetched while
this one is computed.
On Zen 3 the loop is bound by instruction throughput (~4 cycles per row and block, ~10
instructions of it the block's own: load, decode, 2 vpmaddwd, add, convert, broadcast, fma).
Without AVX2 the same signatures fall back to plain numba loops.
"""
from __future__ import annotations

import os

import numpy as np
from llvmlite import binding as llb
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

PREFETCH = True  # the next row group, linearly (+40% from DRAM on one Zen 3 core)
# ... and as many row groups ahead as it takes to be this many bytes ahead (at least the next group): 2 rows of a
# 2,048-column Q8_0 matrix are 4.3 KB, consumed in about one DRAM latency at 2 x 23 GB/s (session 58);
# MOE_OFFLOAD_PREFETCH_BYTES=0: the next group only
PREFETCH_AHEAD_BYTES = int(os.environ.get("MOE_OFFLOAD_PREFETCH_BYTES", "8192") or 0)
HAVE_AVX2 = "+avx2" in llb.get_host_cpu_features().flatten().split(",")

I8, I16, I32, I64, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
V = ir.VectorType


def _fn(builder, name, ret, args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, args), name)


def _slice(builder, v, a, n):
    return builder.shuffle_vector(v, v, ir.Constant(V(I32, n), list(range(a, a + n))))


def _pmadd(builder, a, b):
    return builder.call(_fn(builder, "llvm.x86.avx2.pmadd.wd", V(I32, 8), [V(I16, 16), V(I16, 16)]), [a, b])


# The kernels' float adds and multiplies carry one fast-math flag, nsz (the sign of a zero result may be
# ignored), which permits no regrouping: numba gives every fadd / fmul of a fastmath function that has no
# flag all of them, an intrinsic's inlined ops too, so the kernels' sums would round differently with the
# function that compiled them first (a token pair's rows were 1 ulp off a lone token's, cold caches only).
_EXACT = ("nsz",)


def _fadd(builder, a, b):
    return builder.fadd(a, b, flags=_EXACT)


def _fsub(builder, a, b):
    return builder.fsub(a, b, flags=_EXACT)


def _fmul(builder, a, b):
    return builder.fmul(a, b, flags=_EXACT)


def hsum8(builder, a):
    """<8 x float> -> the sum of its lanes, halving: (0..3 + 4..7), then pairs, then the last two."""
    s = _fadd(builder, _slice(builder, a, 0, 4), _slice(builder, a, 4, 4))
    s = _fadd(builder, _slice(builder, s, 0, 2), _slice(builder, s, 2, 2))
    return _fadd(builder, builder.extract_element(s, ir.Constant(I32, 0)), builder.extract_element(s, ir.Constant(I32, 1)))


def _sum_level(builder, vs, lo, hi):
    """Codegen: pairs of <8 x i32> (vs[2i], vs[2i + 1]) -> shuffle lo + shuffle hi of each pair."""
    def sh(a, b, idx):
        return builder.shuffle_vector(a, b, ir.Constant(V(I32, 8), idx))
    return [builder.add(sh(vs[2 * i], vs[2 * i + 1], lo), sh(vs[2 * i], vs[2 * i + 1], hi)) for i in range(len(vs) // 2)]


def run_sums(builder, vs):
    """Codegen: four <8 x i32> a, b, c, d -> [a0..3 b0..3 c0..3 d0..3 | a4..7 b4..7 c4..7 d4..7] (the sums of each
    vector's lanes 0-3 and 4-7), by pairs interleaved by dwords, then by qwords: 9 shuffles and adds."""
    p = _sum_level(builder, vs, [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15])  # [a0+a2 b0+b2 a1+a3 b1+b3 | ..]
    return _sum_level(builder, p, [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])[0]


def lane_sums(builder, vs):
    """Codegen: eight <8 x i32> -> one <8 x i32> whose lane c is the sum of vs[c]'s lanes: run_sums of each four,
    then their 128-bit halves added (21 shuffles and adds for eight vectors, where a convert, a broadcast and an
    fma each took 32). Integer adds: exact in any order."""
    q = [run_sums(builder, vs[:4]), run_sums(builder, vs[4:])]
    return _sum_level(builder, q, [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])[0]


def _splat(builder, v, n):
    """Scalar v -> <n x v>."""
    t = builder.insert_element(ir.Constant(V(v.type, n), ir.Undefined), v, ir.Constant(I32, 0))
    return builder.shuffle_vector(t, t, ir.Constant(V(I32, n), [0] * n))


def q8_block(builder, v):
    """Codegen: a <32 x float> block's int8 values, llama.cpp's quantize_row_q8_0 (round-to-even(x 127 / max|x|), 0
    where the block is 0), as <32 x i32>, and max|x| (dx8 = max / 127): qgemm's panels and vnni.lanes8 both."""
    fabs = _fn(builder, "llvm.fabs.v32f32", V(F32, 32), [V(F32, 32)])
    fmax = _fn(builder, "llvm.vector.reduce.fmax.v32f32", F32, [V(F32, 32)])
    rint = _fn(builder, "llvm.rint.v32f32", V(F32, 32), [V(F32, 32)])
    a = builder.call(fmax, [builder.call(fabs, [v])])
    pos = builder.fcmp_ordered(">", a, ir.Constant(F32, 0.0))
    f = builder.select(pos, builder.fdiv(ir.Constant(F32, 127.0), a), ir.Constant(F32, 0.0))
    return builder.fptosi(builder.call(rint, [_fmul(builder, v, _splat(builder, f, 32))]), V(I32, 32)), a


def h16x8(builder, p):
    """Codegen: the fp16 at byte pointer p as <8 x f32> (vpbroadcastw from memory, vcvtph2ps: two vector ops where
    a lone lane's insert, convert and broadcast took three; an insert into a lone lane also keeps whatever register
    LLVM picks, the accumulator at times, and so joins its chain)."""
    h = builder.load(builder.bitcast(p, I16.as_pointer()), align=1)
    return builder.fpext(builder.bitcast(_splat(builder, h, 8), V(ir.HalfType(), 8)), V(F32, 8))


def prefetch_offset(builder, woff, rb, nr: int):
    """Codegen: the byte offset (i64) of the row group the rows at woff (nr rows of rb bytes a group) prefetch: the
    next group's, or the first group at least PREFETCH_AHEAD_BYTES ahead where groups are smaller than that."""
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    group = builder.mul(rb, i64(nr))
    div = builder.select(builder.icmp_signed("<", group, i64(1)), i64(1), group)  # a lone row may pass rb = 0
    ahead = builder.udiv(builder.add(div, i64(max(PREFETCH_AHEAD_BYTES, 1) - 1)), div)  # ceil(ahead / group)
    groups = builder.select(builder.icmp_signed("<", ahead, i64(1)), i64(1), ahead)
    return builder.add(woff, builder.mul(group, groups))


def prefetch_lines(builder, p, nbytes: int, on: bool = True) -> None:
    """Codegen: prefetch (into L1, read) the nbytes from pointer p, one prefetch per 64-byte line: the next
    row group, linearly, while this one is computed (+40% from DRAM on one Zen 3 core). Nothing when
    `on` is false (the calibration's row-at-a-time kernels, which stream as ggml's dot products do)."""
    if not (PREFETCH and on):
        return
    pref = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
    for i in range((nbytes + 63) // 64):
        builder.call(pref, [builder.gep(p, [ir.Constant(I64, 64 * i)]), ir.Constant(I32, 0), ir.Constant(I32, 3),
                            ir.Constant(I32, 1)])


def x_halves(builder, xd, blk) -> tuple:
    """Codegen: the even and the odd half (<16 x i16> each, quant16's layout) of 32-block blk of int16 row xd."""
    px = builder.bitcast(builder.gep(xd, [builder.mul(blk, ir.Constant(I64, 32))]), V(I16, 16).as_pointer())
    return builder.load(px, align=2), builder.load(builder.gep(px, [ir.Constant(I64, 1)]), align=2)


def h16_lane0(builder, p):
    """Codegen: <8 x i16> holding the 16 bits at byte pointer p in lane 0, zeros beyond. The bits enter as a
    32-bit integer (movzwl + vmovd, which writes the whole register): loaded as a lone 16-bit lane (vpinsrw)
    they merge into whatever register LLVM picks when no other lane is used, in a row kernel the
    accumulator's, so each block's scale waited for the block before's fma (one row of Q8_0 2.3x slower)."""
    h = builder.zext(builder.load(builder.bitcast(p, I16.as_pointer()), align=1), I32)
    return builder.bitcast(builder.insert_element(ir.Constant(V(I32, 4), [0] * 4), h, ir.Constant(I32, 0)), V(I16, 8))


def block_scales(builder, ps, dds, b, at=None) -> list:
    """Codegen: for each token's dx row in dds, <len(ps) x f32> (at most 8): the fp16 scales at the row pointers
    ps (block b's first bytes, one a row) times the token's dx[b] (dx[at], an i64 value, where given)."""
    n = len(ps)
    hv = h16_lane0(builder, ps[0])
    for k, p in enumerate(ps[1:], 1):
        hv = builder.insert_element(hv, builder.load(builder.bitcast(p, I16.as_pointer()), align=1),
                                    ir.Constant(I32, k))
    sv = builder.fpext(builder.bitcast(hv, V(ir.HalfType(), 8)), V(F32, 8))
    if n < 8:
        sv = _slice(builder, sv, 0, n)
    i = b if at is None else at
    return [_fmul(builder, sv, _splat(builder, builder.load(builder.gep(d, [i])), n)) for d in dds]


def q4_offset_term(builder, corr, slots, dds, nb, b) -> None:
    """Codegen: Q4_0's -8, sum (q - 8) x = sum q x - 8 sum x, per row in float: each token's corr (<n x f32>) +=
    block b's n row scales (stored at slots[t] by block_scales' caller) x 8 sum(x16) (quant16's dx[nb + b])."""
    n = corr[0].type.pointee.count
    for c, sp, d in zip(corr, slots, dds):
        sb = builder.load(builder.bitcast(sp, V(F32, n).as_pointer()), align=4)
        cb = _splat(builder, builder.load(builder.gep(d, [builder.add(nb, b)])), n)
        builder.store(_fadd(builder, builder.load(c), _fmul(builder, sb, cb)), c)


def each_block(builder, nb, block, first=None) -> None:
    """Codegen: first() (block 0's scales), then block(b, last) for b = 0 .. nb - 1, none of it where nb is 0; the
    last block peeled (last=True): the loop's blocks gather the next block's scales unclamped. Clamped (never past a
    row's last block), each block paid a compare, a select and the block's address from its clamped index: 58
    instructions for two blocks of a Q4_0 row pair, 44 peeled; Q4_0's VNNI rows 1.01-1.05x on one core, IQ4_NL's
    1.03-1.04x (session 59, the same bits)."""
    one = ir.Constant(I64, 1)
    with builder.if_then(builder.icmp_signed(">", nb, ir.Constant(I64, 0))):
        if first is not None:
            first()
        with cgutils.for_range(builder, builder.sub(nb, one)) as loop:
            block(loop.index, False)
        block(builder.sub(nb, one), True)


def token_rows(context, builder, sig, args, MT: int) -> tuple[list, list, list]:
    """Codegen for the row kernels' signature (_qsig): pointers to rows k0 .. k0 + MT - 1 of the 2-D X16
    (int16), DX and res (float32) arguments, one list each."""
    k0 = args[5]

    def rows_of(i, ty):
        ary = cgutils.create_struct_proxy(sig.args[i])(context, builder, value=args[i])
        s0 = cgutils.unpack_tuple(builder, ary.strides, 2)[0]
        p = builder.bitcast(ary.data, I8.as_pointer())
        return [builder.bitcast(builder.gep(p, [builder.mul(builder.add(k0, ir.Constant(I64, t)), s0)]),
                                ty.as_pointer()) for t in range(MT)]
    return rows_of(3, I16), rows_of(4, F32), rows_of(7, F32)


def _rows(q4: bool, NR: int, MT: int = 1, prefetch: bool = True):
    """Codegen: res[k0 + t, ro + k] = row_k . x_t for NR rows at byte woff + k * rb (nb blocks each) and
    the MT tokens t of X16 / DX [m, ...] (rows of C arrays) from k0.

    X16 holds each 32-block as [x0, x2, .., x30, x1, x3, .., x31] (quant16), so the weights need
    only in-lane ops to become the matching int16 words (no vpmovsxbw / vpmovzxbw widening):
    - Q8_0: words w = q[2j] | q[2j+1] << 8 give the odd values as w >> 8 and the even ones as
      (w << 8) >> 8 (arithmetic shifts);
    - Q4_0: its 16 bytes go to both 128-bit lanes (vbroadcasti128); with the masks [0x000F | 0x00F0]
      w & mask holds value 2j in lane 0 and 16 x value 16 + 2j in lane 1, (w >> 8) & mask value
      2j + 1 and 16 x value 17 + 2j (one shift, two ands); lane 1's factor 16 is the same in every
      block and is undone once in the final sum.
      The -8 offset is subtracted per row in float: scale x 8 sum(x16) (quant16 stores the sums).
    The NR row scales of a block are converted together (one vcvtph2ps, one block ahead: the insert
    chain stays off the critical path), times each token's dx, and stored to a stack slot from which
    each row broadcast-loads its own (vbroadcastss m32: a load, where a register broadcast costs a
    shuffle). With MT tokens a row's weights are decoded once for all of them; each token's products,
    scales and float adds are those of MT = 1, so the results are bitwise the same. prefetch=False: no
    software prefetch (the same arithmetic, so the same bits).
    """
    bs = 18 if q4 else 34

    def gen(context, builder, sig, args):
        wa, woff, rb, xa, da, k0, nb, ra, roff = args
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        wd = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=wa).data
        xds, dds, rds = token_rows(context, builder, sig, args, MT)
        zero = ir.Constant(V(F32, 8), [0.0] * 8)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(MT)] for _ in range(NR)]
        # two stack slots of NR x MT scales (blocks b and b + 1 alternate); the slot index is not a constant,
        # so LLVM keeps the stores and the scalar loads instead of turning them into vector shuffles
        W = NR * MT
        sbuf = builder.bitcast(cgutils.alloca_once(builder, V(F32, 2 * W)), F32.as_pointer())
        one = i64(1)
        slot = lambda b, t: builder.gep(sbuf, [builder.add(builder.mul(builder.and_(b, one), i64(W)), i64(NR * t))])  # noqa: E731
        sput = lambda b, t, v: builder.store(v, builder.bitcast(slot(b, t), V(F32, NR).as_pointer()), align=4)  # noqa: E731
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        c16 = lambda v: ir.Constant(V(I16, 16), [v] * 16)  # noqa: E731
        rbk = [builder.mul(rb, i64(k)) for k in range(NR)]
        pfo = prefetch_offset(builder, woff, rb, NR)  # the next row group (or further)

        def rowptrs(b):
            p0 = builder.gep(wd, [builder.add(woff, builder.mul(b, i64(bs)))])
            return [builder.gep(p0, [rbk[k]]) if k else p0 for k in range(NR)]

        def put_scales(b, src):
            for t, v in enumerate(block_scales(builder, rowptrs(src), dds, src)):
                sput(b, t, v)

        corr = [cgutils.alloca_once_value(builder, ir.Constant(V(F32, NR), [0.0] * NR)) for _ in range(MT)]

        def block(b, last: bool):
            # block b + 1's scales are gathered now (but for the last block: each_block), so that the
            # insert / convert chain is off the critical path of this block's products
            if not last:
                bn = builder.add(b, i64(1))
                put_scales(bn, bn)
            if q4:
                q4_offset_term(builder, corr, [slot(b, t) for t in range(MT)], dds, nb, b)
            xs = [x_halves(builder, xd, b) for xd in xds]
            ps = rowptrs(b)
            # the next row group (contiguous): NR * bs bytes per block, one prefetch per cache line
            prefetch_lines(builder, builder.gep(wd, [builder.add(pfo, builder.mul(b, i64(NR * bs)))]), NR * bs,
                           prefetch)
            for k in range(NR):
                pq = builder.gep(ps[k], [i64(2)])
                if q4:  # lane masks: lane 1 holds 16 x its nibble values (undone in the final sum)
                    qv = builder.load(builder.bitcast(pq, V(I8, 16).as_pointer()), align=1)
                    q16 = builder.bitcast(builder.shuffle_vector(qv, qv, ir.Constant(V(I32, 32), list(range(16)) * 2)),
                                          V(I16, 16))
                    msk = ir.Constant(V(I16, 16), [0x000F] * 8 + [0x00F0] * 8)
                    we = builder.and_(q16, msk)
                    wo = builder.and_(builder.lshr(q16, c16(8)), msk)
                else:
                    qw = builder.load(builder.bitcast(pq, V(I16, 16).as_pointer()), align=1)
                    wo = builder.ashr(qw, c16(8))
                    we = builder.ashr(builder.shl(qw, c16(8)), c16(8))
                for t, (xe, xo) in enumerate(xs):
                    m = builder.add(_pmadd(builder, we, xe), _pmadd(builder, wo, xo))  # [8] int32
                    skv = _splat(builder, builder.load(builder.gep(slot(b, t), [ir.Constant(I32, k)]), align=4), 8)
                    acc = builder.call(fma, [builder.sitofp(m, V(F32, 8)), skv, builder.load(accs[k][t])])
                    builder.store(acc, accs[k][t])
        each_block(builder, nb, block, lambda: put_scales(i64(0), i64(0)))
        for t in range(MT):
            for k in range(NR):
                a = builder.load(accs[k][t])
                hi = _slice(builder, a, 4, 4)
                if q4:
                    hi = _fmul(builder, hi, ir.Constant(V(F32, 4), [1 / 16] * 4))
                s = _fadd(builder, _slice(builder, a, 0, 4), hi)
                s = _fadd(builder, _slice(builder, s, 0, 2), _slice(builder, s, 2, 2))
                v = _fadd(builder, builder.extract_element(s, ir.Constant(I32, 0)),
                                 builder.extract_element(s, ir.Constant(I32, 1)))
                if q4:
                    v = _fsub(builder, v, builder.extract_element(builder.load(corr[t]), ir.Constant(I32, k)))
                builder.store(v, builder.gep(rds[t], [builder.add(roff, ir.Constant(I64, k))]))
        return context.get_dummy_value()

    return gen


def _rows_f16(NR: int, prefetch: bool = True):
    """Codegen: res[ro + k] = F16 row_k . x (x float32) for NR rows at byte woff + k * rb, nb chunks of 16.

    Row pointers are computed once, outside the loop (computed per chunk, they spilled to the stack:
    ~45 instructions per 4 rows x 16 columns); products accumulate by fma (vmulps + vaddps before);
    a row group at least PREFETCH_AHEAD_BYTES ahead is prefetched linearly, as _rows does (prefetch_offset).
    """

    def gen(context, builder, sig, args):
        wa, woff, rb, xa, _unused, nb, ra, roff = args
        data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        wd, xd, rd = data(0, wa), data(3, xa), data(6, ra)
        zero = ir.Constant(V(F32, 16), [0.0] * 16)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(NR)]
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        fma = _fn(builder, "llvm.fma.v16f32", V(F32, 16), [V(F32, 16)] * 3)
        p0 = builder.gep(wd, [woff])
        rows = [builder.gep(p0, [builder.mul(rb, i64(k))]) if k else p0 for k in range(NR)]
        pf0 = builder.gep(wd, [prefetch_offset(builder, woff, rb, NR)])  # the next row group (or further)
        with cgutils.for_range(builder, nb) as loop:
            c = loop.index
            px = builder.gep(xd, [builder.mul(c, i64(16))])
            xv = builder.load(builder.bitcast(px, V(F32, 16).as_pointer()), align=4)
            off = builder.mul(c, i64(32))
            prefetch_lines(builder, builder.gep(pf0, [builder.mul(c, i64(NR * 32))]), NR * 32, prefetch)  # next group
            for k in range(NR):
                hv = builder.load(builder.bitcast(builder.gep(rows[k], [off]), V(ir.HalfType(), 16).as_pointer()),
                                  align=1)
                builder.store(builder.call(fma, [builder.fpext(hv, V(F32, 16)), xv, builder.load(accs[k])]), accs[k])
        for k in range(NR):
            a = builder.load(accs[k])
            v = hsum8(builder, _fadd(builder, _slice(builder, a, 0, 8), _slice(builder, a, 8, 8)))
            builder.store(v, builder.gep(rd, [builder.add(roff, ir.Constant(I64, k))]))
        return context.get_dummy_value()

    return gen


def _sig(w, wo, rb, x16, dx, nb, res, ro):
    return types.none(w, wo, rb, x16, dx, nb, res, ro)


def _qsig(w, wo, rb, X16, DX, k0, nb, res, ro):
    return types.none(w, wo, rb, X16, DX, k0, nb, res, ro)


def _qkernel(q4: bool, NR: int, MT: int = 1, prefetch: bool = True):
    """rows{NR}[x{MT}]_{q8|q4}(w, wo, rb, X16, DX, k0, nb, res, ro): res[k0:k0+MT, ro:ro+NR] = NR Q8_0 / Q4_0
    rows (bytes at wo, stride rb, nb blocks) . tokens k0.. of
    X16 * DX (2-D, a token a row)."""
    if HAVE_AVX2:
        @intrinsic
        def kernel(typingctx, w, wo, rb, X16, DX, k0, nb, res, ro):
            return _qsig(w, wo, rb, X16, DX, k0, nb, res, ro), _rows(q4, NR, MT, prefetch)
    else:  # a portable fallback with the same signature
        bs = 18 if q4 else 34

        @njit
        def kernel(w, wo, rb, X16, DX, k0, nb, res, ro):
            _slow(q4, NR, MT, w, wo, rb, bs, X16, DX, k0, nb, res, ro)
    return kernel


if HAVE_AVX2:
    @intrinsic
    def rows4_f16(typingctx, w, wo, rb, x, unused, nc, res, ro):
        """res[ro:ro+4] = 4 F16 rows (bytes at wo, stride rb) . x (f32, nc chunks of 16)."""
        return _sig(w, wo, rb, x, unused, nc, res, ro), _rows_f16(4)

    @intrinsic
    def rows1_f16(typingctx, w, wo, rb, x, unused, nc, res, ro):
        """res[ro] = F16 row at wo . x (f32, nc chunks of 16)."""
        return _sig(w, wo, rb, x, unused, nc, res, ro), _rows_f16(1)

    @intrinsic
    def row_f16_noprefetch(typingctx, w, wo, rb, x, unused, nc, res, ro):
        """rows1_f16 without software prefetch (calibration.bench_rowwise)."""
        return _sig(w, wo, rb, x, unused, nc, res, ro), _rows_f16(1, prefetch=False)
else:  # portable fallbacks with the same signatures
    @njit(inline="always")
    def _h2f(lo, hi):
        h = np.int32(lo) | (np.int32(hi) << 8)
        e, m = (h >> 10) & 31, h & 1023
        if e == 0:
            v = np.float32(m) * np.float32(2.0 ** -24)
        else:
            v = np.float32(1024 + m) * np.float32(2.0) ** np.float32(e - 25)
        return -v if h & 0x8000 else v

    @njit
    def _slow(q4, n, mt, w, wo, rb, bstep, X16, DX, k0, nb, res, ro):
        """n rows from byte wo (row stride rb, block stride bstep) . tokens k0.. without AVX2."""
        for t in range(k0, k0 + mt):
            x16, dx = X16[t], DX[t]
            for k in range(n):
                acc = np.float32(0.0)
                for b in range(nb):
                    o = wo + k * rb + b * bstep
                    s = 0
                    for j in range(32):
                        if q4:
                            q = np.int32(w[o + 2 + (j % 16)])
                            v = ((q & 15) if j < 16 else (q >> 4)) - 8
                        else:
                            v = np.int32(np.int8(w[o + 2 + j]))
                        s += v * np.int32(x16[b * 32 + (j % 2) * 16 + j // 2])
                    acc += np.float32(s) * _h2f(w[o], w[o + 1]) * dx[b]
                res[t, ro + k] = acc

    @njit
    def _slow_f16(n, w, wo, rb, x, nc, res, ro):
        for k in range(n):
            acc = np.float32(0.0)
            for j in range(nc * 16):
                o = wo + k * rb + 2 * j
                acc += _h2f(w[o], w[o + 1]) * x[j]
            res[ro + k] = acc

    @njit
    def rows4_f16(w, wo, rb, x, unused, nc, res, ro):
        _slow_f16(4, w, wo, rb, x, nc, res, ro)

    @njit
    def rows1_f16(w, wo, rb, x, unused, nc, res, ro):
        _slow_f16(1, w, wo, rb, x, nc, res, ro)

    row_f16_noprefetch = rows1_f16


# Q8_0 decodes 2 rows a pass (row_products.rows_token: from DRAM 1.3x its 8-row rate), Q4_0 8 (with AVX-512 VNNI
# vnni.py's rows, 2 a pass)
rows2_q8, rows1_q8, rows4x2_q8 = (_qkernel(False, n, t) for n, t in ((2, 1), (1, 1), (4, 2)))
rows8_q4, rows4_q4, rows1_q4, rows4x2_q4 = (_qkernel(True, n, t) for n, t in ((8, 1), (4, 1), (1, 1), (4, 2)))
# Q4_0 four tokens a pass, 8 rows (row_products.rows_quad; one core, 128 rows in L2, against two 4-row pairs: 1.21-1.23x,
# 4 rows 0.98x, 2 rows 0.85x): 32 accumulators, more than the 16 registers, and still the fastest. Q8_0 8 rows
# only 1.06x (4 rows 0.92x, 2 rows 0.86x): it stays in pairs (row_products._FUSED)
rows8x4_q4 = _qkernel(True, 8, 4)
# one row per call and no software prefetch: the structure of ggml's CPU dot products (llama.cpp), whose
# rate calibrate measures for the simulator's llama.cpp plans (calibration.bench_rowwise)
row_q8_noprefetch, row_q4_noprefetch = _qkernel(False, 1, 1, prefetch=False), _qkernel(True, 1, 1, prefetch=False)


@intrinsic
def f32_from_bits(typingctx, i):
    """The float32 whose bits are int32 i (a bitcast, no conversion)."""
    def gen(context, builder, sig, args):
        return builder.bitcast(args[0], F32)
    return types.float32(types.int32), gen


@intrinsic
def f32_from_f16_bits(typingctx, i):
    """The float32 value of the fp16 whose bits are the low 16 of int32 i (fpext: vcvtph2ps with F16C,
    vectorised in loops; a libgcc call without it)."""
    def gen(context, builder, sig, args):
        return builder.fpext(builder.bitcast(builder.trunc(args[0], I16), ir.HalfType()), F32)
    return types.float32(types.int32), gen


@njit(inline="always")
def h2f(lo, hi):
    """fp16 (two little-endian bytes) -> float32."""
    return f32_from_f16_bits(np.int32(lo) | (np.int32(hi) << 8))


@njit(fastmath=True, error_model="numpy", inline="always")
def exp32(x):
    """e**x for float32 x in [-87, 88] (clamped), as Cephes' expf: 2**n e**r with |r| <= ln2 / 2 and a
    degree-6 polynomial, relative error ~1e-7; plain arithmetic, so a loop over it vectorises (numba's
    np.exp is a scalar libm call: 5 us for an expert's 768 SwiGLU activations, 1 us this way)."""
    x = min(max(x, np.float32(-87.0)), np.float32(88.0))
    n = np.floor(x * np.float32(1.44269504) + np.float32(0.5))
    r = x - n * np.float32(0.693359375) + n * np.float32(2.12194440e-4)  # ln2 in two parts: exact n ln2
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    return p * f32_from_bits(np.int32(n + np.float32(127.0)) << 23)


@njit(fastmath=True, error_model="numpy")
def silu_mul(g, u):
    """g[f] = silu(g[f]) * u[f] in place for 1-D float32 g, u (SwiGLU's activation; vectorised)."""
    for f in range(g.shape[0]):
        gv = g[f]
        g[f] = gv / (np.float32(1.0) + exp32(-gv)) * u[f]


@njit(fastmath=True)
def quant16(x, x16, dx):
    """x [n] f32 -> x16 [n] int16 and dx [2 n/32 ..] f32: per 32-block x ~= x16 * dx[:n/32]; within a block
    x16 holds x0, x2, .., x30 then x1, x3, .., x31; dx[n/32:2 n/32] = 8 * (sum of the block's x16). A block's
    largest |x16| is 32639, not 32767, so that x16 = 256 h + l splits into two signed bytes (vnni.split8, which
    writes them behind the sums where dx is longer)."""
    nb = x.shape[0] // 32
    assert dx.shape[0] >= 2 * nb  # the Q4_0 kernels read the block sums behind the scales
    for b in range(nb):
        m = np.float32(0.0)
        for j in range(32):
            m = max(m, abs(x[b * 32 + j]))
        d = m / np.float32(32639.0)  # vnni.X16_MAX
        if not d > 0:  # an all-zero block, or one so small (< 2**-134) that the scale underflows
            d = np.float32(1.0)
        inv = np.float32(1.0) / d
        s = 0
        for j in range(32):  # even positions first, then odd ones (the layout _rows expects)
            q = np.int16(np.round(x[b * 32 + j] * inv))
            x16[b * 32 + (j % 2) * 16 + j // 2] = q
            s += np.int32(q)
        dx[b] = d
        dx[nb + b] = np.float32(8 * s)  # exact (|8 s| < 2**24): the Q4_0 offset term


@njit(fastmath=True, inline="always")
def run_sums16(x16, dx, nb, at):
    """The sums of each 16-value run of x16 (quant16's layout: block b's run 2b holds its values 0-15, even ones at
    words 0-7 and odd ones at 16-23) into dx from at: four blocks a group of eight floats, the first runs of the
    four then their second ones ([r0 r2 r4 r6 r1 r3 r5 r7], the order simd.run_sums gives a row's products in).
    Exact (|sum| <= 16 x 32639 < 2**24). The Q2_K rows' mins take them, where summing x16 again for each pair of
    rows cost ~20% of their loop."""
    for b in range(nb):
        a = np.int32(0)
        t = np.int32(0)
        for j in range(8):
            a += np.int32(x16[b * 32 + j]) + np.int32(x16[b * 32 + 16 + j])
            t += np.int32(x16[b * 32 + 8 + j]) + np.int32(x16[b * 32 + 24 + j])
        o = at + 8 * (b // 4) + b % 4
        dx[o] = np.float32(a)
        dx[o + 4] = np.float32(t)


def _sum_f32_ir(with_b: bool):
    """Codegen: sum over i < 8 nc of a[i] (* b[i]) for 1-D float32 a (b), in two <8 x float> accumulators (even
    and odd chunks), added, then halved (hsum8): a fixed order, whatever the compilation context, and
    vectorised (fastmath's reassoc lets LLVM pick the grouping of a plain loop's sum per context)."""
    def gen(context, builder, sig, args):
        data = lambda i: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=args[i]).data  # noqa: E731
        pa = builder.bitcast(data(0), V(F32, 8).as_pointer())
        pb = builder.bitcast(data(1), V(F32, 8).as_pointer()) if with_b else None
        nc = args[2 if with_b else 1]
        zero = ir.Constant(V(F32, 8), [0.0] * 8)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(2)]
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        with cgutils.for_range(builder, nc) as loop:
            i = loop.index
            acc = builder.select(builder.icmp_unsigned("==", builder.and_(i, ir.Constant(I64, 1)), ir.Constant(I64, 0)),
                                 accs[0], accs[1])
            va = builder.load(builder.gep(pa, [i]), align=4)
            if with_b:
                v = builder.call(fma, [va, builder.load(builder.gep(pb, [i]), align=4), builder.load(acc)])
            else:
                v = _fadd(builder, va, builder.load(acc))
            builder.store(v, acc)
        return hsum8(builder, _fadd(builder, builder.load(accs[0]), builder.load(accs[1])))
    return gen


if HAVE_AVX2:
    @intrinsic
    def dot_f32(typingctx, a, b, nc):
        """a[:8 nc] . b[:8 nc] for 1-D float32 a, b: fma into two 8-lane accumulators (even / odd chunks of 8),
        then a fixed halving sum: the same bits in any compilation context."""
        return types.float32(a, b, nc), _sum_f32_ir(True)

    @intrinsic
    def sum_f32(typingctx, a, nc):
        """a[0] + .. + a[8 nc - 1] for 1-D float32 a, in dot_f32's order."""
        return types.float32(a, nc), _sum_f32_ir(False)
else:
    @njit(inline="always")
    def dot_f32(a, b, nc):
        acc = np.zeros(16, np.float32)
        for i in range(nc):
            for c in range(8):
                acc[(i % 2) * 8 + c] = np.float32(acc[(i % 2) * 8 + c] + a[8 * i + c] * b[8 * i + c])
        return _hsum16(acc)

    @njit(inline="always")
    def sum_f32(a, nc):
        acc = np.zeros(16, np.float32)
        for i in range(nc):
            for c in range(8):
                acc[(i % 2) * 8 + c] = np.float32(acc[(i % 2) * 8 + c] + a[8 * i + c])
        return _hsum16(acc)

    @njit(inline="always")
    def _hsum16(acc):
        s = acc[:8] + acc[8:]
        h = s[:4] + s[4:]
        p = h[:2] + h[2:]
        return np.float32(p[0] + p[1])
