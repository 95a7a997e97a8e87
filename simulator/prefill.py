"""Prefill as events: chunks and micro-batches; stream-all (every touched expert copied once per
chunk on the copy engine in batches through staging slots, each batch's GEMM after it lands),
llama.cpp op offload (RAM experts copied for every micro-batch of at least the threshold, serial
with compute) and CPU prefill.
Attention is quadratic in context (capped for sparse-attention models)."""
from __future__ import annotations


from .engram import gathers_inline, layer_gather_s
from .policies import expected_touched, op_offload
from .resources import cpu_expert_prefill_gflops, host_dense_s, llamacpp_dense_prefill_gflops, llamacpp_weighting_s

# Sparse attention: each query attends at most this many earlier tokens (DeepSeek V3.2+/V4 DSA
# top-k). ModelSpec has no field for it yet (reported to the lead); keyed by architecture here.
SPARSE_ATTENTION_TOPK = {"deepseek-v4": 2048}
# MLA prefill runs attention un-absorbed: per head q.k over 192 dims and p.v over 128 (DeepSeek-V2
# paper, kept by V3/V4) instead of the 512-dim latent the spec's head_dim describes (decode form).
PREFILL_ATTENTION_SCALE = {"deepseek-v4": (192 + 128) / (2 * 512)}
TOUCH_LOCALITY = 1.0  # distinct experts vs the uniform form (0.87 measured once; 1.0 is conservative)


def attention_flops(model, start: int, n: int) -> float:
    """Attention-score FLOPs of tokens start..start+n-1 against their (capped) context."""
    cap = SPARSE_ATTENTION_TOPK.get(model.arch)
    per_ctx = model.attention_flops_per_token(1) * PREFILL_ATTENTION_SCALE.get(model.arch, 1.0)
    if cap is None:
        return per_ctx * (n * start + n * (n - 1) / 2)
    total = 0.0
    full_end = min(start + n, cap)
    if full_end > start:  # tokens whose whole context is below the cap
        k = full_end - start
        total += per_ctx * (k * start + k * (k - 1) / 2)
    total += per_ctx * cap * max(0, start + n - max(start, cap))
    return total


class PrefillRun:
    """Simulates a prompt's prefill on a Machine; `elapsed_s` and the critical resource after."""

    def __init__(self, m, model, plan, prompt_tokens: int, streams: int = 1, engram_cold: float = 0.0):
        self.m, self.model, self.plan = m, model, plan
        self.prompt, self.streams = int(prompt_tokens), streams
        self.pf = plan.prefill
        self.k = plan.experts_per_token or model.top_k
        self.eb = model.expert_bytes
        moe = model.layers_moe
        self.gpu_layers = set(plan.placement.gpu_expert_layers)
        self.ram_layers = [l for l in moe if l not in self.gpu_layers]
        self.crit = {"gpu": 0.0, "copy_engine": 0.0, "cpu": 0.0}
        self.elapsed_s = 0.0
        self.engram_layers = set(model.engram.layers) if gathers_inline(model, plan) else set()
        self.engram_cold = engram_cold  # fraction of the prompt's rows not in the page cache
        self.llamacpp_dense_gflops = (llamacpp_dense_prefill_gflops(m.hw, model, m.threads, m.c)
                                      if plan.engine == "llamacpp" else None)

    def start(self, done) -> None:
        """Prefill every stream's prompt (one after another), then done()."""
        self.done, self.t0 = done, self.m.sim.now
        self.jobs = []  # (position, tokens, outputs: 1 for a chunk's last micro-batch, whose last token's
        for s in range(self.streams):  # logits the engine computes, the output head run once)
            pos = 0
            for n, outputs in self.pf.passes_with_outputs(self.prompt):
                self.jobs.append((pos, n, int(outputs)))
                pos += n
        self.j = 0
        self._next()

    def _next(self) -> None:
        if self.j >= len(self.jobs) or self.prompt == 0:
            self.elapsed_s = self.m.sim.now - self.t0
            self.done()
            return
        pos, n, self.outputs = self.jobs[self.j]
        self.j += 1
        if self.pf.strategy == "stream-all" and self.m.has_gpu:  # nothing to stream to without a device
            self._stream_all(pos, n)
        else:
            self._per_layer(pos, n, 0)

    def _compute_s(self, pos: int, n: int, layer: int, experts_on_gpu: bool) -> float:
        """GPU seconds for one layer of an n-token batch (dense + attention + routed GEMMs)."""
        md, m = self.model, self.m
        flops = self._dense_flops(pos, n)
        if experts_on_gpu and layer in set(md.layers_moe):
            flops += n * self.k * md.expert_flops
        return m.gpu_flops_s(flops)

    def _engram_s(self, n: int, layer: int) -> float:
        """Seconds the layer's inline Engram gather of an n-token batch holds the stream: the
        engine's threads fault cold pages in parallel (dsv41/engram_disk.cpp)."""
        if layer not in self.engram_layers:
            return 0.0
        m = self.m
        return layer_gather_s(self.model, m.hw, m.c, n, self.engram_cold,
                              self.plan.placement.engram_threads or m.threads)

    def _host_dense_s(self, pos: int, n: int) -> float:
        """Host-core seconds for one layer's dense path and attention of an n-token batch (no device)."""
        md, m = self.model, self.m
        return host_dense_s(md.prefill_dense_flops(n, self.outputs) / md.n_layers,
                            attention_flops(md, pos, n) / md.n_layers, m.c, m.threads, self.plan.engine,
                            self.llamacpp_dense_gflops)

    def _dense_flops(self, pos: int, n: int) -> float:
        """FLOPs of one layer's share of an n-token batch's dense path (the head for its outputs) and attention."""
        md = self.model
        return (md.prefill_dense_flops(n, self.outputs) + attention_flops(md, pos, n)) / md.n_layers

    # ---- stream-all: every touched expert copied once per chunk, in batches through slots --------
    def _stream_all(self, pos: int, n: int) -> None:
        """One chunk: per layer the dense path and attention, then the layer's touched experts in
        batches of `dma_batch_experts`, batch j copied into slot j % dma_slots once the GEMM that
        last read that slot is done, its GEMM once it has landed (GPU stream in order). With
        `dma_prefetch` the next RAM layer's first batches are queued as this layer's slots free,
        so they land during that layer's attention; without it they start with its MoE."""
        md, m, pf = self.model, self.m, self.pf
        touched = expected_touched(n, md.n_experts, self.k, TOUCH_LOCALITY)
        full, rest = divmod(touched, pf.dma_batch_experts)
        sizes = [float(pf.dma_batch_experts)] * int(full) + ([rest] if rest > 1e-9 else [])
        gemm_s = m.gpu_flops_s(n * self.k * md.expert_flops) / touched if touched else 0.0  # per expert
        ram = self.ram_layers  # in layer order
        nxt_ram = {a: b for a, b in zip(ram, ram[1:])}
        S = pf.dma_slots
        # per RAM layer: batches landed, copies issued, next GEMM, slots its last batches freed for
        # the next layer's prefetch; the current layer on the GPU
        st = {layer: {"landed": set(), "issued": set(), "gemm": 0, "freed": set()} for layer in ram}

        def issue(layer, j):
            st[layer]["issued"].add(j)
            m.dma(sizes[j] * self.eb, lambda: land(layer, j))

        def land(layer, j):
            st[layer]["landed"].add(j)
            if self.cur == layer and not self.gemm_busy:
                gemm(layer)

        def dense(layer):
            if layer >= md.n_layers:
                self._chunk_done()
                return
            self.cur, self.gemm_busy = None, False
            moe = layer in st
            m.gpu.submit(self._compute_s(pos, n, layer, experts_on_gpu=not moe) + self._engram_s(n, layer),
                         (lambda: moe_start(layer)) if moe else (lambda: dense(layer + 1)))

        def moe_start(layer):
            self.cur = layer
            for j in range(min(S, len(sizes))):
                if j not in st[layer]["issued"]:
                    issue(layer, j)
            gemm(layer)

        def gemm(layer):
            g = st[layer]["gemm"]
            if g >= len(sizes):
                dense(layer + 1)
                return
            if g not in st[layer]["landed"]:
                return  # land() resumes
            self.gemm_busy = True
            st[layer]["gemm"] = g + 1
            m.gpu.submit(sizes[g] * gemm_s, lambda: gemm_done(layer, g))

        def gemm_done(layer, g):
            self.gemm_busy = False
            if g + S < len(sizes):
                issue(layer, g + S)  # its slot is free now
            elif pf.dma_prefetch and layer in nxt_ram:
                # the next RAM layer's first batches, queued in order on the copy stream, each once
                # its slot's last reader here is done (batch j goes to slot j)
                nxt, free = nxt_ram[layer], st[layer]["freed"]
                free.add(g % S)
                j = len(st[nxt]["issued"])
                while j < min(S, len(sizes)) and j in free:
                    issue(nxt, j)
                    j += 1
            gemm(layer)

        self.cur, self.gemm_busy = None, False
        dense(0)

    def _chunk_done(self) -> None:
        self._next()

    # ---- op offload / CPU prefill: per layer, serial --------------------------------------------
    def _per_layer(self, pos: int, n: int, layer: int) -> None:
        md, m = self.model, self.m
        if layer >= md.n_layers:
            self._next()
            return
        nxt = lambda: self._per_layer(pos, n, layer + 1)
        is_moe = layer in set(md.layers_moe)
        in_ram = is_moe and layer not in self.gpu_layers
        eng_s = self._engram_s(n, layer)  # holds the device stream, or the host cores without one
        host_s = 0.0 if m.has_gpu else self._host_dense_s(pos, n) + eng_s  # no device: the host cores run it
        if not in_ram and not m.has_gpu:
            m.cpu.acquire(m.threads, lambda: m.sim.after(host_s, lambda: (m.cpu.release(m.threads), nxt())))
            return
        dense_s = self._compute_s(pos, n, layer, experts_on_gpu=not in_ram) + eng_s
        if not in_ram:
            m.gpu.submit(dense_s, nxt)
            return
        if self.pf.strategy == "op-offload" and op_offload(n, self.pf.op_offload_min_batch) and m.has_gpu:
            # llama.cpp copies the layer's whole expert tensor, then computes; the copy is dropped
            nbytes = md.n_experts * self.eb
            exp_s = m.gpu_flops_s(n * self.k * md.expert_flops)
            m.gpu.submit(dense_s, lambda: m.dma(nbytes, lambda: m.gpu.submit(exp_s, nxt)))
            return
        # experts on the CPU: GEMM FLOPs at the engine's per-core rate for the format and batch, weights from DDR
        touched = expected_touched(n, md.n_experts, self.k, TOUCH_LOCALITY)
        nbytes = touched * self.eb
        gflops = cpu_expert_prefill_gflops(m.hw, self.plan, md, n * self.k / max(touched, 1e-9), m.threads, m.c)
        cpu_s = n * self.k * md.expert_flops / (gflops * 1e9 * m.threads)
        rate = min(m.cpu_expert_rate, nbytes / cpu_s) if cpu_s > 0 else m.cpu_expert_rate
        # llama.cpp then multiplies the outputs by their weights on these cores (with a device, ggml's scheduler runs
        # that on the device)
        if self.plan.engine == "llamacpp" and not m.has_gpu:
            host_s += llamacpp_weighting_s(m.hw, md, n, self.k, m.threads)
        after_dense = lambda: m.cpu_read(nbytes, nxt, rate=rate, extra_s=host_s)
        if m.has_gpu:
            m.gpu.submit(dense_s, after_dense)
        else:
            after_dense()
