"""Numba kernels of the dense path on the CPU: norms, Q/K norm and RoPE, the router's top-k, and
`attention_step`, which runs a layer's whole attention block in one call, the cached attention of
attention.py included (the per-call cost of five separate kernels and their numpy glue was ~0.1 ms
a layer, as much as the bytes of a small model's attention weights take to read)."""
from __future__ import annotations

import numba
import numpy as np
from numba import njit

from .attention import attn_cached
from .kernels import SERIAL_BYTES_HOT, _parts, _parts_serial
from .nbcache import drop_stale_cache

drop_stale_cache(__file__)
# attention_step calls a parallel kernel from compiled code, which finds numba's thread pool
# running only if a call from Python started it: without this, a first call segfaults.
numba.get_num_threads()


@njit(fastmath=True, cache=True)
def norm_route(x, nw, eps, rw, k, h, ids, wts):
    """RMSNorm of x [T, H] (weight nw) into h, router logits h rw^T (rw [E, H] f32), top-k by logit
    (descending) into ids [T, k] int64 and softmax over the top-k into wts [T, k] f32."""
    T, H = x.shape
    E = rw.shape[0]
    lg = np.empty(E, np.float32)
    rms_rows(x, nw, eps, h)
    for t in range(T):
        for e in range(E):
            a = np.float32(0.0)
            for j in range(H):
                a += h[t, j] * rw[e, j]
            lg[e] = a
        for i in range(k):
            b = 0
            bv = np.float32(-np.inf)
            for e in range(E):
                if lg[e] > bv:
                    bv = lg[e]
                    b = e
            ids[t, i] = b
            wts[t, i] = bv
            lg[b] = -np.inf
        m = wts[t, 0]
        z = np.float32(0.0)
        for i in range(k):
            wts[t, i] = np.exp(wts[t, i] - m)
            z += wts[t, i]
        for i in range(k):
            wts[t, i] /= z


@njit(fastmath=True, cache=True)
def rms_rows(x, w, eps, out):
    """out[i] = x[i] / rms(x[i]) * w for rows of x [N, d] (float32, CPU fast path of the dense norms)."""
    d = x.shape[1]
    for i in range(x.shape[0]):
        s = np.float32(0.0)
        for j in range(d):
            s += x[i, j] * x[i, j]
        r = np.float32(1.0) / np.sqrt(s / np.float32(d) + np.float32(eps))
        for j in range(d):
            out[i, j] = x[i, j] * r * w[j]


@njit(fastmath=True, cache=True)
def qk_post(qkv, qn, kn, eps, cos, sin, nh, nkv, neox, norm):
    """In place on qkv [T, nh + 2 nkv, hd]: RMSNorm (qn / kn) then RoPE (cos/sin [n, hd/2], token t at
    row t % n) on the nh query and nkv key heads; the value heads are left alone."""
    T, _, hd = qkv.shape
    half = hd // 2
    n = cos.shape[0]
    tmp = np.empty(hd, np.float32)
    for t in range(T):
        c = cos[t % n]
        s = sin[t % n]
        for h in range(nh + nkv):
            v = qkv[t, h]
            if norm:
                w = qn if h < nh else kn
                ss = np.float32(0.0)
                for j in range(hd):
                    ss += v[j] * v[j]
                r = np.float32(1.0) / np.sqrt(ss / np.float32(hd) + np.float32(eps))
                for j in range(hd):
                    v[j] = v[j] * r * w[j]
            for j in range(hd):
                tmp[j] = v[j]
            for j in range(half):
                if neox:
                    a, b = tmp[j], tmp[j + half]
                    v[j] = a * c[j] - b * s[j]
                    v[j + half] = b * c[j] + a * s[j]
                else:
                    a, b = tmp[2 * j], tmp[2 * j + 1]
                    v[2 * j] = a * c[j] - b * s[j]
                    v[2 * j + 1] = b * c[j] + a * s[j]



@njit(nogil=True, fastmath=True, cache=True)
def _stacked(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, out):
    """out = x [W0; W1; W2]^T across threads, or on this thread when the work is small (SERIAL_BYTES_HOT:
    an attention block runs with nothing else on the cores)."""
    if (w0.shape[0] + w1.shape[0] + w2.shape[0]) * x.shape[0] < SERIAL_BYTES_HOT:
        _parts_serial(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, out)
    else:
        _parts(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, out)


@njit(nogil=True, fastmath=True, cache=True)
def attention_step(xs, nw, eps, wq, cq, Rq, wk, ck, Rk, wv, cv, Rv, qn, kn, cos, sin, nh, nkv, neox, norm,
                   kc, vc, p0, n, wo, co, Ro, out, residual):
    """One layer's attention block for xs [T, H] (T = S streams x n new tokens) -> out [T, H]:
    RMSNorm (nw), fused Q/K/V products read in place, Q/K norm and RoPE, K/V appended to the caches
    at p0, causal GQA attention, output projection (wo); residual: then xs += out in place (the
    residual add the caller would do, the same float adds, without a numpy call). Every caller passes
    all arguments with the same types, so that both steps run one compiled specialisation: two
    (residual omitted in one) gave logits 4e-5 apart."""
    T = xs.shape[0]
    h = np.empty_like(xs)
    rms_rows(xs, nw, eps, h)
    qkv2 = np.empty((T, Rq + Rk + Rv), np.float32)
    _stacked(wq, cq, Rq, wk, ck, Rk, wv, cv, Rv, h, qkv2)
    hd = (Rq + Rk + Rv) // (nh + 2 * nkv)
    qkv = qkv2.reshape((T, nh + 2 * nkv, hd))
    qk_post(qkv, qn, kn, eps, cos, sin, nh, nkv, neox, norm)
    o = np.empty((T, nh * hd), np.float32)
    attn_cached(qkv, kc, vc, p0, n, nh, nkv, o)
    none = wo[:0]
    _stacked(wo, co, Ro, none, co, np.int64(0), none, co, np.int64(0), o, out)
    if residual:
        for t in range(T):
            for j in range(xs.shape[1]):
                xs[t, j] += out[t, j]
