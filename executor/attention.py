"""Causal GQA attention over the KV cache on the CPU (numba), for new tokens of S streams.

The unit of work is one query head of one new token (as llama.cpp's CPU attention splits the output's
rows): scores against the cached keys, softmax, the weighted sum of the cached values, with 1-D
contiguous rows so the loops over the head dimension vectorise. Softmax uses simd.exp32, which
vectorises; numba's np.exp is a scalar libm call per score. Items run across threads when there is
enough of them (a prompt, or a long context; a parallel region costs ~2 us while the threads spin):
decode at a 4,000-token context and a 512-token prompt take 0.4-0.6x the time of the single-thread
kernel before (README, the row "attention and short products on the CPU"; `benchmarks/bench_attention.py`).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .attention_tiles import KT_KEYS, PV_DIMS, QB, scores_tile, values_tile
from .kernels import prange_only
from .nbcache import drop_stale_cache
from .simd import dot_f32, exp32, sum_f32

drop_stale_cache(__file__)

# multiply-adds (scores and values, all heads) below which the items run on the calling thread
SERIAL_MACS = 1 << 16
LANES = 64  # interleaved shares of the work items, split over the threads


@njit(fastmath=True, error_model="numpy", cache=True)
def _attend(qkv, kc, vc, it, p0, n, nh, nkv, sc, out):
    """Work item it = (s, j, h) of S * n * nh: out[s * n + j, h * hd:(h + 1) * hd] = softmax(q_h .
    K[:p0 + j + 1] / sqrt(hd)) V of query head h's KV head (K / V already cached); sc: scratch of at
    least p0 + n floats. Rows are 1-D contiguous views, so the loops over hd vectorise (indexing a
    [g, hd] slice of qkv instead ran 2x slower).

    The two sums (q . k over hd, and the softmax's over T) go through simd.dot_f32 / sum_f32, whose order is
    fixed: as plain fastmath loops LLVM grouped them per compilation context, and numba's cached copy of
    the parallel `_attend_all` came out 1 ulp off the serial items from a checkout's second run on (Zen 4)."""
    hd = qkv.shape[2]
    h = it % nh
    r = it // nh  # the token row s * n + j
    s, j = r // n, r % n
    kvh = h // (nh // nkv)
    T = p0 + j + 1
    scale = np.float32(1.0) / np.sqrt(np.float32(hd))
    q = qkv[r, h]
    ks, vs = kc[s, kvh], vc[s, kvh]  # [ctx, hd]
    h8 = hd // 8
    m = np.float32(-np.inf)
    for t in range(T):
        kt = ks[t]
        v = dot_f32(q, kt, h8)
        for d in range(8 * h8, hd):
            v = v + q[d] * kt[d]
        v *= scale
        sc[t] = v
        m = max(m, v)
    for t in range(T):
        sc[t] = exp32(sc[t] - m)
    z = sum_f32(sc, T // 8)
    for t in range(8 * (T // 8), T):
        z = z + sc[t]
    o = out[r, h * hd:(h + 1) * hd]
    for d in range(hd):
        o[d] = 0.0
    for t in range(T):
        vt = vs[t]
        p = sc[t]
        for d in range(hd):
            o[d] += p * vt[d]
    inv = np.float32(1.0) / z
    for d in range(hd):
        o[d] *= inv


@njit(fastmath=True, cache=True)
def _append(qkv, kc, vc, p0, n, nh, nkv):
    """K / V of the n new tokens of each stream (qkv [S * n, nh + 2 nkv, hd]) into the caches at p0."""
    hd = qkv.shape[2]
    for r in range(qkv.shape[0]):
        s, j = r // n, r % n
        for h in range(nkv):
            for d in range(hd):
                kc[s, h, p0 + j, d] = qkv[r, nh + h, d]
                vc[s, h, p0 + j, d] = qkv[r, nh + nkv + h, d]


@njit(inline="always")
def by_blocks(n, hd):
    """Whether n new tokens of a stream go QB queries a work item (_attend_block): a prompt, and a head width of
    whole value tiles."""
    return n >= QB and hd % PV_DIMS == 0


@njit(fastmath=True, cache=True)
def _keys_transposed(kc, T):
    """The first T cached keys of every stream and KV head transposed, [S, nkv, hd, T rounded up to KT_KEYS], zeros
    past T (a scores tile reads KT_KEYS keys at a time)."""
    S, nkv, _, hd = kc.shape
    KT = np.zeros((S, nkv, hd, (T + KT_KEYS - 1) // KT_KEYS * KT_KEYS), np.float32)
    for s in range(S):
        for h in range(nkv):
            for t in range(T):
                for d in range(hd):
                    KT[s, h, d, t] = kc[s, h, t, d]
    return KT


@njit(cache=True)
def _block_scratch(hd, KT):
    """One lane's scratch for _attend_block: (Qb [QB, hd], P [QB, KT's keys], Ob [QB, hd])."""
    return np.empty((QB, hd), np.float32), np.empty((QB, KT.shape[3]), np.float32), np.empty((QB, hd), np.float32)


@njit(fastmath=True, error_model="numpy", cache=True)
def _attend_block(qkv, KT, vc, it, p0, n, nh, nkv, Qb, P, Ob, out):
    """Work item it = (s, b, h) of S * ceil(n / QB) * nh: new tokens QB b .. QB b + QB - 1 of stream s through query
    head h, as _attend takes each (the output rows they own), QB at a time through attention_tiles' register
    tiles (KT: _keys_transposed; Qb [QB, hd], P [QB, KT's keys], Ob [QB, hd]: scratch)."""
    hd = qkv.shape[2]
    nb = (n + QB - 1) // QB
    h = it % nh
    r = it // nh
    s, b = r // nb, r % nb
    j0 = QB * b
    nq = min(QB, n - j0)
    kvh = h // (nh // nkv)
    T = p0 + j0 + nq  # the keys the block's last query sees
    scale = np.float32(1.0) / np.sqrt(np.float32(hd))
    for q in range(QB):
        for d in range(hd):
            Qb[q, d] = qkv[s * n + j0 + q, h, d] * scale if q < nq else np.float32(0.0)
    for t0 in range(0, T, KT_KEYS):
        scores_tile(Qb, KT[s, kvh], np.int64(t0), P)
    z = np.empty(QB, np.float32)
    for q in range(QB):
        Tq = p0 + j0 + q + 1 if q < nq else 0  # causal: the keys of query q; none for a short block's padding
        row = P[q]
        m = np.float32(-np.inf)
        for t in range(Tq):
            m = max(m, row[t])
        for t in range(Tq):
            row[t] = exp32(row[t] - m)
        zq = sum_f32(row, Tq // 8)
        for t in range(8 * (Tq // 8), Tq):
            zq = zq + row[t]
        z[q] = zq
        for t in range(Tq, T):
            row[t] = np.float32(0.0)
    Ob[:, :] = np.float32(0.0)
    for d0 in range(0, hd, PV_DIMS):
        values_tile(P, vc[s, kvh], np.int64(T), np.int64(d0), Ob)
    for q in range(nq):
        inv = np.float32(1.0) / z[q]
        o = out[s * n + j0 + q, h * hd:(h + 1) * hd]
        for d in range(hd):
            o[d] = Ob[q, d] * inv


@njit(parallel=prange_only(), fastmath=True, cache=True)
def _attend_all(qkv, kc, vc, p0, n, nh, nkv, out):
    """_attend for every item across threads, in LANES interleaved lanes (lane c takes items c, c + LANES,
    ...: a prompt's later tokens see more keys, so contiguous shares would be unbalanced), each with one
    scratch row of its own; the threads split the lanes. A prompt of QB tokens or more (a head width of whole
    PV_DIMS) goes QB queries an item (_attend_block), the keys transposed once a call."""
    hd = qkv.shape[2]
    if by_blocks(n, hd):
        KT = _keys_transposed(kc, p0 + n)
        m = (qkv.shape[0] // n) * ((n + QB - 1) // QB) * nh
        lanes = min(LANES, m)
        for c in prange(lanes):
            Qb, P, Ob = _block_scratch(hd, KT)
            for it in range(c, m, lanes):
                _attend_block(qkv, KT, vc, it, p0, n, nh, nkv, Qb, P, Ob, out)
        return
    m = qkv.shape[0] * nh
    lanes = min(LANES, m)
    for c in prange(lanes):
        sc = np.empty(p0 + n, np.float32)
        for it in range(c, m, lanes):
            _attend(qkv, kc, vc, it, p0, n, nh, nkv, sc, out)


@njit(fastmath=True, cache=True)
def attn_cached(qkv, kc, vc, p0, n, nh, nkv, out):
    """Causal GQA attention of new tokens: qkv [S * n, nh + 2 nkv, hd] (Q and K already normed and rotated);
    stores K / V of the n new tokens at p0.. of the caches kc / vc [S, nkv, ctx, hd], then
    out[s * n + j, h * hd:(h + 1) * hd] = softmax(q . K[: p0 + j + 1] / sqrt(hd)) V: a token at a time (decode), a
    prompt QB tokens at a time (by_blocks), on this thread under SERIAL_MACS, else across threads."""
    _append(qkv, kc, vc, p0, n, nh, nkv)
    S = qkv.shape[0] // n
    macs = 2 * S * nh * qkv.shape[2] * (n * p0 + n * (n + 1) // 2)
    hd = qkv.shape[2]
    if macs < SERIAL_MACS and by_blocks(n, hd):
        KT = _keys_transposed(kc, p0 + n)
        Qb, P, Ob = _block_scratch(hd, KT)
        for it in range(S * ((n + QB - 1) // QB) * nh):
            _attend_block(qkv, KT, vc, it, p0, n, nh, nkv, Qb, P, Ob, out)
    elif macs < SERIAL_MACS:
        sc = np.empty(p0 + n, np.float32)
        for it in range(qkv.shape[0] * nh):
            _attend(qkv, kc, vc, it, p0, n, nh, nkv, sc, out)
    else:
        _attend_all(qkv, kc, vc, p0, n, nh, nkv, out)
