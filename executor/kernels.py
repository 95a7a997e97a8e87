"""Numba CPU kernels: SwiGLU experts reading F16 / Q8_0 / Q4_0 blocks in place from the mmap.

All kernels take expert tensors as uint8 [E, rows, row_bytes] views (no copies), release the GIL
(nogil) and split rows across threads (prange). Type codes: 1 = F16, 2 = Q8_0, 3 = Q4_0.
"""
from __future__ import annotations

import time

import numba
import numpy as np
from numba import njit, prange

F16, Q8_0, Q4_0 = 1, 2, 3
_ROWS = 16  # rows per parallel work item

# 2**(e-25) for half exponents e (e = 0: subnormal scale 2**-24)
_EXP = np.array([2.0 ** -24] + [2.0 ** (e - 25) for e in range(1, 32)], dtype=np.float32)
_TWO112 = np.float32(2.0 ** 112)


@njit(inline="always")
def _h2f(lo, hi):
    """fp16 (two little-endian bytes) -> float32."""
    h = np.int32(lo) | (np.int32(hi) << 8)
    e = (h >> 10) & 31
    m = h & 1023
    v = np.float32(m + (1024 if e > 0 else 0)) * _EXP[e]
    return -v if h & 0x8000 else v


@njit(fastmath=True, inline="always")
def _dot_q8(row, x):
    """Q8_0 row (bytes) . x."""
    acc = np.float32(0.0)
    for b in range(x.shape[0] // 32):
        o = b * 34
        s = np.float32(0.0)
        for j in range(32):
            s += np.float32(np.int8(row[o + 2 + j])) * x[b * 32 + j]
        acc += s * _h2f(row[o], row[o + 1])
    return acc


@njit(fastmath=True, inline="always")
def _dot_q4(row, x):
    """Q4_0 row (bytes) . x."""
    acc = np.float32(0.0)
    for b in range(x.shape[0] // 32):
        o = b * 18
        s = np.float32(0.0)
        for j in range(16):
            q = np.int32(row[o + 2 + j])
            s += np.float32((q & 15) - 8) * x[b * 32 + j] + np.float32((q >> 4) - 8) * x[b * 32 + 16 + j]
        acc += s * _h2f(row[o], row[o + 1])
    return acc


@njit(fastmath=True, inline="always")
def _deq_f16(row, buf):
    """F16 row (bytes) -> buf float32 (exact, subnormals included)."""
    ib = buf.view(np.int32)
    for j in range(buf.shape[0]):
        h = np.int32(row[2 * j]) | (np.int32(row[2 * j + 1]) << 8)
        ib[j] = ((h & 0x8000) << 16) | ((h & 0x7FFF) << 13)
    for j in range(buf.shape[0]):
        buf[j] *= _TWO112


@njit(fastmath=True, inline="always")
def _deq(code, row, buf):
    """Dequantise one row of type `code` into buf float32 [cols]."""
    if code == F16:
        _deq_f16(row, buf)
    elif code == Q8_0:
        for b in range(buf.shape[0] // 32):
            o = b * 34
            d = _h2f(row[o], row[o + 1])
            for j in range(32):
                buf[b * 32 + j] = np.float32(np.int8(row[o + 2 + j])) * d
    else:
        for b in range(buf.shape[0] // 32):
            o = b * 18
            d = _h2f(row[o], row[o + 1])
            for j in range(16):
                q = np.int32(row[o + 2 + j])
                buf[b * 32 + j] = np.float32((q & 15) - 8) * d
                buf[b * 32 + 16 + j] = np.float32((q >> 4) - 8) * d


@njit(fastmath=True, inline="always")
def _dot(code, row, x, buf):
    """row (type `code`) . x; buf [cols] scratch for F16."""
    if code == Q8_0:
        return _dot_q8(row, x)
    if code == Q4_0:
        return _dot_q4(row, x)
    _deq_f16(row, buf)
    s = np.float32(0.0)
    for j in range(x.shape[0]):
        s += buf[j] * x[j]
    return s


@njit(fastmath=True, inline="always")
def _rows_times(code, row, xs, idx, n, buf, out, col):
    """out[i, col] = row . xs[idx[i]] for i < n (dequantise once when n > 1)."""
    if n == 1:
        out[0, col] = _dot(code, row, xs[idx[0]], buf)
        return
    _deq(code, row, buf)
    for i in range(n):
        x = xs[idx[i]]
        s = np.float32(0.0)
        for j in range(x.shape[0]):
            s += buf[j] * x[j]
        out[i, col] = s


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _moe(gd, gc, ud, uc, dd, dc, x, experts, offs, tok, wts, act, out):
    """SwiGLU experts: out[t] += sum_a wts[a] * down_e(silu(gate_e x_t) * up_e x_t), CSR by expert."""
    n = experts.shape[0]
    F = gd.shape[1]
    H = dd.shape[1]
    maxm = 1
    for i in range(n):
        maxm = max(maxm, offs[i + 1] - offs[i])
    nch = (F + _ROWS - 1) // _ROWS
    for it in prange(n * nch):  # phase 1: act[a, f] = silu(g) * u
        i = it // nch
        r0 = (it % nch) * _ROWS
        e = experts[i]
        a0 = offs[i]
        m = offs[i + 1] - a0
        idx = tok[a0:a0 + m]
        buf = np.empty(x.shape[1], np.float32)
        g = np.empty((m, 1), np.float32)
        u = np.empty((m, 1), np.float32)
        for r in range(r0, min(F, r0 + _ROWS)):
            _rows_times(gc, gd[e, r], x, idx, m, buf, g, 0)
            _rows_times(uc, ud[e, r], x, idx, m, buf, u, 0)
            for k in range(m):
                gv = g[k, 0]
                act[a0 + k, r] = gv / (np.float32(1.0) + np.exp(-gv)) * u[k, 0]
    nh = (H + _ROWS - 1) // _ROWS
    for it in prange(nh):  # phase 2: each thread owns rows of out, loops over experts
        r0 = it * _ROWS
        buf = np.empty(F, np.float32)
        y = np.empty((maxm, 1), np.float32)
        lidx = np.arange(maxm)
        for i in range(n):
            e = experts[i]
            a0 = offs[i]
            m = offs[i + 1] - a0
            sub = act[a0:a0 + m]
            for r in range(r0, min(H, r0 + _ROWS)):
                _rows_times(dc, dd[e, r], sub, lidx, m, buf, y, 0)
                for k in range(m):
                    out[tok[a0 + k], r] += wts[a0 + k] * y[k, 0]


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _matmul(wd, code, e, x, out):
    """out[t, r] = W_e[r] . x[t] for one expert matrix (in place), rows split across threads."""
    R = wd.shape[1]
    T = x.shape[0]
    nch = (R + _ROWS - 1) // _ROWS
    for it in prange(nch):
        buf = np.empty(x.shape[1], np.float32)
        col = np.empty((T, 1), np.float32)
        idx = np.arange(T)
        for r in range(it * _ROWS, min(R, (it + 1) * _ROWS)):
            _rows_times(code, wd[e, r], x, idx, T, buf, col, 0)
            for t in range(T):
                out[t, r] = col[t, 0]


def expert_matmul(w, e: int, x: np.ndarray) -> np.ndarray:
    """W_e x for ExpertTensor `w`, expert `e`, x [T, cols] f32 -> [T, rows] f32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], w.rows), np.float32)
    _matmul(w.data, w.code, int(e), x, out)
    return out


def csr(experts_per_tok: np.ndarray, weights: np.ndarray, keep=None):
    """Group routing [T, K] by expert -> (experts int32 [n], offs [n+1], tok [m], wts [m]); keep(e) filters."""
    T, K = experts_per_tok.shape
    flat_e = experts_per_tok.reshape(-1)
    order = np.argsort(flat_e, kind="stable")
    fe = flat_e[order]
    tok = (order // K).astype(np.int32)
    wts = weights.reshape(-1)[order].astype(np.float32)
    uniq, starts = np.unique(fe, return_index=True)
    if keep is not None:
        mask = np.array([keep(int(u)) for u in uniq], dtype=bool)
        ends = np.append(starts[1:], fe.shape[0])
        sel = np.concatenate([np.arange(s, t) for s, t, k in zip(starts, ends, mask) if k] or [np.zeros(0, np.int64)])
        counts = (ends - starts)[mask]
        uniq = uniq[mask]
        tok, wts = tok[sel.astype(np.int64)], wts[sel.astype(np.int64)]
    else:
        counts = np.diff(np.append(starts, fe.shape[0]))
    offs = np.zeros(len(uniq) + 1, np.int32)
    offs[1:] = np.cumsum(counts)
    return uniq.astype(np.int32), offs, tok, wts


def moe_cpu(gate, up, down, x: np.ndarray, experts, offs, tok, wts, out: np.ndarray | None = None) -> np.ndarray:
    """Routed SwiGLU experts on the CPU for x [T, H] (CSR routing), in place from the mmap -> [T, H] f32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.zeros((x.shape[0], down.rows), np.float32)
    act = np.empty((max(1, tok.shape[0]), gate.rows), np.float32)
    if experts.shape[0]:
        _moe(gate.data, gate.code, up.data, up.code, down.data, down.code, x,
             experts, offs, tok, wts, act, out)
    return out


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _sum_u64(a):
    s = np.uint64(0)
    for i in prange(a.shape[0]):
        s += a[i]
    return s


def read_bandwidth(nbytes: int = 1 << 30, repeat: int = 5) -> float:
    """Measured memory read bandwidth (GB/s, best of `repeat`) of a parallel numba sum over nbytes."""
    a = np.ones(nbytes // 8, np.uint64)
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
