"""Decode steps on the torch path (the dense path on CUDA) as two static-shape calls a layer, captured
as CUDA graphs on CUDA and replayed every step (eager elsewhere: the same code, tested on the CPU):

- A, attention and routing: x + attention(x) at position `pos` (K / V written there by index; all of
  the cache's positions attended under a mask `position <= pos`, so that no shape depends on the
  step), the MoE norm and the router's top-k, packed [S, H + 2k] for the one device-to-host copy a
  layer needs (the host picks hits, misses and the auction from the routing, as in the eager step);
- E, the resident experts: SwiGLU of every routed (token, expert) pair through the slot it sits in
  (Experts.slot_map, a device-side map kept by Experts.apply / release; the slots gathered and
  multiplied in batches), the pairs not resident weighted zero; on a static layer every expert.

Eager PyTorch paid ~36 kernel launches and 3 host synchronisations a layer for the dense path, and ~12
launches per resident expert, on the H200 host: about 1 ms of dispatch a layer, more than the layer's
work (benchmarks/bench_gpu_step.py; README, "A CUDA host"). A replay is one launch. Prefill (several
tokens a stream) stays eager.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as Fn

from .dense import _sdpa, rms_norm, rope_table

GRAPHS = True  # capture A and E as CUDA graphs on CUDA (False: the same static calls, eagerly)


class StaticCall:
    """fn() -> tensors, captured as a CUDA graph at its first call when `graph` (after a warm-up
    on the step's own inputs: what it writes, the replay writes again), else called eagerly. `out` holds
    the latest outputs: with a graph, the same tensors at every replay."""

    def __init__(self, fn, graph: bool, pool=None):
        self.fn, self.graph, self.pool, self.g, self.out = fn, graph, pool, None, None

    def __call__(self):
        if self.g is not None:
            self.g.replay()
            return self.out
        if self.graph:
            try:
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(2):
                        self.fn()
                torch.cuda.current_stream().wait_stream(s)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    self.out = self.fn()
                self.g = g
                g.replay()
                return self.out
            except RuntimeError as e:  # run eagerly from now on
                warnings.warn(f"CUDA graph capture failed, running eagerly: {e}")
                self.graph = False
        self.out = self.fn()
        return self.out


def attn_route(dense, i: int, kv, x: torch.Tensor, pos: torch.Tensor, ar: torch.Tensor, cos_t, sin_t, k: int):
    """Layer i for one new token a stream, x [S, 1, H] at position pos (int64 [1]) -> (x + attention
    [S, 1, H], MoE input h [S, H], top-k weights [S, k], expert ids [S, k] int64, pack [S, H + 2k])."""
    c, L = dense.c, dense.layers[i]
    S, nh, nkv = x.shape[0], c.n_heads, c.n_kv
    qkv = L["wqkv"](rms_norm(x, L["attn_norm"], c.eps)).view(S, 1, nh + 2 * nkv, c.head_dim)
    cos, sin = cos_t.index_select(0, pos)[:, None], sin_t.index_select(0, pos)[:, None]  # [1, 1, hd/2]
    q, kk, v = dense.qkv_heads(i, qkv, cos, sin)  # [S, heads, 1, hd]
    kv.k[i].index_copy_(2, pos, kk)  # [S, nkv, ctx, hd]
    kv.v[i].index_copy_(2, pos, v)
    mask = (ar <= pos)[None, None, None, :]  # [1, 1, 1, ctx]: the cached positions and this one
    o = _sdpa(q, kv.k[i], kv.v[i], mask, nh // nkv).transpose(1, 2).reshape(S, 1, nh * c.head_dim)
    xa = x + L["wo"](o)
    hn = dense.ffn_in(i, xa).reshape(S, -1)  # [S, H]
    w, idx = dense.top_k(i, hn, k)  # [S, k]
    return xa, hn, w, idx, torch.cat([hn.float(), w, idx.float()], dim=-1)  # ids < 2^24: exact in f32


def resident_experts(ex, i: int, h: torch.Tensor, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Sum over the routed experts of layer i resident on the device (slots, or a static layer) of
    weight x SwiGLU, for h [T, H], w / idx [T, k] -> [T, H]; pairs not resident add zero."""
    T, k = idx.shape
    flat = idx.reshape(-1)  # [T k]
    if i in ex.static:
        g, u, d = (t.index_select(0, flat) for t in ex.static[i])
        ok = None
    else:
        s = ex.slot_map[i].index_select(0, flat)  # [T k], -1 where not resident
        ok = (s >= 0)[:, None]
        s = s.clamp(min=0)
        g, u, d = ex.slot_g.index_select(0, s), ex.slot_u.index_select(0, s), ex.slot_d.index_select(0, s)
    xr = h[:, None, :].expand(T, k, h.shape[1]).reshape(T * k, -1, 1)  # [T k, H, 1] (no host sync)
    y = torch.bmm(d, Fn.silu(torch.bmm(g, xr)) * torch.bmm(u, xr))[:, :, 0] * w.reshape(-1, 1).to(h.dtype)
    if ok is not None:  # where, not a product: a slot never filled may hold anything
        y = torch.where(ok, y, torch.zeros((), dtype=y.dtype, device=y.device))
    return y.view(T, k, -1).sum(1)  # [T, H]


class DeviceStep:
    """A runner's decode steps as static calls: the residual stream lives in `x` [S, 1, H], the position
    in `pos`; layer(i) runs A, E[i]() returns the resident experts' sum [S, H] (Runner.step drives both)."""

    def __init__(self, runner, graph: bool):
        r = self.r = runner
        self.graph = graph
        d, c, kv = r.dense, r.c, r.kv
        dev = r.device
        ctx = kv.k[0].shape[2]
        self.x = torch.zeros(r.plan.streams, 1, c.hidden, device=dev, dtype=d.dtype)
        self.pos = torch.zeros(1, dtype=torch.int64, device=dev)
        self.ar = torch.arange(ctx, device=dev)
        self.cos, self.sin = rope_table(ctx, c.head_dim, c.rope_base, dev, d.dtype)  # [ctx, hd/2]
        # one memory pool for every layer's graphs (E's gathered slots would otherwise be held once per
        # layer): safe here because each graph's outputs are held for good (no later capture reuses them)
        # and consumed before any other graph replays, but A_i's, which E_i reads and is captured after
        pool = torch.cuda.graph_pool_handle() if graph else None
        self.A = [StaticCall(lambda i=i: attn_route(d, i, kv, self.x, self.pos, self.ar, self.cos, self.sin, r.k),
                             graph, pool) for i in range(c.n_layers)]
        self.E = [StaticCall(lambda i=i: resident_experts(r.experts, i, *self.A[i].out[1:4]), graph, pool)
                  for i in range(c.n_layers)]

    def begin(self, x: torch.Tensor, p0: int) -> torch.Tensor:
        """Start a step at position p0 with embeddings x [S, 1, H] -> the residual stream."""
        self.x.copy_(x)
        self.pos.fill_(p0)
        return self.x

    def layer(self, i: int):
        """A for layer i -> (x + attention, h [S, H] on the device, ids [S, k] int64, weights [S, k] f32,
        h [S, H] f32 numpy on the host): the routing and h cross to the host in one copy."""
        xa, hn, _, _, pack = self.A[i]()
        H, k = hn.shape[1], self.r.k
        ph = pack.cpu().numpy()
        return xa, hn, ph[:, H + k:].astype("int64"), ph[:, H:H + k].copy(), ph[:, :H].copy()
