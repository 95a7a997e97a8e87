"""The routed SwiGLU experts on the CPU: a step's routing grouped by expert (CSR) and the numba expert
kernels over it, reading the quantised expert tensors in place (the row kernels of kernels.py).

A decode job whose experts split evenly over the threads runs each expert start to end on one
thread (gate, up, activation, down into the thread's own partial output: one parallel region, no
barrier); other jobs split each matrix's rows across the threads; small jobs run on the calling
thread (a parallel region costs more than it saves). Each token is quantised to int16 once per job.
Experts with prefill-sized token counts (gemm.GEMM_TOKENS or more) take the GEMM path: their tokens are packed
once a job (gemm.pack_into), and the rows split into few large items (two an
expert for gate / up, 2 x threads for down), each of which streams the panels once.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

# the choice of whole experts per thread is a policy the simulator charges too: one statement of it
from simulator.policies import WHOLE_BALANCE, WHOLE_TOKENS, thread_loads, whole_experts_per_thread  # noqa: F401

from .gemm import pack_into
from .kernel_table import table_rows_matmul
from .kernels import (_FUSED, _SERIAL_BYTES, NT, _parts, _parts_serial, _quant_needed, _quant_rows, flat, gemm_path,
                      int_panels, item_rows, panels, prange_only, quant_empty, quant_row, reads_int16)
from .qgemm import gemm_pack, gemm_width, row_range
from .nbcache import drop_stale_cache
from .simd import silu_mul

drop_stale_cache(__file__)
# moe_routed calls a parallel kernel from compiled code, which finds numba's thread pool running only
# if a call from Python started it (as in dense_kernels)
numba.get_num_threads()


@njit(fastmath=True, cache=True)
def _moe_prep(x, experts, offs, tok, fused, floats=True, ints16=True):
    """Gather each expert's tokens (CSR order) and their int16 activations -> (xg [M, H], x16, dx, max
    tokens per expert). Each token is quantised once, however many of its experts run here (decode: 1
    token and top-k experts, 27 -> 6 us a layer on `small`). The int16 rows are copied only for experts of
    at most `fused` tokens (the largest _FUSED of the gate's and up's types): above it the products read the
    GEMM's panels, packed from the float rows or from each token's int16 row (q16 / qd [T, ..], returned too), and
    dx's rows are long with AVX-512 VNNI (vnni.split8: prefill's 4,096 copies a `small-q4` layer cost ~100 ms a
    512-token prompt). The float rows are gathered only where `floats`: the fused int16 rows and the integer
    panels read none (kernels.int_panels; xg is then uninitialised, its shape all they take), and at 64 tokens the
    4 MB copy of a `small` layer's xg was 2.5 ms of a 32 ms job on 2 threads, run on one. The tokens are quantised
    only where `ints16` (some product reads int16 rows: _reads_int16; int8 panels read the floats)."""
    M, H = tok.shape[0], x.shape[1]
    q16, qd = _quant_needed(x, ints16)  # [T, H], [T, 2 H/32 ..]
    xg = np.empty((M, H), np.float32)
    x16 = np.empty((M, H), np.int16)
    dx = np.empty((M, qd.shape[1]), np.float32)
    maxm = 1
    for i in range(experts.shape[0]):
        m = offs[i + 1] - offs[i]
        maxm = max(maxm, m)
        for a in range(offs[i], offs[i + 1]):  # element loops: numba's row assignment xg[a] = x[t] is 3x slower
            t = tok[a]
            if floats:
                for h in range(H):
                    xg[a, h] = x[t, h]
            if m <= fused:
                for h in range(H):
                    x16[a, h] = q16[t, h]
                for j in range(qd.shape[1]):
                    dx[a, j] = qd[t, j]
    return xg, x16, dx, maxm, q16, qd


@njit(cache=True)
def _reads_int16(offs, c0, c1):
    """Whether any expert of a CSR job reads its tokens' int16 rows through products of types c0 / c1
    (kernels.reads_int16)."""
    for i in range(offs.shape[0] - 1):
        if reads_int16(offs[i + 1] - offs[i], c0, c1, R1=1):
            return True
    return False


@njit(fastmath=True, cache=True)
def _pack_expert(P, b, xs, X, x16, dx, rows, ints):
    """One expert's m tokens into the panels P[b:b + ceil(m / NT)]: integer ones from rows `rows` [m] of x16 / dx
    (int16) or of X (int8) where `ints` (qgemm.gemm_pack), else float ones from its gathered rows xs [m, C]
    (gemm.pack_into)."""
    if ints:
        gemm_pack(P, b, X, x16, dx, rows)
    else:
        pack_into(P, b, xs)


@njit(cache=True)
def _panel_array(nblocks, C, ints):
    """Uninitialised token panels of nblocks blocks for rows of C values, integer (qgemm.gemm_width) or float."""
    return np.empty((nblocks, gemm_width(C) if ints else C, NT), np.float32)


@njit(cache=True)
def _panel_blocks(offs, c0, c1):
    """Each expert's first block in the stacked token panels of a CSR job [n + 1]: expert i's are
    P[pb[i]:pb[i + 1]], none unless its products with type c0 or c1 take the GEMM path (kernels.gemm_path)."""
    n = offs.shape[0] - 1
    pb = np.zeros(n + 1, np.int64)
    for i in range(n):
        m = offs[i + 1] - offs[i]
        pb[i + 1] = pb[i] + ((m + NT - 1) // NT if gemm_path(m, c0) or gemm_path(m, c1) else 0)
    return pb


@njit(fastmath=True, cache=True)
def _expert_panels(xs, X, x16, dx, rows, offs, c0, c1):
    """The stacked token panels of every expert's rows of xs [M, C] (the same rows: rows [M] of X and of the int16 x16 /
    dx), on this thread (_panel_blocks, _pack_expert) -> (P, pb)."""
    pb = _panel_blocks(offs, c0, c1)
    ints = int_panels(c0, c1, R1=1)
    P = _panel_array(pb[-1], xs.shape[1], ints)
    for i in range(offs.shape[0] - 1):
        if pb[i + 1] > pb[i]:
            _pack_expert(P, pb[i], xs[offs[i]:offs[i + 1]], X, x16, dx, rows[offs[i]:offs[i + 1]], ints)
    return P, pb


@njit(fastmath=True, cache=True)
def _moe_up(it, gd, gc, ud, uc, F, experts, offs, xg, x16, dx, P, pb, n, act):
    """Work item `it` of phase 1: act[a, f] = silu(gate x) * (up x) for one expert and n rows of F (P, pb:
    the experts' token panels, _expert_panels)."""
    nch = (F + n - 1) // n
    i = it // nch
    r0 = (it % nch) * n
    r1 = min(F, r0 + n)
    e = experts[i]
    a0 = offs[i]
    m = offs[i + 1] - a0
    g = np.empty((m, n), np.float32)
    u = np.empty((m, n), np.float32)
    s = slice(a0, a0 + m)
    Pi = P[pb[i]:pb[i + 1]]
    table_rows_matmul(gc, gd[e], r0, r1, gd.shape[1] // F, xg[s], x16[s], dx[s], Pi, g, np.int64(0))
    table_rows_matmul(uc, ud[e], r0, r1, ud.shape[1] // F, xg[s], x16[s], dx[s], Pi, u, np.int64(0))
    for k in range(m):
        silu_mul(g[k, :r1 - r0], u[k, :r1 - r0])
        for r in range(r1 - r0):
            act[a0 + k, r0 + r] = g[k, r]


@njit(fastmath=True, cache=True)
def _moe_down(it, dd, dc, H, experts, offs, tok, wts, act, a16, da, P, pb, n, maxm, out):
    """Work item `it` of phase 2: n rows of out [T, H] (owned by this item), summed over experts."""
    r0 = it * n
    r1 = min(H, r0 + n)
    y = np.empty((maxm, n), np.float32)
    for i in range(experts.shape[0]):
        e = experts[i]
        a0 = offs[i]
        m = offs[i + 1] - a0
        table_rows_matmul(dc, dd[e], r0, r1, dd.shape[1] // H, act[a0:a0 + m], a16[a0:a0 + m], da[a0:a0 + m],
                          P[pb[i]:pb[i + 1]], y, np.int64(0))
        for k in range(m):
            t = tok[a0 + k]
            for r in range(r1 - r0):
                out[t, r0 + r] += wts[a0 + k] * y[k, r]


@njit(fastmath=True, cache=True)
def _expert_whole(i, gd, gc, ud, uc, dd, dc, F, H, experts, offs, tok, wts, x, xg, x16, dx, q16, qd, out):
    """Expert i of the CSR list, start to end on this thread: out[t] += w * down(silu(gate x) * up x) for
    each of its tokens t (weight w; x [T, H] / q16 / qd: each token's float and int16 row, for integer panels)."""
    e = experts[i]
    a0 = offs[i]
    m = offs[i + 1] - a0
    s = slice(a0, a0 + m)
    g = np.empty((m, F), np.float32)  # [m, F]: gate x, then the activation
    u = np.empty((m, F), np.float32)
    P = np.zeros((0, H, NT), np.float32)
    if gemm_path(m, gc) or gemm_path(m, uc):
        ints = int_panels(gc, uc, R1=1)
        P = _panel_array((m + NT - 1) // NT, H, ints)
        _pack_expert(P, np.int64(0), xg[s], x, q16, qd, tok[a0:a0 + m], ints)
    table_rows_matmul(gc, gd[e], np.int64(0), F, gd.shape[1] // F, xg[s], x16[s], dx[s], P, g, np.int64(0))
    table_rows_matmul(uc, ud[e], np.int64(0), F, ud.shape[1] // F, xg[s], x16[s], dx[s], P, u, np.int64(0))
    for k in range(m):
        silu_mul(g[k], u[k])
    a16, da = _quant_needed(g, reads_int16(m, dc))
    y = np.empty((m, H), np.float32)  # [m, H]
    P = panels(g, a16, da, gemm_path(m, dc), int_panels(dc))
    table_rows_matmul(dc, dd[e], np.int64(0), H, dd.shape[1] // H, g, a16, da, P, y, np.int64(0))
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


@njit(parallel=prange_only(), nogil=True, fastmath=True, cache=True)
def _moe(gd, gc, ud, uc, dd, dc, F, H, x, experts, offs, tok, wts, act, out, nthr, whole):
    """SwiGLU experts: out[t] += sum_a wts[a] * down_e(silu(gate_e x_t) * up_e x_t), CSR by expert.

    gd/ud/dd: flat expert bytes [E, rows * row_bytes]; act [m, F] scratch; nthr the kernel threads.
    whole (whole_experts_per_thread: the experts split evenly over the threads, as one token's top-k
    does): each thread runs whole experts into its own partial output, one parallel region and no
    barrier between the up and the down products (expert GB/s at 2 threads, side by side: 1.07x on
    `small-q4`, 1.05-1.11x on `small`). Otherwise each matrix's rows split across the threads.
    """
    xg, x16, dx, maxm, q16, qd = _moe_prep(x, experts, offs, tok, max(_FUSED[gc], _FUSED[uc]),
                                           not int_panels(gc, uc, R1=1), _reads_int16(offs, gc, uc))
    if whole:
        owner = _owners(offs, nthr)
        part = np.zeros((nthr, out.shape[0], H), np.float32)
        for t in prange(nthr):
            for i in range(owner.shape[0]):
                if owner[i] == t:
                    _expert_whole(i, gd, gc, ud, uc, dd, dc, F, H, experts, offs, tok, wts, x, xg, x16, dx, q16,
                                  qd, part[t])
        for t in range(nthr):
            out += part[t]
        return
    pb = _panel_blocks(offs, gc, uc)
    ints = int_panels(gc, uc, R1=1)
    P = _panel_array(pb[-1], H, ints)
    if pb[-1]:  # some expert takes the GEMM: its tokens packed here, in parallel
        for i in prange(experts.shape[0]):
            if pb[i + 1] > pb[i]:
                _pack_expert(P, pb[i], xg[offs[i]:offs[i + 1]], x, q16, qd, tok[offs[i]:offs[i + 1]], ints)
    n = item_rows(pb[-1] > 0, F, 2)  # GEMM: two items an expert
    for it in prange(experts.shape[0] * ((F + n - 1) // n)):
        _moe_up(np.int64(it), gd, gc, ud, uc, F, experts, offs, xg, x16, dx, P, pb, n, act)
    a16, da = quant_empty(tok.shape[0], F)  # the rows phase 1 wrote (act may be longer), across the threads: each
    skip = np.zeros(tok.shape[0], np.bool_)  # row the serial loop's bits (4,096 rows of `small` at pp512: 3.7 ms on
    for i in range(experts.shape[0]):  # one), but those of experts whose down product reads none (int8 panels)
        skip[offs[i]:offs[i + 1]] = not reads_int16(offs[i + 1] - offs[i], dc)
    for t in prange(tok.shape[0]):
        if not skip[t]:
            quant_row(act[t], a16[t], da[t])
    pb = _panel_blocks(offs, dc, dc)
    ints = int_panels(dc)
    P = _panel_array(pb[-1], F, ints)
    if pb[-1]:
        rows = row_range(tok.shape[0])
        for i in prange(experts.shape[0]):
            if pb[i + 1] > pb[i]:
                _pack_expert(P, pb[i], act[offs[i]:offs[i + 1]], act, a16, da, rows[offs[i]:offs[i + 1]], ints)
    n = item_rows(pb[-1] > 0, H, 2 * nthr)
    for it in prange((H + n - 1) // n):
        _moe_down(np.int64(it), dd, dc, H, experts, offs, tok, wts, act, a16, da, P, pb, n, maxm, out)


@njit(nogil=True, fastmath=True, cache=True)
def _moe_serial(gd, gc, ud, uc, dd, dc, F, H, x, experts, offs, tok, wts, act, out, nthr=1, whole=False):
    """_moe on the calling thread (little work: a parallel region costs more than it saves); nthr and
    whole unused."""
    xg, x16, dx, maxm, q16, qd = _moe_prep(x, experts, offs, tok, max(_FUSED[gc], _FUSED[uc]),
                                           not int_panels(gc, uc, R1=1), _reads_int16(offs, gc, uc))
    P, pb = _expert_panels(xg, x, q16, qd, tok, offs, gc, uc)
    for i in range(experts.shape[0]):  # each expert's matrices in one call (F rows an item)
        _moe_up(np.int64(i), gd, gc, ud, uc, F, experts, offs, xg, x16, dx, P, pb, F, act)
    a16, da = _quant_rows(act[:tok.shape[0]])  # the rows phase 1 wrote (act may be longer)
    P, pb = _expert_panels(act, act, a16, da, row_range(tok.shape[0]), offs, dc, dc)
    _moe_down(np.int64(0), dd, dc, H, experts, offs, tok, wts, act, a16, da, P, pb, H, maxm, out)


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


@njit(cache=True)
def _whole(offs, nthr):
    """whole_experts_per_thread for the CSR offsets offs [n + 1], in numba: the choice both moe_kernel and
    moe_routed make at run time (whole_experts_per_thread is its readable statement, tested against it)."""
    n = offs.shape[0] - 1
    if offs[n] == n:  # one token an expert (decode)
        return -(-n // nthr) * nthr <= WHOLE_BALANCE * n
    for i in range(n):
        if offs[i + 1] - offs[i] > WHOLE_TOKENS:
            return False
    owner = _owners(offs, nthr)
    load = np.zeros(nthr, np.int64)
    for i in range(n):
        load[owner[i]] += offs[i + 1] - offs[i]
    return load.max() * nthr <= WHOLE_BALANCE * load.sum()


def moe_kernel(n_experts: int, expert_bytes: int, offs, whole: bool = True,
               serial_bytes: int = _SERIAL_BYTES) -> tuple:
    """(kernel, nthr, whole) for a CPU job of n_experts experts: the serial kernel when the work is
    under serial_bytes, else the parallel one with whole experts per thread when `whole` is allowed and
    whole_experts_per_thread says so for the job's tokens per expert."""
    if n_experts * expert_bytes < serial_bytes:
        return _moe_serial, 1, False
    nthr = numba.get_num_threads()
    return _moe, nthr, bool(whole and _whole(offs[:n_experts + 1], nthr))


@njit(nogil=True, fastmath=True, cache=True)
def moe_routed(gd, gc, ud, uc, dd, dc, F, H, x, ids, w, keep, act, out, expert_bytes, serial_bytes, nthr,
               fresh, resid):
    """A layer's routed experts in one call from Python: the CSR of the routing ids / w [T, k] (experts
    with keep[e] only), moe_kernel's choice (serial under serial_bytes, else nthr threads, whole experts
    per thread where they balance) and the SwiGLU experts, out[t] += sum_a w_a expert_a(x_t)
    -> the experts run, int32 [n]. Three calls and their glue from Python cost ~5 us a layer more.
    fresh: out is zeroed first; resid [T, H] (or [0, H]: nothing): then resid += out (the caller's
    residual add, the same float adds, without two numpy calls). As attention_step, one signature
    for every caller: one compiled specialisation for both steps."""
    if fresh:
        out[:] = 0.0
    experts, offs, tok, wts = _csr(ids, w, keep)
    n = experts.shape[0]
    if n and n * expert_bytes < serial_bytes:
        _moe_serial(gd, gc, ud, uc, dd, dc, F, H, x, experts, offs, tok, wts, act, out, np.int64(1), np.bool_(False))
    elif n:
        _moe(gd, gc, ud, uc, dd, dc, F, H, x, experts, offs, tok, wts, act, out, nthr, _whole(offs, nthr))
    for t in range(resid.shape[0]):
        for j in range(resid.shape[1]):
            resid[t, j] += out[t, j]
    return experts


def moe_cpu(gate, up, down, x: np.ndarray, experts, offs, tok, wts, out: np.ndarray | None = None,
            whole: bool = True, serial_bytes: int = _SERIAL_BYTES) -> np.ndarray:
    """Routed SwiGLU experts on the CPU for x [T, H] (CSR routing), in place from the mmap -> [T, H] f32.
    whole=False: rows split across threads even where whole experts per thread would balance;
    serial_bytes: the job size below which it runs on this thread (kernels.SERIAL_BYTES_HOT where
    nothing else computes on the cores meanwhile)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if out is None:
        out = np.zeros((x.shape[0], down.rows), np.float32)
    act = np.empty((max(1, tok.shape[0]), gate.rows), np.float32)
    if experts.shape[0]:
        fn, nthr, w = moe_kernel(experts.shape[0], gate.expert_bytes + up.expert_bytes + down.expert_bytes,
                                 offs, whole, serial_bytes)
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
