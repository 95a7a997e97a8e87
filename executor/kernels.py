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


_U = np.uint64


@njit(fastmath=True)
def _q8_dot(w, r0, r1, rb, x, res, qk):
    """res[r - r0] = Q8_0 row r . x for rows [r0, r1) of flat bytes w (row stride rb); 4 rows at a time."""
    nb = _U(x.shape[0] // 32)
    two, c34, c32, one = _U(2), _U(34), _U(32), _U(1)
    rbu = _U(rb)
    r = r0
    while r < r1:
        o0 = _U(r) * rbu
        if r + 4 <= r1:
            o1, o2, o3 = o0 + rbu, o0 + _U(2) * rbu, o0 + _U(3) * rbu
        else:
            o1 = o2 = o3 = o0
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for b in range(nb):
            o = _U(b) * c34
            xo = _U(b) * c32
            t0 = t1 = t2 = t3 = np.float32(0.0)
            for j in range(qk):
                xv = x[xo + j]
                t0 += np.float32(np.int8(w[o0 + o + two + j])) * xv
                t1 += np.float32(np.int8(w[o1 + o + two + j])) * xv
                t2 += np.float32(np.int8(w[o2 + o + two + j])) * xv
                t3 += np.float32(np.int8(w[o3 + o + two + j])) * xv
            a0 += t0 * _h2f(w[o0 + o], w[o0 + o + one])
            a1 += t1 * _h2f(w[o1 + o], w[o1 + o + one])
            a2 += t2 * _h2f(w[o2 + o], w[o2 + o + one])
            a3 += t3 * _h2f(w[o3 + o], w[o3 + o + one])
        res[r - r0] = a0
        if r + 4 <= r1:
            res[r - r0 + 1] = a1
            res[r - r0 + 2] = a2
            res[r - r0 + 3] = a3
            r += 4
        else:
            r += 1


@njit(fastmath=True)
def _q4_dot(w, r0, r1, rb, x, res, qk):
    """res[r - r0] = Q4_0 row r . x for rows [r0, r1) of flat bytes w (row stride rb); 4 rows at a time."""
    nb = _U(x.shape[0] // 32)
    two, c18, c32, c16, one = _U(2), _U(18), _U(32), _U(16), _U(1)
    rbu = _U(rb)
    hq = _U(qk // 2)
    r = r0
    while r < r1:
        o0 = _U(r) * rbu
        if r + 4 <= r1:
            o1, o2, o3 = o0 + rbu, o0 + _U(2) * rbu, o0 + _U(3) * rbu
        else:
            o1 = o2 = o3 = o0
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for b in range(nb):
            o = _U(b) * c18
            xo = _U(b) * c32
            t0 = t1 = t2 = t3 = np.float32(0.0)
            for j in range(hq):
                xl = x[xo + j]
                xh = x[xo + c16 + j]
                q0 = np.int32(w[o0 + o + two + j])
                q1 = np.int32(w[o1 + o + two + j])
                q2 = np.int32(w[o2 + o + two + j])
                q3 = np.int32(w[o3 + o + two + j])
                t0 += np.float32((q0 & 15) - 8) * xl + np.float32((q0 >> 4) - 8) * xh
                t1 += np.float32((q1 & 15) - 8) * xl + np.float32((q1 >> 4) - 8) * xh
                t2 += np.float32((q2 & 15) - 8) * xl + np.float32((q2 >> 4) - 8) * xh
                t3 += np.float32((q3 & 15) - 8) * xl + np.float32((q3 >> 4) - 8) * xh
            a0 += t0 * _h2f(w[o0 + o], w[o0 + o + one])
            a1 += t1 * _h2f(w[o1 + o], w[o1 + o + one])
            a2 += t2 * _h2f(w[o2 + o], w[o2 + o + one])
            a3 += t3 * _h2f(w[o3 + o], w[o3 + o + one])
        res[r - r0] = a0
        if r + 4 <= r1:
            res[r - r0 + 1] = a1
            res[r - r0 + 2] = a2
            res[r - r0 + 3] = a3
            r += 4
        else:
            r += 1


@njit(fastmath=True, inline="always")
def _deq(code, w, o0, buf, qk):
    """Dequantise the row at byte o0 of flat bytes w into buf float32 [cols]."""
    n = _U(buf.shape[0])
    if code == F16:
        ib = buf.view(np.int32)
        for j in range(n):
            h = np.int32(w[o0 + _U(2) * j]) | (np.int32(w[o0 + _U(2) * j + _U(1)]) << 8)
            ib[j] = ((h & 0x8000) << 16) | ((h & 0x7FFF) << 13)
        for j in range(n):
            buf[j] *= _TWO112
    elif code == Q8_0:
        for b in range(n // _U(32)):
            o = o0 + _U(b) * _U(34)
            d = _h2f(w[o], w[o + _U(1)])
            for j in range(qk):
                buf[_U(b) * _U(32) + j] = np.float32(np.int8(w[o + _U(2) + j])) * d
    else:
        for b in range(n // _U(32)):
            o = o0 + _U(b) * _U(18)
            d = _h2f(w[o], w[o + _U(1)])
            for j in range(qk // 2):
                q = np.int32(w[o + _U(2) + j])
                buf[_U(b) * _U(32) + j] = np.float32((q & 15) - 8) * d
                buf[_U(b) * _U(32) + _U(16) + j] = np.float32((q >> 4) - 8) * d


@njit(fastmath=True, inline="always")
def _vdot(a, b):
    s = np.float32(0.0)
    for j in range(_U(a.shape[0])):
        s += a[j] * b[j]
    return s


@njit(fastmath=True)
def _rows_dot(code, w, r0, r1, rb, x, buf, res, qk):
    """res[r - r0] = row_r . x for rows [r0, r1) of flat expert bytes w (row stride rb)."""
    if code == Q8_0:
        _q8_dot(w, r0, r1, rb, x, res, qk)
    elif code == Q4_0:
        _q4_dot(w, r0, r1, rb, x, res, qk)
    else:
        for r in range(r0, r1):
            _deq(code, w, _U(r) * _U(rb), buf, _U(qk))
            res[r - r0] = _vdot(buf, x)


@njit(fastmath=True)
def _rows_matmul(code, w, r0, r1, rb, xs, idx, m, buf, res, qk):
    """res[k, r - r0] = row_r . xs[idx[k]] for k < m; one token: fused dots, else dequantise once."""
    if m == 1:
        _rows_dot(code, w, r0, r1, rb, xs[idx[0]], buf, res[0], qk)
        return
    for r in range(r0, r1):
        _deq(code, w, _U(r) * _U(rb), buf, _U(qk))
        for k in range(m):
            res[k, r - r0] = _vdot(buf, xs[idx[k]])


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _moe(gd, gc, ud, uc, dd, dc, F, H, x, experts, offs, tok, wts, act, out, qk):
    """SwiGLU experts: out[t] += sum_a wts[a] * down_e(silu(gate_e x_t) * up_e x_t), CSR by expert.

    gd/ud/dd: flat expert bytes [E, rows * row_bytes]; act [m, F] scratch; qk = 32 (block size).
    """
    n = experts.shape[0]
    grb = gd.shape[1] // F
    drb = dd.shape[1] // H
    maxm = 1
    for i in range(n):
        maxm = max(maxm, offs[i + 1] - offs[i])
    nch = (F + _ROWS - 1) // _ROWS
    for it in prange(n * nch):  # phase 1: act[a, f] = silu(g) * u
        i = it // nch
        r0 = (it % nch) * _ROWS
        r1 = min(F, r0 + _ROWS)
        e = experts[i]
        a0 = offs[i]
        m = offs[i + 1] - a0
        idx = tok[a0:a0 + m]
        buf = np.empty(x.shape[1], np.float32)
        g = np.empty((m, _ROWS), np.float32)
        u = np.empty((m, _ROWS), np.float32)
        _rows_matmul(gc, gd[e], r0, r1, grb, x, idx, m, buf, g, qk)
        _rows_matmul(uc, ud[e], r0, r1, grb, x, idx, m, buf, u, qk)
        for k in range(m):
            for r in range(r1 - r0):
                gv = g[k, r]
                act[a0 + k, r0 + r] = gv / (np.float32(1.0) + np.exp(-gv)) * u[k, r]
    nh = (H + _ROWS - 1) // _ROWS
    for it in prange(nh):  # phase 2: each thread owns rows of out, loops over experts
        r0 = it * _ROWS
        r1 = min(H, r0 + _ROWS)
        buf = np.empty(F, np.float32)
        y = np.empty((maxm, _ROWS), np.float32)
        lidx = np.arange(maxm)
        for i in range(n):
            e = experts[i]
            a0 = offs[i]
            m = offs[i + 1] - a0
            _rows_matmul(dc, dd[e], r0, r1, drb, act[a0:a0 + m], lidx, m, buf, y, qk)
            for k in range(m):
                t = tok[a0 + k]
                for r in range(r1 - r0):
                    out[t, r0 + r] += wts[a0 + k] * y[k, r]


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _matmul(wd, code, R, x, out, qk):
    """out[t, r] = W[r] . x[t] for one expert matrix (flat bytes wd, in place), rows across threads."""
    T = x.shape[0]
    rb = wd.shape[0] // R
    nch = (R + _ROWS - 1) // _ROWS
    for it in prange(nch):
        r0 = it * _ROWS
        r1 = min(R, r0 + _ROWS)
        buf = np.empty(x.shape[1], np.float32)
        res = np.empty((T, _ROWS), np.float32)
        idx = np.arange(T)
        _rows_matmul(code, wd, r0, r1, rb, x, idx, T, buf, res, qk)
        for t in range(T):
            for r in range(r1 - r0):
                out[t, r0 + r] = res[t, r]


def flat(w) -> np.ndarray:
    """ExpertTensor bytes as a flat [E, rows * row_bytes] uint8 view (no copy)."""
    return w.data.reshape(w.data.shape[0], -1)


def expert_matmul(w, e: int, x: np.ndarray) -> np.ndarray:
    """W_e x for ExpertTensor `w`, expert `e`, x [T, cols] f32 -> [T, rows] f32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], w.rows), np.float32)
    _matmul(flat(w)[int(e)], w.code, w.rows, x, out, 32)
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
        _moe(flat(gate), gate.code, flat(up), up.code, flat(down), down.code, gate.rows, down.rows,
             x, experts, offs, tok, wts, act, out, 32)
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
