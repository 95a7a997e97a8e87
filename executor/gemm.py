"""Prefill-sized products (more than a few tokens per weight row): rows are dequantised from the
mmap four at a time into a small float32 buffer (L1-resident), then multiplied with the tokens in
4-row x 3-token register blocks. Twelve independent accumulators keep both FMA pipes busy and load
each weight and activation once per twelve products; one row x one token at a time (a single
dot) ran at 34 GFLOP/s on one Zen 3 core, the 4 x 3 block at 79 (tiny bench, in cache).
Type codes as in kernels.py: 1 = F16, 2 = Q8_0, 3 = Q4_0, 4 = Q4_K, 5 = Q6_K (the K-quants' 256-weight
super-blocks as ggml lays them out: ggml-quants.c dequantize_row_q4_K / _q6_K)."""
from __future__ import annotations

import numpy as np
from numba import njit

from .kquants import deq_q4_k_row, deq_q6_k_row
from .nbcache import drop_stale_cache
from .simd import h2f

drop_stale_cache("gemm", ("simd.py", "kquants.py"))

F16, Q8_0, Q4_0, Q4_K, Q6_K = 1, 2, 3, 4, 5
_U = np.uint64


@njit(fastmath=True, inline="always")
def deq_row(code, w, o0, buf, qk):
    """Dequantise the row at byte o0 of flat bytes w into buf float32 [cols]."""
    n = _U(buf.shape[0])
    if code == F16:
        for j in range(n):
            buf[j] = h2f(w[o0 + _U(2) * j], w[o0 + _U(2) * j + _U(1)])
    elif code == Q8_0:
        for b in range(n // _U(32)):
            o = o0 + _U(b) * _U(34)
            d = h2f(w[o], w[o + _U(1)])
            for j in range(qk):
                buf[_U(b) * _U(32) + j] = np.float32(np.int8(w[o + _U(2) + j])) * d
    elif code == Q4_K:
        deq_q4_k_row(w, np.int64(o0), buf, np.int64(n // _U(256)))
    elif code == Q6_K:
        deq_q6_k_row(w, np.int64(o0), buf, np.int64(n // _U(256)))
    else:  # low nibbles are values 0..15 of the block, high ones 16..31: two unit-stride loops
        for b in range(n // _U(32)):
            o = o0 + _U(b) * _U(18)
            d = h2f(w[o], w[o + _U(1)])
            for j in range(qk // _U(2)):
                buf[_U(b) * _U(32) + j] = np.float32((np.int32(w[o + _U(2) + j]) & 15) - 8) * d
            for j in range(qk // _U(2)):
                buf[_U(b) * _U(32) + _U(16) + j] = np.float32((np.int32(w[o + _U(2) + j]) >> 4) - 8) * d


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


@njit(fastmath=True)
def deq_matmul(code, w, r0, r1, rb, X, res, off):
    """res[k, off + r - r0] = row_r . X[k] for rows [r0, r1) of flat bytes w (row stride rb) and the m
    tokens of X [m, cols]; each row is dequantised once."""
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
        k = 0
        while k + 3 <= m:
            _block4x3(buf[0], buf[1], buf[2], buf[3], X[k], X[k + 1], X[k + 2], out, k, 0)
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
