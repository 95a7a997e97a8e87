"""The CPU dense path without torch glue: the residual stream is a numpy array [T, H] (T = S streams x
n new tokens), each layer calls the numba kernels straight from here (attention block, norm + router)
with arguments bound once and scratch buffers reused across steps; when every routed expert of a
layer is a CPU miss (no device slots, not a static layer, the `cpu` miss policy) the experts' kernel
(cpu_experts.moe_routed: the CSR, the kernel choice and the SwiGLU experts in one call) is called
here too, else Experts.forward takes the layer's experts (device tiers in torch). On a small model the
torch glue of the general step (tensor wrapping, small ops at ~2-10 us each, buffers allocated per
call) cost as much as the kernels themselves.

The kernels, their arguments and the order of every floating-point add are those of the general
step, so with its kernels called from Python (`fused=False`, and plans with device tiers) results are
bitwise the same; the two residual adds of a layer (x += attention, x += experts) run at the end of the
kernels that produce them (their `residual` / `resid` arguments: the same float adds, without three
numpy calls: the layer loop ~4-6% faster on `tiny`, paired in one process,
benchmarks/bench_residual_adds.py). Where every layer is plain CPU work whatever the routing (no
slots, no static layer, the `cpu` miss policy), runs of layers go to cpu_layers.run_layers, one numba
call each: no Python between the kernels, the same tokens, logits a few ulps a layer apart (see there).
Runner.step takes this path when the dense weights are read in place on the CPU.
"""
from __future__ import annotations

import time

import numba
import numpy as np
import torch

from simulator.policies import ExpertCacheBase

from . import cpu_experts as CE
from . import cpu_layers as CL
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

    def __init__(self, runner, fused: bool = True):
        """fused=False: every layer's kernels called from Python (bitwise the general step's results)."""
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
        ex = runner.experts
        self.observes = type(ex.cache).observe is not ExpertCacheBase.observe  # NoCache's does nothing
        self.cpu_misses = ex.plan.miss_policy.kind == "cpu" and not X.THREAD_ALWAYS
        self.bufs: tuple | None = None
        self.pending: list[tuple] = []  # fused steps whose trace records flush() has yet to build
        self.nthr = numba.get_num_threads()
        # every layer plain CPU work whatever the routing: whole runs of layers in one numba call
        plain = self.cpu_misses and not ex.static and not ex.cache.slots and not self.observes
        self.tables = CL.LayerTables(self) if plain and fused and CL.AVAILABLE else None
        if self.tables is not None:  # load run_layers now (~0.1 s from numba's cache), not in the first step
            x, cos, sin = np.zeros((1, c.hidden), np.float32), self.cos[:1], self.sin[:1]
            self._run_layers(0, 0, x, cos, sin, 0, 1)

    def _buffers(self, T: int) -> tuple:
        """Scratch for T tokens: a, h, y [T, H] f32, ids [T, k] int64, w [T, k] f32, act [T * k, F] f32; kept
        for the last T only (a long prompt's would be large, and decode steps all have T = S)."""
        if self.bufs is None or self.bufs[0].shape[0] != T:
            H, k, F = self.r.c.hidden, self.r.k, self.r.c.expert_ff
            self.bufs = (np.empty((T, H), np.float32), np.empty((T, H), np.float32), np.empty((T, H), np.float32),
                         np.empty((T, k), np.int64), np.empty((T, k), np.float32), np.empty((T * k, F), np.float32))
        return self.bufs

    def _cpu_experts(self, i: int, h: np.ndarray, eid: np.ndarray, w: np.ndarray, x: np.ndarray) -> dict:
        """Layer i's routed experts, all CPU misses, for h [T, H] routed eid / w [T, k]: x += their sum, in
        place (Experts._forward_cpu's kernel call and add, in one call) -> the experts' trace fields."""
        y, act = self.bufs[2], self.bufs[5]
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

    def _engram(self, i: int, x: np.ndarray, n: int) -> tuple:
        """Layer i's Engram rows added to x in place, if it has them -> (pages, rows, major faults, seconds)."""
        eng = self.r.engram
        if eng is None or i not in eng.layers:
            return 0, 0, 0, 0.0
        t0, f0 = time.perf_counter(), major_faults()
        add, pages = eng.lookup_step(i, self.r.hist, n)
        x += add.astype(np.float32, copy=False)  # as the torch path: rounded, then added
        return pages, x.shape[0] * eng.rows_per_token, major_faults() - f0, time.perf_counter() - t0

    def _layer(self, i: int, x, cos, sin, p0: int, n: int, tag: dict) -> dict:
        """Layer i on x [T, H] in place, its kernels called from Python -> its trace record (tag: its step
        and phase)."""
        pc, ex = time.perf_counter, self.r.experts
        a, h, _, eid, w = self.bufs[:5]
        t0 = pc()
        pages, rows, faults, t_eng = self._engram(i, x, n)
        pre, mid, wo = self.att[i]
        attention_step(x, *pre, cos, sin, *mid, p0, n, *wo, a, True)  # x += the block's output, inside
        norm_route(x, *self.route[i], h, eid, w)
        t1 = pc()
        # every routed expert a CPU miss: Experts.forward's condition for its inline CPU step; with
        # slots, a layer none of whose routed experts is resident takes that step too
        slot = ex.slot
        if self.cpu_misses and i not in ex.static and (not slot or not any((i, e) in slot for e in eid.flat)):
            rec = self._cpu_experts(i, h, eid, w, x)
        else:  # device tiers: the general expert step (torch on the CPU device), as in Runner.step
            yt, rec = ex.forward(i, torch.from_numpy(h), eid, w)
            x += yt.numpy()
        t2 = pc()
        rec.update(tag, layer=i, tokens=x.shape[0], kv_start=p0, routed=eid.tolist(),
                   t_dense_ms=(t1 - t0 - t_eng) * 1e3,
                   t_experts_ms=(t2 - t1) * 1e3, engram_pages=pages, t_engram_ms=t_eng * 1e3, engram_rows=rows,
                   engram_major_faults=faults)
        return rec

    def _run_layers(self, i0: int, i1: int, x, cos, sin, p0: int, n: int) -> np.ndarray:
        """cpu_layers.run_layers on layers [i0, i1) -> its output (a new array: read when the trace is built)."""
        a, h, y, eid, w, act = self._buffers(x.shape[0])
        c = self.r.c
        out = CL.out_buffer(c.n_layers, x.shape[0], self.r.k, c.n_experts)
        CL.run_layers(x, *self.tables.args(), cos, sin, p0, n, self.r.k, self.r.experts.all_experts, act, y, a, h,
                      eid, w, K.SERIAL_BYTES_HOT, self.nthr, i0, i1, out)
        return out

    def _layers_fused(self, i0: int, x, cos, sin, p0: int, n: int) -> tuple:
        """Layers from i0 to the next Engram layer (or the end) on x in place, in one run_layers call (the
        first one's Engram add before it) -> (i0, i1, the Engram add's figures, run_layers' output)."""
        eng, L = self.r.engram, self.r.c.n_layers
        i1 = next((j for j in range(i0 + 1, L) if eng is not None and j in eng.layers), L)
        engram = self._engram(i0, x, n)
        return i0, i1, engram, self._run_layers(i0, i1, x, cos, sin, p0, n)

    def flush(self) -> None:
        """Append the trace records of the fused steps run since the last flush (built here, after the
        timed steps: ~4 us a record in a step, its Python data cache-cold after the kernels)."""
        r, k = self.r, self.r.k
        for step, phase, S, T, p0, t_embed, t_head, runs in self.pending:
            recs = [rec for i0, i1, eng, out in runs
                    for rec in CL.layer_records(out, i0, i1, T, k, self.ebytes, step, phase, eng, S, p0)]
            recs[0]["t_dense_ms"] += t_embed
            recs[-1]["t_dense_ms"] += t_head
            r.trace += recs
        self.pending.clear()

    def step(self, ids: np.ndarray, phase: str, step: int, outputs: bool = True) -> np.ndarray | None:
        """Run new tokens ids [S, n] through the model -> logits [S, V] f32 at each stream's last token (None
        with outputs=False: the head not run)."""
        r, pc = self.r, time.perf_counter
        S, n = ids.shape
        T, p0 = S * n, r.kv.len
        if p0 + n > self.kc[0].shape[2]:
            raise ValueError(f"KV cache of {self.kc[0].shape[2]} tokens cannot take {p0 + n}")
        for s in range(S):
            r.hist[s].extend(ids[s].tolist())
        self._buffers(T)
        self.nthr = numba.get_num_threads()
        cos, sin = self.cos[p0:p0 + n], self.sin[p0:p0 + n]  # [n, hd/2]
        t0 = pc()
        x = r.dense.embed_np(ids)  # [T, H]
        t_embed = (pc() - t0) * 1e3  # the embedding counts as layer 0's dense time
        L, recs, runs = r.c.n_layers, [], []
        if self.tables is not None:  # runs of layers in one call each; their records built at flush()
            while not runs or runs[-1][1] < L:
                runs.append(self._layers_fused(runs[-1][1] if runs else 0, x, cos, sin, p0, n))
        else:
            tag = dict(step=step, phase=phase, streams=S)
            recs = [self._layer(i, x, cos, sin, p0, n, tag) for i in range(L)]
            recs[0]["t_dense_ms"] += t_embed
        r.kv.len += n
        t0 = pc()
        logits = r.dense.head_np(x.reshape(S, n, -1)[:, -1]) if outputs else None  # [S, V]
        t_head = (pc() - t0) * 1e3
        if runs:
            self.pending.append((step, phase, S, T, p0, t_embed, t_head, runs))
        else:
            recs[-1]["t_dense_ms"] += t_head
            r.trace += recs
        return logits
