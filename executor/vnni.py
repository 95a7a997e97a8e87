"""Q4_0 rows with AVX-512 VNNI (`vpdpbusd`): two rows a 512-bit register, int16 activations split in two bytes;
IQ4_NL's rows too, the same blocks with a codebook lookup (_rows_vnni's `book`).

On a core with two 512-bit multiply pipes (Intel server parts) simd.py's 256-bit Q4_0 loop is bound by its
five multiply-pipe instructions per row and block (2 `vpmaddwd`, the shift, the convert, the fma: 31.6 G
weights/s a core in L2 here, 2.6 cycles per row and block). `vpdpbusd` multiplies 64 unsigned bytes by 64
signed ones and adds each four into an int32 lane, so one instruction takes a block of two rows if the
activations are bytes. They stay int16 (the executor's precision, not llama.cpp's int8): each x16 is split as
x16 = 256 h + l with h, l signed bytes (|x16| <= 32639, simd.quant16), and a block of a row pair costs

    vpermt2d (the two rows' 16 bytes, dwords interleaved)  vpandq (nibbles: low ones x 1, high ones x 16)
    vpdpbusd (. h)  vpslld 8  vpdpbusd (. l)  vcvtdq2ps  vfmadd (the pair's two scales, vbroadcastsd)

seven instructions for two rows where simd.py spends sixteen, beside the pair's scales (gathered 8 blocks at a
time, _rows_vnni). Row k of a pair takes the even dword lanes, row k + 1 the odd ones; lanes 0-7 hold the low
nibbles (weights 0-15 of the block), lanes 8-15 the high nibbles times 16 (weights 16-31; undone in the final sum,
as simd.py's lane 1). The activations come pre-arranged to
that order, each dword twice (once a row): split8 writes them behind the scales in DX, 128 bytes a block. The
integer sum of a lane is the int16 kernel's, exactly; a row's float adds are its own, whichever row it is
paired with (a lone row is paired with itself), and each token's are as alone, so a token gets the same bits
in any row group or token group. The -8 offset is simd.py's, scale x 8 sum(x16) per row in float, summed in 8
lanes (_rows_vnni).

An int8 build (`execute --gemm-int8`: llama.cpp's precision, as its prefill GEMM) makes the activations bytes:
lanes8 writes each token's x8 (qgemm.qpack8_into's values) in the same places, with each lane's start (-8 or -128
times its bytes' sum, so the offset comes off in the integers) and the blocks' dx8, and a block of a row pair is
one vpdpbusd, not two, a shift and an add: one core in L2 1.27x, `small-q4` / `small-iq4nl` decode even with
llama.cpp's repacked rows (README). lanes8 also writes whole blocks of x8 for the int8 build's K-quant and IQ4_XS rows
(kquants_vnni.py) in the block's last 64 bytes, and the blocks' and 16-value runs' sums those rows' offsets take.
"""
from __future__ import annotations

import os

import numpy as np
from llvmlite import binding as llb
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from .simd import (F32, I8, I16, I32, I64, V, _fadd, _fmul, _fn, _fsub, _qsig, _slice, _splat, prefetch_lines,
                   prefetch_offset, q8_block, token_rows)

_FEATURES = llb.get_host_cpu_features().flatten().split(",")
# MOE_OFFLOAD_NO_VNNI=1 keeps simd.py's int16 rows on a VNNI CPU (the same results to float rounding; to test or time
# that path)
HAVE_VNNI512 = (all(f"+{f}" in _FEATURES for f in ("avx512f", "avx512bw", "avx512vnni"))
                and os.environ.get("MOE_OFFLOAD_NO_VNNI") != "1")
# AVX-512 VBMI (vpermb: a byte lookup in 64 entries by each index's low six bits) takes IQ4_NL's codebook lookup
# without masking the nibbles first (the table repeats every 16): one core in L2, one token, 1.07-1.08x (session 38)
HAVE_VBMI = "+avx512vbmi" in _FEATURES
X16_MAX = 32639  # the largest |x16| whose split h = (x16 + 128) >> 8 fits a signed byte
SPLIT_FLOATS = 64  # float32 slots of DX a block's split takes (256 bytes: h then l, 64 each, then each int32 lane's
# -128 x the sum of its four h, then of its four l: where IQ4_NL's rows start their integer sums)
# DX's run sums (simd.run_sums16, read by the Q2_K rows) start at RUN_SUMS_AT x (blocks) floats: behind the
# scales, the block sums and, with AVX-512 VNNI, the split bytes
RUN_SUMS_AT = 2 + SPLIT_FLOATS * HAVE_VNNI512


def _split_pos(j: int) -> tuple[int, int]:
    """Byte offsets (within a block's 64) of activation j (0..31) of a block: row k's copy, row k + 1's."""
    half, m, b = j // 16, (j % 16) // 4, j % 4  # high nibble?, the row's dword of 16 bytes, byte in it
    lane = half * 2 + m // 2  # 128-bit lane: [A_2L B_2L A_2L+1 B_2L+1] for dwords m = 2L, 2L + 1
    d = lane * 4 + (m % 2) * 2  # row k's dword in the register; row k + 1's is the next
    return 4 * d + b, 4 * d + 4 + b


def _split_order(held=lambda j: (j % 2) * 16 + j // 2) -> list[int]:
    """For each of a block's 64 places (split8's order), where the activation it holds is in the block written
    from: held(j) for activation j (default quant16's even-first order; lanes8's floats are in order, j)."""
    src = [0] * 64
    for j in range(32):
        for p in _split_pos(j):
            src[p] = held(j)
    return src


def _lane_starts(builder, v, bias):
    """Codegen: each int32 lane's start, bias (a list of 16) x the sum of its four bytes of v (<64 x i8 or i16>)."""
    w32 = builder.sext(v, V(I32, 64))
    lanes = [builder.shuffle_vector(w32, w32, ir.Constant(V(I32, 16), [4 * c + q for c in range(16)]))
             for q in range(4)]
    tot = builder.add(builder.add(lanes[0], lanes[1]), builder.add(lanes[2], lanes[3]))
    return builder.mul(tot, ir.Constant(V(I32, 16), bias))


@intrinsic
def split8(typingctx, x16, dx, nb):
    """Write x16's split (x16 = 256 h + l, h and l int8) behind the 2 nb scales and sums of dx (both 1-D and
    contiguous; nb an int64), block by block in the lane order of the VNNI rows: 64 bytes of h, then 64 of l,
    each value at its two rows' places, then for each of the 16 int32 lanes -128 x the sum of its four h, then of
    its four l (IQ4_NL's bias, _rows_vnni). A block is one load, a word permute to the 64 places (vpermw), the
    split in words, two truncations to bytes (vpmovwb), the lanes' sums by shuffles, and four stores."""
    def gen(context, builder, sig, args):
        xa, da, n = args
        data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        px, pd = data(0, xa), builder.bitcast(data(1, da), I8.as_pointer())
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        order = ir.Constant(V(I32, 64), _split_order())
        c = lambda v: ir.Constant(V(I16, 64), [v] * 64)  # noqa: E731
        base = builder.gep(pd, [builder.mul(n, i64(8))])  # behind 2 nb floats
        with cgutils.for_range(builder, n) as loop:
            b = loop.index
            w = builder.load(builder.bitcast(builder.gep(px, [builder.mul(b, i64(32))]), V(I16, 32).as_pointer()),
                             align=2)
            w = builder.shuffle_vector(w, w, order)  # <64 x i16>: each x16 at its two places
            h = builder.ashr(builder.add(w, c(128)), c(8))
            lo = builder.sub(w, builder.shl(h, c(8)))
            ob = builder.gep(base, [builder.mul(b, i64(4 * SPLIT_FLOATS))])
            for j, v in enumerate((h, lo)):
                builder.store(builder.trunc(v, V(I8, 64)), builder.bitcast(builder.gep(ob, [i64(64 * j)]),
                                                                           V(I8, 64).as_pointer()), align=1)
                builder.store(_lane_starts(builder, v, [-128] * 16),
                              builder.bitcast(builder.gep(ob, [i64(128 + 64 * j)]), V(I32, 16).as_pointer()), align=1)
        return context.get_dummy_value()
    return types.none(x16, dx, nb), gen


# An int8 build's block (lanes8), in the split's place, in <16 x i32> (64 bytes): x8 at its 64 places, then the lanes'
# starts for Q4_0, then for IQ4_NL, then (L8_KQ) 64-byte pairs of whole blocks in order for the K-quant rows
# (kquants_vnni.py), each block's x8 in two of them (_kq_at_ir), so that one 64-byte load of a row's nibbles meets one
# slot: in each four blocks 4i .. 4i + 3 the slots hold
#     4i: x8(4i) x8(4i + 2)   4i + 1: x8(4i + 1) x8(4i + 3)   (Q4_K: a load's low nibbles, its high ones)
#     4i + 2: x8(4i) x8(4i + 1)   4i + 3: x8(4i + 2) x8(4i + 3)   (Q6_K, Q3_K, Q2_K, IQ4_XS)
# The last two only where the four blocks are whole. The blocks' dx8 follow the run sums, contiguous (dx8_at), then
# sums8 (dx8 x the sum of a block's x8: Q4_K's and Q5_K's mins, IQ4_XS's +128), then runs8 (the same for each
# 16-value run: Q6_K's and Q3_K's offsets, Q2_K's mins): a scale read from each block's 256 bytes instead cost the
# Q4_0 rows ~10% from DRAM on two threads (session 38)
L8_Q4_STARTS, L8_IQ4_STARTS, L8_KQ = 1, 2, 3


@njit(inline="always")
def dx8_at(nb):
    """Where an int8 build's dx8 start in a DX row of nb blocks (floats): behind the run sums (simd.run_sums16)."""
    return RUN_SUMS_AT * nb + 8 * ((nb + 3) // 4)


def _dx8_at_ir(builder, nb):
    """Codegen of dx8_at (nb an i64 value)."""
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    return builder.add(builder.mul(nb, c(RUN_SUMS_AT)), builder.mul(builder.sdiv(builder.add(nb, c(3)), c(4)), c(8)))


@njit(inline="always")
def sums8_at(nb):
    """Where an int8 build's sums8 (dx8 x the sum of a block's x8) start in a DX row of nb blocks (floats): behind
    the dx8; runs8 (the same for each 16-value run, two a block) follow at sums8_at(nb) + nb."""
    return dx8_at(nb) + nb


def _kq_at_ir(builder, b, q6: bool):
    """Codegen: the byte offset, within the split area, of block b's x8 in its Q4_K place (q6: its Q6_K place) of the
    L8_KQ slots (b an i64)."""
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    half = builder.and_(builder.lshr(b, c(1)), c(1))  # block 4i + 2 or 4i + 3
    slot, at = ((builder.add(builder.and_(b, c(~3)), builder.add(half, c(2))), builder.and_(b, c(1))) if q6 else
                (builder.and_(b, c(~2)), half))
    return builder.add(builder.add(builder.mul(slot, c(4 * SPLIT_FLOATS)), c(64 * L8_KQ)), builder.mul(at, c(32)))


@intrinsic
def lanes8(typingctx, x, dx, nb):
    """int8 activations for the VNNI rows (an int8 build, `execute --gemm-int8`: llama.cpp's precision) from the
    float row x behind the 2 nb floats of dx (both 1-D and contiguous; nb an int64), block by block: x8 =
    round-to-even(x 127 / max|x|), qgemm.qpack8_into's own quantisation, at its two rows' places (split8's order,
    64 bytes); then each int32 lane's start for Q4_0 rows (-8 x the sum of its four bytes; -128 x in lanes 8-15, whose
    weights come x 16), then for IQ4_NL ones (-128 x: its codebook + 128), so a lane ends at sum (q - bias) x8; the
    block's x8 in order at its K-quant places (_kq_at_ir); dx8 = max|x| / 127 at dx[dx8_at(nb) + b], dx8 x the sum of
    the block's x8 at dx[sums8_at(nb) + b], and of each of its 16-value runs at dx[sums8_at(nb) + nb + 2 b (+ 1)]. A
    block is one load, its max, the rounding, a byte shuffle to the 64 places, the lanes' sums by shuffles, and nine
    stores."""
    if getattr(x, "layout", "") != "C":
        raise TypeError("vnni.lanes8 reads a C-contiguous row of floats")

    def gen(context, builder, sig, args):
        xa, da, n = args
        data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        pxf = data(0, xa)
        pd = builder.bitcast(data(1, da), I8.as_pointer())
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        order = ir.Constant(V(I32, 64), _split_order(lambda j: j))
        base = builder.gep(pd, [builder.mul(n, i64(8))])  # behind 2 nb floats
        d8 = _dx8_at_ir(builder, n)
        vsum = _fn(builder, "llvm.vector.reduce.add.v16i32", I32, [V(I32, 16)])
        with cgutils.for_range(builder, n) as loop:
            b = loop.index
            v = builder.load(builder.bitcast(builder.gep(pxf, [builder.mul(b, i64(32))]), V(F32, 32).as_pointer()),
                             align=4)
            q, a = q8_block(builder, v)  # qgemm.qpack8_into's values
            runs = [builder.call(vsum, [_slice(builder, q, 16 * r, 16)]) for r in (0, 1)]
            q = builder.trunc(q, V(I8, 32))

            def kq(q6):
                return builder.bitcast(builder.gep(base, [_kq_at_ir(builder, b, q6)]), V(I8, 32).as_pointer())
            builder.store(q, kq(False), align=1)
            with builder.if_then(builder.icmp_signed("<", builder.or_(b, i64(3)), n)):  # its four blocks whole
                builder.store(q, kq(True), align=1)
            q = builder.shuffle_vector(q, q, order)  # <64 x i8>: each x8 at its two places
            ob = builder.gep(base, [builder.mul(b, i64(4 * SPLIT_FLOATS))])
            builder.store(q, builder.bitcast(ob, V(I8, 64).as_pointer()), align=1)
            for at, bias in ((L8_Q4_STARTS, [-8] * 8 + [-128] * 8), (L8_IQ4_STARTS, [-128] * 16)):
                builder.store(_lane_starts(builder, q, bias),
                              builder.bitcast(builder.gep(ob, [i64(64 * at)]), V(I32, 16).as_pointer()), align=1)
            dx8 = builder.fdiv(a, ir.Constant(F32, 127.0))
            pf = builder.bitcast(pd, F32.as_pointer())
            builder.store(dx8, builder.gep(pf, [builder.add(d8, b)]), align=4)
            s8 = builder.add(d8, n)
            builder.store(_fmul(builder, builder.sitofp(builder.add(*runs), F32), dx8),
                          builder.gep(pf, [builder.add(s8, b)]), align=4)
            r8 = builder.add(builder.add(s8, n), builder.mul(b, i64(2)))
            for r in (0, 1):
                builder.store(_fmul(builder, builder.sitofp(runs[r], F32), dx8),
                              builder.gep(pf, [builder.add(r8, i64(r))]), align=4)
        return context.get_dummy_value()
    return types.none(x, dx, nb), gen


def _dpbusd(builder, acc, a, b):
    """acc + (each four unsigned bytes of a times the signed bytes of b, summed): <16 x i32>."""
    f = _fn(builder, "llvm.x86.avx512.vpdpbusd.512", V(I32, 16), [V(I32, 16)] * 3)
    return builder.call(f, [acc, a, b])


GROUP = 8  # blocks whose scales a row gathers at once: the fp16 scales of 8 Q4_0 / IQ4_NL blocks lie in its first
# 128 bytes
_WORDS = ir.Constant(V(I16, 64), list(range(64)))


def _masked_load(builder, ptr, ty, mask):
    """Codegen: the lanes of vector type ty at ptr where mask (<n x i1>) holds, zeros elsewhere (vmovdqu16 / vmovups
    with a k-mask: lanes off the mask are not read, so past the end of a mapping is safe). A plain load of a row's
    first 128 bytes let LLVM split the blocks' own 16-byte loads that overlap it into vmovq pairs and vpunpcklqdq."""
    f = _fn(builder, f"llvm.masked.load.v{ty.count}{'f32' if ty.element == F32 else 'i16'}.p0v{ty.count}"
            f"{'f32' if ty.element == F32 else 'i16'}", ty, [ty.as_pointer(), I32, V(ir.IntType(1), ty.count), ty])
    return builder.call(f, [builder.bitcast(ptr, ty.as_pointer()), ir.Constant(I32, 1), mask, ir.Constant(ty, None)])


def _offset_sum(builder, lanes):
    """Codegen: Q4_0's offset term of a row pair, its 16 lanes at pointer `lanes` ([A0 B0 A1 B1 .. A7 B7], lane j
    the sum over blocks j, j + 8, ..), added by halving (lanes j and j + 4, then j and j + 2, then the two left):
    <2 x f32>, rows A and B."""
    v = builder.load(builder.bitcast(lanes, V(F32, 16).as_pointer()), align=4)
    for n in (8, 4, 2):
        v = _fadd(builder, _slice(builder, v, 0, n), _slice(builder, v, n, n))
    return v


def _rows_vnni(NR: int, MT: int = 1, book: tuple = (), int8: bool = False, vbmi: bool = HAVE_VBMI):
    """Codegen: res[k0 + t, ro + k] = row_k . x_t for NR Q4_0 rows (book: IQ4_NL's, its 16-value int8 codebook) at
    byte woff + k * rb (nb blocks each), NR even or 1 (paired with itself), and the MT tokens t of DX's split (split8)
    and scales from k0.

    IQ4_NL's blocks are Q4_0's (fp16 d, 16 bytes of nibbles, value 16 + l the high nibble of byte l); its nibbles
    index the codebook. Both nibbles of a lane are shifted down to 0..15 (vpsrlvd: the high lanes by 4) and looked
    up in the codebook plus 128, unsigned bytes (vpermb in its four copies, with AVX-512 VBMI; else masked, then
    vpshufb). The bias comes off in the integers: each lane's h and l sums start at -128 x the sum of the lane's
    four h (l) bytes (split8 writes them once a token), so a lane ends at sum q x16 exactly (|.| <= 4 x 127 x 32639
    < 2**24: its convert is exact too).

    Blocks go GROUP at a time: a row pair's 16 scales of a group in one register (two masked loads of the rows'
    first 128 bytes, one word permute, one vcvtph2ps, times each token's 8 dx twice), each block's pair broadcast
    from it (vpermpd), and Q4_0's offset term for the 8 blocks in one multiply and add into 16 lanes (_offset_sum).
    Gathered a block at a time (two 16-bit loads, an insert, a convert, a multiply, a store and a broadcast load
    back) the scales took a quarter of the loop: one core, a 2,048-column matrix in L2, 2 rows, one token 1.15-1.25x
    (`python benchmarks/bench_q4_rows.py`, session 60). A row's last group, of fewer blocks, loads only its blocks'
    scales (k-masks) and runs only its blocks. With several tokens (8 rows, 2 or 4 tokens) the 4 pairs' scales of
    each token do not fit in registers beside the accumulators: the next group's go to a stack buffer during this
    group and each block broadcast-loads its pair (vbroadcastsd); read back right after they were stored (one zmm
    store, eight 8-byte loads) they stalled store forwarding, 2 tokens 0.55x. The lanes are then an array in memory
    (as vectors LLVM kept all 16 in registers and spilled). A token's float adds are the same in every kernel, so it
    gets the same bits in any row group or token group; simd.py's rows (a CPU without VNNI) subtract the offset
    term block by block (simd.q4_offset_term: 8 lanes there cost its rows 5-12%), so the two agree to float rounding,
    not bit for bit.

    int8: DX holds lanes8's int8 activations instead of the split: one vpdpbusd a row pair and block, from the lane's
    start (Q4_0's -8 comes off there too), and the block scales times dx8."""
    NP = max(1, NR // 2)
    bs = 18
    iq4 = bool(book)
    offset = not (iq4 or int8)  # Q4_0's -8 in float (the int16 build)

    def gen(context, builder, sig, args):
        woff, rb, nb, roff = args[1], args[2], args[6], args[8]  # _qsig's; X16 is not read: DX holds the split
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        _, dds, rds = token_rows(context, builder, sig, args, MT)
        wd = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0]).data
        zero16 = ir.Constant(V(F32, 16), [0.0] * 16)
        izero = ir.Constant(V(I32, 16), [0] * 16)
        accs = [[cgutils.alloca_once_value(builder, zero16) for _ in range(MT)] for _ in range(NP)]
        R = max(NR, 2)  # scales of a lone row: its own, twice
        # Q4_0's offset term, [A0 B0 A1 B1 .. A7 B7] a token and row pair: lane 2 j + i row i's sum over blocks
        # j (mod 8)
        # (several tokens: an array in memory, added to once a group; as vectors LLVM kept all NP x MT in registers
        # beside the accumulators, and 8 rows x 4 tokens spilled)
        lane_zeros = zero16 if MT == 1 else ir.Constant(ir.ArrayType(F32, 16), [0.0] * 16)
        lanes = [[cgutils.alloca_once_value(builder, lane_zeros) for _ in range(NP)] for _ in range(MT)]
        fma = _fn(builder, "llvm.fma.v16f32", V(F32, 16), [V(F32, 16)] * 3)
        rbk = [builder.mul(rb, i64(k if NR > 1 else 0)) for k in range(R)]
        pfo = prefetch_offset(builder, woff, rb, NR)  # the next row group (or further), as simd.py's
        nib = ir.Constant(V(I32, 16), [0x0F0F0F0F] * 8 + ([0x0F0F0F0F] if iq4 else [0xF0F0F0F0 - (1 << 32)]) * 8)
        hi4 = ir.Constant(V(I32, 16), [0] * 8 + [4] * 8)  # iq4: the high nibbles down to 0..15
        lut = ir.Constant(V(I8, 64), [int(v) + 128 for v in book] * 4 if iq4 else [0] * 64)
        pshufb = _fn(builder, "llvm.x86.avx512.pshuf.b.512", V(I8, 64), [V(I8, 64)] * 2)
        vpermb = _fn(builder, "llvm.x86.avx512.permvar.qi.512", V(I8, 64), [V(I8, 64)] * 2)
        pick = ir.Constant(V(I32, 16), [0, 4, 1, 5, 2, 6, 3, 7] * 2)  # A0 B0 A1 B1 | A2 B2 A3 B3, twice
        xoff = builder.mul(nb, i64(2))  # the split starts after the 2 nb floats of scales and sums
        d8 = _dx8_at_ir(builder, nb) if int8 else None
        twice = ir.Constant(V(I32, 16), [j // 2 for j in range(16)])

        def rowptrs(b):
            p0 = builder.gep(wd, [builder.add(woff, builder.mul(b, i64(bs)))])
            return [builder.gep(p0, [rbk[k]]) for k in range(R)]

        def group_scales(b0, n_in, into=None, pairs=None):
            """[token][pair] <16 x f32>: blocks b0 .. b0 + 7's row scales times the token's dx, a pair's interleaved
            (n_in: an i64 count of the group's blocks where under GROUP; the others' lanes 0), stored to buffer `into`
            (an i64, 0 or 1) where given. Adds Q4_0's offset term of the blocks to each token's lanes."""
            wmask = ir.Constant(V(ir.IntType(1), 64), [int(w % 9 == 0) for w in range(64)])
            fmask = ir.Constant(V(ir.IntType(1), 8), [1] * 8)
            if n_in is not None:
                wmask = builder.and_(wmask, builder.icmp_unsigned("<", _WORDS, _splat(
                    builder, builder.trunc(builder.mul(n_in, i64(9)), I16), 64)))
                fmask = builder.icmp_unsigned("<", ir.Constant(V(I64, 8), list(range(8))), _splat(builder, n_in, 8))
            pairs = range(NP) if pairs is None else pairs
            rows = rowptrs(b0)
            words = {}
            for k in [2 * p + i for p in pairs for i in (0, 1)]:
                if into is None or n_in is not None:  # scale j at word 9 j
                    words[k] = _masked_load(builder, rows[k], V(I16, 64), wmask)
                else:  # the next group, whole (plain loads: a masked one that misses the cache stalls, 8 rows x 4
                    # tokens from DRAM 0.87-0.91x)
                    words[k] = builder.load(builder.bitcast(rows[k], V(I16, 64).as_pointer()), align=1)
            dxs, sums = [], []
            for d in dds:
                at = builder.add(d8, b0) if int8 else b0
                v = _masked_load(builder, builder.gep(d, [at]), V(F32, 8), fmask)
                dxs.append(builder.shuffle_vector(v, v, twice))
                if offset:
                    c = _masked_load(builder, builder.gep(d, [builder.add(nb, b0)]), V(F32, 8), fmask)
                    sums.append(builder.shuffle_vector(c, c, twice))
            out = [[None] * NP for _ in range(MT)]  # (stored at `into` where given)
            idx = ir.Constant(V(I32, 16), [9 * (j // 2) + 64 * (j % 2) for j in range(16)])
            for p in pairs:
                h = builder.shuffle_vector(words[2 * p], words[2 * p + 1], idx)
                sv = builder.fpext(builder.bitcast(h, V(ir.HalfType(), 16)), V(F32, 16))
                for t in range(MT):
                    out[t][p] = _fmul(builder, sv, dxs[t])
                    if into is not None:
                        at = builder.bitcast(gslot(into, t, p, 0), V(F32, 16).as_pointer())
                        builder.store(out[t][p], at, align=4)
                    if offset:
                        ln = builder.bitcast(lanes[t][p], V(F32, 16).as_pointer())
                        builder.store(_fadd(builder, builder.load(ln, align=4), _fmul(builder, out[t][p], sums[t])), ln,
                                      align=4)
            return out

        def block(b, pair_scales):
            """Block b of the rows; pair_scales(t, p): token t's scales of row pair p, <16 x f32>, each row's 8
            times."""
            xs, starts = [], []  # each token's split (h, l), and where each lane's sums start: 0, or (iq4) -128 x its
            for t in range(MT):  # four h (l) bytes' sum (split8's)
                px = builder.bitcast(builder.gep(dds[t], [builder.add(xoff, builder.mul(b, i64(SPLIT_FLOATS)))]),
                                     V(I32, 16).as_pointer())
                if int8:
                    xs.append((builder.load(px, align=4), None))
                    at = L8_IQ4_STARTS if iq4 else L8_Q4_STARTS
                    starts.append((builder.load(builder.gep(px, [i64(at)]), align=4), None))
                    continue
                xs.append(tuple(builder.load(builder.gep(px, [i64(q)]), align=4) for q in (0, 1)))
                starts.append(tuple(builder.load(builder.gep(px, [i64(q)]), align=4) for q in (2, 3)) if iq4 else
                              (izero, izero))
            ps = rowptrs(b)
            prefetch_lines(builder, builder.gep(wd, [builder.add(pfo, builder.mul(b, i64(NR * bs)))]), NR * bs)
            for p in range(NP):
                qa, qb = (builder.load(builder.bitcast(builder.gep(ps[2 * p + i], [i64(2)]), V(I32, 4).as_pointer()),
                                       align=1) for i in (0, 1))
                wq = builder.shuffle_vector(qa, qb, pick)
                if iq4:
                    if vbmi:  # bits 4-5 of an index (the next nibble's) pick the same value: no mask
                        wq = builder.call(vpermb, [lut, builder.bitcast(builder.lshr(wq, hi4), V(I8, 64))])
                    else:
                        wq = builder.call(pshufb, [lut, builder.bitcast(builder.and_(builder.lshr(wq, hi4), nib),
                                                                        V(I8, 64))])
                    wq = builder.bitcast(wq, V(I32, 16))
                else:
                    wq = builder.and_(wq, nib)
                for t, (xh, xl) in enumerate(xs):
                    sh, sl = starts[t]
                    mh = _dpbusd(builder, sh, wq, xh)  # sum q h, then times 256 plus sum q l (int8: sum q x8)
                    m = mh if int8 else _dpbusd(builder, builder.add(builder.shl(mh, ir.Constant(V(I32, 16), [8] * 16)),
                                                                     sl), wq, xl)
                    acc = builder.call(fma, [builder.sitofp(m, V(F32, 16)), pair_scales(t, p),
                                             builder.load(accs[p][t])])
                    builder.store(acc, accs[p][t])

        def run_group(b0, n_in, pair_of, before=None):
            """Blocks b0 .. b0 + 7 (n_in of them where given), block j's pair scales pair_of(j, t, p); before(j) first
            where given."""
            for j in range(GROUP):
                def pair(t, p, j=j):
                    return pair_of(j, t, p)
                if before is not None:
                    before(j)
                if n_in is None:
                    block(builder.add(b0, i64(j)), pair)
                else:
                    with builder.if_then(builder.icmp_signed("<", i64(j), n_in)):
                        block(builder.add(b0, i64(j)), pair)

        full = builder.sdiv(nb, i64(GROUP))
        rest = builder.sub(nb, builder.mul(full, i64(GROUP)))
        has_rest = builder.icmp_signed(">", rest, i64(0))
        if MT == 1:  # the group's scales in registers, block j's pair by a permute
            def in_register(b0, n_in=None):
                scales = group_scales(b0, n_in)
                run_group(b0, n_in, lambda j, t, p: builder.shuffle_vector(
                    scales[t][p], scales[t][p], ir.Constant(V(I32, 16), [2 * j, 2 * j + 1] * 8)))
            with cgutils.for_range(builder, full) as loop:
                in_register(builder.mul(loop.index, i64(GROUP)))
            with builder.if_then(has_rest):
                in_register(builder.mul(full, i64(GROUP)), rest)
        else:  # the next group's scales to a stack buffer during this group, block j's pair broadcast-loaded
            gbuf = builder.bitcast(cgutils.alloca_once(builder, V(F32, 2 * 16 * NP * MT)), F32.as_pointer())

            def gslot(q, t, p, j):  # buffer q's pair p of token t, block j
                at = builder.add(builder.mul(q, i64(16 * NP * MT)), i64(16 * (t * NP + p) + 2 * j))
                return builder.gep(gbuf, [at])

            def from_buffer(q):
                def pair_of(j, t, p):
                    s2 = builder.load(builder.bitcast(gslot(q, t, p, j), I64.as_pointer()), align=4)
                    return builder.bitcast(_splat(builder, s2, 8), V(F32, 16))
                return pair_of

            with builder.if_then(builder.icmp_signed(">", full, i64(0))):
                group_scales(i64(0), None, i64(0))
            with cgutils.for_range(builder, full) as loop:
                g = loop.index
                q = builder.and_(g, i64(1))
                nxt, one_q = builder.mul(builder.add(g, i64(1)), i64(GROUP)), builder.sub(i64(1), q)
                whole_next = builder.icmp_signed("<", builder.add(g, i64(1)), full)

                def next_pair(j):  # the next group's scales: all before block 0 (2 tokens), or (4 tokens) pair j's
                    # before block j, not in a burst: 8 rows x 4 tokens 1.07-1.13x the burst, 8 x 2 0.85-0.95x
                    pairs = ((j,) if j < NP else ()) if MT >= 4 else (range(NP) if j == 0 else ())
                    if not pairs:
                        return
                    with builder.if_else(whole_next) as (whole, last):
                        with whole:
                            group_scales(nxt, None, one_q, pairs)
                        with last:
                            with builder.if_then(has_rest):
                                group_scales(nxt, rest, one_q, pairs)
                run_group(builder.mul(g, i64(GROUP)), None, from_buffer(q), next_pair)
            with builder.if_then(has_rest):
                with builder.if_then(builder.icmp_signed("==", full, i64(0))):
                    group_scales(i64(0), rest, i64(0))
                run_group(builder.mul(full, i64(GROUP)), rest, from_buffer(builder.and_(full, i64(1))))
        for t in range(MT):
            for p in range(NP):
                a = builder.load(accs[p][t])
                hi = _slice(builder, a, 8, 8)  # Q4_0's high nibbles came x 16
                s = _fadd(builder, _slice(builder, a, 0, 8),
                          hi if iq4 else _fmul(builder, hi, ir.Constant(V(F32, 8), [1 / 16] * 8)))
                s = _fadd(builder, _slice(builder, s, 0, 4), _slice(builder, s, 4, 4))  # lanes 0, 1, 2, 3
                corr = None
                if offset:  # the pair's two rows
                    corr = _offset_sum(builder, lanes[t][p])
                for i in range(min(2, NR)):  # row 2p + i: lanes i and i + 2
                    k = 2 * p + i
                    v = _fadd(builder, builder.extract_element(s, ir.Constant(I32, i)),
                              builder.extract_element(s, ir.Constant(I32, i + 2)))
                    if offset:
                        v = _fsub(builder, v, builder.extract_element(corr, ir.Constant(I32, i)))
                    builder.store(v, builder.gep(rds[t], [builder.add(roff, ir.Constant(I64, k))]))
        return context.get_dummy_value()

    return gen


def vnni_kernel(NR: int, MT: int = 1, book: tuple = (), int8: bool = False, vbmi: bool = HAVE_VBMI):
    """rows{NR}[x{MT}] for Q4_0 on VNNI: simd._qkernel's signature and its results bit for bit, DX carrying
    split8's bytes (kernels._quant_rows writes them); book: IQ4_NL's rows against that codebook (iquants.KVALUES);
    int8: DX carrying lanes8's int8 activations instead (an int8 build's _quant_rows); vbmi: IQ4_NL's lookup by
    vpermb."""
    @intrinsic
    def kernel(typingctx, w, wo, rb, X16, DX, k0, nb, res, ro):
        return _qsig(w, wo, rb, X16, DX, k0, nb, res, ro), _rows_vnni(NR, MT, tuple(book), int8, vbmi)
    return kernel


# Not cached: vnni.py has no drop_stale_cache, so a change to simd.py would leave a cached copy stale. fastmath as
# kernels.quant_row's (LLVM divides by 127 as a multiply there too)
@njit(fastmath=True)
def lanes8_rows(x):
    """lanes8's int8 activations of the float tokens x [T, C] in a zeroed DX as wide as an int8 build's (its dx8,
    sums8 and runs8 behind the run sums) -> DX [T, dx8_at(C / 32) + 4 C / 32]: the int8 rows' inputs in either build
    (tests, benchmarks)."""
    T, nb = x.shape[0], x.shape[1] // 32
    dx = np.zeros((T, dx8_at(nb) + 4 * nb), np.float32)
    for t in range(T):
        lanes8(np.ascontiguousarray(x[t]), dx[t], np.int64(nb))
    return dx
