"""The CPU dense path without torch glue: the residual stream is a numpy array [T, H] (T = S streams x
n new tokens), each layer calls the numba kernels straight from here (attention block, norm + router)
with arguments bound once and scratch buffers reused across steps; when every routed expert of a
layer is a CPU miss (no device slots, not a static layer, the `cpu` miss policy) the experts' kernel
(cpu_experts.moe_routed: the CSR, the kernel choice and the SwiGLU experts in one call) is called
here too, else Experts.forward takes the layer's experts (device tiers in torch). On a small model the
torch glue of the general step (tensor wrapping, small ops at ~2-10 us each, buffers allocated per
call) cost as much as the kernels themselves.

The kernels, their arguments and the order of every floating-point add are those of the general
step, so results are bitwise the same; the two residual adds of a layer (x += attention, x += experts)
run at the end of the kernels that produce them (their `residual` / `resid` arguments: the same float
adds, without three numpy calls: the layer loop ~4-6% faster on `tiny`, paired in one process,
benchmarks/bench_residual_adds.py). The layer's kernels are called from Python, not from one
fused numba function: numba links a callee's code into each caller, and which copy a later call binds
to depends on load order, which moved logits by ~1e-4 when the two paths ran in one process.
Runner.step takes this path when the dense weights are read in place on the CPU.
"""
from __future__ import annotations

import time

import numba
import numpy as np
import torch

from simulator.policies import ExpertCacheBase

from . import cpu_experts as CE
from . import experts as X
from . import kernels as K
from .dense_kernels import attention_step, norm_route
from .engram import major_faults


def fits(runner) -> bool:
    """Whether `runner`'s model and placement can take this path (see the module's docstring)."""
    d = runner.dense
    if runner.device.type != "cpu" or not d.fast:
        return False
    for L in d.layers:
        pq, po = L["wqkv"].parts, L["wo"].parts
        if pq is None or len(pq) != 3 or po is None or len(po) != 1 or "sh_gate" in L:
            return False
    return True


class CpuStep:
    """Runs Runner.step's work on the CPU in numpy / numba: step(ids, phase, step) -> logits [S, V]."""

    def __init__(self, runner):
        self.r = runner
        d, c, kv = runner.dense, runner.c, runner.kv
        self.kc = [t.numpy() for t in kv.k]  # [S, n_kv, ctx, hd] views of the torch caches
        self.vc = [t.numpy() for t in kv.v]
        self.cos, self.sin = d._rope_np(kv.k[0].shape[2], kv.k[0].shape[2])  # [ctx, hd/2]
        norm_w = d._out_norm_np
        self.att = []  # per layer: attention_step's arguments before cos / sin, between them and p0, after n
        self.route = []  # per layer: norm_route's arguments after x
        for i, L in enumerate(d.layers):
            Ln, pq, po = d.np_layers[i], L["wqkv"].parts, L["wo"].parts
            qn, kn = (Ln["q_norm"], Ln["k_norm"]) if c.qk_norm else (norm_w, norm_w)
            self.att.append(((Ln["attn_norm"], c.eps, *pq[0][:3], *pq[1][:3], *pq[2][:3], qn, kn),
                             (c.n_heads, c.n_kv, c.rope_style == "neox", c.qk_norm, self.kc[i], self.vc[i]),
                             po[0][:3]))
            self.route.append((Ln["ffn_norm"], c.eps, Ln["router"], runner.k))
        self.ebytes = runner.experts.ebytes
        self.observes = type(runner.experts.cache).observe is not ExpertCacheBase.observe  # NoCache's does nothing
        self.bufs: tuple | None = None

    def _buffers(self, T: int) -> tuple:
        """Scratch for T tokens: a, h, y [T, H] f32, ids [T, k] int64, w [T, k] f32, act [T * k, F] f32;
        kept for the last T only (a long prompt's would be large, and decode steps all have T = S)."""
        if self.bufs is None or self.bufs[0].shape[0] != T:
            H, k, F = self.r.c.hidden, self.r.k, self.r.c.expert_ff
            self.bufs = (np.empty((T, H), np.float32), np.empty((T, H), np.float32), np.empty((T, H), np.float32),
                         np.empty((T, k), np.int64), np.empty((T, k), np.float32), np.empty((T * k, F), np.float32))
        return self.bufs

    def _cpu_experts(self, i: int, h: np.ndarray, eid: np.ndarray, w: np.ndarray, x: np.ndarray) -> dict:
        """Layer i's routed experts, all CPU misses, for h [T, H] routed eid / w [T, k]: x += their sum, in
        place (Experts._forward_cpu's kernel call and add, in one call) -> the experts' trace fields."""
        _, _, y, _, _, act = self.bufs
        ex = self.r.experts
        args, eb = ex.moe_args[i]
        t = time.perf_counter()
        # as Experts._forward_cpu: small jobs too in a parallel region, since nothing else runs here
        experts = CE.moe_routed(*args, h, eid, w, ex.all_experts, act, y, eb, K.SERIAL_BYTES_HOT, self.nthr, True, x)
        t_cpu = (time.perf_counter() - t) * 1e3
        if self.observes:
            ex.cache.observe(i, eid.reshape(-1))
        miss = experts.tolist()
        return X.cpu_record(miss, t_cpu, len(miss) * self.ebytes[i])

    def step(self, ids: np.ndarray, phase: str, step: int) -> np.ndarray:
        """Run new tokens ids [S, n] through the model -> logits [S, V] f32 at each stream's last token."""
        r, pc = self.r, time.perf_counter
        S, n = ids.shape
        T, p0 = S * n, r.kv.len
        if p0 + n > self.kc[0].shape[2]:
            raise ValueError(f"KV cache of {self.kc[0].shape[2]} tokens cannot take {p0 + n}")
        for s in range(S):
            r.hist[s].extend(ids[s].tolist())
        a, h, _, eid, w, _ = self._buffers(T)
        self.nthr = numba.get_num_threads()
        cos, sin = self.cos[p0:p0 + n], self.sin[p0:p0 + n]  # [n, hd/2]
        trace, eng = r.trace, r.engram
        ex = r.experts
        # every routed expert a CPU miss: Experts.forward's condition for its inline CPU step; with
        # slots, a layer none of whose routed experts is resident takes that step too
        cpu_misses, static = ex.plan.miss_policy.kind == "cpu" and not X.THREAD_ALWAYS, ex.static
        slot = ex.slot
        t0 = pc()
        x = r.dense.embed_np(ids)  # [T, H]
        t_extra = pc() - t0  # the embedding counts as layer 0's dense time
        for i in range(r.c.n_layers):
            t0 = pc()
            pages, rows, faults, t_eng = 0, 0, 0, 0.0
            if eng is not None and i in eng.layers:
                f0 = major_faults()
                add, pages = eng.lookup_step(i, r.hist, n)
                x += add.astype(np.float32, copy=False)  # as the torch path: rounded, then added
                rows, faults = T * eng.rows_per_token, major_faults() - f0
                t_eng = pc() - t0
            pre, mid, wo = self.att[i]
            attention_step(x, *pre, cos, sin, *mid, p0, n, *wo, a, True)  # x += the block's output, inside
            norm_route(x, *self.route[i], h, eid, w)
            t1 = pc()
            if cpu_misses and i not in static and (not slot or not any((i, e) in slot for e in eid.flat)):
                rec = self._cpu_experts(i, h, eid, w, x)
            else:  # device tiers: the general expert step (torch on the CPU device), as in Runner.step
                yt, rec = ex.forward(i, torch.from_numpy(h), eid, w)
                x += yt.numpy()
            t2 = pc()
            rec.update(step=step, phase=phase, layer=i, tokens=T, routed=eid.tolist(),
                       t_dense_ms=(t1 - t0 - t_eng + t_extra) * 1e3, t_experts_ms=(t2 - t1) * 1e3,
                       engram_pages=pages, t_engram_ms=t_eng * 1e3, engram_rows=rows, engram_major_faults=faults)
            trace.append(rec)
            t_extra = 0.0
        r.kv.len += n
        t0 = pc()
        logits = r.dense.head_np(x.reshape(S, n, -1)[:, -1])  # [S, V]
        trace[-1]["t_dense_ms"] += (pc() - t0) * 1e3
        return logits
