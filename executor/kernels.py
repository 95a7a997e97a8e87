"""Numba CPU kernels: SwiGLU experts (and dense matvecs) reading F16 / Q8_0 / Q4_0 in place from the mmap.

Weights are uint8 views of the file mapping (no copies). One-token products use the AVX2 row
intrinsics of simd.py (Q8_0 / Q4_0 with int16 activations, F16 with float32 ones); more than
_FUSED tokens per expert dequantise each row once. Kernels release the GIL (nogil) and split rows
across threads (prange); little work runs serially. Type codes: 1 = F16, 2 = Q8_0, 3 = Q4_0.
"""
from __future__ import annotations

import time
from pathlib import Path

import numba
import numpy as np
from numba import njit, prange

from .gemm import deq_matmul
from .simd import quant16, rows1_f16, rows1_q4, rows1_q8, rows4_f16, rows4_q4, rows4_q8, rows8_q4, rows8_q8, silu_mul


def drop_stale_cache(stem: str, deps: tuple[str, ...]) -> None:
    """numba's cache=True watches only the cached function's own file: drop module `stem`'s cached
    kernels when one of the modules `deps` (beside it) changed, since their code is compiled in."""
    here = Path(__file__).resolve().parent
    srcs = [here / d for d in deps]
    stamp = here / "__pycache__" / f"{stem}.deps-stamp"
    now = " ".join(f"{f.stat().st_mtime_ns} {f.stat().st_size}" for f in srcs)
    try:
        if stamp.exists() and stamp.read_text() == now:
            return
        for f in (here / "__pycache__").glob(f"{stem}.*.nb[ic]"):
            f.unlink()
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(now)
    except OSError:  # read-only install: the cache is whatever was shipped
        pass


drop_stale_cache("kernels", ("simd.py", "gemm.py"))

F16, Q8_0, Q4_0 = 1, 2, 3

_ROWS = 32  # rows per parallel work item (16 -> 32: ~5% on Q4_0 expert GB/s, fewer item switches)
_FUSED = 8  # tokens per expert up to which each token gets fused in-place dots


@njit(fastmath=True)
def _rows_dot(code, w, r0, r1, rb, x, x16, dx, res):
    """res[r - r0] = row_r . x for rows [r0, r1) of flat expert bytes w (row stride rb).

    Q8_0 / Q4_0 use the int16 activations x16 * dx, F16 the float32 x (simd.py intrinsics).
    """
    nb = np.int64(x.shape[0] // 32)
    r = r0
    if code == Q8_0:
        while r + 8 <= r1:
            rows8_q8(w, np.int64(r * rb), np.int64(rb), x16, dx, nb, res, np.int64(r - r0))
            r += 8
        while r + 4 <= r1:
            rows4_q8(w, np.int64(r * rb), np.int64(rb), x16, dx, nb, res, np.int64(r - r0))
            r += 4
        while r < r1:
            rows1_q8(w, np.int64(r * rb), np.int64(rb), x16, dx, nb, res, np.int64(r - r0))
            r += 1
    elif code == Q4_0:
        while r + 8 <= r1:
            rows8_q4(w, np.int64(r * rb), np.int64(rb), x16, dx, nb, res, np.int64(r - r0))
            r += 8
        while r + 4 <= r1:
            rows4_q4(w, np.int64(r * rb), np.int64(rb), x16, dx, nb, res, np.int64(r - r0))
            r += 4
        while r < r1:
            rows1_q4(w, np.int64(r * rb), np.int64(rb), x16, dx, nb, res, np.int64(r - r0))
            r += 1
    else:  # F16: float32 activations, exact products
        nc = np.int64(x.shape[0] // 16)
        while r + 4 <= r1:
            rows4_f16(w, np.int64(r * rb), np.int64(rb), x, dx, nc, res, np.int64(r - r0))
            r += 4
        while r < r1:
            rows1_f16(w, np.int64(r * rb), np.int64(rb), x, dx, nc, res, np.int64(r - r0))
            r += 1


@njit(fastmath=True)
def _rows_matmul(code, w, r0, r1, rb, X, X16, DX, res):
    """res[k, r - r0] = row_r . X[k] for the m rows of X [m, cols]: fused in-place dots per token up to
    _FUSED tokens (the weight rows stay in L1/L2), else the rows are dequantised once and multiplied
    with every token in register blocks (prefill; gemm.py)."""
    m = X.shape[0]
    if m <= _FUSED:
        for k in range(m):
            _rows_dot(code, w, r0, r1, rb, X[k], X16[k], DX[k], res[k])
        return
    deq_matmul(code, w, r0, r1, rb, X, res)


@njit(fastmath=True, cache=True)
def _moe_prep(x, experts, offs, tok):
    """Gather each expert's tokens (CSR order) and their int16 activations -> (xg [M, H], x16, dx, max
    tokens per expert). Each token is quantised once, however many of its experts run here (decode: 1
    token and top-k experts, 27 -> 4 us a layer on `small`)."""
    M, H = tok.shape[0], x.shape[1]
    q16, qd = _quant_rows(x)  # [T, H], [T, 2 H/32]
    xg = np.empty((M, H), np.float32)
    x16 = np.empty((M, H), np.int16)
    dx = np.empty((M, qd.shape[1]), np.float32)
    for a in range(M):  # element loops: numba's row assignment xg[a] = x[t] is 3x slower here
        t = tok[a]
        for h in range(H):
            xg[a, h] = x[t, h]
            x16[a, h] = q16[t, h]
        for j in range(qd.shape[1]):
            dx[a, j] = qd[t, j]
    maxm = 1
    for i in range(experts.shape[0]):
        maxm = max(maxm, offs[i + 1] - offs[i])
    return xg, x16, dx, maxm


@njit(fastmath=True, cache=True)
def _moe_up(it, gd, gc, ud, uc, F, experts, offs, xg, x16, dx, act):
    """Work item `it` of phase 1: act[a, f] = silu(gate x) * (up x) for one expert and _ROWS rows of F."""
    nch = (F + _ROWS - 1) // _ROWS
    i = it // nch
    r0 = (it % nch) * _ROWS
    r1 = min(F, r0 + _ROWS)
    e = experts[i]
    a0 = offs[i]
    m = offs[i + 1] - a0
    g = np.empty((m, _ROWS), np.float32)
    u = np.empty((m, _ROWS), np.float32)
    s = slice(a0, a0 + m)
    _rows_matmul(gc, gd[e], r0, r1, gd.shape[1] // F, xg[s], x16[s], dx[s], g)
    _rows_matmul(uc, ud[e], r0, r1, ud.shape[1] // F, xg[s], x16[s], dx[s], u)
    for k in range(m):
        silu_mul(g[k, :r1 - r0], u[k, :r1 - r0])
        for r in range(r1 - r0):
            act[a0 + k, r0 + r] = g[k, r]


@njit(fastmath=True, cache=True)
def _moe_down(it, dd, dc, H, experts, offs, tok, wts, act, a16, da, maxm, out):
    """Work item `it` of phase 2: _ROWS rows of out [T, H] (owned by this item), summed over experts."""
    r0 = it * _ROWS
    r1 = min(H, r0 + _ROWS)
    y = np.empty((maxm, _ROWS), np.float32)
    for i in range(experts.shape[0]):
        e = experts[i]
        a0 = offs[i]
        m = offs[i + 1] - a0
        _rows_matmul(dc, dd[e], r0, r1, dd.shape[1] // H, act[a0:a0 + m], a16[a0:a0 + m], da[a0:a0 + m], y)
        for k in range(m):
            t = tok[a0 + k]
            for r in range(r1 - r0):
                out[t, r0 + r] += wts[a0 + k] * y[k, r]


@njit(fastmath=True, cache=True)
def _expert_whole(i, gd, gc, ud, uc, dd, dc, F, H, experts, offs, tok, wts, xg, x16, dx, out):
    """Expert i of the CSR list, start to end on this thread: out[t] += w * down(silu(gate x) * up x) for
    each of its tokens t (weight w)."""
    e = experts[i]
    a0 = offs[i]
    m = offs[i + 1] - a0
    s = slice(a0, a0 + m)
    g = np.empty((m, F), np.float32)  # [m, F]: gate x, then the activation
    u = np.empty((m, F), np.float32)
    _rows_matmul(gc, gd[e], 0, F, gd.shape[1] // F, xg[s], x16[s], dx[s], g)
    _rows_matmul(uc, ud[e], 0, F, ud.shape[1] // F, xg[s], x16[s], dx[s], u)
    for k in range(m):
        silu_mul(g[k], u[k])
    a16, da = _quant_rows(g)
    y = np.empty((m, H), np.float32)  # [m, H]
    _rows_matmul(dc, dd[e], 0, H, dd.shape[1] // H, g, a16, da, y)
    for k in range(m):
        t = tok[a0 + k]
        for h in range(H):
            out[t, h] += wts[a0 + k] * y[k, h]


@njit(cache=True)
def _owners(offs, nthr):
    """Experts to threads, most tokens first onto the least loaded (longest processing time first)
    -> owner [n]."""
    m = offs[1:] - offs[:-1]
    owner = np.zeros(m.shape[0], np.int64)
    load = np.zeros(nthr, np.int64)
    for i in np.argsort(-m, kind="mergesort"):
        t = np.argmin(load)
        owner[i] = t
        load[t] += m[i]
    return owner


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _moe(gd, gc, ud, uc, dd, dc, F, H, x, experts, offs, tok, wts, act, out, nthr, whole):
    """SwiGLU experts: out[t] += sum_a wts[a] * down_e(silu(gate_e x_t) * up_e x_t), CSR by expert.

    gd/ud/dd: flat expert bytes [E, rows * row_bytes]; act [m, F] scratch; nthr the kernel threads.
    whole (whole_experts_per_thread: the experts split evenly over the threads, as one token's top-k
    does): each thread runs whole experts into its own partial output, one parallel region and no
    barrier between the up and the down products (expert GB/s at 2 threads, side by side: 1.07x on
    `small-q4`, 1.05-1.11x on `small`). Otherwise each matrix's rows split across the threads.
    """
    xg, x16, dx, maxm = _moe_prep(x, experts, offs, tok)
    if whole:
        owner = _owners(offs, nthr)
        part = np.zeros((nthr, out.shape[0], H), np.float32)
        for t in prange(nthr):
            for i in np.flatnonzero(owner == t):
                _expert_whole(i, gd, gc, ud, uc, dd, dc, F, H, experts, offs, tok, wts, xg, x16, dx, part[t])
        for t in range(nthr):
            out += part[t]
        return
    for it in prange(experts.shape[0] * ((F + _ROWS - 1) // _ROWS)):
        _moe_up(it, gd, gc, ud, uc, F, experts, offs, xg, x16, dx, act)
    a16, da = _quant_rows(act)
    for it in prange((H + _ROWS - 1) // _ROWS):
        _moe_down(it, dd, dc, H, experts, offs, tok, wts, act, a16, da, maxm, out)


@njit(nogil=True, fastmath=True, cache=True)
def _moe_serial(gd, gc, ud, uc, dd, dc, F, H, x, experts, offs, tok, wts, act, out, nthr=1, whole=False):
    """_moe on the calling thread (little work: a parallel region costs more than it saves); nthr and
    whole unused."""
    xg, x16, dx, maxm = _moe_prep(x, experts, offs, tok)
    for it in range(experts.shape[0] * ((F + _ROWS - 1) // _ROWS)):
        _moe_up(it, gd, gc, ud, uc, F, experts, offs, xg, x16, dx, act)
    a16, da = _quant_rows(act)
    for it in range((H + _ROWS - 1) // _ROWS):
        _moe_down(it, dd, dc, H, experts, offs, tok, wts, act, a16, da, maxm, out)


@njit(fastmath=True, cache=True)
def _quant_rows(x):
    """int16 activations of x [T, C]: (x16 [T, C], dx [T, 2 C/32]) (layout: simd.quant16)."""
    T, C = x.shape
    x16 = np.empty((T, C), np.int16)
    dx = np.empty((T, 2 * (C // 32)), np.float32)
    for t in range(T):
        quant16(x[t], x16[t], dx[t])
    return x16, dx


@njit(fastmath=True, cache=True)
def _chunk_off(wd, code, R, x, x16, dx, it, out, off):
    """Rows [it * _ROWS, (it + 1) * _ROWS) of W (R rows) into columns off + r of out [T, *] = x W^T."""
    T = x.shape[0]
    r0 = it * _ROWS
    r1 = min(R, r0 + _ROWS)
    res = np.empty((T, _ROWS), np.float32)
    _rows_matmul(code, wd, r0, r1, wd.shape[0] // R, x, x16, dx, res)
    for t in range(T):
        for r in range(r1 - r0):
            out[t, off + r0 + r] = res[t, r]


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _matmul(wd, code, R, x, out):
    """out[t, r] = W[r] . x[t] for one matrix (flat bytes wd, in place), rows across threads."""
    x16, dx = _quant_rows(x)
    for it in prange((R + _ROWS - 1) // _ROWS):
        _chunk_off(wd, code, R, x, x16, dx, it, out, 0)


@njit(nogil=True, fastmath=True, cache=True)
def _matmul_serial(wd, code, R, x, out):
    """_matmul on the calling thread (small matrices: a parallel region costs more than it saves)."""
    x16, dx = _quant_rows(x)
    for it in range((R + _ROWS - 1) // _ROWS):
        _chunk_off(wd, code, R, x, x16, dx, it, out, 0)


_SERIAL_BYTES = 1 << 20  # weight bytes x tokens below which _matmul_serial is used
_WHOLE_BALANCE = 1.1  # most loaded thread / mean (tokens as the load) up to which experts run whole


def thread_loads(counts, threads: int) -> np.ndarray:
    """Tokens per thread when whole experts (tokens routed to each: `counts`) go to `threads` threads
    as the kernel assigns them (_owners: most tokens first onto the least loaded)."""
    counts = np.asarray(counts, dtype=np.int64)
    offs = np.concatenate((np.zeros(1, np.int64), np.cumsum(counts)))
    return np.bincount(_owners(offs, max(1, threads)), weights=counts, minlength=max(1, threads)).astype(np.int64)


def _even_split(n: int, threads: int) -> bool:
    """Whether n one-token experts split evenly enough over the threads (loads ceil / floor of n / threads)."""
    return -(-n // threads) * threads <= _WHOLE_BALANCE * n


def whole_experts_per_thread(counts, threads: int) -> bool:
    """True when a CPU job of experts routed by `counts` tokens runs each expert start to end on one
    thread (one parallel region, no barrier between the up and the down products): at most _FUSED
    tokens an expert and the busiest thread within 1.1x the mean; else each matrix's rows split."""
    counts = np.asarray(counts)
    if counts.size == 0 or counts.max() > _FUSED:
        return False
    if counts.max() == 1:
        return _even_split(counts.size, threads)
    load = thread_loads(counts, threads)
    return bool(load.max() * load.size <= _WHOLE_BALANCE * load.sum())


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
def _parts_item(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, x16, dx, it, out):
    """Work item `it` over the row chunks of up to three stacked matrices (R = 0: absent)."""
    n0 = (R0 + _ROWS - 1) // _ROWS
    n1 = (R1 + _ROWS - 1) // _ROWS
    if it < n0:
        _chunk_off(w0, c0, R0, x, x16, dx, it, out, 0)
    elif it < n0 + n1:
        _chunk_off(w1, c1, R1, x, x16, dx, it - n0, out, R0)
    else:
        _chunk_off(w2, c2, R2, x, x16, dx, it - n0 - n1, out, R0 + R1)


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _parts(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, out):
    """out [T, R0 + R1 + R2] = x [W0; W1; W2]^T: one activation quantisation, rows across threads."""
    x16, dx = _quant_rows(x)
    n = (R0 + _ROWS - 1) // _ROWS + (R1 + _ROWS - 1) // _ROWS + (R2 + _ROWS - 1) // _ROWS
    for it in prange(n):
        _parts_item(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, x16, dx, it, out)


@njit(nogil=True, fastmath=True, cache=True)
def _parts_serial(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, out):
    """_parts on the calling thread."""
    x16, dx = _quant_rows(x)
    n = (R0 + _ROWS - 1) // _ROWS + (R1 + _ROWS - 1) // _ROWS + (R2 + _ROWS - 1) // _ROWS
    for it in range(n):
        _parts_item(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, x16, dx, it, out)


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


@njit(cache=True)
def _csr(ids, w, keep):
    """Counting sort of routing ids/w [T, K] by expert, kept experts only (keep [E] bool)."""
    T, K = ids.shape
    E = keep.shape[0]
    cnt = np.zeros(E + 1, np.int64)
    for t in range(T):
        for k in range(K):
            if keep[ids[t, k]]:
                cnt[ids[t, k] + 1] += 1
    n = 0
    for e in range(E):
        n += cnt[e + 1] > 0
    experts = np.empty(n, np.int32)
    offs = np.zeros(n + 1, np.int32)
    pos = np.zeros(E, np.int64)
    j = 0
    for e in range(E):
        if cnt[e + 1] > 0:
            experts[j] = e
            offs[j + 1] = offs[j] + cnt[e + 1]
            pos[e] = offs[j]
            j += 1
    tok = np.empty(offs[n], np.int32)
    wts = np.empty(offs[n], np.float32)
    for t in range(T):  # token order within an expert
        for k in range(K):
            e = ids[t, k]
            if keep[e]:
                tok[pos[e]] = t
                wts[pos[e]] = w[t, k]
                pos[e] += 1
    return experts, offs, tok, wts


def csr(experts_per_tok: np.ndarray, weights: np.ndarray, keep=None):
    """Group routing [T, K] by expert -> (experts int32 [n], offs [n+1], tok [m], wts [m]).

    keep: None (all), a bool mask [E] or a predicate on expert ids: the experts this tier computes.
    """
    ids = np.ascontiguousarray(experts_per_tok, dtype=np.int64)
    E = int(ids.max()) + 1 if ids.size else 0
    if keep is None:
        mask = np.ones(E, dtype=bool)
    elif callable(keep):
        mask = np.array([bool(keep(e)) for e in range(E)], dtype=bool)
    else:
        mask = np.asarray(keep, dtype=bool)
    return _csr(ids, np.ascontiguousarray(weights, dtype=np.float32), mask)


def moe_kernel(n_experts: int, expert_bytes: int, offs, whole: bool = True) -> tuple:
    """(kernel, nthr, whole) for a CPU job of n_experts experts: the serial kernel when the work is
    small, else the parallel one with whole experts per thread when `whole` is allowed and
    whole_experts_per_thread says so for the job's tokens per expert."""
    if n_experts * expert_bytes < _SERIAL_BYTES:
        return _moe_serial, 1, False
    nthr = numba.get_num_threads()
    if whole and int(offs[n_experts]) == n_experts:  # one token an expert (decode), decided without numpy
        return _moe, nthr, _even_split(n_experts, nthr)  # (8 us a layer less)
    return _moe, nthr, bool(whole and whole_experts_per_thread(np.diff(offs), nthr))


def moe_cpu(gate, up, down, x: np.ndarray, experts, offs, tok, wts, out: np.ndarray | None = None,
            whole: bool = True) -> np.ndarray:
    """Routed SwiGLU experts on the CPU for x [T, H] (CSR routing), in place from the mmap -> [T, H] f32.
    whole=False: rows split across threads even where whole experts per thread would balance."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.zeros((x.shape[0], down.rows), np.float32)
    act = np.empty((max(1, tok.shape[0]), gate.rows), np.float32)
    if experts.shape[0]:
        fn, nthr, w = moe_kernel(experts.shape[0], gate.expert_bytes + up.expert_bytes + down.expert_bytes,
                                 offs, whole)
        fn(flat(gate), gate.code, flat(up), up.code, flat(down), down.code, gate.rows, down.rows,
           x, experts, offs, tok, wts, act, out, nthr, w)
    return out


def warm_up(gate, up, down, parts=None) -> None:
    """Load (or compile) the serial and the parallel expert kernels, and the stacked-matrix ones for
    `parts` when given, for these weights' array types: one expert of real weights, one zero token, so
    a step's first call does not pay for it (numba loads a specialisation at its first call)."""
    x = np.zeros((1, down.rows), np.float32)
    experts, offs, tok, wts = csr(np.zeros((1, 1), np.int64), np.ones((1, 1), np.float32))
    act = np.empty((1, gate.rows), np.float32)
    out = np.zeros_like(x)
    for fn in (_moe_serial, _moe):
        fn(flat(gate), gate.code, flat(up), up.code, flat(down), down.code, gate.rows, down.rows,
           x, experts, offs, tok, wts, act, out, numba.get_num_threads(), False)
    if parts:
        xp = np.zeros((1, parts[0][3]), np.float32)
        ps = list(parts) + [(parts[0][0][:0], parts[0][1], 0, None)] * (3 - len(parts))
        o = np.empty((1, sum(q[2] for q in parts)), np.float32)
        for fn in (_parts_serial, _parts):
            fn(ps[0][0], ps[0][1], ps[0][2], ps[1][0], ps[1][1], ps[1][2], ps[2][0], ps[2][1], ps[2][2], xp, o)


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
