"""Routed experts, tier by tier: device-resident (static layers and the VRAM cache of plan slots,
dequantised torch tensors), CPU misses (numba kernels in place from the mmap, on a worker thread
so they overlap the device's work), PCIe misses (quantised bytes copied to the device, dequantised
there and thrown away). The cache replacement and the miss auction come from simulator.policies.
Every copy here blocks the host thread (pageable memory, the compute stream): a plan describing this
executor says expert_cache.copies="sync" and, for the auction, miss_policy.gpu_path="copy"; a
zero-copy miss is served as a copy too (no kernel here reads mapped host memory).
"""
from __future__ import annotations

import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import torch
import torch.nn.functional as Fn

from simulator.policies import auction_split, make_cache
from specs.plan import Plan

from . import cpu_experts as CE
from . import kernels as K
from .gguf_model import GGUFModel, ExpertTensor
from .iquants import KVALUES

THREAD_ALWAYS = False  # CPU experts always on the worker thread (else inline when nothing overlaps)


def torch_dequant(b: torch.Tensor, code: int, cols: int) -> torch.Tensor:
    """Dequantise rows of bytes b uint8 [R, row_bytes] (any device) of kernel type `code` -> f32 [R, cols]."""
    R = b.shape[0]
    if code == K.F16:
        return b.contiguous().view(torch.float16).float().reshape(R, cols)
    if code == K.Q4_K:
        return _torch_q4_k(b.reshape(R, cols // 256, 144)).reshape(R, cols)
    if code == K.Q6_K:
        return _torch_q6_k(b.reshape(R, cols // 256, 210)).reshape(R, cols)
    if code == K.Q5_K:
        return _torch_q4_k(b.reshape(R, cols // 256, 176)).reshape(R, cols)
    if code == K.Q3_K:
        return _torch_q3_k(b.reshape(R, cols // 256, 110)).reshape(R, cols)
    if code == K.Q2_K:
        return _torch_q2_k(b.reshape(R, cols // 256, 84)).reshape(R, cols)
    if code == K.IQ4_XS:
        return _torch_iq4_xs(b.reshape(R, cols // 256, 136)).reshape(R, cols)
    if code == K.IQ4_NL:
        blk = b.reshape(R, cols // 32, 18)
        return (_iq4_values(blk[..., 2:]) * _f16(blk[..., :2])).reshape(R, cols)
    nb = cols // 32
    if code == K.Q8_0:
        blk = b.reshape(R, nb, 34)
        d = blk[..., :2].contiguous().view(torch.float16).float()  # [R, nb, 1]
        q = blk[..., 2:].contiguous().view(torch.int8).float()  # [R, nb, 32]
        return (q * d).reshape(R, cols)
    blk = b.reshape(R, nb, 18)
    d = blk[..., :2].contiguous().view(torch.float16).float()
    q = blk[..., 2:].to(torch.int16)  # [R, nb, 16]
    v = torch.cat([(q & 15) - 8, (q >> 4) - 8], dim=-1).float()  # [R, nb, 32]
    return (v * d).reshape(R, cols)


def _iq4_values(qs: torch.Tensor) -> torch.Tensor:
    """IQ4 nibble bytes uint8 [..., 16] -> their codebook values f32 [..., 32] (low nibbles first: iquants.py)."""
    kv = torch.tensor(KVALUES, dtype=torch.float32, device=qs.device)
    return kv[torch.cat([qs & 15, qs >> 4], dim=-1).long()]


def _torch_iq4_xs(blk: torch.Tensor) -> torch.Tensor:
    """IQ4_XS super-blocks uint8 [R, n, 136] -> f32 [R, n, 256] (iquants.iq4_xs_scale's scales)."""
    c = torch.arange(8, device=blk.device)
    sl = blk[..., 4:8].long()[..., c // 2] >> (4 * (c % 2))  # [R, n, 8]
    sh = (blk[..., 2].long() | (blk[..., 3].long() << 8))[..., None] >> (2 * c)
    ls = (sl & 15) | ((sh & 3) << 4)
    dl = _f16(blk[..., 0:2]) * (ls - 32).float()  # [R, n, 8]
    v = _iq4_values(blk[..., 8:].reshape(*blk.shape[:2], 8, 16))  # [R, n, 8, 32]
    return (v * dl[..., None]).reshape(*blk.shape[:2], 256)


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 bytes b uint8 [..., 2] -> float32 [..., 1]."""
    return b.contiguous().view(torch.float16).float()


def _torch_q4_k(blk: torch.Tensor) -> torch.Tensor:
    """Q4_K super-blocks uint8 [R, n, 144] -> f32 [R, n, 256] (kquant_blocks._q4_k_block's layout); Q5_K ones
    [R, n, 176]: 32 bytes of fifth bits before the nibbles, bit c of byte l for value l of sub-block c."""
    d, dmin = _f16(blk[..., 0:2]), _f16(blk[..., 2:4])  # [R, n, 1]
    s = blk[..., 4:16].to(torch.int32)
    lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = torch.cat([lo & 63, (hi & 15) | ((lo >> 6) << 4)], dim=-1).float()  # [R, n, 8]
    mn = torch.cat([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], dim=-1).float()
    q5 = blk.shape[-1] == 176
    q = blk[..., 48 if q5 else 16:].to(torch.int32).reshape(*blk.shape[:2], 4, 1, 32)
    q = torch.cat([q & 15, q >> 4], dim=-2).reshape(*blk.shape[:2], 8, 32)  # sub-block 2j + h
    if q5:
        c = torch.arange(8, dtype=torch.int32, device=blk.device).reshape(8, 1)
        q = q | (((blk[..., 16:48].to(torch.int32).unsqueeze(-2) >> c) & 1) << 4)  # [R, n, 8, 32]
    q = q.float()
    return ((d * sc).unsqueeze(-1) * q - (dmin * mn).unsqueeze(-1)).reshape(*blk.shape[:2], 256)


def _torch_q6_k(blk: torch.Tensor) -> torch.Tensor:
    """Q6_K super-blocks uint8 [R, n, 210] -> f32 [R, n, 256] (kquant_blocks._q6_k_block's layout)."""
    R, n = blk.shape[:2]
    ql = blk[..., 0:128].to(torch.int32).reshape(R, n, 2, 1, 64)
    ql = torch.cat([ql & 15, ql >> 4], dim=-2).reshape(R, n, 2, 4, 32)  # [half, i, l]: i = 2 (nibble) + 32-block
    qh = blk[..., 128:192].to(torch.int32).reshape(R, n, 2, 1, 32)
    qh = (qh >> torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=blk.device).reshape(4, 1)) & 3  # [half, i, l]
    q = ((ql | (qh << 4)) - 32).float().reshape(R, n, 16, 16)
    sc = blk[..., 192:208].contiguous().view(torch.int8).float()  # [R, n, 16]
    d = _f16(blk[..., 208:210])
    return ((d * sc).unsqueeze(-1) * q).reshape(R, n, 256)


def _torch_q3_k(blk: torch.Tensor) -> torch.Tensor:
    """Q3_K super-blocks uint8 [R, n, 110] -> f32 [R, n, 256] (kquant_blocks._q3_k_block's layout)."""
    R, n = blk.shape[:2]
    dev = blk.device
    s = blk[..., 96:108].to(torch.int32)
    lo = (s[..., 0:8].unsqueeze(-2) >> torch.tensor([0, 4], dtype=torch.int32, device=dev).reshape(2, 1)) & 15
    hi = (s[..., 8:12].unsqueeze(-2) >> torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=dev).reshape(4, 1)) & 3
    sc = ((lo.reshape(R, n, 16) | (hi.reshape(R, n, 16) << 4)) - 32).float()  # [R, n, 16] runs
    q = blk[..., 32:96].to(torch.int32).reshape(R, n, 2, 1, 32)
    q = (q >> torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=dev).reshape(4, 1)) & 3  # [R, n, half, j, l]
    hm = blk[..., 0:32].to(torch.int32).reshape(R, n, 1, 32)
    hm = ((hm >> torch.arange(8, dtype=torch.int32, device=dev).reshape(8, 1)) & 1).reshape(R, n, 2, 4, 32)
    v = (q - 4 + 4 * hm).float().reshape(R, n, 16, 16)
    d = _f16(blk[..., 108:110])
    return ((d * sc).unsqueeze(-1) * v).reshape(R, n, 256)


def _torch_q2_k(blk: torch.Tensor) -> torch.Tensor:
    """Q2_K super-blocks uint8 [R, n, 84] -> f32 [R, n, 256] (kquant_blocks._q2_k_block's layout)."""
    R, n = blk.shape[:2]
    sc = blk[..., 0:16].to(torch.int32)
    dl = _f16(blk[..., 80:82]) * (sc & 15).float()  # [R, n, 16] runs
    ml = _f16(blk[..., 82:84]) * (sc >> 4).float()
    q = blk[..., 16:80].to(torch.int32).reshape(R, n, 2, 1, 32)
    q = ((q >> torch.tensor([0, 2, 4, 6], dtype=torch.int32, device=blk.device).reshape(4, 1)) & 3).float()
    return (dl.unsqueeze(-1) * q.reshape(R, n, 16, 16) - ml.unsqueeze(-1)).reshape(R, n, 256)


def load_expert(w: ExpertTensor, e: int, device, dtype) -> torch.Tensor:
    """Expert e of w dequantised on `device` -> [rows, cols] (bytes cross PCIe quantised)."""
    with warnings.catch_warnings():  # a read-only view of the mmap; never written
        warnings.simplefilter("ignore")
        b = torch.from_numpy(np.asarray(w.data[e])).to(device, non_blocking=False)
    return torch_dequant(b, w.code, w.cols).to(dtype)


def _host(h: torch.Tensor) -> np.ndarray:
    """h as f32 numpy on the host (a view on the CPU)."""
    return h.numpy() if h.device.type == "cpu" and h.dtype == torch.float32 else h.detach().float().cpu().numpy()


def cpu_record(miss: list[int], t_cpu_ms: float, bytes_cpu: int) -> dict:
    """The experts' fields of a layer's trace record when every routed expert ran on the CPU."""
    return dict(hits=[], misses=miss, cpu=list(miss), pcie=[], k_cpu=None, t_dev_ms=0.0, t_cpu_ms=t_cpu_ms,
                t_wait_ms=0.0, bytes_cpu=bytes_cpu, bytes_pcie=0, bytes_dev=0)


def swiglu(x: torch.Tensor, g: torch.Tensor, u: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """down(silu(gate x) * up x) for x [m, H], g/u [F, H], d [H, F] -> [m, H]."""
    return (Fn.silu(x @ g.T) * (x @ u.T)) @ d.T


class Experts:
    """The routed experts of a model, placed as `plan` says, on `device` (CPU stands in for a GPU)."""

    def __init__(self, model: GGUFModel, plan: Plan, device: torch.device, dtype=torch.float32):
        c = model.cfg
        self.m, self.plan, self.device, self.dtype = model, plan, device, dtype
        self.W = [tuple(model.experts(i, p) for p in ("gate", "up", "down")) for i in range(c.n_layers)]
        self.ebytes = [model.expert_bytes(i) for i in range(c.n_layers)]
        # per layer: cpu_experts.moe_routed's leading arguments (flat bytes, type codes, rows) and the bytes
        # of one expert, bound once (the inline all-miss step here and CpuStep both call it)
        self.moe_args = [((K.flat(g), g.code, K.flat(u), u.code, K.flat(d), d.code, g.rows, d.rows),
                          g.expert_bytes + u.expert_bytes + d.expert_bytes) for g, u, d in self.W]
        self.all_experts = np.ones(c.n_experts, dtype=bool)  # the keep mask of a layer whose experts all miss
        self.dev_ebytes = 3 * c.hidden * c.expert_ff * torch.tensor([], dtype=dtype).element_size()
        self.static: dict[int, tuple] = {}
        for i in plan.placement.gpu_expert_layers:  # llama.cpp static split: the whole layer on the device
            self.static[i] = tuple(torch.stack([load_expert(w, e, device, dtype) for e in range(c.n_experts)])
                                   for w in self.W[i])
        self.cache = make_cache(plan.expert_cache, c.n_layers, c.n_experts)
        n = self.cache.slots
        self.slot_g = torch.zeros(n, c.expert_ff, c.hidden, device=device, dtype=dtype)
        self.slot_u = torch.zeros(n, c.expert_ff, c.hidden, device=device, dtype=dtype)
        self.slot_d = torch.zeros(n, c.hidden, c.expert_ff, device=device, dtype=dtype)
        self.slot: dict[tuple[int, int], int] = {}
        # the same residency on the device, for device_step's resident experts: slot of (layer, expert), -1 if none
        self.slot_map = torch.full((c.n_layers, c.n_experts), -1, dtype=torch.int64, device=device)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cpu-experts")
        self._first_fill()

    def _first_fill(self) -> None:
        """The residency of a fresh load: every slot free, then the policy's initial experts in them, its step
        count at 0."""
        self.free = list(range(self.cache.slots - 1, -1, -1))
        if self.cache.slots and self.cache.n_resident:
            self.apply(self.cache.end_step())
        self.cache.step = 0

    def reset(self) -> None:
        """Back to the residency and policy state of a fresh load (what a warm-up run routed is forgotten)."""
        c = self.m.cfg
        self.release()
        self.cache = make_cache(self.plan.expert_cache, c.n_layers, c.n_experts)
        self._first_fill()

    # --- cache residency ---------------------------------------------------------------------
    def apply(self, changes) -> int:
        """Apply residency changes [(layer, in, out)] to the device slots; returns experts loaded."""
        loaded = 0
        for layer, e_in, e_out in changes:
            if e_out >= 0 and (layer, e_out) in self.slot:
                self.free.append(self.slot.pop((layer, e_out)))
                self.slot_map[layer, e_out] = -1
            if e_in >= 0 and (layer, e_in) not in self.slot and self.free:
                s = self.free.pop()
                g, u, d = self.W[layer]
                self.slot_g[s] = load_expert(g, e_in, self.device, self.dtype)
                self.slot_u[s] = load_expert(u, e_in, self.device, self.dtype)
                self.slot_d[s] = load_expert(d, e_in, self.device, self.dtype)
                self.slot[(layer, e_in)] = s
                self.slot_map[layer, e_in] = s
                loaded += 1
        return loaded

    def end_step(self) -> int:
        """Close a step: let the policy swap experts, load them; returns experts loaded."""
        return self.apply(self.cache.end_step())

    def release(self) -> None:
        """Drop the cache (prefill needs the VRAM); the policy refills it later."""
        self.cache.release()
        self.free.extend(self.slot.values())
        self.slot.clear()
        self.slot_map.fill_(-1)

    # --- one layer ---------------------------------------------------------------------------
    def _cpu_job(self, layer: int, x: np.ndarray, routing) -> tuple[np.ndarray, float]:
        t = time.perf_counter()
        # whole experts per thread only when the device is not torch on these same cores: beside it, a
        # thread that loses its core delays its whole experts (cache plans here ran 8% slower so)
        y = CE.moe_cpu(*self.W[layer], x, *routing, whole=self.device.type != "cpu")
        return y, (time.perf_counter() - t) * 1e3

    def forward(self, layer: int, h: torch.Tensor, ids: np.ndarray, w: np.ndarray, resident=None,
                h_host: np.ndarray | None = None) -> tuple[torch.Tensor, dict]:
        """Routed experts of `layer` for h [T, H], routing ids/w [T, k] -> (y [T, H], trace record).
        resident: a callable giving the resident experts' sum [T, H] (device_step's E), else they run
        one by one here; h_host: h as f32 numpy on the host, when the caller has it."""
        static = self.static.get(layer)
        if static is None and not self.slot and self.plan.miss_policy.kind == "cpu" and not THREAD_ALWAYS:
            return self._forward_cpu(layer, h, ids, w, h_host)
        union = np.unique(ids)
        if static is not None:
            dev, miss = union, union[:0]
        elif not self.slot:
            dev, miss = union[:0], union
        else:
            mask = np.array([(layer, int(e)) in self.slot for e in union], dtype=bool)
            dev, miss = union[mask], union[~mask]
        mp = self.plan.miss_policy
        k_cpu = None
        if mp.kind == "cpu":
            cpu, pcie = miss, miss[:0]
        elif mp.kind == "auction":
            tokens = None
            if ids.shape[0] > 1 and len(miss) > 1:  # tokens per miss; the coldest go to the CPU first
                score = getattr(self.cache, "score", None)
                if score is not None:
                    miss = miss[np.argsort(score[layer, miss], kind="stable")]
                tokens = (ids.reshape(-1)[:, None] == miss[None, :]).sum(0)
            k_cpu, _ = auction_split(len(dev), len(miss), mp.t_hit_ms, mp.t_zc_ms, mp.c_a_ms, mp.c_b_ms,
                                     tokens=tokens, c_tok=mp.c_tok, max_cpu=mp.max_cpu)
            cpu, pcie = miss[:k_cpu], miss[k_cpu:]
        else:  # copy / zero-copy: every miss crosses PCIe
            cpu, pcie = miss[:0], miss
        fut = cpu_args = None
        if len(cpu):
            xs = _host(h) if h_host is None else h_host
            keep = None
            if len(cpu) < len(union):
                keep = np.zeros(self.m.cfg.n_experts, dtype=bool)
                keep[cpu] = True
            cpu_args = (layer, xs, CE.csr(ids, w, keep))
            if THREAD_ALWAYS or len(dev) or len(pcie):  # overlap: CPU experts on the worker thread, device work here
                fut = self.pool.submit(self._cpu_job, *cpu_args)
        t0 = time.perf_counter()
        y = resident() if resident is not None and len(dev) else None
        eager = dev if resident is None else dev[:0]
        if len(eager) or len(pcie):
            ye = self._device_experts(layer, h, ids, w, eager, pcie, static)
            y = ye if y is None else y + ye
        if h.device.type == "cuda":
            torch.cuda.synchronize()
        t_dev = (time.perf_counter() - t0) * 1e3
        t_cpu = t_wait = 0.0
        if cpu_args is not None:
            t1 = time.perf_counter()
            yc, t_cpu = fut.result() if fut is not None else self._cpu_job(*cpu_args)
            t_wait = (time.perf_counter() - t1) * 1e3 if fut is not None else 0.0
            yc = torch.from_numpy(yc).to(h.device, h.dtype)
            y = yc if y is None else y + yc
        if y is None:
            y = torch.zeros_like(h)
        if static is None:
            self.cache.observe(layer, ids.reshape(-1))
        rec = dict(hits=[int(e) for e in dev], misses=[int(e) for e in miss], cpu=[int(e) for e in cpu],
                   pcie=[int(e) for e in pcie], k_cpu=k_cpu, t_dev_ms=t_dev, t_cpu_ms=t_cpu, t_wait_ms=t_wait,
                   bytes_cpu=len(cpu) * self.ebytes[layer], bytes_pcie=len(pcie) * self.ebytes[layer],
                   bytes_dev=(len(dev) + len(pcie)) * self.dev_ebytes)
        return y, rec

    def _device_experts(self, layer, h, ids, w, dev, pcie, static) -> torch.Tensor:
        """Sum over the device's experts (resident `dev`, copied `pcie`) of weight x SwiGLU for their
        tokens of h [T, H] -> [T, H]. The routing crosses to the device once per layer (one copy of
        every expert's token indices and weights), not once per expert: on CUDA each small copy from
        pageable memory waits for the device to catch up."""
        experts = [(int(e), "dev") for e in dev] + [(int(e), "pcie") for e in pcie]
        T = ids.shape[0]
        if T == 1:  # one token: its weight per expert is a host scalar, no index tensors at all
            wk = {int(e): float(wt) for e, wt in zip(ids[0], w[0])}
        else:
            sel = [np.nonzero(ids == e) for e, _ in experts]  # (tokens, slots) of each expert
            off = np.cumsum([0] + [len(tk) for tk, _ in sel])
            tk_all = np.concatenate([tk for tk, _ in sel])
            tk_d = torch.from_numpy(tk_all).to(h.device)  # [sum n_e]
            wt_d = torch.from_numpy(w[tk_all, np.concatenate([kk for _, kk in sel])]).to(h.device, h.dtype)
        y = torch.zeros_like(h)
        for j, (e, src) in enumerate(experts):
            if src == "pcie":
                g, u, d = (load_expert(wx, e, self.device, self.dtype) for wx in self.W[layer])
            elif static is not None:
                g, u, d = static[0][e], static[1][e], static[2][e]
            else:
                s = self.slot[(layer, e)]
                g, u, d = self.slot_g[s], self.slot_u[s], self.slot_d[s]
            if T == 1:
                y += swiglu(h, g, u, d) * wk[e]
            else:
                tki = tk_d[off[j]:off[j + 1]]
                y.index_add_(0, tki, swiglu(h[tki], g, u, d) * wt_d[off[j]:off[j + 1], None])
        return y

    def _forward_cpu(self, layer: int, h: torch.Tensor, ids: np.ndarray, w: np.ndarray,
                     h_host: np.ndarray | None = None) -> tuple[torch.Tensor, dict]:
        """forward() when every routed expert is a CPU miss (no device slots, CPU miss policy): inline,
        numpy in and out, no device bookkeeping."""
        xs = _host(h) if h_host is None else h_host
        args, eb = self.moe_args[layer]
        xs = np.ascontiguousarray(xs, dtype=np.float32)
        y = np.zeros((xs.shape[0], args[7]), np.float32)  # [T, H]
        act = np.empty((max(1, ids.size), args[6]), np.float32)  # [T k, F]
        t = time.perf_counter()
        experts = CE.moe_routed(*args, xs, np.ascontiguousarray(ids, dtype=np.int64),
                                np.ascontiguousarray(w, dtype=np.float32), self.all_experts, act, y, eb,
                                K.SERIAL_BYTES_HOT, numba.get_num_threads(),  # alone on the cores here
                                False, y[:0])  # y zeroed above; the caller adds the residual
        t_cpu = (time.perf_counter() - t) * 1e3
        y = torch.from_numpy(y).to(h.device, h.dtype)
        self.cache.observe(layer, ids.reshape(-1))
        miss = experts.tolist()
        return y, cpu_record(miss, t_cpu, len(miss) * self.ebytes[layer])

    def close(self) -> None:
        """Stop the CPU worker thread."""
        self.pool.shutdown(wait=True)
