"""Decode as events: per step and layer, the dense path on the GPU, routing, hits and misses
against the cache, misses served as the plan says (auction, CPU, zero-copy, copy, static
per-layer placement), a sync at each GPU/CPU handover, Engram rows from NVMe, cache swaps on the
copy engine. A step carries every stream's tokens (and MTP drafts) and reads their union.
"""
from __future__ import annotations

import numpy as np

from .engram import layer_gather_s, pages_per_row
from .policies import auction_split
from .resources import llamacpp_weighting_s

_CRIT = ("gpu", "pcie_h2d", "cpu", "nvme", "handover", "expert_device")


class DecodeRun:
    """Simulates `n_steps` decode steps on a Machine; `step_s` holds each step's duration (s)."""

    def __init__(self, m, model, plan, routing, cache, page_cache, rng, tokens_per_step: int,
                 committed_per_step: float, context: int, streams: int = 1, engram_cold: float = 0.0,
                 device=None, routed_streams: int | None = None):
        self.m, self.model, self.plan, self.cache, self.page = m, model, plan, cache, page_cache
        self.device = device  # a second card's expert tier (simulator.device_tier.ExpertDeviceTier) or None
        self.routing, self.rng = routing, rng
        self.ntok, self.committed, self.streams = tokens_per_step, committed_per_step, streams
        # rows the MoE layers route: a CUDA-graph engine pads a step to its next captured batch size, and the
        # padding rows pick and read experts as tokens do (plan.graph_batch_sizes); attention, KV and Engram
        # reads stay the real tokens'
        self.route_streams = routed_streams or streams
        self.route_tok = self.ntok // streams * self.route_streams
        self.context = float(context)
        self.eb = model.expert_bytes
        self.L = model.n_moe_layers
        self.moe_index = {layer: i for i, layer in enumerate(model.layers_moe)}
        self.static_gpu = set(self.moe_index[x] for x in plan.placement.gpu_expert_layers
                              if x in self.moe_index)
        self.kind = plan.miss_policy.kind
        mp = plan.miss_policy
        self.auction = (mp.t_hit_ms, mp.t_zc_ms, mp.c_a_ms, mp.c_b_ms)
        self._memo: dict = {}
        self.dense_on_gpu = m.has_gpu and plan.placement.dense == "gpu"
        self.kv_tok = model.kv_bytes_per_token(plan.kv.dtype)
        self.dense_layer_bytes = model.dense_bytes_per_token / model.n_layers
        self.own_layer_bytes = model.layer_dense_bytes  # without the head's share (read once, at the end)
        self.engram_layers = set(model.engram.layers) if (model.engram and plan.placement.engram
                                                          in ("nvme",)) else set()
        self.engram_inline = plan.placement.engram_gather == "inline"
        self.engram_cold = engram_cold  # fraction of this request's rows not in the page cache
        self.handover_s = m.c.handover_ms * 1e-3
        # llama.cpp's multiply of a layer's expert outputs by their weights, on the host cores beside the CPU's
        # products where there is no device (with one, ggml's scheduler puts it on the device: resources.py)
        self.weigh_s = (llamacpp_weighting_s(m.hw, model, self.route_tok, plan.experts_per_token or model.top_k,
                                             m.threads) if plan.engine == "llamacpp" and not m.has_gpu else 0.0)
        self.step_s: list[float] = []
        self.crit = dict.fromkeys(_CRIT, 0.0)
        self.hits = self.reads = 0
        self.bytes_by_tier = {"vram": 0.0, "zero_copy": 0.0, "cpu": 0.0, "copy": 0.0, "nvme": 0.0,
                              "fills": 0.0, "device": 0.0, "device_staged": 0.0}
        self.landing = np.zeros((self.L, model.n_experts), dtype=bool)  # fills still in flight
        self.copies = plan.expert_cache.copies
        self._inflight: list[dict] = []  # background copies not landed: {mask [L, E], waiters}
        self._pending: list[dict] = []  # async copies waiting for the next replan

    # ---- step ---------------------------------------------------------------------------------
    def start(self, n_steps: int, done) -> None:
        """Run n_steps steps, then done()."""
        self.left, self.done = n_steps, done
        self.routes = self.routing.sample_steps(n_steps, self.route_streams, self.ntok // self.streams, self.rng)
        self.step_idx = 0
        self._step()

    def _step(self) -> None:
        if self.step_idx >= self.left:
            self.done()
            return
        self.t0 = self.m.sim.now
        self.r = self.routes[self.step_idx]
        self.engram_ready, self.engram_wait = True, None
        nbytes = self.ntok * self.model.engram_bytes_per_token(self.m.hw.page_bytes) * self.engram_cold
        if self.engram_layers and nbytes and not self.engram_inline:
            # row ids depend only on token ids: the cold pages are read before the pass
            self.engram_ready = False
            self.bytes_by_tier["nvme"] += nbytes
            self.m.nvme_read(nbytes, self._engram_done, random=True)
        self._layer(0)

    def _gather(self, layer: int) -> None:
        """The layer's Engram rows gathered while the stream waits: host time per row, and a
        page fault (one NVMe read at a time) per cold page; then the layer's dense path."""
        m = self.m
        warm_s = layer_gather_s(self.model, m.hw, m.c, self.ntok, 0.0)
        total_s = layer_gather_s(self.model, m.hw, m.c, self.ntok, self.engram_cold)
        rows = self.ntok * self.model.engram.rows_per_token_per_layer
        self.bytes_by_tier["nvme"] += rows * self.engram_cold * pages_per_row(self.model, m.hw.page_bytes) \
            * m.hw.page_bytes
        self.crit["cpu"] += warm_s
        self.crit["nvme"] += total_s - warm_s
        if self.dense_on_gpu and not m.shares_host:
            m.gpu.submit(total_s, lambda: self._dense(layer))  # a host callback on the compute stream
        else:
            m.sim.after(total_s, lambda: self._dense(layer))

    def _engram_done(self) -> None:
        self.engram_ready = True
        if self.engram_wait is not None:
            cb, self.engram_wait = self.engram_wait, None
            cb()

    def _engram_resume(self, layer: int, t_wait: float) -> None:
        self.crit["nvme"] += self.m.sim.now - t_wait
        self._layer(layer)

    def _layer(self, layer: int) -> None:
        if layer >= self.model.n_layers:
            self._step_end()
            return
        if layer in self.engram_layers and not self.engram_ready:
            t_wait = self.m.sim.now
            self.engram_wait = lambda: self._engram_resume(layer, t_wait)
            return
        if layer in self.engram_layers and self.engram_inline:
            self._gather(layer)
        else:
            self._dense(layer)

    def _dense(self, layer: int) -> None:
        """The layer's dense path (attention reading the KV cache, router, shared expert)."""
        m = self.m
        kv = self.kv_tok * self.context * self.ntok / self.model.n_layers
        w_bytes = self.dense_layer_bytes
        self.lt = m.sim.now
        if self.dense_on_gpu and m.shares_host:
            m.host_dense(w_bytes + kv, lambda: self._routed(layer), tokens=self.ntok)
        elif self.dense_on_gpu:  # the host issues the layer's kernels, the GPU streams its weights
            m.gpu.submit(m.dense_dispatch_s(self.ntok) + m.gpu_read_s(w_bytes + kv), lambda: self._routed(layer))
        else:
            # the layer's own dense bytes alternate with its experts (the head is one stream at the end)
            alt = (m.c.cpu_layer_ms + m.c.cpu_layer_ms_per_mb * (self.own_layer_bytes + kv) / 1e6) * 1e-3
            m.cpu_read(w_bytes + kv, lambda: self._routed(layer), rate=m.cpu_dense_rate,
                       extra_s=alt if layer in self.moe_index else 0.0)

    def _routed(self, layer: int) -> None:
        m = self.m
        i = self.moe_index.get(layer)
        if i is None:
            self.crit["gpu" if self.dense_on_gpu else "cpu"] += m.sim.now - self.lt
            self._layer(layer + 1)
            return
        self.crit["gpu" if self.dense_on_gpu else "cpu"] += m.sim.now - self.lt
        picks = self.r[:, i, :]
        cnt = None
        if self.route_tok == 1:
            ex = picks[0]
        else:  # tokens per expert: the CPU tier (and a host device) pays per product beyond the first
            ex, cnt = np.unique(picks, return_counts=True)
        self.reads += ex.size
        gate = None  # in-flight copy batches this layer's device kernel waits for
        if not m.has_gpu:  # no device to hold a resident: every routed expert runs on the CPU
            hit = np.zeros(ex.size, dtype=bool)
        elif i in self.static_gpu:
            hit = np.ones(ex.size, dtype=bool)
        else:
            hit = self.cache.res[i, ex]
            if self.copies == "async":  # pointed at its slot only from the next replan
                hit = hit & ~self.landing[i, ex]
            elif self._inflight and self.landing[i, ex[hit]].any():
                # a copy still in flight: the device's kernel waits on it (stream-ordered after the
                # copy's event), so which experts hit does not depend on how fast anything runs
                gate = [b for b in self._inflight if b["mask"][i, ex[hit]].any()]
        self.cache.observe(i, ex if self.route_tok == 1 else picks.ravel())
        n_h = int(np.count_nonzero(hit))
        n_m = ex.size - n_h
        self.hits += n_h
        miss, mcnt = ex[~hit], (cnt[~hit] if cnt is not None else None)
        score = getattr(self.cache, "score", None)
        if mcnt is not None and score is not None and n_m > 1:  # the coldest misses go to the CPU first
            order = np.argsort(score[i, miss], kind="stable")
            miss, mcnt = miss[order], mcnt[order]
        mp = self.plan.miss_policy
        dev_held = dev_staged = 0
        tier_k = -1
        if self.device is not None and m.has_gpu and n_m:  # the second card takes what it holds and stages some
            miss, dev_tok, tier_k, dev_held, dev_staged = self.device.route(i, n_h, miss, mcnt, mp, self.route_tok)
            mcnt = dev_tok if mcnt is not None else None
            n_m = miss.size
        if tier_k >= 0:
            k_cpu = tier_k
        elif n_m == 0 or not m.has_gpu:
            k_cpu = n_m
        elif self.kind == "auction" and mcnt is not None and mp.c_tok:
            k_cpu = auction_split(n_h, n_m, *self.auction, tokens=mcnt, c_tok=mp.c_tok, max_cpu=mp.max_cpu)[0]
        elif self.kind == "auction":
            key = (n_h, n_m)
            k_cpu = self._memo.get(key)
            if k_cpu is None:
                k_cpu = self._memo[key] = auction_split(n_h, n_m, *self.auction, max_cpu=mp.max_cpu)[0]
        elif self.kind == "cpu":
            k_cpu = n_m
        else:
            k_cpu = 0
        n_ssd_cpu = n_ssd_gpu = 0
        if self.page is not None and n_m:
            in_ram = self.page.res[i, miss]
            self.page.observe(i, miss)
            n_ssd_cpu = int((~in_ram[:k_cpu]).sum())
            n_ssd_gpu = int((~in_ram[k_cpu:]).sum())
        self.pending, self.lt = 3 if (dev_held or dev_staged) else 2, m.sim.now
        self.last = "gpu"
        eb = self.eb
        self.bytes_by_tier["vram"] += n_h * eb
        n_gpu_miss = n_m - k_cpu
        copying = self.kind == "copy" or (self.kind == "auction" and mp.gpu_path == "copy")

        # GPU side: resident experts, then zero-copy or copied misses (after any copy they wait on)
        def gpu_side():
            hit_s = m.gpu_expert_s(n_h * eb)
            if n_gpu_miss:
                tier = "copy" if copying else "zero_copy"
                self.bytes_by_tier[tier] += n_gpu_miss * eb
                if n_ssd_gpu:
                    self.bytes_by_tier["nvme"] += n_ssd_gpu * eb
                compute_s = m.gpu_expert_s(n_gpu_miss * eb) + n_gpu_miss * m.c.copy_miss_ms * 1e-3
                if copying and self.copies == "sync":  # on the compute stream: the GPU waits for the copy
                    after = lambda: m.gpu.acquire(lambda: m.dma(n_gpu_miss * eb, lambda: (
                        m.gpu.release(), m.gpu.submit(compute_s, lambda: self._join(layer, "pcie_h2d")))))
                elif copying:  # the copy engine beside the hits
                    after = lambda: m.dma(n_gpu_miss * eb, lambda: m.gpu.submit(
                        compute_s, lambda: self._join(layer, "pcie_h2d")))
                else:
                    after = lambda: m.gpu.acquire(lambda: m.sim.after(hit_s, lambda: m.zero_copy(
                        n_gpu_miss * eb, lambda: (m.gpu.release(), self._join(layer, "pcie_h2d")))))
                if n_ssd_gpu:
                    m.nvme_read(n_ssd_gpu * eb, after)
                else:
                    after()
                if copying:
                    m.gpu.submit(hit_s)
            elif m.shares_host and n_h:  # the host device computes its residents beside the CPU job
                extra = int(cnt[hit].sum()) - n_h if cnt is not None else 0
                m.host_experts(n_h, lambda: self._join(layer, "gpu"), extra_pairs=extra,
                               hold_s=m.c.overlap_dev_ms * 1e-3 if shared_both else 0.0)
            elif m.has_gpu and not m.shares_host:
                m.gpu.submit(hit_s, lambda: self._join(layer, "gpu"))
            else:
                self.pending -= 1
                if self.pending == 0:
                    self._join(layer, "gpu", count=False)
        dev_work = bool(n_h or n_gpu_miss)
        # an engine's fitted host costs (calibration.trace_fit; 0 elsewhere): the device tier's dispatch
        # per layer; on a discrete GPU, where device work and a CPU job overlap, the host time of the
        # hand-off (before both sides) and each side's slowdown while they share the host's cores
        both = dev_work and k_cpu and m.has_gpu and not m.shares_host
        # on a host-sharing device, hits beside a CPU job share its cores: the hand-off's host time
        # (overlap_layer_ms where fitted), then the hits and the job in turn, plus what sharing the
        # cores costs beyond that (overlap_dev_ms, held by the hits)
        shared_both = bool(n_h and k_cpu and m.shares_host)
        pre = m.c.overlap_layer_ms * 1e-3 if both else 0.0
        if shared_both:
            dl = (m.c.overlap_layer_ms or m.c.device_layer_ms) * 1e-3
        else:
            dl = (pre + m.c.overlap_dev_ms * 1e-3) if both else (m.c.device_layer_ms * 1e-3 if dev_work else 0.0)
        go_gpu = (lambda: m.sim.after(dl, gpu_side)) if dl else gpu_side
        if gate:
            self._after_landing(gate, go_gpu)
        else:
            go_gpu()
        # CPU side
        if k_cpu:
            self.bytes_by_tier["cpu"] += k_cpu * eb
            # a handover when device work runs beside the CPU job (on a host-sharing device the
            # job otherwise runs inline on the same thread)
            ho = self.handover_s if ((n_h or n_gpu_miss) if m.shares_host else m.has_gpu) else 0.0
            if both:
                ho += pre + m.c.overlap_cpu_ms * 1e-3
            elif shared_both:  # submitted after the hand-off; it then waits for the hits' cores
                ho += dl
            ram_part = (k_cpu - n_ssd_cpu) * eb
            # the further (token, expert) products of experts routed by several tokens of the step
            extra_s = m.cpu_pairs_s(int(mcnt[:k_cpu].sum()) - k_cpu) if mcnt is not None else 0.0
            if not self.dense_on_gpu:  # experts read between attention blocks on the same cores
                extra_s += m.c.cpu_layer_ms_per_mb * k_cpu * eb / 1e9
            extra_s += self.weigh_s
            # whole experts per thread or rows split, as the engine runs this job (resources.Machine.cpu_job_rate)
            rate = m.cpu_job_rate(mcnt[:k_cpu] if mcnt is not None else (1,) * k_cpu)
            if n_ssd_cpu:  # pages stream in while the CPU computes; one expert's work trails
                self.bytes_by_tier["nvme"] += n_ssd_cpu * eb
                self.sub = 2
                sub_done = lambda: self._cpu_sub(layer, eb, extra_s, rate)
                m.nvme_read(n_ssd_cpu * eb, sub_done)
                overlap = ram_part + (n_ssd_cpu - 1) * eb
                go = lambda: m.cpu_read(overlap, sub_done, rate=rate) if overlap else sub_done()
            else:
                go = lambda: m.cpu_read(ram_part, lambda: self._join(layer, "cpu"), rate=rate, extra_s=extra_s)
            m.sim.after(ho, go) if ho else go()
        else:
            self.pending -= 1
            if self.pending == 0:
                self._join(layer, "gpu", count=False)
        if dev_held or dev_staged:  # the card's job, signalled as the CPU's is; the layer combines all three
            self.bytes_by_tier["device"] += (dev_held + dev_staged) * eb
            self.bytes_by_tier["device_staged"] += dev_staged * eb
            job = lambda: m.device_job(dev_held, dev_staged, self.plan.device_tier,  # noqa: E731
                                       lambda: self._join(layer, "expert_device"))
            m.sim.after(self.handover_s, job) if self.handover_s else job()

    def _cpu_sub(self, layer, ssd_bytes, extra_s: float = 0.0, rate: float | None = None) -> None:
        """One of the two streams (NVMe read, CPU work on what is in RAM) ended; after both, the trailing
        expert's work (at the job's `rate`, bytes/s) and the step's further products (extra_s, seconds)."""
        self.sub -= 1
        if self.sub == 0:
            self.m.cpu_read(ssd_bytes, lambda: self._join(layer, "nvme"), rate=rate, extra_s=extra_s)

    def _join(self, layer: int, who: str, count: bool = True) -> None:
        if count:
            self.pending -= 1
            self.last = who
        if self.pending > 0:
            return
        self.crit[self.last] += self.m.sim.now - self.lt
        self._layer(layer + 1)

    def admit(self, changes) -> None:
        """Copy the experts a cache step admits [(layer, in, out)] into their slots, as the plan's copies
        mode says: on the compute stream (sync), a side stream live from the next replan (async), or the
        copy engine beside the next steps (background)."""
        m = self.m
        ins = [(c[0], c[1]) for c in changes if c[1] >= 0]
        mode = "sync" if self.cache.stream_ordered else self.copies
        if ins and m.shares_host:  # the host device loads its copies between steps, untimed
            self.bytes_by_tier["fills"] += len(ins) * self.eb
        elif ins:
            rows, cols = np.array(ins).T
            nbytes = len(ins) * self.eb
            self.bytes_by_tier["fills"] += nbytes
            if mode == "sync":  # on the compute stream: the next step's kernels wait for the copy
                m.gpu.acquire(lambda: m.dma(nbytes, m.gpu.release))
            elif mode == "async":  # a side stream; live from the next replan
                self.landing[rows, cols] = True
                entry = {"rows": rows, "cols": cols, "done": False}
                self._pending.append(entry)
                m.dma(nbytes, lambda: self._async_landed(entry))
            else:  # the copy engine beside the next steps; a kernel routed to one waits for it
                self.landing[rows, cols] = True
                batch = {"mask": np.zeros_like(self.landing), "waiters": []}
                batch["mask"][rows, cols] = True
                self._inflight.append(batch)
                m.dma(nbytes, lambda: self._batch_landed(batch, rows, cols))

    def _step_end(self) -> None:
        m = self.m
        over = m.c.step_overhead_ms * 1e-3
        changes = self.cache.end_step()
        if self.device is not None:
            self.device.end_step()
        if self.cache.replanned and self._pending:  # last replan's side-stream copies go live
            self._go_live()
        self.admit(changes)
        self.context += self.committed
        self.step_idx += 1
        if over:
            self.crit["gpu"] += over
            m.sim.after(over, self._record)
        else:
            self._record()

    def _go_live(self) -> None:
        """Point the last replan's newcomers at their slots; the compute stream waits for any copy
        still in flight (main.wait_event)."""
        for e in self._pending:
            e["live"] = True
            if e["done"]:
                self._landed(e["rows"], e["cols"])
            else:
                self.m.gpu.acquire(lambda e=e: self.m.gpu.release() if e["done"] else e.update(hold=True))
        self._pending = []

    def _async_landed(self, e) -> None:
        e["done"] = True
        if e.get("live"):
            self._landed(e["rows"], e["cols"])
        if e.pop("hold", False):
            self.m.gpu.release()

    def _batch_landed(self, batch, rows, cols) -> None:
        self._landed(rows, cols)
        self._inflight.remove(batch)
        for w in batch["waiters"]:
            w()

    def _after_landing(self, batches, fn) -> None:
        """fn() once every copy batch in `batches` has landed."""
        left = {"n": len(batches)}

        def one():
            left["n"] -= 1
            if left["n"] == 0:
                fn()
        for b in batches:
            b["waiters"].append(one)

    def _landed(self, rows, cols) -> None:
        self.landing[rows, cols] = False

    def _record(self) -> None:
        self.step_s.append(self.m.sim.now - self.t0)
        self._step()

    @property
    def hit_rate(self) -> float:
        """Share of distinct routed experts served from VRAM."""
        return self.hits / self.reads if self.reads else 0.0
