"""Each weight type's row products, read in place: res[k, off + r - r0] = row_r . x_k for a row range of one
matrix and a few tokens, specialised per type code. The one-token rows of simd.py / kquants.py / iquants.py (AVX2
intrinsics, int16 activations; F16 with float32 ones) in groups of 8, 4, 2 or 1 rows, token pairs and fours decoded
once per row group, and above _FUSED tokens the rows dequantised once (gemm.py).

Every function here takes the type code as a compile-time constant (a literal): each type compiles its own copy,
holding its own kernels only, which kernel_table.py compiles once as a C function and the parallel drivers (kernels.py,
cpu_experts.py) call through a table. Before, every driver and each level between linked in and re-optimised the
kernels of all ten types (numba links a callee's whole module into its caller): a cold all-CPU and 4-stream run of
`tiny` (tests/conftest.py's cold run, an empty NUMBA_CACHE_DIR) took 129-131 s, 65-67 s through the table.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit
from numba.core import types
from numba.core.errors import TypingError
from numba.extending import overload

from .gemm import (F16, GEMM_TOKENS, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_0, Q4_K, Q5_K, Q6_K, Q8_0,
                   deq_dots, deq_matmul)
from .iquants import (KVALUES, rows1_iq4_nl, rows1_iq4_xs, rows2_iq4_nl, rows2_iq4_xs, rows2x4_iq4_nl, rows2x4_iq4_xs,
                      rows2x2_iq4_nl, rows2x2_iq4_xs)
from .kquants import (rows1_q2_k, rows1_q3_k, rows1_q4_k, rows1_q5_k, rows1_q6_k, rows2_q2_k, rows2_q3_k, rows2_q4_k,
                      rows2_q5_k, rows2_q6_k, rows2x4_q2_k, rows2x4_q3_k, rows2x4_q4_k, rows2x4_q5_k, rows2x4_q6_k,
                      rows2x2_q2_k, rows2x2_q3_k, rows2x2_q4_k, rows2x2_q5_k, rows2x2_q6_k)
from . import simd
from .simd import rows1_f16, rows1_q8, rows2_q8, rows4_f16, rows4x2_q8
from .kquants_vnni import k_vnni_kernel
from .qgemm import HAVE_QGEMM, INT8, gemm_matmul
from .vnni import HAVE_VNNI512, vnni_kernel

# Q4_0 rows: with AVX-512 VNNI two rows a 512-bit register (vnni.py: one core in L2 1.15-1.19x simd.py's 256-bit
# loop, from DRAM on 2 threads 1.05-1.10x; the same integer sums, the float ops but for the order of the offset term
# (vnni.py), so the same results to float rounding),
# else simd.py's
# An int8 build (`execute --gemm-int8`, llama.cpp's precision) gives these rows, and IQ4_NL's below, int8 activations
# (vnni.lanes8): one vpdpbusd a row pair and block, not two, a shift and an add. One core in L2, 1 / 2 / 4 tokens
# (session 38): Q4_0 33.3 / 19.3 / 12.0 -> 42.3 / 23.0 / 16.3 G weights/s, IQ4_NL 27.3 / 15.9 / 9.6 -> 34.5 / 22.3 /
# 15.1 (36.9 / 22.3 / 15.5 by vpermb); all-CPU decode against llama.cpp's repacked rows: README
ROWS_INT8 = INT8 and HAVE_VNNI512
if HAVE_VNNI512:
    rows8_q4, rows4_q4, rows2_q4, rows1_q4, rows8x2_q4, rows8x4_q4 = (vnni_kernel(n, t, int8=ROWS_INT8) for n, t in
                                                                      ((8, 1), (4, 1), (2, 1), (1, 1), (8, 2), (8, 4)))
    _Q4_PAIR = (8, rows8x2_q4)
else:
    rows8_q4, rows4_q4, rows1_q4, rows8x4_q4 = simd.rows8_q4, simd.rows4_q4, simd.rows1_q4, simd.rows8x4_q4
    _Q4_PAIR = (4, simd.rows4x2_q4)
# IQ4_NL rows: its blocks are Q4_0's with a codebook, so with AVX-512 VNNI they take vnni.py's rows with a lookup
# (vpshufb; the codebook's +128 bias off in the integer sums): one core in L2, a `small` expert matrix, 1 / 2 / 4 tokens
# 23.2 / 16.2 / 9.7 -> 27.3 / 15.9 / 9.4 G weights/s (session 37); from DRAM (226 MB, one core) both ~12 GB/s, the
# core's memory bound on this VM; else iquants.py's 256-bit rows
if HAVE_VNNI512:
    _IQ4NL_TOKEN = tuple((n, vnni_kernel(n, 1, KVALUES, ROWS_INT8)) for n in (2, 1))
    _IQ4NL_PAIR, _IQ4NL_QUAD = (8, vnni_kernel(8, 2, KVALUES, ROWS_INT8)), (8, vnni_kernel(8, 4, KVALUES, ROWS_INT8))
else:
    _IQ4NL_TOKEN, _IQ4NL_PAIR, _IQ4NL_QUAD = (((2, rows2_iq4_nl), (1, rows1_iq4_nl)), (2, rows2x2_iq4_nl),
                                              (2, rows2x4_iq4_nl))
# The K-quants' and IQ4_XS's rows in an int8 build: kquants_vnni.py's, on int8 activations (lanes8's), one vpdpbusd a
# 64-byte load of a row's values where kquants.py's int16 rows take four vpmaddwd. A `small` expert matrix, one core in
# L2, one token, int16 -> int8 (session 39, `python benchmarks/bench_int8_rows.py`, G weights/s): Q4_K 34.3 -> 43.1, Q6_K
# 25.7 -> 35.1, Q5_K 27.7 -> 33.8, Q3_K 25.2 -> 29.1, Q2_K 29.5 -> 37.1, IQ4_XS 23.2 -> 33.4; two and four tokens
# 1.01-1.53x, swinging from run to run; from DRAM, one token on two threads (`--dram`), Q4_K 23.5-26.7 -> 29.6-35.5
# GB/s, Q6_K 21.0 -> 24.8, Q5_K 31.6 -> 34.9, Q3_K 20.4 -> 23.9, Q2_K 18.5 -> 22.9, IQ4_XS 21.6 -> 25.5. Every kernel of
# a type in the build is int8, so that a token gets the same bits in any token group. One token, rows a pass: Q6_K's
# and Q5_K's one (from DRAM Q6_K 31.1-40.5 GB/s against 2 rows' 25.1-33.4 in three processes of a first loop, 24.8
# against 24.0 in the bench; Q5_K 34.9 against 33.2; even in L2)
if ROWS_INT8:
    def _k_rows(kind: str, one: int) -> tuple:
        """(one token's groups, two tokens' kernel, four tokens' group) of kind's int8 rows, `one` rows a pass."""
        return (((2, k_vnni_kernel(2, 1, kind)),) if one == 2 else ()) + ((1, k_vnni_kernel(1, 1, kind)),), \
            (2, k_vnni_kernel(2, 2, kind)), (2, k_vnni_kernel(2, 4, kind))
    _Q4K, _Q6K, _Q5K, _Q3K, _Q2K, _IQ4XS = (_k_rows(k, n) for k, n in (("q4_k", 2), ("q6_k", 1), ("q5_k", 1),
                                                                       ("q3_k", 2), ("q2_k", 2), ("iq4_xs", 2)))
else:
    _Q4K = ((2, rows2_q4_k), (1, rows1_q4_k)), (2, rows2x2_q4_k), (2, rows2x4_q4_k)
    _Q6K = ((2, rows2_q6_k), (1, rows1_q6_k)), (2, rows2x2_q6_k), (2, rows2x4_q6_k)
    _Q5K = ((2, rows2_q5_k), (1, rows1_q5_k)), (2, rows2x2_q5_k), (2, rows2x4_q5_k)
    _Q3K = ((2, rows2_q3_k), (1, rows1_q3_k)), (2, rows2x2_q3_k), (2, rows2x4_q3_k)
    _Q2K = ((2, rows2_q2_k), (1, rows1_q2_k)), (2, rows2x2_q2_k), (2, rows2x4_q2_k)
    _IQ4XS = ((2, rows2_iq4_xs), (1, rows1_iq4_xs)), (2, rows2x2_iq4_xs), (2, rows2x4_iq4_xs)

# Tokens per expert up to which each token gets fused in-place dots, by type code (-, F16, Q8_0, Q4_0, Q4_K, Q6_K, Q5_K,
# Q3_K, Q2_K, IQ4_NL, IQ4_XS); more take a GEMM. Without VNNI (_FUSED_FLOAT) that GEMM dequantises each row once
# (gemm.deq_matmul) and runs in float. Dequantise-then-GEMM against the fused path, one core,
# an expert's rows in cache (bench_token_pairs.py --presets small small-q4, --presets small-q4k --parts gate down):
# - Q4_0, four tokens a row group (session 17, two runs): 1.23-1.26 at 16 tokens, 1.10-1.16 at 24, 1.07-1.13 at 32;
# - Q8_0, token pairs (four-token groups of 8 rows were only 1.06x pairs in cache, and `small` pp64 0.91x in one
#   noisy end-to-end A/B, so not kept): 1.04-1.28 at 16, 0.94-1.25 at 24;
# - F16, one token at a time: 1.18-1.26 at 8-16 tokens (`tiny`);
# - the K-quants, whose rows dequantise faster than their dots run (kquant_blocks.deq_q*_k_row), four tokens a 2-row
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
_FUSED_FLOAT = (0, 16, 16, 32, 12, 6, 6, 8, 4, 8, 4)
# With the integer GEMM (qgemm.py, AVX-512 VNNI) it takes over from the fused rows at fewer tokens. One Zen 4 core, a
# `small`-sized expert matrix in cache, qgemm / fused (session 31, `python benchmarks/bench_qgemm.py`): at 4, 6, 8 tokens
# Q8_0 0.54 0.90 1.26, Q4_K 0.58 0.91 1.17, Q6_K 0.94 1.35 1.83, Q2_K 0.85 1.28 1.69, IQ4_XS 0.78 1.23 1.54; at 5, 6, 7
# (a first version) Q4_0 0.60 0.67 1.08, Q5_K 1.03 0.78 1.08, Q3_K 0.87 1.01 1.27, IQ4_NL 0.98 1.22 1.49; at 16 tokens
# 1.7-2.3. F16 keeps its 16.
# An int8 build's GEMM (q_matmul8) and its int8 rows run at other rates: the same bench run with
# MOE_OFFLOAD_GEMM_INT8=1 (session 39, `--tokens 3 4 5 6 7 8 10 12 --rounds 15`), qgemm / fused at 4 5 6 7 8 tokens:
# Q8_0 0.77 1.04 1.13 1.39 1.47, Q4_K 0.71 0.88-0.92 1.07-1.12 1.20-1.29 1.45, Q6_K 0.78 1.01-1.10 1.14-1.19 1.36-1.49
# 1.59, Q5_K 0.78 1.09 1.28 1.53 1.53, Q3_K 0.80 1.13 1.24 1.56 1.56, Q2_K 0.68 0.93 1.15 1.28 1.30, IQ4_NL 0.56
# 0.78-0.80 0.92-0.94 1.14 1.10, IQ4_XS 0.92 1.29 1.42 1.80 1.76; Q4_0 0.34 0.47-0.65 0.55-0.76 0.71-0.99 0.94, at 10
# and 12 0.98 and 1.10 (Q5_K's, Q3_K's and Q2_K's with their int16 fused rows, which their int8 ones, since, match at four
# tokens: 42.8 / 42.6 / 45.6 against 43.9 / 42.0 / 45.9 G token-weights/s)
_FUSED_INT8 = (0, 16, 4, 8, 5, 4, 4, 4, 5, 6, 4)
_FUSED = _FUSED_INT8 if ROWS_INT8 else (0, 16, 7, 6, 6, 5, 6, 5, 5, 5, 4) if HAVE_QGEMM else _FUSED_FLOAT


# Each type's row kernels (numba intrinsics: simd.py, kquants.py, iquants.py), chosen when a product is typed for a
# literal type code, so that a type's copy holds its own kernels only. One token: (rows a pass, kernel) from the
# largest group down to single rows; two tokens: (rows, kernel), a row group decoded once for both; four tokens: the
# same.
# Q4_0 and IQ4_NL on VNNI: 2 rows a pass, as Q8_0 (the same bits in any row group). Decode reads them from DRAM, where
# fewer streams read faster: 8 -> 4 rows on a Zen 4 (226 MB of rows, two threads, three processes, session 38) Q4_0 int16
# 21.5-22.8 -> 24.8-30.9 GB/s, int8 and IQ4_NL even; 4 -> 2 rows on a Zen 5 (session 54, `bench_q8_rows.py --fmt Q4_0`,
# 1 GiB of experts, 2 threads, per-round ratios to 8 rows: 4 rows 0.95-0.96x, 2 rows 1.11-1.12x, 43.1-45.8 GB/s, 92-97%
# of the read; in L2, one core, 2 rows 54.4 against 4 rows' 47.7 G weights/s). All-CPU decode, alternating with the
# tree before (`small-q4` tg32, 6 rounds): 156.8 -> 186.7 tok/s, the experts 34.4-38.3 -> 41.1-46.4 GB/s; `small-iq4nl`
# 150.0 -> 164.3; the int8 build's `small-q4` even (180.0 -> 182.6). Two tokens (several streams' decode) take them 8
# rows a pass: from DRAM, 2 threads (session 54, a scratch of bench_q8_rows' loop), against 4 rows 1.29x (int8 1.27x),
# IQ4_NL 1.18x (1.26x), 2 rows 0.86-0.93x; `small-q4` decode alternating with 4 rows, 4 rounds each: 2 streams 220.2
# -> 267.2 tok/s, 4 streams 316.0 -> 337.0. The K-quants' and IQ4s' pairs (kquants.py / iquants.py, kquants_vnni.py in
# an int8 build) run 2 rows a pass, as their single tokens, not 4: the same scratch, against 4 rows Q4_K 1.11x, Q5_K
# 1.12x, Q6_K 1.22x, Q3_K 1.02x, Q2_K and IQ4_XS 1.00x, int8 Q4_K 1.16x, Q6_K 1.11x; `small-q4k` 2 streams alternating,
# 6 rounds: 167.0 -> 189.8 tok/s
_TOKEN = {Q8_0: ((2, rows2_q8), (1, rows1_q8)),
          Q4_0: ((2, rows2_q4), (1, rows1_q4)) if HAVE_VNNI512 else ((8, rows8_q4), (4, rows4_q4), (1, rows1_q4)),
          Q4_K: _Q4K[0], Q6_K: _Q6K[0], Q5_K: _Q5K[0], Q3_K: _Q3K[0], Q2_K: _Q2K[0], IQ4_NL: _IQ4NL_TOKEN,
          IQ4_XS: _IQ4XS[0]}
_PAIR = {Q8_0: (4, rows4x2_q8), Q4_0: _Q4_PAIR, Q4_K: _Q4K[1], Q6_K: _Q6K[1], Q5_K: _Q5K[1], Q3_K: _Q3K[1], Q2_K: _Q2K[1],
         IQ4_NL: _IQ4NL_PAIR, IQ4_XS: _IQ4XS[1]}
_QUAD = {Q4_0: (8, rows8x4_q4), Q4_K: _Q4K[2], Q6_K: _Q6K[2], Q5_K: _Q5K[2], Q3_K: _Q3K[2], Q2_K: _Q2K[2],
         IQ4_NL: _IQ4NL_QUAD, IQ4_XS: _IQ4XS[2]}
# (Q8_0 stays in pairs: _FUSED; F16 has float32 rows of its own: rows_matmul)


def _literal(code) -> int:
    """The type code a product is being typed for (a numba literal; anything else is a typing error)."""
    if not isinstance(code, types.IntegerLiteral):
        raise TypingError(f"row products are typed per type code: a literal, not {code}")
    return code.literal_value


# The products below are typed per literal type code (numba overloads): each type's copy of each is one function of its
# own holding that type's kernels, compiled once a type. Each is called from one kind of caller only (rows_fused's
# one call, then the overloads' own calls), since numba compiles an overload again for callers compiled under other
# options: _token_rows twice a type when rows_fused called it too, which cost ~10 s of a cold compile.

def _overload(stub):
    """Register the decorated function as the per-type typing of `stub` (fastmath, as every kernel here)."""
    return overload(stub, prefer_literal=True, jit_options={"fastmath": True})


def _nothing(code, w, r, r1, rb, X16, DX, k, nb, res, base):
    """A product a type has none of (F16's int16 rows, Q8_0's fours): typed, never called."""


def _token_rows(code, w, r, r1, rb, X16, DX, k, nb, res, base):
    """res[k, base + r'] = row_r' . token k for rows r' in [r, r1), in the type's row groups, largest first."""


@_overload(_token_rows)
def _token_rows_typed(code, w, r, r1, rb, X16, DX, k, nb, res, base):
    groups = _TOKEN.get(_literal(code))
    if groups is None:
        return _nothing
    (g1, k1), one = groups[0], groups[-1][1]
    g2, k2 = groups[1] if len(groups) == 3 else groups[0]  # Q4_0's 4-row group without VNNI; else the first again

    def impl(code, w, r, r1, rb, X16, DX, k, nb, res, base):
        while r + g1 <= r1:
            k1(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(base + r))
            r += g1
        while r + g2 <= r1:
            k2(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(base + r))
            r += g2
        while r < r1:
            one(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(base + r))
            r += 1
    return impl


def _pair_rows(code, w, r, r1, rb, X16, DX, k, nb, res, base):
    """_token_rows for tokens k and k + 1 at once: the type's row groups (_PAIR: Q8_0 4 rows, the K-quants and IQ4s
    2, Q4_0 / IQ4_NL 8 with AVX-512 VNNI) decoded once for both, the rows left over a token at a time."""


@_overload(_pair_rows)
def _pair_rows_typed(code, w, r, r1, rb, X16, DX, k, nb, res, base):
    g, kern = _PAIR.get(_literal(code), (0, None))
    if kern is None:
        return _nothing

    def impl(code, w, r, r1, rb, X16, DX, k, nb, res, base):
        while r + g <= r1:
            kern(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(base + r))
            r += g
        if r < r1:
            _token_rows(code, w, r, r1, rb, X16, DX, k, nb, res, base)
            _token_rows(code, w, r, r1, rb, X16, DX, k + 1, nb, res, base)
    return impl


def _quad_rows(code, w, r, r1, rb, X16, DX, k, nb, res, base):
    """_token_rows for tokens k .. k + 3 at once: the type's row groups decoded once for all four, the rows left over
    as two pairs."""


@_overload(_quad_rows)
def _quad_rows_typed(code, w, r, r1, rb, X16, DX, k, nb, res, base):
    g, kern = _QUAD.get(_literal(code), (0, None))
    if kern is None:
        return _nothing

    def impl(code, w, r, r1, rb, X16, DX, k, nb, res, base):
        while r + g <= r1:
            kern(w, np.int64(r * rb), np.int64(rb), X16, DX, k, nb, res, np.int64(base + r))
            r += g
        if r < r1:
            _pair_rows(code, w, r, r1, rb, X16, DX, k, nb, res, base)
            _pair_rows(code, w, r, r1, rb, X16, DX, k + 2, nb, res, base)
    return impl


def _fused_rows(code, w, r0, r1, rb, X16, DX, nb, res, base):
    """Every token of X16 / DX through rows [r0, r1): four at a time (not Q8_0: _FUSED), then in pairs, then one."""


@_overload(_fused_rows)
def _fused_rows_typed(code, w, r0, r1, rb, X16, DX, nb, res, base):
    fours = _literal(code) in _QUAD

    def impl(code, w, r0, r1, rb, X16, DX, nb, res, base):
        m = X16.shape[0]
        k = np.int64(0)  # not a literal 0: one compiled specialisation of the row kernels below, not two
        if fours:
            while k + 4 <= m:
                _quad_rows(code, w, r0, r1, rb, X16, DX, k, nb, res, base)
                k += 4
        while k + 2 <= m:
            _pair_rows(code, w, r0, r1, rb, X16, DX, k, nb, res, base)
            k += 2
        if k < m:
            _token_rows(code, w, r0, r1, rb, X16, DX, k, nb, res, base)
    return impl


@njit(fastmath=True, inline="always")
def rows_token(code, w, r0, r1, rb, X16, DX, k, res, off):
    """res[k, off + r - r0] = row_r . token k for rows [r0, r1) of flat bytes w of type `code` (row stride rb), the
    token's int16 activations X16[k] * DX[k] (simd.py / kquants.py / iquants.py intrinsics, 8, 4, 2 or 1 rows a pass).

    Q8_0 runs 2 rows a pass: from DRAM, on 2 threads, 1.28-1.35x its 8-row rate at 1024- to 4096-wide rows
    (bench_q8_rows.py: 91% of the read against 68% at 2048), and no slower in cache; Q4_0, whose arithmetic
    per byte is twice Q8_0's, keeps 8 with AVX2 (2 rows 0.80-0.85x, 4 rows 0.96-1.02x) and runs 2 with AVX-512
    VNNI, whose row pair is one register (_TOKEN's comment). The K-quants run 2 rows a pass
    too: never slower than 4 in any run here, faster while the machine runs slow (bench_q8_rows.py --fmt
    Q4_K|Q6_K: from DRAM Q4_K 1.00-1.05x, Q6_K 1.02-1.20x; --l2, one core, 1.00-1.13x)."""
    _token_rows(code, w, r0, r1, rb, X16, DX, k, np.int64(X16.shape[1] // 32), res, off - r0)


@njit(fastmath=True, inline="always")
def rows_pair(code, w, r0, r1, rb, X16, DX, k, res, off):
    """rows_token for tokens k and k + 1 at once: the type's row groups (_PAIR) decoded once for both (the same
    products and float adds per row and token, so the same bits), the rows left over per token."""
    _pair_rows(code, w, r0, r1, rb, X16, DX, k, np.int64(X16.shape[1] // 32), res, off - r0)


@njit(fastmath=True, inline="always")
def rows_quad(code, w, r0, r1, rb, X16, DX, k, res, off):
    """rows_token for tokens k .. k + 3 of Q4_0 / K-quant / IQ4 rows at once: each row group decoded once for all four
    (the same products and float adds per row and token, so the same bits), 8-row groups for Q4_0, 2-row ones for
    the K-quants; the last rows as two pairs. An expert's rows in cache, one core, four tokens against two pairs
    (bench_token_pairs.py): Q4_0 1.18x, Q4_K 1.13x, Q6_K 1.20x (Q8_0 stays in pairs: _FUSED)."""
    _quad_rows(code, w, r0, r1, rb, X16, DX, k, np.int64(X16.shape[1] // 32), res, off - r0)


@njit(fastmath=True, inline="always")
def rows_fused(code, w, r0, r1, rb, X16, DX, res, off):
    """res[k, off + r - r0] = row_r . token k for every token of X16 / DX (int16 activations) and rows [r0, r1) of
    quantised bytes w: tokens four at a time (not Q8_0), then in pairs, then one."""
    _fused_rows(code, w, r0, r1, rb, X16, DX, np.int64(X16.shape[1] // 32), res, off - r0)


@njit(fastmath=True, inline="always")
def rows_matmul(code, w, r0, r1, rb, X, X16, DX, P, res, off):
    """res[k, off + r - r0] = row_r . X[k] for the m rows of X [m, cols]: fused in-place dots up to _FUSED[code]
    tokens (the quantised types: int16 activations X16 * DX, tokens in fours and pairs: rows_fused; F16: float32 X),
    the weight rows staying in L1/L2; else each weight is decoded once and multiplied with the tokens' packed panels P
    (kernels.panels): to its integer against integer panels (qgemm.gemm_matmul), or dequantised against float ones
    (gemm.deq_matmul; under GEMM_TOKENS gemm.deq_dots on X)."""
    m = X.shape[0]
    if gemm_path(m, code):
        if P.shape[1] != X.shape[1]:  # integer panels (qgemm.gemm_pack: narrower than a row)
            gemm_matmul(code, w, r0, r1, rb, P, m, res, off)
        else:
            deq_matmul(code, w, r0, r1, rb, P, m, res, off)
    elif m > _FUSED[code]:
        deq_dots(code, w, r0, r1, rb, X, res, off)
    elif code == F16 and m == 1:  # one token (decode): one row a pass, a single stream per thread from DRAM:
        # `small`'s attention products at 1.34x four rows' GB/s on 2 threads (32-row items; 2048 x 2048 rows
        # 1.32-1.39x; the same bits), its all-CPU decode's dense path 0.1-0.5 ms a token faster (README, session 35)
        nc = np.int64(X.shape[1] // 16)
        for r in range(r0, r1):
            rows1_f16(w, np.int64(r * rb), np.int64(rb), X[0], DX[0], nc, res[0], np.int64(off + r - r0))
    elif code == F16:  # several tokens: a row group's weights stay in L1 / L2 for the next token
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
        rows_fused(code, w, r0, r1, rb, X16, DX, res, off)


_INT8_ROWS = (Q4_0, IQ4_NL, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS)  # the types an int8 build gives int8 rows


def rows_activations(code: int) -> str:
    """The activations type `code`'s fused in-place rows read: 'int8' for Q4_0, the IQ4s and the K-quants in an int8
    build with AVX-512 VNNI (ROWS_INT8), 'float32' for F16, else 'int16' (Q8_0's in either build)."""
    return "float32" if code == F16 else "int8" if ROWS_INT8 and code in _INT8_ROWS else "int16"


@njit(fastmath=True, inline="always")
def gemm_path(T, code):
    """Whether T tokens through a matrix of type `code` take packed panels and few large items: qgemm.q_matmul above
    _FUSED tokens (HAVE_QGEMM, a quantised type), else gemm.deq_matmul from GEMM_TOKENS."""
    return T > _FUSED[code] and (T >= GEMM_TOKENS or (HAVE_QGEMM and code != F16))


# Entry points from Python (tests, benchmarks): each compiled per type code with the code a constant in it, as in
# kernel_table's C functions. A literal argument instead (numba.literally) types the same, but ran the packed GEMM at
# 48 tokens ~15x slower (27 against 1.6-1.8 ms for a 768 x 2048 Q8_0 matrix, one process): measure through these.

@lru_cache(maxsize=None)
def _entry(code: int):
    """The products of type `code` in one function (one compile a type, not one a product and type), `which` of them
    chosen at run time: 0 rows_token, 1 rows_pair, 2 rows_fused, 3 gemm.deq_matmul, 4 qgemm.gemm_matmul."""
    @njit(fastmath=True)
    def products(which, w, r0, r1, rb, X16, DX, P, m, k, res, off):
        if which == 0:
            rows_token(code, w, r0, r1, rb, X16, DX, k, res, off)
        elif which == 1:
            rows_pair(code, w, r0, r1, rb, X16, DX, k, res, off)
        elif which == 2:
            rows_fused(code, w, r0, r1, rb, X16, DX, res, off)
        elif which == 3:
            deq_matmul(code, w, r0, r1, rb, P, m, res, off)
        else:
            gemm_matmul(code, w, r0, r1, rb, P, m, res, off)
    return products


_NO_P = np.zeros((0, 32, 16), np.float32)  # packed tokens where a product takes none
_NO_X16, _NO_DX = np.zeros((0, 32), np.int16), np.zeros((0, 2), np.float32)


def py_rows_token(code, w, r0, r1, rb, X16, DX, k, res, off) -> None:
    """rows_token from Python: res[k, off + r - r0] = row_r . token k (float32)."""
    _entry(int(code))(0, w, r0, r1, rb, X16, DX, _NO_P, 0, k, res, off)


def py_rows_pair(code, w, r0, r1, rb, X16, DX, k, res, off) -> None:
    """rows_pair from Python: tokens k and k + 1 (float32)."""
    _entry(int(code))(1, w, r0, r1, rb, X16, DX, _NO_P, 0, k, res, off)


def py_rows_fused(code, w, r0, r1, rb, X16, DX, res, off) -> None:
    """rows_fused from Python: every token of X16 / DX (float32)."""
    _entry(int(code))(2, w, r0, r1, rb, X16, DX, _NO_P, 0, 0, res, off)


def py_deq_matmul(code, w, r0, r1, rb, P, m, res, off) -> None:
    """gemm.deq_matmul from Python: the m tokens packed in P (float32)."""
    _entry(int(code))(3, w, r0, r1, rb, _NO_X16, _NO_DX, P, m, 0, res, off)


def py_q_matmul(code, w, r0, r1, rb, P, m, res, off) -> None:
    """qgemm.gemm_matmul from Python: the m tokens packed in P by qgemm.gemm_pack (float32)."""
    _entry(int(code))(4, w, r0, r1, rb, _NO_X16, _NO_DX, P, m, 0, res, off)
