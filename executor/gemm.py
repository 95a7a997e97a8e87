"""Prefill-sized products (more than a few tokens per weight row), as a BLIS-style GEMM: the tokens are
packed once per matrix of tokens (pack_tokens: 16 a block, a column's tokens side by side); the weights
are dequantised from the mmap 6 rows x 256 columns at a time into an L1 panel, each weight once, and
every token block runs through a 6-row x 16-token register tile (12 accumulators, 2 vector loads and 6
broadcasts per 12 FMAs). On one Zen 3 core, in cache: 73-83 GFLOP/s of a 97 GFLOP/s FMA peak, where the
4-row x 3-token dot-product blocks before it ran 59-64 (benchmarks/bench_gemm.py, session 18). Below
GEMM_TOKENS tokens those blocks stay (deq_dots): there the tile's 16-token blocks would idle lanes.
Type codes as in kernels.py: 1 = F16, 2 = Q8_0, 3 = Q4_0, 4 = Q4_K, 5 = Q6_K, 6 = Q5_K, 7 = Q3_K, 8 = Q2_K (the
K-quants' 256-weight super-blocks as ggml lays them out: ggml-quants.c dequantize_row_q*_K), 9 = IQ4_NL (32-weight
blocks), 10 = IQ4_XS (256-weight super-blocks)."""
from __future__ import annotations

import os

import numpy as np
from llvmlite import binding as llb
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic, overload

from .iquants import deq_iq4_nl_row, deq_iq4_xs_row
from .kquant_blocks import deq_q2_k_row, deq_q3_k_row, deq_q4_k_row, deq_q5_k_row, deq_q6_k_row
from .nbcache import drop_stale_cache
from .simd import h2f

drop_stale_cache(__file__)

F16, Q8_0, Q4_0, Q4_K, Q6_K, Q5_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
_U = np.uint64
MR, NT, KC = 6, 16, 256  # rows a panel, tokens a block, columns a slice (a K-quant super-block multiple)
# Tokens from which deq_matmul runs (below, deq_dots): one core, `small-q4k`'s gate / down in cache, against the
# 4 x 3 dot blocks: 0.76-0.85x at 17 tokens (a 16-token tile and a mostly idle 8-token one), 0.91-1.02x at 20,
# 0.98-1.06x at 40, 1.15-1.23x at 48; and `execute` pp64 (16 tokens an expert on average) ran 0.85-0.93x on it.
GEMM_TOKENS = 48
_I32, _I64 = ir.IntType(32), ir.IntType(64)
# zmm tiles (this GEMM's 32-token tile; qgemm's, with AVX-512 VNNI) where the core has AVX-512: a core with full-width
# 512-bit pipes (Zen 5, Intel's server parts) retires a zmm FMA at its ymm rate (session 55's Zen 5 VM: 12 chains of
# vpdpwssd, 7.4-7.6 G ymm against 7.7-8.2 G zmm a second); Zen 4 splits a zmm op in two, the same FLOPs a cycle.
# MOE_OFFLOAD_ZMM=0 / 1 turns them off / on (to compare; the kernels' caches follow it: nbcache._SWITCHES).
HAVE_AVX512 = all(f"+{f}" in llb.get_host_cpu_features().flatten().split(",") for f in ("avx512f", "avx512bw"))
ZMM = HAVE_AVX512 and {"0": False, "1": True}.get(os.environ.get("MOE_OFFLOAD_ZMM", ""), True)


@njit(fastmath=True, inline="always")
def _deq_f16(w, o0, buf, qk):
    for j in range(_U(buf.shape[0])):
        buf[j] = h2f(w[o0 + _U(2) * j], w[o0 + _U(2) * j + _U(1)])


@njit(fastmath=True, inline="always")
def _deq_q8_0(w, o0, buf, qk):
    for b in range(_U(buf.shape[0]) // _U(32)):
        o = o0 + _U(b) * _U(34)
        d = h2f(w[o], w[o + _U(1)])
        for j in range(qk):
            buf[_U(b) * _U(32) + j] = np.float32(np.int8(w[o + _U(2) + j])) * d


@njit(fastmath=True, inline="always")
def _deq_q4_0(w, o0, buf, qk):
    """Low nibbles are values 0..15 of the block, high ones 16..31: two unit-stride loops."""
    for b in range(_U(buf.shape[0]) // _U(32)):
        o = o0 + _U(b) * _U(18)
        d = h2f(w[o], w[o + _U(1)])
        for j in range(qk // _U(2)):
            buf[_U(b) * _U(32) + j] = np.float32((np.int32(w[o + _U(2) + j]) & 15) - 8) * d
        for j in range(qk // _U(2)):
            buf[_U(b) * _U(32) + _U(16) + j] = np.float32((np.int32(w[o + _U(2) + j]) >> 4) - 8) * d


def _deq_blocks(kernel, values: int):
    """A row dequantiser of kquant_blocks.py / iquants.py over the row's blocks of `values` weights."""
    @njit(fastmath=True, inline="always")
    def deq(w, o0, buf, qk):
        kernel(w, np.int64(o0), buf, np.int64(_U(buf.shape[0]) // _U(values)))
    return deq


_deq_q4_k = _deq_blocks(deq_q4_k_row, 256)
_deq_q6_k = _deq_blocks(deq_q6_k_row, 256)
_deq_q5_k = _deq_blocks(deq_q5_k_row, 256)
_deq_q3_k = _deq_blocks(deq_q3_k_row, 256)
_deq_q2_k = _deq_blocks(deq_q2_k_row, 256)
_deq_iq4_nl = _deq_blocks(deq_iq4_nl_row, 32)
_deq_iq4_xs = _deq_blocks(deq_iq4_xs_row, 256)
_DEQ = {F16: _deq_f16, Q8_0: _deq_q8_0, Q4_0: _deq_q4_0, Q4_K: _deq_q4_k, Q6_K: _deq_q6_k, Q5_K: _deq_q5_k,
        Q3_K: _deq_q3_k, Q2_K: _deq_q2_k, IQ4_NL: _deq_iq4_nl, IQ4_XS: _deq_iq4_xs}


@njit(fastmath=True, inline="always")
def _deq_any(code, w, o0, buf, qk):
    """deq_row for a type code known only when it runs (deq_rows: embedding lookups)."""
    if code == F16:
        _deq_f16(w, o0, buf, qk)
    elif code == Q8_0:
        _deq_q8_0(w, o0, buf, qk)
    elif code == Q4_K:
        _deq_q4_k(w, o0, buf, qk)
    elif code == Q6_K:
        _deq_q6_k(w, o0, buf, qk)
    elif code == Q5_K:
        _deq_q5_k(w, o0, buf, qk)
    elif code == Q3_K:
        _deq_q3_k(w, o0, buf, qk)
    elif code == Q2_K:
        _deq_q2_k(w, o0, buf, qk)
    elif code == IQ4_NL:
        _deq_iq4_nl(w, o0, buf, qk)
    elif code == IQ4_XS:
        _deq_iq4_xs(w, o0, buf, qk)
    else:
        _deq_q4_0(w, o0, buf, qk)


def deq_row(code, w, o0, buf, qk):
    """Dequantise the row at byte o0 of flat bytes w (type `code`) into buf float32 [cols] (in numba code: the
    overload below; from Python, deq_rows)."""
    raise TypeError("gemm.deq_row runs inside numba code only; from Python use gemm.deq_rows")


@overload(deq_row, prefer_literal=True)
def _deq_row_typed(code, w, o0, buf, qk):
    """A literal type code (deq_matmul, deq_dots: one copy a type) takes that type's dequantiser only."""
    if isinstance(code, types.IntegerLiteral):
        deq = _DEQ[code.literal_value]
        return lambda code, w, o0, buf, qk: deq(w, o0, buf, qk)
    return lambda code, w, o0, buf, qk: _deq_any(code, w, o0, buf, qk)


def _tile_gen(NV: int, L: int = 8):
    """Codegen: C[MR, L NV] += A[:MR, :n] B[c0:c0 + n, :L NV]: MR rows of a dequantised panel (A, row-major)
    times L NV tokens of packed blocks. L = 8 (ymm): B one block [cols, NT], C [MR, NT], vector j its tokens 8 j ..;
    L = 16 (zmm): B blocks [NV, cols, NT] and C [NV, MR, NT], vector j block j. Each column loads the tokens' NV
    vectors once and broadcasts each row's weight: MR NV FMAs (12 at NV = 2) from NV vector loads and MR broadcasts,
    the accumulators in 12 registers; no horizontal sums. A lane's FMAs are the same in order at either width: the
    same bits."""
    VT = ir.VectorType(ir.FloatType(), L)

    def gen(context, builder, sig, args):
        a, b, c = (cgutils.create_struct_proxy(sig.args[i])(context, builder, value=args[i]) for i in (0, 1, 4))
        c0, n = args[2], args[3]
        i64 = lambda v: ir.Constant(_I64, v)  # noqa: E731
        lda = cgutils.unpack_tuple(builder, a.shape, 2)[1]
        i8 = ir.IntType(8).as_pointer()
        b8, c8 = builder.bitcast(b.data, i8), builder.bitcast(c.data, i8)
        # bytes from one block to the next (zmm: the arrays' first stride), else from one vector to the next
        b_blk, c_blk = ((cgutils.unpack_tuple(builder, x.strides, 3)[0] for x in (b, c)) if L == 16
                        else (i64(32), i64(32)))
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VT, [VT] * 3), f"llvm.fma.v{L}f32")
        splat = ir.Constant(ir.VectorType(_I32, L), [0] * L)

        def cp(i, j):  # tokens L j .. of row i of C
            at = builder.add(builder.mul(c_blk, i64(j)), i64(4 * i * NT))
            return builder.bitcast(builder.gep(c8, [at]), VT.as_pointer())
        acc = [[cgutils.alloca_once_value(builder, builder.load(cp(i, j), align=4)) for j in range(NV)]
               for i in range(MR)]
        arow = [builder.gep(a.data, [builder.mul(lda, i64(i))]) for i in range(MR)]
        with cgutils.for_range(builder, n) as loop:
            k = loop.index
            col = builder.mul(builder.add(c0, k), i64(4 * NT))
            bv = [builder.load(builder.bitcast(builder.gep(b8, [builder.add(col, builder.mul(b_blk, i64(j)))]),
                                               VT.as_pointer()), align=4) for j in range(NV)]
            for i in range(MR):
                v = builder.insert_element(ir.Constant(VT, ir.Undefined), builder.load(builder.gep(arow[i], [k])),
                                           ir.Constant(_I32, 0))
                v = builder.shuffle_vector(v, v, splat)
                for j in range(NV):
                    builder.store(builder.call(fma, [v, bv[j], builder.load(acc[i][j])]), acc[i][j])
        for i in range(MR):
            for j in range(NV):
                builder.store(builder.load(acc[i][j]), cp(i, j), align=4)
        return context.get_dummy_value()
    return gen


@intrinsic
def _ztile32(typingctx, A, B, c0, n, C):
    """C[:2, MR, NT] += A[:, :n] B[:2, c0:c0 + n] (32 tokens: two blocks, zmm)."""
    return types.none(A, B, c0, n, C), _tile_gen(2, 16)


@intrinsic
def _tile16(typingctx, A, B, c0, n, C):
    """C[MR, 16] += A[:, :n] B[c0:c0 + n] (16 tokens)."""
    return types.none(A, B, c0, n, C), _tile_gen(2)


@intrinsic
def _tile8(typingctx, A, B, c0, n, C):
    """C[MR, :8] += A[:, :n] B[c0:c0 + n, :8] (a block's last 8 tokens or fewer)."""
    return types.none(A, B, c0, n, C), _tile_gen(1)


@njit(fastmath=True, cache=True)
def pack_into(P, b0, X):
    """X [m, cols] into the token panels P[b0:b0 + ceil(m / NT)] (pack_tokens' layout, zero-padded)."""
    m = X.shape[0]
    for kb in range((m + NT - 1) // NT):
        for c in range(X.shape[1]):
            for tt in range(NT):
                t = kb * NT + tt
                P[b0 + kb, c, tt] = X[t, c] if t < m else np.float32(0.0)


@njit(fastmath=True, cache=True)
def pack_tokens(X):
    """X [m, cols] -> the GEMM's token panels [ceil(m / NT), cols, NT] float32: NT tokens a block, a column's
    tokens side by side, zero-padded (packed once per matrix of tokens, read by every row panel)."""
    P = np.empty(((X.shape[0] + NT - 1) // NT, X.shape[1], NT), np.float32)
    pack_into(P, np.int64(0), X)
    return P


# bytes a block of each type code holds, and its columns (F16: one; Q8_0 / Q4_0 / IQ4_NL: 32; the K-quants, IQ4_XS: 256)
_BLOCK_BYTES = (0, 2, 34, 18, 144, 210, 176, 110, 84, 18, 136)
_BLOCK_VALUES = (1, 1, 32, 32, 256, 256, 256, 256, 256, 32, 256)


@njit(fastmath=True, inline="always")
def _col_bytes(code, c0):
    """Byte offset of column c0 (a block boundary) within a row of type `code`."""
    return c0 // _BLOCK_VALUES[code] * _BLOCK_BYTES[code]


def _deq_matmul(wide: bool):
    """deq_matmul with its 32-token zmm tile (wide) or without: one body, the tiles chosen here."""
    @njit(fastmath=True, inline="always")
    def deq_matmul(code, w, r0, r1, rb, P, m, res, off):
        _deq_matmul_body(code, w, r0, r1, rb, P, m, res, off, wide)
    return deq_matmul


@njit(fastmath=True, inline="always")
def _deq_matmul_body(code, w, r0, r1, rb, P, m, res, off, wide):
    """res[k, off + r - r0] = row_r . token k for rows [r0, r1) of flat bytes w (row stride rb) and the m tokens
    packed in P (pack_tokens); each weight is dequantised once.

    The loop order of a BLIS GEMM (Van Zee & van de Geijn, "BLIS: A Framework for Rapidly Instantiating BLAS
    Functionality", 2015): KC columns at a time (the tokens' slice, KC x m floats, stays in L2), MR rows
    dequantised into a panel (L1), every token block through a register tile; the tiles' sums carry over from
    one KC slice to the next in C. One core, an expert's matrix in cache, 48-256 tokens (benchmarks/
    bench_gemm.py): 73-83 GFLOP/s where a 4-row x 3-token block of dot products (each row against each
    token, summed across lanes at the end) ran 59-64, of a 97 GFLOP/s FMA peak."""
    cols = P.shape[1]
    qk = _U(cols // (cols // 32))  # 32, but opaque to LLVM (a constant trip count unrolls into gathers)
    nkb = P.shape[0]
    npn = (r1 - r0 + MR - 1) // MR
    A = np.empty((MR, KC), np.float32)
    C = np.zeros((npn, nkb, MR, NT), np.float32)
    for c0 in range(0, cols, KC):
        kc = min(KC, cols - c0)
        cb = _U(_col_bytes(code, c0))
        for p in range(npn):
            r = r0 + p * MR
            nr = min(MR, r1 - r)
            for i in range(nr):
                deq_row(code, w, _U(r + i) * _U(rb) + cb, A[i, :kc], qk)
            for i in range(nr, MR):  # a short last panel: zero rows, results dropped below
                A[i, :] = 0.0
            kb = 0
            while kb < nkb:  # 16-token tiles, a last 1-8 tokens in 8; with ZMM 32-token tiles first
                if wide and m - kb * NT > NT:
                    _ztile32(A, P[kb:kb + 2], c0, kc, C[p, kb:kb + 2])
                    kb += 2
                    continue
                if m - kb * NT > 8:
                    _tile16(A, P[kb], c0, kc, C[p, kb])
                else:
                    _tile8(A, P[kb], c0, kc, C[p, kb])
                kb += 1
    for p in range(npn):  # a token's MR results side by side (a token per row of res: one line, not MR)
        nr = min(MR, r1 - r0 - p * MR)
        for k in range(m):
            for i in range(nr):
                res[k, off + p * MR + i] = C[p, k // NT, i, k % NT]


deq_matmul = _deq_matmul(ZMM)
deq_matmul.__doc__ = _deq_matmul_body.__doc__


@njit(fastmath=True)
def _block4x3(w0, w1, w2, w3, x0, x1, x2, res, k, r):
    """res[k..k+2, r..r+3] = rows w0..w3 . tokens x0..x2 (twelve accumulators)."""
    s00 = s01 = s02 = s10 = s11 = s12 = np.float32(0.0)
    s20 = s21 = s22 = s30 = s31 = s32 = np.float32(0.0)
    for j in range(w0.shape[0]):
        a, b, c = x0[j], x1[j], x2[j]
        s00 += w0[j] * a
        s01 += w0[j] * b
        s02 += w0[j] * c
        s10 += w1[j] * a
        s11 += w1[j] * b
        s12 += w1[j] * c
        s20 += w2[j] * a
        s21 += w2[j] * b
        s22 += w2[j] * c
        s30 += w3[j] * a
        s31 += w3[j] * b
        s32 += w3[j] * c
    res[k, r], res[k + 1, r], res[k + 2, r] = s00, s01, s02
    res[k, r + 1], res[k + 1, r + 1], res[k + 2, r + 1] = s10, s11, s12
    res[k, r + 2], res[k + 1, r + 2], res[k + 2, r + 2] = s20, s21, s22
    res[k, r + 3], res[k + 1, r + 3], res[k + 2, r + 3] = s30, s31, s32


@njit(fastmath=True)
def _block4x1(w0, w1, w2, w3, x0, res, k, r):
    """res[k, r..r+3] = rows w0..w3 . token x0."""
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for j in range(w0.shape[0]):
        a = x0[j]
        s0 += w0[j] * a
        s1 += w1[j] * a
        s2 += w2[j] * a
        s3 += w3[j] * a
    res[k, r], res[k, r + 1], res[k, r + 2], res[k, r + 3] = s0, s1, s2, s3


@njit(fastmath=True, inline="always")
def deq_dots(code, w, r0, r1, rb, X, res, off):
    """res[k, off + r - r0] = row_r . X[k] for rows [r0, r1) of flat bytes w (row stride rb) and the m
    tokens of X [m, cols] (fewer than GEMM_TOKENS): rows dequantised four at a time, each against the tokens
    in 4-row x 3-token blocks of dot products (no packing; deq_matmul's 16-token tiles would idle lanes)."""
    m, cols = X.shape
    qk = _U(cols // (cols // 32))  # 32, but opaque to LLVM (a constant trip count unrolls into gathers)
    buf = np.empty((4, cols), np.float32)
    out = np.empty((m, 4), np.float32)
    r = r0
    while r < r1:
        nr = min(4, r1 - r)
        for i in range(nr):
            deq_row(code, w, _U(r + i) * _U(rb), buf[i], qk)
        for i in range(nr, 4):  # a short last group: zero rows, results dropped below
            buf[i, :] = 0.0
        k = np.int64(0)
        while k + 3 <= m:
            _block4x3(buf[0], buf[1], buf[2], buf[3], X[k], X[k + 1], X[k + 2], out, k, np.int64(0))
            k += 3
        while k < m:
            _block4x1(buf[0], buf[1], buf[2], buf[3], X[k], out, k, 0)
            k += 1
        for kk in range(m):
            for i in range(nr):
                res[kk, off + r - r0 + i] = out[kk, i]
        r += nr


@njit(fastmath=True, cache=True)
def deq_rows(code, rows_bytes, out):
    """out [n, cols] float32 = the n quantised rows rows_bytes [n, row bytes] (an embedding lookup)."""
    qk = _U(out.shape[1] // (out.shape[1] // 32))
    for i in range(out.shape[0]):
        deq_row(code, rows_bytes[i], _U(0), out[i], qk)
