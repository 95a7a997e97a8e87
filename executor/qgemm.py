"""Prefill-sized products in integers: the weights' own small integers times int16 activations, summed in int32
by AVX-512 VNNI `vpdpwssd` (16 multiply-adds an instruction at 256 bits, where an fp32 FMA does 8), each sub-block's
sums scaled once in float. The BLIS loop order of gemm.deq_matmul, with integer panels on both sides:

- tokens (qpack_into, once per matrix of tokens): a 16-token block holds, for each pair of adjacent activations
  (x[2p], x[2p+1]) of a row, the two int16 as one int32 per token (a pair's 16 tokens side by side), then per token
  each 32-block's scale dx, and dx times the sum of the block's x16 and of each 16-value half (the mins' terms);
- weights (q_decode, 6 whole rows at a time, QKC columns at most, into a panel): each value's integer in natural order
  (Q4_K's nibble, Q6_K's q - 32, IQ4's codebook byte ...), each sub-block's float scale (d sc) and negated min
  (dmin m: the types with mins) per row;
- the register tile: 6 rows x 16 tokens, 12 int32 accumulators; per pair of columns a row's two int16 are
  broadcast as one int32 and `vpdpwssd`-ed against the tokens' pairs; at the end of a sub-block (32 values, 16 for
  Q6_K / Q3_K / Q2_K) each accumulator is converted, times (row scale x token dx) added into a float one, and the
  min term (row min x token sum) added;
- meanwhile the first token block's tile prefetches the next panel's rows into L2, spread over its column steps: the
  decode finds them there, where the hardware's stream prefetch, idle during the tiles, left it waiting on DRAM.
  One Zen 4 core, a `small-q4k` expert matrix from DRAM against the same one in L2 (GFLOP/s, session 32): Q4_K at 9
  / 16 tokens 73 / 129 -> 85 / 150 (in L2: 88 / 154), Q6_K 61 / 107 -> 73 / 124 (79 / 134).

Integer sums of a sub-block stay below 2**31: |weight| <= 128 and |x16| <= 32639 (simd.quant16), 32 products.
The activations are simd.quant16's (per 32-block int16, <= 1.54e-5 of the block's largest value), so results
match the fused int16 rows (row_products.rows_fused) to float rounding, and gguf.dequantize-then-matmul as they do.
Without VNNI the same code runs on `vpmaddwd` + `vpaddd` (AVX2, 16 ymm registers: the tests run it there; its speed
against the fp32 GEMM is not measured, so the executor takes this path only where HAVE_QGEMM). F16 weights have no
integers: they stay on gemm.py.

int8 activations (INT8: `execute --gemm-int8`, llama.cpp's precision): qpack8_into quantises each 32-block of a
token's float row to int8 (llama.cpp's Q8_0), four adjacent values an int32, and keeps the block's and halves' integer
sums; _rows8 adds BIAS8 to each weight's integer, so that `vpdpbusd` (unsigned weights x signed tokens, 32
multiply-adds an instruction at 256 bits) takes four values a step, and the bias comes off where each sub-block's
integer sums start (-bias sum(x8): no float step). One core, calibrate's weights, 128 tokens an expert: 1.28-1.64x
the int16 tile (session 36; the bias through a float step then); pp512 of `small-q4k` 1.14x llama.cpp's in place
(session 37), where int16 runs 0.75-0.80x.
"""
from __future__ import annotations

import os

import numpy as np
from llvmlite import binding as llb
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from specs.formats import EXECUTOR_SLICE_COLS, executor_group_bytes

from .cpu_caches import cache_bytes
from .gemm import MR, NT, ZMM, _col_bytes
from .nbcache import drop_stale_cache
from .qdecode import q_decode
from .simd import F32, HAVE_AVX2, I8, I16, I32, I64, V, _fmul, _fn, _slice, _splat, q8_block

drop_stale_cache(__file__)

_FEATURES = llb.get_host_cpu_features().flatten().split(",")
HAVE_VNNI256 = all(f"+{f}" in _FEATURES for f in ("avx512vnni", "avx512vl"))  # vpdpwssd on ymm, 32 ymm registers
# The tiles' width: 16 tokens a 512-bit register (`vpdpwssd` / `vpdpbusd` on zmm) where the core has AVX-512 VNNI, else
# 8 a ymm (gemm.ZMM, MOE_OFFLOAD_ZMM). On the Zen 5 VM of session 55, 12 independent chains ran 7.4-7.6 G ymm against
# 7.7-8.2 G zmm `vpdpwssd` a second (118-122 against 245-262 G multiply-adds), where the 16-token ymm tile already ran
# at 83% of the ymm peak.
HAVE_VNNI512 = HAVE_VNNI256 and all(f"+{f}" in _FEATURES for f in ("avx512f", "avx512bw"))
WIDE = HAVE_VNNI512 and ZMM
# Where prefill's products take the integer GEMM (row_products.rows_matmul): with VNNI; MOE_OFFLOAD_QGEMM=0 / 1 turns
# it off / on whatever the CPU (to compare or test the paths; the kernels' caches follow it: nbcache._SWITCHES)
HAVE_QGEMM = HAVE_AVX2 and {"0": False, "1": True}.get(os.environ.get("MOE_OFFLOAD_QGEMM", ""), HAVE_VNNI256)
# MOE_OFFLOAD_GEMM_INT8=1: the integer GEMM takes int8 activations (qpack8_into, q_matmul8: vpdpbusd, 32 multiply-adds an
# instruction at 256 bits against vpdpwssd's 16) at llama.cpp's precision, ~0.5% of a product's largest term against
# int16's 2e-5; `execute --gemm-int8` sets it. Read at import like HAVE_QGEMM (nbcache._SWITCHES)
INT8 = HAVE_QGEMM and os.environ.get("MOE_OFFLOAD_GEMM_INT8", "") == "1"
_U = np.uint64
# Columns a slice (q_matmul): whole rows up to 4,096 values, the largest MoE experts' (a 4,096-column slice of a
# 16-token block's panels, 160 KB, stays in L2). gemm.deq_matmul's 256-column slices, read a row's 256 columns at a
# time down all its rows, ran from DRAM at 0.74-0.84x this (`small-q4k`, a 64-token layer job: 67 against 84-90
# GFLOP/s on 1 thread, 127 against 152-166 on 2; 512 tokens 198 against 213: weights that stream from DRAM want long
# runs of a row, not the 144 bytes of a super-block)
QKC = EXECUTOR_SLICE_COLS  # 4,096 (specs.formats states it for the simulator's token groups)
# Token panels a row panel's tiles stream in one go: tokens in groups (BLIS's outermost loop over the B panel's NC
# columns, Van Zee & van de Geijn 2015) whose slice of the panels takes at most this, each group through every row
# panel (its rows decoded again for the next group). One slice of all of an expert's tokens spilled from L2 past
# ~200 tokens at 2,048 columns (80 KB a 16-token block): on the Zen 5 VM of session 57 (1 MB L2), one core, the rate
# at 512 tokens an expert fell to 0.80x its rate at 128 for Q4_K, 0.91x Q4_0, 0.83x Q6_K's down; in groups of 640 KB
# 0.97x / 0.98x / 0.92x (benchmarks/bench_token_groups.py); groups of 3/8 or 1/2 of L2 split 128 tokens and lost 2-7%
# there. 5/8 of L2 leaves the rest to the decoded rows and the sums (specs.formats.executor_group_tokens: the simulator's statement of the groups, tested against group_blocks).
# MOE_OFFLOAD_TOKEN_GROUP_BYTES overrides it (0: one group, the loop before; nbcache._SWITCHES).
_GROUP_ENV = os.environ.get("MOE_OFFLOAD_TOKEN_GROUP_BYTES", "")
GROUP_BYTES = int(_GROUP_ENV) if _GROUP_ENV else executor_group_bytes(cache_bytes(2) or 1 << 20)

# The values a sub-block of each type code spans (its scale's reach) and whether it has a min: Q4_K / Q5_K per 32,
# Q6_K / Q3_K / Q2_K per 16 (ggml-quants.c dequantize_row_q*_K), Q8_0 / Q4_0 / IQ4 per 32-block.
SUB = (32, 32, 32, 32, 32, 16, 32, 16, 16, 32, 32)
MINS = (False, False, False, False, True, False, True, False, True, False, False)
# int8 activations (q_matmul8): each type's integers plus this bias are vpdpbusd's unsigned bytes (Q8_0 -128..127, Q4_0
# -8..7, Q6_K -32..31, Q3_K -4..3, IQ4 -127..113 (kvalues_iq4nl); Q4_K / Q5_K / Q2_K are unsigned already)
BIAS8 = (0, 0, 128, 8, 0, 32, 0, 4, 0, 128, 128)


@njit(inline="always")
def panel_width(cols):
    """Floats a token's column of a qpack_into block takes for a row of `cols` values: cols / 2 pairs, then per
    32-block dx, dx sum(x16), and dx sum(x16) of each 16-value half (cols / 8 in all)."""
    return cols // 2 + cols // 8


@njit(inline="always")
def panel_width8(cols):
    """Floats a token's column of a qpack8_into block takes for a row of `cols` values: cols / 4 quads, then per
    32-block dx, dx sum(x8), and dx sum(x8) of each 16-value half (3 cols / 8 in all)."""
    return cols // 4 + cols // 8


@njit(inline="always")
def group_blocks(width, ks, cols, nkb, group_bytes):
    """16-token blocks of a group of q_matmul's tokens (nkb blocks in all) for panels of `width` floats a token read
    in slices of ks of their cols columns: group_bytes of slice, an even number (a zmm tile takes two), at least two
    (0: all nkb blocks, one group)."""
    if not group_bytes:
        return max(1, nkb)
    return max(2, group_bytes // (width * ks // cols * NT * 4) // 2 * 2)


@njit(cache=True)
def row_range(n):
    """0 .. n - 1 as int32, the type of a CSR job's token indices (cpu_experts.csr): rows for qpack_into that index the
    arrays they come with, in qpack_into's one compiled signature."""
    rows = np.empty(n, np.int32)
    for i in range(n):
        rows[i] = i
    return rows


@njit(fastmath=True, inline="always")
def _token16(B, tt, X16, DX, i, nb):
    """Token column tt of block B [panel_width(cols), NT] from int16 row i of X16 / DX (qpack_into)."""
    x, dx = X16[i], DX[i]
    B32 = B.view(np.int32)
    for b in range(nb):
        s0 = np.int32(0)
        s1 = np.int32(0)
        for p in range(16):  # values 2p and 2p + 1: quant16 holds the even ones first, then the odd
            lo, hi = np.int32(x[32 * b + p]), np.int32(x[32 * b + 16 + p])
            B32[16 * b + p, tt] = (lo & 0xFFFF) | (hi << 16)
            if p < 8:
                s0 += lo + hi
            else:
                s1 += lo + hi
        d = dx[b]
        B[16 * nb + b, tt] = d
        B[17 * nb + b, tt] = d * np.float32(s0 + s1)
        B[18 * nb + 2 * b, tt] = d * np.float32(s0)
        B[18 * nb + 2 * b + 1, tt] = d * np.float32(s1)


def _token8_gen(context, builder, sig, args):
    """Codegen of _token8: per 32-block one <32 x float> load, its largest |x|, x 127 / max rounded to even (vrndscaleps)
    and truncated to bytes, the block's eight quads stored down the column, then dx8 and the integer sums (sign-extended
    bytes, added in any order: exact). 4,096 rows of 2,048 values (a `small` layer's pp512 up products) on one core:
    5.1 ms, where session 36's requantised int16 rows value by value took 14.5 ms and plain numba loops over the
    floats 10.3 (session 37)."""
    B, X = (cgutils.create_struct_proxy(sig.args[i])(context, builder, value=args[i]) for i in (0, 2))
    tt, nb = args[1], args[3]
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    b8 = builder.bitcast(B.data, I8.as_pointer())
    rs = cgutils.unpack_tuple(builder, B.strides, 2)[0]  # bytes a row of the block (4 NT)
    xf = builder.bitcast(X.data, F32.as_pointer())
    radd = _fn(builder, "llvm.vector.reduce.add.v16i32", I32, [V(I32, 16)])

    def at(r, ty):  # element tt of row r of the block, as a pointer to ty
        p = builder.gep(b8, [builder.add(builder.mul(r, rs), builder.mul(tt, i64(4)))])
        return builder.bitcast(p, ty.as_pointer())
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        v = builder.load(builder.bitcast(builder.gep(xf, [builder.mul(b, i64(32))]), V(F32, 32).as_pointer()), align=4)
        q, a = q8_block(builder, v)
        quads = builder.bitcast(builder.trunc(q, V(I8, 32)), V(I32, 8))
        for k in range(8):
            builder.store(builder.extract_element(quads, ir.Constant(I32, k)),
                          at(builder.add(builder.mul(b, i64(8)), i64(k)), I32), align=4)
        s0 = builder.call(radd, [_slice(builder, q, 0, 16)])
        s1 = builder.call(radd, [_slice(builder, q, 16, 16)])
        builder.store(builder.fdiv(a, ir.Constant(F32, 127.0)), at(builder.add(builder.mul(nb, i64(8)), b), F32), align=4)
        builder.store(builder.add(s0, s1), at(builder.add(builder.mul(nb, i64(9)), b), I32), align=4)
        h0 = builder.add(builder.mul(nb, i64(10)), builder.mul(b, i64(2)))
        builder.store(s0, at(h0, I32), align=4)
        builder.store(s1, at(builder.add(h0, i64(1)), I32), align=4)
    return context.get_dummy_value()


@intrinsic
def _token8_ir(typingctx, B, tt, x, nb):
    if getattr(x, "layout", "") != "C" or getattr(B, "layout", "") != "C":
        raise TypeError("qgemm._token8 reads C-contiguous rows into a C-contiguous block")
    return types.none(B, tt, x, nb), _token8_gen


@njit(fastmath=True, inline="always")
def _token8(B, tt, X, D, i, nb):
    """Token column tt of block B [panel_width8(cols), NT] from float row i of X (C-contiguous; D unused): per
    32-block x8 = round(x 127 / max|x|), four adjacent values one int32, then dx8 = max|x| / 127 and the int32 sums
    of x8 over the block and each 16-value half (qpack8_into)."""
    _token8_ir(B, tt, X[i], nb)


def _packer(token):
    """The token blocks' loop of qpack_into / qpack8_into: each of blocks P[b0 ..]'s NT columns row idx[t] of the
    activations A (and D) by `token`, those past the last token zeros."""
    @njit(fastmath=True, inline="always")
    def pack(P, b0, A, D, idx):
        m, nb = idx.shape[0], A.shape[1] // 32
        for kb in range((m + NT - 1) // NT):
            B = P[b0 + kb]
            for tt in range(NT):
                t = kb * NT + tt
                if t < m:
                    token(B, tt, A, D, idx[t], nb)
                else:
                    for j in range(B.shape[0]):
                        B[j, tt] = np.float32(0.0)
    return pack


_pack16, _pack8 = _packer(_token16), _packer(_token8)


@njit(fastmath=True, cache=True)
def qpack_into(P, b0, X16, DX, idx):
    """The int16 activations of rows idx of X16 / DX (simd.quant16's layout) into the integer GEMM's token blocks
    P[b0:b0 + ceil(len(idx) / NT)] [panel_width(cols), NT] (NT tokens a block, zero-padded)."""
    _pack16(P, b0, X16, DX, idx)


@njit(fastmath=True, cache=True)
def qpack8_into(P, b0, X, idx):
    """Rows idx of the float activations X [T, cols] (C-contiguous) as int8 into q_matmul8's token blocks
    P[b0:b0 + ceil(len(idx) / NT)] [panel_width8(cols), NT]: per 32-block x8 = round(x 127 / max|x|), four adjacent
    values (natural order) one int32 a token, then dx8 = max|x| / 127 and the int32 sums of x8 over the block and
    each 16-value half (llama.cpp's Q8_0 activations, quantize_row_q8_0; its K-quants take one scale per 256 values,
    Q8_K)."""
    _pack8(P, b0, X, X, idx)


@njit(fastmath=True, inline="always")
def gemm_pack(P, b0, X, X16, DX, idx):
    """The executor's token panels of rows idx (qpack8_into from the floats X where INT8, else qpack_into from the
    int16 rows X16 / DX)."""
    if INT8:
        qpack8_into(P, b0, X, idx)
    else:
        qpack_into(P, b0, X16, DX, idx)


def _dp(builder, acc, a, b):
    """acc + the pairwise int16 products of a and b (<8 x i32> or <16 x i32>: two int16 a lane): vpdpwssd, else
    vpmaddwd + vpaddd (8 lanes only)."""
    n = a.type.count
    if n == 16:
        return builder.call(_fn(builder, "llvm.x86.avx512.vpdpwssd.512", V(I32, 16), [V(I32, 16)] * 3), [acc, a, b])
    if HAVE_VNNI256:
        return builder.call(_fn(builder, "llvm.x86.avx512.vpdpwssd.256", V(I32, 8), [V(I32, 8)] * 3), [acc, a, b])
    pm = builder.call(_fn(builder, "llvm.x86.avx2.pmadd.wd", V(I32, 8), [V(I16, 16), V(I16, 16)]),
                      [builder.bitcast(a, V(I16, 16)), builder.bitcast(b, V(I16, 16))])
    return builder.add(acc, pm)


def _dp8(builder, acc, s, u):
    """acc + per int32 lane the sum of its four signed bytes of s times the four unsigned bytes of u (<8 x i32> or
    <16 x i32>): vpdpbusd, else the bytes widened to int32 (portable IR: the tests' path without VNNI; 8 lanes)."""
    n = s.type.count
    if n == 16:
        return builder.call(_fn(builder, "llvm.x86.avx512.vpdpbusd.512", V(I32, 16), [V(I32, 16)] * 3), [acc, u, s])
    if HAVE_VNNI256:
        return builder.call(_fn(builder, "llvm.x86.avx512.vpdpbusd.256", V(I32, 8), [V(I32, 8)] * 3), [acc, u, s])
    prod = builder.mul(builder.sext(builder.bitcast(s, V(I8, 32)), V(I32, 32)),
                       builder.zext(builder.bitcast(u, V(I8, 32)), V(I32, 32)))
    for q in range(4):
        acc = builder.add(acc, builder.shuffle_vector(prod, prod, ir.Constant(V(I32, 8), [4 * j + q for j in range(8)])))
    return acc


def _qtile_gen(G: int, mins: bool, NV: int, step: int = 2, bias: int = 0, L: int = 8):
    """Codegen: C [blocks, MR, NT] += rows A16 [MR, kc] (int16, natural order; scales SC, negated mins MN [MR,
    kc / 16]) times the first L NV tokens of qpack_into blocks Pk [blocks, panel_width(cols), NT] (L = 8: ymm lanes
    j at block j // 2, half j % 2; L = 16: zmm, lanes j a whole block j), over columns [c0, c0 + kc) of rows of nb
    32-blocks: per G-value sub-block, G / 2 steps of MR x NV vpdpwssd (a row's pair broadcast, the tokens' pairs
    loaded), then per accumulator one convert and one fma with (row scale x token dx), and one fma with the min
    term. The int32 accumulators take MR NV of the 32 registers, the float ones as many (NV = 3: LLVM keeps some of
    those in L1). step 4: int8 activations, qpack8_into's blocks of value quads against rows of unsigned bytes
    (q_matmul8), G / 4 steps of `vpdpbusd`, each sub-block's integer sums starting at -bias sum(x8) (the weights'
    bias, BIAS8: no float step for it). Each lane's integer sums and float steps are the same whatever L: the same
    bits."""
    def gen(context, builder, sig, args):
        A, SC, MN, Pk, C, W = (cgutils.create_struct_proxy(sig.args[i])(context, builder, value=args[i])
                               for i in (0, 1, 2, 3, 7, 8))
        c0, kc, nb, pfo, rb, sb = args[4], args[5], args[6], args[9], args[10], args[11]
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        fma = _fn(builder, f"llvm.fma.v{L}f32", V(F32, L), [V(F32, L)] * 3)
        a_s = cgutils.unpack_tuple(builder, A.strides, 2)[0]
        s_s = cgutils.unpack_tuple(builder, SC.strides, 2)[0]
        p8 = builder.bitcast(Pk.data, I8.as_pointer())
        p_blk = cgutils.unpack_tuple(builder, Pk.strides, 3)[0]
        c8 = builder.bitcast(C.data, I8.as_pointer())
        c_blk = cgutils.unpack_tuple(builder, C.strides, 3)[0]

        def row(ary, s, i, ty):  # row i of a 2-D array as a pointer to ty
            return builder.bitcast(builder.gep(builder.bitcast(ary.data, I8.as_pointer()), [builder.mul(s, i64(i))]),
                                   ty.as_pointer())

        def pvec(r, j, ty):  # <L x ty> at row r, tokens L j .. L j + L - 1 of the blocks
            blk, half = (j // 2, j % 2) if L == 8 else (j, 0)
            at = builder.add(builder.mul(r, i64(4 * NT)), i64(32 * half))
            p = builder.gep(p8, [builder.add(at, builder.mul(p_blk, i64(blk)))])
            return builder.load(builder.bitcast(p, V(ty, L).as_pointer()), align=4)
        K = 32 // step  # a 32-block's rows of token words: value pairs (int16) or quads (int8)
        arows = [row(A, a_s, i, I16 if step == 2 else I8) for i in range(MR)]
        srows = [row(SC, s_s, i, F32) for i in range(MR)]
        mrows = [row(MN, s_s, i, F32) for i in range(MR)] if mins else None

        def cp(i, j):
            blk, half = (j // 2, j % 2) if L == 8 else (j, 0)
            at = builder.add(builder.mul(c_blk, i64(blk)), i64(4 * (i * NT + 8 * half)))
            return builder.bitcast(builder.gep(c8, [at]), V(F32, L).as_pointer())
        acc = [[cgutils.alloca_once_value(builder, builder.load(cp(i, j), align=4)) for j in range(NV)]
               for i in range(MR)]
        zero = ir.Constant(V(I32, L), [0] * L)
        pair0, blk0 = builder.udiv(c0, i64(step)), builder.udiv(c0, i64(32))
        pref = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
        w8 = builder.bitcast(W.data, I8.as_pointer())
        nbk = builder.udiv(kc, i64(32))
        with cgutils.for_range(builder, nbk) as loop:
            b = loop.index
            gb = builder.add(blk0, b)
            with cgutils.if_likely(builder, builder.icmp_signed("!=", sb, i64(0))):
                # the next panel's rows, a 32-column step of each a block (L2: the decode reads them next)
                at = builder.add(pfo, builder.udiv(builder.mul(b, sb), nbk))
                for i in range(MR):
                    builder.call(pref, [builder.gep(w8, [builder.add(at, builder.mul(rb, i64(i)))]),
                                        ir.Constant(I32, 0), ir.Constant(I32, 2), ir.Constant(I32, 1)])
            dv = [pvec(builder.add(builder.mul(nb, i64(K)), gb), j, F32) for j in range(NV)]
            for g in range(32 // G):
                # the sums of x (int16: dx sum(x16) in float; int8: sum(x8) in int32) over the block (G = 32) or its
                # half g (G = 16)
                sr = (builder.add(builder.mul(nb, i64(K + 1)), gb) if G == 32 else
                      builder.add(builder.mul(nb, i64(K + 2)), builder.add(builder.mul(gb, i64(2)), i64(g))))
                ia = [[zero] * NV for _ in range(MR)]
                if bias:  # the weights' bias comes off where the integer sums start: -bias sum(x8), every row's
                    nbx = [builder.mul(pvec(sr, j, I32), _splat(builder, ir.Constant(I32, -bias), L))
                           for j in range(NV)]
                    ia = [list(nbx) for _ in range(MR)]
                for p in range(G // step):
                    pr = builder.add(pair0, builder.add(builder.mul(b, i64(K)), i64(g * G // step + p)))
                    tv = [pvec(pr, j, I32) for j in range(NV)]
                    col = builder.add(builder.mul(b, i64(32)), i64(g * G + step * p))
                    for i in range(MR):
                        wp = builder.bitcast(builder.gep(arows[i], [col]), I32.as_pointer())
                        wv = _splat(builder, builder.load(wp, align=2 if step == 2 else 1), L)
                        for j in range(NV):
                            ia[i][j] = (_dp if step == 2 else _dp8)(builder, ia[i][j], tv[j], wv)
                sub = builder.add(builder.mul(b, i64(32 // G)), i64(g))
                if mins:  # dx sum(x) of the block or half
                    sv = [pvec(sr, j, F32) if step == 2
                          else _fmul(builder, dv[j], builder.sitofp(pvec(sr, j, I32), V(F32, L)))
                          for j in range(NV)]
                for i in range(MR):
                    s = _splat(builder, builder.load(builder.gep(srows[i], [sub])), L)
                    mv = _splat(builder, builder.load(builder.gep(mrows[i], [sub])), L) if mins else None
                    for j in range(NV):
                        f = builder.call(fma, [builder.sitofp(ia[i][j], V(F32, L)), _fmul(builder, s, dv[j]),
                                               builder.load(acc[i][j])])
                        if mins:
                            f = builder.call(fma, [mv, sv[j], f])
                        builder.store(f, acc[i][j])
        for i in range(MR):
            for j in range(NV):
                builder.store(builder.load(acc[i][j]), cp(i, j), align=4)
        return context.get_dummy_value()
    return gen


def _tile(G: int, mins: bool, NV: int, step: int, bias: int, L: int = 8):
    @intrinsic
    def tile(typingctx, A16, SC, MN, Pk, c0, kc, nb, C, W, pfo, rb, sb):
        return types.none(A16, SC, MN, Pk, c0, kc, nb, C, W, pfo, rb, sb), _qtile_gen(G, mins, NV, step, bias, L)
    return tile


# (sub-block, mins, step, bias) -> the ymm tiles of 8, 16 and 24 tokens of the types' (SUB, MINS, BIAS8), then the zmm
# ones of 16 and 32 (WIDE); step 4: int8 activations against biased weights (q_matmul8)
_TILES = {(SUB[c], MINS[c], s, BIAS8[c] if s == 4 else 0): None for c in range(len(SUB)) for s in (2, 4)}
_TILES = {k: tuple(_tile(*k[:2], nv, *k[2:]) for nv in (1, 2, 3))
          + tuple(_tile(*k[:2], nv, *k[2:], 16) for nv in (1, 2)) for k in _TILES}


def q_tile(code, A16, SC, MN, Pk, c0, kc, nb, C, nv, W, pfo, rb, sb):
    """C[:, MR, :] += the panel's rows times the first 8 nv tokens of blocks Pk (nv 1, 2 or 3: one block or two),
    over columns [c0, c0 + kc) (the tile of type `code`'s sub-blocks and mins), prefetching into L2 meanwhile the sb
    bytes of each of MR rows of W from byte pfo (row stride rb; sb = 0: none); numba code only."""
    raise TypeError("qgemm.q_tile runs inside numba code only")


def q_tile_wide(code, A16, SC, MN, Pk, c0, kc, nb, C, nv, W, pfo, rb, sb):
    """q_tile with zmm tiles: nv 2 (16 tokens, one block) or 4 (32, two blocks) in 512-bit registers, nv 1 the ymm
    8-token tile; numba code only."""
    raise TypeError("qgemm.q_tile_wide runs inside numba code only")


def _tiles_of(code, A16):
    step = 4 if A16.dtype == types.uint8 else 2  # int8 activations against biased unsigned weights (q_matmul8)
    c = code.literal_value
    return _TILES[(SUB[c], MINS[c], step, BIAS8[c] if step == 4 else 0)]


def _by_nv(small, mid, big):
    """A tile call chosen by nv: 1 small (8 tokens), 2 mid (16), 3 or 4 big (24 or 32: two blocks)."""
    def impl(code, A16, SC, MN, Pk, c0, kc, nb, C, nv, W, pfo, rb, sb):
        if nv >= 3:
            big(A16, SC, MN, Pk, c0, kc, nb, C, W, pfo, rb, sb)
        elif nv == 2:
            mid(A16, SC, MN, Pk, c0, kc, nb, C, W, pfo, rb, sb)
        else:
            small(A16, SC, MN, Pk, c0, kc, nb, C, W, pfo, rb, sb)
    return impl


@overload(q_tile, prefer_literal=True, jit_options={"fastmath": True})
def _q_tile_typed(code, A16, SC, MN, Pk, c0, kc, nb, C, nv, W, pfo, rb, sb):
    return _by_nv(*_tiles_of(code, A16)[:3])


@overload(q_tile_wide, prefer_literal=True, jit_options={"fastmath": True})
def _q_tile_wide_typed(code, A16, SC, MN, Pk, c0, kc, nb, C, nv, W, pfo, rb, sb):
    t = _tiles_of(code, A16)
    return _by_nv(t[0], t[3], t[4])


@njit(fastmath=True, inline="always")
def _rows16(code, w, o, A, A16, S, N, kc, i):
    """Row i of the panel: its integers into A[i] (int16), scales and negated mins into S[i] / N[i] (q_decode)."""
    q_decode(code, w, o, A[i], S[i], N[i], kc)


@njit(fastmath=True, inline="always")
def _rows8(code, w, o, A, A16, S, N, kc, i):
    """Row i of the panel as unsigned bytes for vpdpbusd: its integers plus BIAS8[code] into A[i] (uint8; the tile
    takes the bias off the integer sums: types with mins have none)."""
    q_decode(code, w, o, A16[0], S[i], N[i], kc)
    bias = BIAS8[code]
    for c in range(kc):
        A[i, c] = np.uint8(A16[0, c] + bias)


def _q_matmul(int8: bool, wide: bool = WIDE, group_bytes: int = GROUP_BYTES):
    """q_matmul (int8: q_matmul8): one body, the panel rows' type and its tiles (wide: zmm, q_tile_wide) and its
    token groups (group_bytes of panel slice; 0: one group) chosen here."""
    den, adt, rows = (12, np.uint8, _rows8) if int8 else (20, np.int16, _rows16)
    tile = q_tile_wide if wide else q_tile

    @njit(fastmath=True, inline="always")
    def q_matmul(code, w, r0, r1, rb, P, m, res, off):
        cols = P.shape[1] * 32 // den
        nb = cols // 32
        nkb = P.shape[0]
        npn = (r1 - r0 + MR - 1) // MR
        ks = min(cols, QKC)
        A = np.empty((MR, ks), adt)
        A16 = np.empty((1, ks if int8 else 0), np.int16)  # _rows8's decoded row before the bias (_rows16: none)
        S = np.empty((MR, ks // 16), np.float32)
        N = np.zeros((MR, ks // 16), np.float32)
        C = np.zeros((npn, nkb, MR, NT), np.float32)
        gb = group_blocks(P.shape[1], ks, cols, nkb, group_bytes)
        for c0 in range(0, cols, ks):
            kc = min(ks, cols - c0)
            cb = _col_bytes(code, c0)
            for g0 in range(0, nkb, gb):
                g1 = min(nkb, g0 + gb)
                mg = min(m, g1 * NT)
                for p in range(npn):
                    r = r0 + p * MR
                    nr = min(MR, r1 - r)
                    for i in range(nr):
                        rows(code, w, _U(r + i) * _U(rb) + _U(cb), A, A16, S, N, kc, i)
                    for i in range(nr, MR):  # a short last panel: zero rows, results dropped below
                        A[i, :] = 0
                        S[i, :] = 0.0
                        N[i, :] = 0.0
                    # the first token block's tile prefetches the next panel's rows (their slice): the decode above
                    # then finds them in L2 rather than waiting on DRAM, where the hardware's stream prefetch stopped
                    # during the tiles
                    sb = np.int64(_col_bytes(code, kc)) if p + 1 < npn else np.int64(0)
                    pfo = np.int64((r + MR) * rb + cb)
                    kb = g0
                    while kb < g1:
                        # ymm: 16-token tiles, a last 17-24 tokens in one 24-token tile (two blocks), 1-8 in 8;
                        # zmm: 32-token tiles (two blocks), a last 9-16 tokens in 16, 1-8 in the ymm 8
                        rem = mg - kb * NT
                        if wide:
                            nv = 1 if rem <= 8 else (2 if rem <= 16 else 4)
                        else:
                            nv = 1 if rem <= 8 else (3 if 16 < rem <= 24 else 2)
                        tile(code, A, S, N, P[kb:kb + 2], np.int64(c0), np.int64(kc), np.int64(nb),
                             C[p, kb:kb + 2], nv, w, pfo, np.int64(rb), sb if kb == g0 else np.int64(0))
                        kb += 2 if nv >= 3 else 1
        for p in range(npn):
            nr = min(MR, r1 - r0 - p * MR)
            for k in range(m):
                for i in range(nr):
                    res[k, off + p * MR + i] = C[p, k // NT, i, k % NT]
    return q_matmul


q_matmul = _q_matmul(False)
q_matmul.__doc__ = """res[k, off + r - r0] = row_r . token k for rows [r0, r1) of flat bytes w (type `code`, row stride
rb) and the m tokens packed by qpack_into in P (rows of 8 / 5 P.shape[1] values: panel_width); each weight decoded to its
integer once."""
q_matmul8 = _q_matmul(True)
q_matmul8.__doc__ = """q_matmul against int8 activations packed by qpack8_into (rows of 8 / 3 P.shape[1] values)."""


# The integer GEMM the executor runs (INT8 chooses): its token panels' width, their packing and the product
gemm_width = panel_width8 if INT8 else panel_width
gemm_matmul = q_matmul8 if INT8 else q_matmul


def gemm_activations() -> str:
    """The activations of the products above row_products._FUSED tokens an expert: 'int8' or 'int16' (the integer
    GEMM; INT8), else 'float' (gemm.deq_matmul)."""
    return "int8" if INT8 else ("int16" if HAVE_QGEMM else "float")
