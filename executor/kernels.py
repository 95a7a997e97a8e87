"""Numba CPU matrix kernels reading F16 / Q8_0 / Q4_0 weights in place from the mmap (the routed
SwiGLU experts built on them are in cpu_experts.py).

Weights are uint8 views of the file mapping (no copies). One-token products use the AVX2 row
intrinsics of simd.py (Q8_0 / Q4_0 with int16 activations, F16 with float32 ones; Q4_0 with AVX-512
VNNI those of vnni.py, the same results); more than
_FUSED tokens per expert dequantise each row once (gemm.py: dot blocks, from GEMM_TOKENS a packed
register-tile GEMM in few large items). The K-quants of llama.cpp's Q2_K .. Q5_K_M files (Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K) have kernels of their own (kquants.py, int16 activations too), as have the codebook types
of its IQ4_NL / IQ4_XS files (iquants.py). Kernels release the GIL (nogil) and split rows across threads (prange);
little work runs serially. Type codes: 1 = F16, 2 = Q8_0, 3 = Q4_0, 4 = Q4_K, 5 = Q6_K, 6 = Q5_K (Q5_K_M files: Q5_K
with Q6_K), 7 = Q3_K, 8 = Q2_K (Q3_K_M and Q2_K files), 9 = IQ4_NL, 10 = IQ4_XS.
"""
from __future__ import annotations

import time

import numba
import numpy as np
from numba import njit, prange

from .gemm import (F16, GEMM_TOKENS, IQ4_NL, IQ4_XS, MR, NT, Q2_K, Q3_K, Q4_0, Q4_K, Q5_K, Q6_K,  # noqa: F401
                   Q8_0, deq_dots, deq_matmul, pack_tokens)  # (the type codes are re-exported)
from .iquants import (rows1_iq4_nl, rows1_iq4_xs, rows2_iq4_nl, rows2_iq4_xs, rows2x4_iq4_nl, rows2x4_iq4_xs,
                      rows4x2_iq4_nl, rows4x2_iq4_xs)
from .kquants import (rows1_q2_k, rows1_q3_k, rows1_q4_k, rows1_q5_k, rows1_q6_k, rows2_q2_k, rows2_q3_k, rows2_q4_k,
                      rows2_q5_k, rows2_q6_k, rows2x4_q2_k, rows2x4_q3_k, rows2x4_q4_k, rows2x4_q5_k, rows2x4_q6_k,
                      rows4x2_q2_k, rows4x2_q3_k, rows4x2_q4_k, rows4x2_q5_k, rows4x2_q6_k)
from .nbcache import drop_stale_cache
from . import simd
from .simd import quant16, rows1_f16, rows1_q8, rows2_q8, rows4_f16, rows4x2_q8
from .vnni import HAVE_VNNI512, SPLIT_FLOATS, split8, vnni_kernel

drop_stale_cache("kernels", ("simd.py", "gemm.py", "kquants.py", "iquants.py", "vnni.py"))

# Q4_0 rows: with AVX-512 VNNI two rows a 512-bit register (vnni.py: one core in L2 1.15-1.19x simd.py's 256-bit
# loop, from DRAM on 2 threads 1.05-1.10x; the same integer sums and float ops, so the same results bit for bit),
# else simd.py's
if HAVE_VNNI512:
    rows8_q4, rows4_q4, rows1_q4, rows4x2_q4, rows8x4_q4 = (vnni_kernel(n, t) for n, t in
                                                            ((8, 1), (4, 1), (1, 1), (4, 2), (8, 4)))
else:
    rows8_q4, rows4_q4, rows1_q4, rows4x2_q4, rows8x4_q4 = (simd.rows8_q4, simd.rows4_q4, simd.rows1_q4,
                                                            simd.rows4x2_q4, simd.rows8x4_q4)



def prange_only() -> dict:
    """njit's `parallel` option for kernels whose only parallel loop is a prange. parallel=True also turns
    the array expressions around it (np.zeros, out += a, a == t) into parallel regions of their own,
    ~2 us each where one suffices: cpu_experts._moe paid four a decode layer, ~7 of its ~28 us on `tiny`.
    A new dict each call: numba's ParallelOptions consumes the dict it is given."""
    return dict(prange=True, comprehension=False, reduction=False, inplace_binop=False, setitem=False,
                numpy=False, stencil=False, fusion=False)

_ROWS = 32  # rows per parallel work item (16 -> 32: ~5% on Q4_0 expert GB/s, fewer item switches)
# Tokens per expert up to which each token gets fused in-place dots, by type code (-, F16, Q8_0, Q4_0, Q4_K, Q6_K, Q5_K,
# Q3_K, Q2_K, IQ4_NL, IQ4_XS);
# more dequantise each row once for a GEMM (gemm.deq_matmul). Dequantise-then-GEMM against the fused path, one core,
# an expert's rows in cache (bench_token_pairs.py --presets small small-q4, --presets small-q4k --parts gate down):
# - Q4_0, four tokens a row group (session 17, two runs): 1.23-1.26 at 16 tokens, 1.10-1.16 at 24, 1.07-1.13 at 32;
# - Q8_0, token pairs (four-token groups of 8 rows were only 1.06x pairs in cache, and `small` pp64 0.91x in one
#   noisy end-to-end A/B, so not kept): 1.04-1.28 at 16, 0.94-1.25 at 24;
# - F16, one token at a time: 1.18-1.26 at 8-16 tokens (`tiny`);
# - the K-quants, whose rows dequantise faster than their dots run (kquants.deq_q*_k_row), four tokens a 2-row
#   group: Q4_K 1.07 / 0.93 at 12 tokens (two runs), 0.81-0.90 at 16; Q6_K 1.04 at 6, 0.99-1.00 at 8 (pairs only: 10 and
#   4 tokens); Q5_K (session 28, `--presets small-q5k`, its rows dequantised at 6.0 G weights/s, Q4_K's 6.5): 1.29 at
#   4, 0.99 at 6, 0.84 at 8, 0.66 at 12; Q3_K (`--presets small-q3k`, rows dequantised at 6.1): 1.42 at 4, 1.03 at 6,
#   1.07 at 8, 0.86 at 12; Q2_K (`--presets small-q2k`, rows dequantised at 5.0): 1.03 at 4, 0.73 at 6, 0.67 at 8;
#   IQ4_NL (session 29, `--presets small-iq4nl`, gate / down, rows dequantised at 5.0-5.6): 1.53 / 1.39 at 4, 1.09 / 1.20
#   at 6, 1.18 / 1.12 at 8, 0.94 / 0.91 at 12; IQ4_XS (`small-iq4xs`, 5.0-5.4): 1.46 / 1.42 at 4, 0.97 / 0.88 at 6,
#   0.88 / 1.26 at 8, 0.77 / 0.86 at 12.
# These ratios are against the 4 x 3 dot blocks (gemm.deq_dots), which still run above _FUSED up to gemm.GEMM_TOKENS.
# Session 18's packed GEMM in their place would have moved no crossover, two runs: Q8_0 1.30-1.32 at 12, 0.88-0.97
# at 16; Q4_0 1.14-1.17 at 16, 0.99-1.15 at 24, 0.93-1.01 at 32; Q4_K 0.88-1.14 at 12; Q6_K 1.47-1.50 at 6, 0.59-0.93
# at 8; it wins where an expert has many tokens and its packed tokens are reused (prefill, from GEMM_TOKENS).
_FUSED = (0, 16, 16, 32, 12, 6, 6, 8, 4, 8, 4)


@njit(fastmath=True, inline="always")
def _rows2_k(code, w, o, rb, X16, DX, k, nb, res, ro):
    """res[k, ro:ro + 2] for the two K-quant / IQ4 rows at byte o (kquants.py, iquants.py)."""
    if code == Q4_K:
        rows2_q4_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q5_K:
        rows2_q5_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q3_K:
        rows2_q3_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q2_K:
        rows2_q2_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == IQ4_NL:
        rows2_iq4_nl(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == IQ4_XS:
        rows2_iq4_xs(w, o, rb, X16, DX, k, nb, res, ro)
    else:
        rows2_q6_k(w, o, rb, X16, DX, k, nb, res, ro)


@njit(fastmath=True, inline="always")
def _rows1_k(code, w, o, rb, X16, DX, k, nb, res, ro):
    """res[k, ro] for the K-quant / IQ4 row at byte o."""
    if code == Q4_K:
        rows1_q4_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q5_K:
        rows1_q5_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q3_K:
        rows1_q3_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q2_K:
        rows1_q2_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == IQ4_NL:
        rows1_iq4_nl(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == IQ4_XS:
        rows1_iq4_xs(w, o, rb, X16, DX, k, nb, res, ro)
    else:
        rows1_q6_k(w, o, rb, X16, DX, k, nb, res, ro)


@njit(fastmath=True, inline="always")
def _rows4x2(code, w, o, rb, X16, DX, k, nb, res, ro):
    """res[k:k + 2, ro:ro + 4] for four rows at byte o and tokens k, k + 1 (each row decoded once)."""
    if code == Q8_0:
        rows4x2_q8(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q4_0:
        rows4x2_q4(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q4_K:
        rows4x2_q4_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q5_K:
        rows4x2_q5_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q3_K:
        rows4x2_q3_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q2_K:
        rows4x2_q2_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == IQ4_NL:
        rows4x2_iq4_nl(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == IQ4_XS:
        rows4x2_iq4_xs(w, o, rb, X16, DX, k, nb, res, ro)
    else:
        rows4x2_q6_k(w, o, rb, X16, DX, k, nb, res, ro)


@njit(fastmath=True, inline="always")
def _rows2x4_k(code, w, o, rb, X16, DX, k, nb, res, ro):
    """res[k:k + 4, ro:ro + 2] for two K-quant / IQ4 rows at byte o and tokens k .. k + 3."""
    if code == Q4_K:
        rows2x4_q4_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q5_K:
        rows2x4_q5_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q3_K:
        rows2x4_q3_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == Q2_K:
        rows2x4_q2_k(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == IQ4_NL:
        rows2x4_iq4_nl(w, o, rb, X16, DX, k, nb, res, ro)
    elif code == IQ4_XS:
        rows2x4_iq4_xs(w, o, rb, X16, DX, k, nb, res, ro)
    else:
        rows2x4_q6_k(w, o, rb, X16, DX, k, nb, res, ro)


@njit(fastmath=True)
def _rows_token(code, w, r0, r1, rb, X16, DX, k, res, off):
    """res[k, off + r - r0] = row_r . token k for rows [r0, r1) of flat Q8_0 / Q4_0 / Q4_K / Q6_K bytes w (row
    stride rb), the token's int16 activations X16[k] * DX[k] (simd.py / kquants.py intrinsics, 8, 4 or 2 rows
    at a time).

    Q8_0 runs 2 rows a pass: from DRAM, on 2 threads, 1.28-1.35x its 8-row rate at 1024- to 4096-wide rows
    (bench_q8_rows.py: 91% of the read against 68% at 2048), and no slower in cache; Q4_0, whose arithmetic
    per byte is twice Q8_0's, keeps 8 (2 rows 0.80-0.85x, 4 rows 0.96-1.02x). The K-quants run 2 rows a pass
    too: never slower than 4 in any run here, faster while the machine runs slow (bench_q8_rows.py --fmt
    Q4_K|Q6_K: from DRAM Q4_K 1.00-1.05x, Q6_K 1.02-1.20x; --l2, one core, 1.00-1.13x)."""
    nb = np.int64(X16.shape[1] // 32)
    r = r0
    if code >= Q4_K:  # K-quants and IQ4s: 2-row groups, then single rows
        while r + 2 <= r1:
            _rows2_k(code, w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(off + r - r0))
            r += 2
        while r < r1:
            _rows1_k(code, w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(off + r - r0))
            r += 1
    elif code == Q8_0:
        while r + 2 <= r1:
            rows2_q8(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(off + r - r0))
            r += 2
        while r < r1:
            rows1_q8(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(off + r - r0))
            r += 1
    else:
        while r + 8 <= r1:
            rows8_q4(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(off + r - r0))
            r += 8
        while r + 4 <= r1:
            rows4_q4(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(off + r - r0))
            r += 4
        while r < r1:
            rows1_q4(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(off + r - r0))
            r += 1


@njit(fastmath=True)
def _rows_pair(code, w, r0, r1, rb, X16, DX, k, res, off):
    """_rows_token for tokens k and k + 1 at once: 4-row groups decoded once for both (the same products
    and float adds per row and token, so the same bits), the last r % 4 rows per token."""
    nb = np.int64(X16.shape[1] // 32)
    r = r0
    while r + 4 <= r1:
        _rows4x2(code, w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(off + r - r0))
        r += 4
    if r < r1:
        _rows_token(code, w, r, r1, rb, X16, DX, k, res, off + r - r0)
        _rows_token(code, w, r, r1, rb, X16, DX, k + 1, res, off + r - r0)


@njit(fastmath=True)
def _rows_quad(code, w, r0, r1, rb, X16, DX, k, res, off):
    """_rows_token for tokens k .. k + 3 of Q4_0 / Q4_K / Q6_K rows at once: each row group decoded once for all four
    (the same products and float adds per row and token, so the same bits), 8-row groups for Q4_0, 2-row ones for
    the K-quants; the last rows as two pairs. An expert's rows in cache, one core, four tokens against two pairs
    (bench_token_pairs.py): Q4_0 1.18x, Q4_K 1.13x, Q6_K 1.20x (Q8_0 stays in pairs: _FUSED)."""
    nb = np.int64(X16.shape[1] // 32)
    g = 8 if code == Q4_0 else 2
    r = r0
    while r + g <= r1:
        if code == Q4_0:
            rows8x4_q4(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(off + r - r0))
        else:
            _rows2x4_k(code, w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(off + r - r0))
        r += g
    if r < r1:
        _rows_pair(code, w, r, r1, rb, X16, DX, k, res, off + r - r0)
        _rows_pair(code, w, r, r1, rb, X16, DX, k + 2, res, off + r - r0)


@njit(fastmath=True)
def _rows_fused(code, w, r0, r1, rb, X16, DX, res, off):
    """res[k, off + r - r0] = row_r . token k for every token of X16 / DX (int16 activations) and rows [r0, r1) of
    Q8_0 / Q4_0 / Q4_K / Q6_K bytes w: tokens four at a time (not Q8_0), then in pairs, then one."""
    m = X16.shape[0]
    k = np.int64(0)  # not a literal 0: one compiled specialisation of the row kernels below, not two
    while k + 4 <= m and code != Q8_0:
        _rows_quad(code, w, r0, r1, rb, X16, DX, k, res, off)
        k += 4
    while k + 2 <= m:
        _rows_pair(code, w, r0, r1, rb, X16, DX, k, res, off)
        k += 2
    if k < m:
        _rows_token(code, w, r0, r1, rb, X16, DX, k, res, off)


@njit(fastmath=True)
def _rows_matmul(code, w, r0, r1, rb, X, X16, DX, P, res, off):
    """res[k, off + r - r0] = row_r . X[k] for the m rows of X [m, cols]: fused in-place dots up to _FUSED[code]
    tokens (Q8_0 / Q4_0 / Q4_K / Q6_K: int16 activations X16 * DX, tokens in fours and pairs: _rows_fused;
    F16: float32 X), the weight rows staying in L1/L2; else the rows are dequantised once and multiplied with
    the tokens' packed panels P (`panels`; prefill: gemm.deq_matmul; under GEMM_TOKENS gemm.deq_dots on X)."""
    m = X.shape[0]
    if gemm_path(m, code):
        deq_matmul(code, w, r0, r1, rb, P, m, res, off)
    elif m > _FUSED[code]:
        deq_dots(code, w, r0, r1, rb, X, res, off)
    elif code == F16:
        nc = np.int64(X.shape[1] // 16)
        for k in range(m):
            r = r0
            while r + 4 <= r1:
                rows4_f16(w, np.int64(r * rb), np.int64(rb), X[k], DX[k], nc, res[k], np.int64(off + r - r0))
                r += 4
            while r < r1:
                rows1_f16(w, np.int64(r * rb), np.int64(rb), X[k], DX[k], nc, res[k], np.int64(off + r - r0))
                r += 1
    else:
        _rows_fused(code, w, r0, r1, rb, X16, DX, res, off)


@njit(fastmath=True, cache=True)
def _quant_rows(x):
    """int16 activations of x [T, C]: (x16 [T, C], dx [T, 2 C/32], with AVX-512 VNNI [T, (2 + 32) C/32]: the
    split bytes of the VNNI Q4_0 rows behind the scales and sums) (layouts: simd.quant16, vnni.split8)."""
    T, C = x.shape
    nb = C // 32
    x16 = np.empty((T, C), np.int16)
    dx = np.empty((T, (2 + SPLIT_FLOATS * HAVE_VNNI512) * nb), np.float32)
    for t in range(T):
        quant16(x[t], x16[t], dx[t])
        if HAVE_VNNI512:
            split8(x16[t], dx[t], nb)
    return x16, dx


@njit(fastmath=True, cache=True)
def panels(x, gemm):
    """The GEMM's packed token panels of x [T, C] (gemm.pack_tokens) where a product takes the GEMM path
    (gemm: gemm_path), else none ([0, C, NT])."""
    if gemm:
        return pack_tokens(x)
    return np.zeros((0, x.shape[1], NT), np.float32)


@njit(fastmath=True, inline="always")
def gemm_path(T, code):
    """Whether T tokens through a matrix of type `code` take gemm.deq_matmul (packed panels, few large items)."""
    return T >= GEMM_TOKENS and T > _FUSED[code]


_GEMM_ITEMS = 16  # a dense matrix's items on the GEMM path: two a thread up to 8 threads (a constant: numba cannot
# cache a kernel that asks for its thread count)


@njit(fastmath=True, inline="always")
def item_rows(gemm, R, items):
    """Rows per parallel work item of an R-row matrix: _ROWS; on the GEMM path R / items in whole 6-row panels.
    Every GEMM item streams all the tokens' panels once (a KC slice of them stays in L2 while the item's
    panels pass), so few large items: at pp512 on `small`, 24-row items re-read an expert's 1 MB of panels
    32 times a matrix (2 GB a layer, more than L3 holds) and ran no faster than the dot products."""
    return MR * (-(-R // (items * MR))) if gemm else _ROWS


@njit(fastmath=True, cache=True)
def _chunk_off(wd, code, R, x, x16, dx, P, n, it, out, off):
    """Rows [it * n, (it + 1) * n) of W (R rows) into columns off + r of out [T, *] = x W^T, in
    place (a scratch block per item and its copy cost ~30% of a short-row product: `tiny`'s head)."""
    r0 = it * n
    _rows_matmul(code, wd, r0, min(R, r0 + n), wd.shape[0] // R, x, x16, dx, P, out, off + r0)


@njit(parallel=prange_only(), nogil=True, fastmath=True, cache=True)
def _matmul(wd, code, R, x, out):
    """out[t, r] = W[r] . x[t] for one matrix (flat bytes wd, in place), rows across threads."""
    x16, dx = _quant_rows(x)
    gemm = gemm_path(x.shape[0], code)
    P = panels(x, gemm)
    n = item_rows(gemm, R, _GEMM_ITEMS)
    for it in prange((R + n - 1) // n):
        _chunk_off(wd, code, R, x, x16, dx, P, n, np.int64(it), out, np.int64(0))


@njit(nogil=True, fastmath=True, cache=True)
def _matmul_serial(wd, code, R, x, out):
    """_matmul on the calling thread (small matrices: a parallel region costs more than it saves)."""
    x16, dx = _quant_rows(x)
    _rows_matmul(code, wd, np.int64(0), R, wd.shape[0] // R, x, x16, dx, panels(x, gemm_path(x.shape[0], code)), out, np.int64(0))


_SERIAL_BYTES = 1 << 20  # weight bytes x tokens below which _matmul_serial is used
# The same where nothing else computes on these cores between a layer's kernels (the CPU step; an
# attention block). A parallel region costs ~2 us while the kernel threads still spin from the last
# one, 43-46 us once they sleep (after ~100 us idle: GOMP_SPINCOUNT, executor/__init__.py;
# bench_executor.py prints both): small products in regions of their own keep them spinning. 1 MB ->
# 128 KB on all-CPU decode, three alternating rounds, quiet: `tiny` 1,342-1,532 -> 1,941-2,595 tok/s,
# the llama-bench fixture's shape 414-455 -> 485-780, `small` unchanged (its products are larger);
# beside a busy process `tiny` 613-858 -> 1,568-2,085, the fixture 170-219 -> 150-167. Beside torch
# on the same cores (a CPU device's cache plans) the 1 MB threshold stays: there a parallel job of
# small experts races torch's threads for the two cores.
SERIAL_BYTES_HOT = 128 << 10


def flat(w) -> np.ndarray:
    """ExpertTensor bytes as a flat [E, rows * row_bytes] uint8 view (no copy)."""
    return w.data.reshape(w.data.shape[0], -1)


def expert_matmul(w, e: int, x: np.ndarray) -> np.ndarray:
    """W_e x for ExpertTensor `w`, expert `e`, x [T, cols] f32 -> [T, rows] f32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], w.rows), np.float32)
    _matmul(flat(w)[int(e)], w.code, w.rows, x, out)
    return out


def linear(flat_w: np.ndarray, code: int, rows: int, x: np.ndarray) -> np.ndarray:
    """x [T, cols] f32 times a 2-D weight read in place (flat bytes, type code) -> [T, rows] f32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], rows), np.float32)
    (_matmul_serial if flat_w.nbytes * x.shape[0] < _SERIAL_BYTES else _matmul)(flat_w, code, rows, x, out)
    return out


@njit(fastmath=True, cache=True)
def _parts_item(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, x16, dx, P, n, it, out):
    """Work item `it` over the n-row chunks of up to three stacked matrices (R = 0: absent)."""
    n0 = (R0 + n - 1) // n
    n1 = (R1 + n - 1) // n
    if it < n0:
        _chunk_off(w0, c0, R0, x, x16, dx, P, n, it, out, np.int64(0))
    elif it < n0 + n1:
        _chunk_off(w1, c1, R1, x, x16, dx, P, n, it - n0, out, R0)
    else:
        _chunk_off(w2, c2, R2, x, x16, dx, P, n, it - n0 - n1, out, R0 + R1)


@njit(fastmath=True, cache=True)
def _token_item(w, code, R, x, x16, dx, P, it, out, off):
    """_chunk_off for one token: rows [it * _ROWS, (it + 1) * _ROWS) of W straight into the row kernels
    (_rows_token, the call _rows_fused makes for one token, so the same bits) with the chunk a constant."""
    r0 = it * _ROWS
    r1 = min(R, r0 + _ROWS)
    if code == F16:
        _rows_matmul(code, w, r0, r1, w.shape[0] // R, x, x16, dx, P, out, off + r0)
    else:
        _rows_token(code, w, r0, r1, w.shape[0] // R, x16, dx, np.int64(0), out, off + r0)


@njit(fastmath=True, cache=True)
def _parts_gemm(T, c0, c1, R1, c2, R2):
    """Whether any of the stacked matrices takes the GEMM path for T tokens."""
    return gemm_path(T, c0) or (R1 > 0 and gemm_path(T, c1)) or (R2 > 0 and gemm_path(T, c2))


@njit(parallel=prange_only(), nogil=True, fastmath=True, cache=True)
def _parts(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, out):
    """out [T, R0 + R1 + R2] = x [W0; W1; W2]^T: one activation quantisation, rows across threads."""
    x16, dx = _quant_rows(x)
    gemm = _parts_gemm(x.shape[0], c0, c1, R1, c2, R2)
    P = panels(x, gemm)
    if x.shape[0] == 1:  # decode: items straight into the row kernels (_token_item), the chunk a constant:
        # the llama-bench fixture's 17 MB Q8_0 head 1.05-1.07x against the general items below (paired rounds),
        # its all-CPU decode 1.05x / 1.11x (alternating processes); `small` and `tiny` within noise
        n0, n1 = (R0 + _ROWS - 1) // _ROWS, (R1 + _ROWS - 1) // _ROWS
        for it in prange(n0 + n1 + (R2 + _ROWS - 1) // _ROWS):
            if it < n0:
                _token_item(w0, c0, R0, x, x16, dx, P, np.int64(it), out, np.int64(0))
            elif it < n0 + n1:
                _token_item(w1, c1, R1, x, x16, dx, P, np.int64(it - n0), out, R0)
            else:
                _token_item(w2, c2, R2, x, x16, dx, P, np.int64(it - n0 - n1), out, R0 + R1)
        return
    n = item_rows(gemm, R0 + R1 + R2, _GEMM_ITEMS)
    items = (R0 + n - 1) // n + (R1 + n - 1) // n + (R2 + n - 1) // n
    for it in prange(items):
        _parts_item(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, x16, dx, P, n, np.int64(it), out)


@njit(nogil=True, fastmath=True, cache=True)
def _parts_serial(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, out):
    """_parts on the calling thread, each matrix in one call (no row chunks: their calls cost ~30% of a
    short-row product, `tiny`'s)."""
    x16, dx = _quant_rows(x)
    P = panels(x, _parts_gemm(x.shape[0], c0, c1, R1, c2, R2))
    if R0:
        _rows_matmul(c0, w0, np.int64(0), R0, w0.shape[0] // R0, x, x16, dx, P, out, np.int64(0))
    if R1:
        _rows_matmul(c1, w1, np.int64(0), R1, w1.shape[0] // R1, x, x16, dx, P, out, R0)
    if R2:
        _rows_matmul(c2, w2, np.int64(0), R2, w2.shape[0] // R2, x, x16, dx, P, out, R0 + R1)


def linear_parts(parts, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x [T, cols] f32 times 1..3 stacked weights read in place, parts [(flat, code, rows, _)] -> [T, sum rows]
    in one kernel call (the activations are quantised once)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows = sum(p[2] for p in parts)
    if out is None:
        out = np.empty((x.shape[0], rows), np.float32)
    ps = list(parts) + [(parts[0][0][:0], parts[0][1], 0, None)] * (3 - len(parts))
    nbytes = sum(p[0].nbytes for p in parts)
    fn = _parts_serial if nbytes * x.shape[0] < _SERIAL_BYTES else _parts
    fn(ps[0][0], ps[0][1], ps[0][2], ps[1][0], ps[1][1], ps[1][2], ps[2][0], ps[2][1], ps[2][2], x, out)
    return out


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _sum_u64(a):
    s = np.uint64(0)
    for i in prange(a.shape[0]):
        s += a[i]
    return s


def read_bandwidth(nbytes: int = 1 << 30, repeat: int = 5, pool: np.ndarray | None = None) -> float:
    """Measured memory read bandwidth (GB/s, best of `repeat`) of a parallel numba sum over nbytes (or
    over `pool`, uint64, allocated once by a caller that reads often)."""
    a = np.ones(nbytes // 8, np.uint64) if pool is None else pool
    nbytes = a.nbytes
    _sum_u64(a[:1024])
    best = 0.0
    for _ in range(repeat):
        t = time.perf_counter()
        _sum_u64(a)
        best = max(best, nbytes / (time.perf_counter() - t) / 1e9)
    return best


def set_threads(n: int | None) -> None:
    """Use `n` CPU threads for the kernels (None: all)."""
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS) if n else numba.config.NUMBA_NUM_THREADS)
