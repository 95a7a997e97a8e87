"""Numba CPU kernels: SwiGLU experts reading F16 / Q8_0 / Q4_0 blocks in place from the mmap.

All kernels take expert tensors as uint8 [E, rows, row_bytes] views (no copies), release the GIL
(nogil) and split rows across threads (prange). Type codes: 1 = F16, 2 = Q8_0, 3 = Q4_0.
"""
from __future__ import annotations

import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

from .simd import quant16, rows1_q4, rows1_q8, rows4_q4, rows4_q8


def _drop_stale_cache() -> None:
    """numba's cache=True watches only this file; drop its cached kernels when simd.py changed."""
    here = Path(__file__).resolve().parent
    src = here / "simd.py"
    stamp = here / "__pycache__" / "kernels.simd-stamp"
    now = f"{src.stat().st_mtime_ns} {src.stat().st_size}"
    try:
        if stamp.exists() and stamp.read_text() == now:
            return
        for f in (here / "__pycache__").glob("kernels.*.nb[ic]"):
            f.unlink()
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(now)
    except OSError:  # read-only install: the cache is whatever was shipped
        pass


_drop_stale_cache()

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
            for j in range(qk // _U(2)):
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
def _rows_dot(code, w, r0, r1, rb, x, x16, dx, buf, res):
    """res[r - r0] = row_r . x for rows [r0, r1) of flat expert bytes w (row stride rb).

    Q8_0 / Q4_0 use the int16 activations x16 * dx (simd.py); F16 dequantises each row into buf.
    """
    nb = np.int64(x.shape[0] // 32)
    r = r0
    if code == Q8_0:
        while r + 4 <= r1:
            rows4_q8(w, np.int64(r * rb), np.int64(rb), x16, dx, nb, res, np.int64(r - r0))
            r += 4
        while r < r1:
            rows1_q8(w, np.int64(r * rb), np.int64(rb), x16, dx, nb, res, np.int64(r - r0))
            r += 1
    elif code == Q4_0:
        while r + 4 <= r1:
            rows4_q4(w, np.int64(r * rb), np.int64(rb), x16, dx, nb, res, np.int64(r - r0))
            r += 4
        while r < r1:
            rows1_q4(w, np.int64(r * rb), np.int64(rb), x16, dx, nb, res, np.int64(r - r0))
            r += 1
    else:
        for r in range(r0, r1):
            _deq(code, w, _U(r) * _U(rb), buf, _U(32))
            res[r - r0] = _vdot(buf, x)


@njit(fastmath=True)
def _rows_matmul(code, w, r0, r1, rb, xs, x16s, dxs, idx, m, buf, res):
    """res[k, r - r0] = row_r . xs[idx[k]] for k < m; one token: fused dots, else dequantise once."""
    if m == 1:
        t = idx[0]
        _rows_dot(code, w, r0, r1, rb, xs[t], x16s[t], dxs[t], buf, res[0])
        return
    for r in range(r0, r1):
        _deq(code, w, _U(r) * _U(rb), buf, _U(32))
        for k in range(m):
            res[k, r - r0] = _vdot(buf, xs[idx[k]])


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _moe(gd, gc, ud, uc, dd, dc, F, H, x, experts, offs, tok, wts, act, out):
    """SwiGLU experts: out[t] += sum_a wts[a] * down_e(silu(gate_e x_t) * up_e x_t), CSR by expert.

    gd/ud/dd: flat expert bytes [E, rows * row_bytes]; act [m, F] scratch.
    """
    n = experts.shape[0]
    T = x.shape[0]
    M = act.shape[0]
    grb, urb, drb = gd.shape[1] // F, ud.shape[1] // F, dd.shape[1] // H
    x16 = np.empty((T, H), np.int16)
    dx = np.empty((T, H // 32), np.float32)
    for t in range(T):
        quant16(x[t], x16[t], dx[t])
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
        buf = np.empty(H, np.float32)
        g = np.empty((m, _ROWS), np.float32)
        u = np.empty((m, _ROWS), np.float32)
        _rows_matmul(gc, gd[e], r0, r1, grb, x, x16, dx, idx, m, buf, g)
        _rows_matmul(uc, ud[e], r0, r1, urb, x, x16, dx, idx, m, buf, u)
        for k in range(m):
            for r in range(r1 - r0):
                gv = g[k, r]
                act[a0 + k, r0 + r] = gv / (np.float32(1.0) + np.exp(-gv)) * u[k, r]
    a16 = np.empty((M, F), np.int16)
    da = np.empty((M, F // 32), np.float32)
    for a in range(M):  # serial: a parallel region here costs more than it saves
        quant16(act[a], a16[a], da[a])
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
            _rows_matmul(dc, dd[e], r0, r1, drb, act[a0:a0 + m], a16[a0:a0 + m], da[a0:a0 + m], lidx, m, buf, y)
            for k in range(m):
                t = tok[a0 + k]
                for r in range(r1 - r0):
                    out[t, r0 + r] += wts[a0 + k] * y[k, r]


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _matmul(wd, code, R, x, out):
    """out[t, r] = W[r] . x[t] for one expert matrix (flat bytes wd, in place), rows across threads."""
    T, C = x.shape
    rb = wd.shape[0] // R
    x16 = np.empty((T, C), np.int16)
    dx = np.empty((T, C // 32), np.float32)
    for t in range(T):
        quant16(x[t], x16[t], dx[t])
    nch = (R + _ROWS - 1) // _ROWS
    for it in prange(nch):
        r0 = it * _ROWS
        r1 = min(R, r0 + _ROWS)
        buf = np.empty(C, np.float32)
        res = np.empty((T, _ROWS), np.float32)
        idx = np.arange(T)
        _rows_matmul(code, wd, r0, r1, rb, x, x16, dx, idx, T, buf, res)
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
    _matmul(flat(w)[int(e)], w.code, w.rows, x, out)
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
             x, experts, offs, tok, wts, act, out)
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
