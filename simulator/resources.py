"""The machine as simulated resources: GPU compute stream, copy engine, PCIe H2D, DDR pool, CPU
cores, NVMe; and the calibrated constants shared by the event simulation and the screen.

Every transfer that touches system memory also crosses the DDR link, so CPU expert reads,
zero-copy reads, DMA copies and page-cache fills contend there (fluid sharing).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from specs.formats import (LLAMACPP_TILED_WINDOW_TOKENS, LLAMACPP_WEIGHTING_KEY, executor_expert_groups,
                           executor_prefill_group_bytes, llamacpp_dense_prefill_key, llamacpp_prefill_keys,
                           llamacpp_prefill_path, llamacpp_repacks)

from .engine import FluidNet, Pool, Serial, Sim
from .policies import whole_experts_per_thread

GB = 1e9


@dataclass(frozen=True)
class Constants:
    """Overhead and efficiency constants; `hw.constants` overrides each by name (fitted ones)."""

    zc_efficiency: float = 1.0  # fraction of pcie.zero_copy_gbs a decode zero-copy read attains
    handover_ms: float = 0.0  # GPU->CPU->GPU synchronisation per layer with CPU expert work, ms
    step_overhead_ms: float = 0.0  # per decode step (sampling, graph launch), ms
    gpu_bw_efficiency: float = 1.0  # fraction of VRAM bandwidth for dense reads (7.4 ms is an upper estimate)
    # GPU expert GEMV: dsv41-flash-offload's t_hit = 0.03 ms per 13.27 MB expert = 442 GB/s = 47% of
    # the 3090's 936 GB/s (reported constant, not fitted); used for every GPU-resident expert.
    gpu_expert_efficiency: float = 0.47
    gemm_efficiency: float = 0.30  # fraction of fp16_tflops prefill GEMMs attain (assumed, see README)
    cpu_prefill_gflops_per_core: float = 50.0  # CPU prefill expert GEMM rate per core, GFLOP/s (assumed)
    cpu_prefill_ref_tokens: float = 16.0  # tokens an expert of the batch that rate was measured on (calibrate: 64 x 8 / 32)
    # what an expert's product costs beyond its multiply-adds (its weights decoded once, its tokens' last, part-filled
    # register tile), in tokens' worth of them: the executor's GEMM runs at m / (m + m0) of its peak at m tokens an
    # expert (calibrate: two batch sizes; 0: one rate at every m)
    cpu_prefill_fixed_tokens: float = 0.0
    # the executor's dense products (attention projections, router, head) and its attention on the host cores in
    # prefill, GFLOP/s per core (calibrate: a synthetic F16 attention block at 512 tokens); 0: the expert rate above
    cpu_dense_gflops_per_core: float = 0.0
    cpu_attention_gflops_per_core: float = 0.0
    cpu_job_ms: float = 0.0  # fixed cost of one CPU expert job (kernel launch, routing tables), ms
    # a decode layer whose dense path runs on the host cores, beyond its bytes and job costs: what
    # alternating attention and expert work costs (calibrate's layer loop), ms
    cpu_layer_ms: float = 0.0
    cpu_layer_ms_per_mb: float = 0.0  # the same, further per MB such a layer reads on the host cores
    # An engine's host costs, fitted from its traces (calibration.trace_fit; 0 for engines that
    # launch a layer as one graph): fixed host time of each layer's dense path (Python and torch
    # dispatch, norms, routing), on a host-sharing pseudo-GPU or before a discrete GPU's kernels;
    # the rate at which the device computes a resident expert (GB/s over the expert's device
    # bytes, dispatch included) and the bytes per weight its resident copies take (f32 = 4).
    layer_overhead_ms: float = 0.0
    token_overhead_ms: float = 0.0  # per layer, per token beyond the first in a step (several streams)
    device_layer_ms: float = 0.0  # host time of a MoE layer's device-tier dispatch (layers with device work)
    # A discrete GPU's layers where device work and a CPU job overlap (an executor dispatching from
    # the host cores the CPU job runs on): host time of the hand-off, before both sides; the device
    # side's and the CPU job's slowdown while they run together, ms
    overlap_layer_ms: float = 0.0
    overlap_dev_ms: float = 0.0
    overlap_cpu_ms: float = 0.0
    # An engine copying experts from pageable memory (its mmap) instead of pinned buffers: the rate such
    # a host-to-device copy attains (0: pcie.h2d_gbs, pinned) and its host time per copied expert
    # beyond the copy and a hit (separate copies of its tensors, dequantising on the device), ms
    copy_h2d_gbs: float = 0.0
    copy_miss_ms: float = 0.0
    dev_expert_gbs: float = 0.0  # 0: VRAM bandwidth x gpu_expert_efficiency
    dev_bytes_per_param: float = 0.0  # 0: the expert's quantised bytes
    engram_row_us: float = 0.0  # host time to gather one cached Engram row inline, µs

    @classmethod
    def from_hw(cls, hw, engine: str | None = None, **override) -> "Constants":
        """Defaults, then the profile's fitted `constants`, then explicit overrides. calibrate's c_a_ms
        (the executor's cost of one kernel call) stands for cpu_job_ms unless one is fitted, except
        for llama.cpp (`engine`), whose graph runs a token's ops on a persistent thread pool."""
        vals = {f.name: hw.constant(f.name, getattr(cls(), f.name)) for f in fields(cls)}
        if "cpu_job_ms" not in hw.constants and "c_a_ms" in hw.constants and engine != "llamacpp":
            vals["cpu_job_ms"] = float(hw.constants["c_a_ms"])  # calibrate's measured fixed cost per CPU job
        vals.update(override)
        return cls(**vals)


def rowwise(hw, plan) -> bool:
    """Whether `plan`'s engine's CPU products run at the profile's rowwise rates: llama.cpp's ggml computes
    one weight row per dot product without software prefetch (calibration.bench_rowwise), where the
    profile has such rates."""
    return plan.engine == "llamacpp" and bool(hw.cpu.rowwise_gbs)


def repacked(hw, plan, fmt) -> bool:
    """Whether `plan`'s engine computes CPU weights in `fmt` from its repacked layout: llama.cpp copies
    the formats its kernels interleave on this CPU's instruction sets at load (unless --no-repack) and
    computes them 8 rows a pass (specs.formats.llamacpp_repacks)."""
    return plan.engine == "llamacpp" and plan.cpu_repack and llamacpp_repacks(fmt, hw.cpu.isa)


def whole_jobs(hw, plan, threads: int) -> bool:
    """Whether `plan`'s engine runs a CPU job whose experts split evenly over the threads as whole experts per
    thread (simulator.policies.whole_experts_per_thread): the executor's (on one thread, every decode job), unless
    the plan gives experts to a device of torch on these same cores (a cache, static layers, misses sent there: beside
    it a thread that loses its core delays its whole experts, so it splits rows: executor.experts); where the
    profile has whole-expert rates on that many threads (CPU.whole_timed: on one, where it timed them on one)."""
    device_experts = bool(plan.expert_cache.slots or plan.placement.gpu_expert_layers or plan.miss_policy.kind != "cpu")
    shares = hw.gpu is not None and hw.gpu.shares_host and device_experts
    return plan.engine == "custom" and not shares and hw.cpu.whole_timed(threads)


def cpu_gbs(hw, fmt, threads: int, plan, whole: bool = False) -> float:
    """GB/s at which `plan`'s engine computes weights in `fmt` on `threads` host cores (for llama.cpp:
    the repacked rate of the formats it repacks, the rowwise rate of the others), those read in place from its mmap
    slowed by the file's page layout (in_place_page_excess); whole: a job of whole experts per thread, where
    whole_jobs says the engine runs them)."""
    rp = repacked(hw, plan, fmt)
    rate = hw.cpu.expert_gbs_for(fmt, threads, rowwise=rowwise(hw, plan), repacked=rp,
                                 whole=whole and whole_jobs(hw, plan, threads))
    return rate / (1.0 + in_place_page_excess(hw, fmt, threads, plan)) if not rp else rate


def in_place_page_excess(hw, fmt, threads: int, plan) -> float:
    """Extra time, as a fraction, `plan`'s engine's CPU products of `fmt` on `threads` cores take read in place through
    its mmap of a file whose page boundaries are physical breaks in the share plan.cpu_file_page_breaks
    (CPU.file_page_excess: the prefetcher streams physical addresses and starts again at each break): llama.cpp's
    rows at its rowwise rates' excess (none for weights read into buffers at load, --no-mmap), the executor's (which
    reads its experts and CPU dense weights in place always) at its kernel's; 0 for other engines (not calibrated)."""
    if not plan.cpu_file_page_breaks or plan.engine not in ("llamacpp", "custom"):
        return 0.0
    if plan.engine == "llamacpp" and not plan.cpu_mmap:
        return 0.0
    return hw.cpu.file_page_excess(fmt, threads, plan.cpu_file_page_breaks, kernel=plan.engine == "custom")


def cpu_expert_gbs(hw, model, threads: int, plan, whole: bool = False) -> float:
    """GB/s at which `plan`'s engine computes `model`'s routed experts on `threads` host cores: each weight type's
    bytes at its own rate (cpu_gbs: a Q4_K_M file's Q6_K down projections at Q6_K's; llama.cpp's repacked Q4_K
    beside the Q2_K it computes in place, in its Q2_K files); whole as cpu_gbs."""
    return model.expert_rate(lambda fmt: cpu_gbs(hw, fmt, threads, plan, whole))


def cpu_dense_gbs(hw, model, threads: int, plan) -> float:
    """GB/s at which `plan`'s engine reads `model`'s dense path on `threads` host cores: each weight type's
    bytes at its own rate, as cpu_expert_gbs (F16 attention beside a Q8_0 head; a Q4_K_M file's Q6_K attn_v)."""
    return model.dense_rate(lambda fmt: cpu_gbs(hw, fmt, threads, plan))


def cpu_expert_prefill_gflops(hw, plan, model, tokens_per_expert: float, threads: int, c: Constants) -> float:
    """GFLOP/s per core of `plan`'s engine's CPU expert products on a prefill batch with that many tokens an
    expert: each weight type's share of the multiply-adds at its own rate (cpu_prefill_gflops); the executor's in
    the token groups its integer GEMM takes on this CPU's L2, on the activations the profile timed it on
    (specs.formats.executor_expert_groups; an int8 build's groups hold 1.5x the tokens)."""
    groups = 1.0 if plan.engine == "llamacpp" else executor_expert_groups(
        model.hidden, model.expert_ffn, tokens_per_expert, executor_prefill_group_bytes(hw.cpu.l2_bytes, hw.cpu.isa),
        hw.cpu.executor_gemm_activations)
    return model.expert_rate(lambda fmt: cpu_prefill_gflops(hw, plan, fmt, tokens_per_expert, threads, c, groups),
                             per="weights")


def cpu_prefill_gflops(hw, plan, fmt, tokens_per_expert: float, threads: int, c: Constants,
                       groups: float = 1.0) -> float:
    """GFLOP/s per core of `plan`'s engine's CPU expert products on a prefill batch with that many tokens an
    expert: for llama.cpp, the rate of the structure ggml gives `fmt` there (specs.formats.llamacpp_prefill_path)
    where the profile has it (on the repacked path, the rebuilt format's: specs.formats.llamacpp_prefill_keys); else
    the executor's, in `groups` token groups an expert: its prefill job's rate, scaled by `fmt`'s products' speed over
    the job format's where the profile has it (cpu.prefill_format_share). A path whose windows share a fixed part
    (the tiled GEMM's unpacking) runs at the batch's own share of it (ggml_window_scale)."""
    if plan.engine == "llamacpp" and hw.cpu.ggml_prefill_gflops:
        path = llamacpp_prefill_path(fmt, repacked(hw, plan, fmt), tokens_per_expert, hw.cpu.isa)
        for key in llamacpp_prefill_keys(fmt.name, path):
            own = hw.cpu.ggml_prefill_gflops_for(key, threads)
            if own is not None:
                return own * ggml_window_scale(hw.cpu, key, tokens_per_expert, threads)
    return executor_prefill_gflops(c, tokens_per_expert, groups) * hw.cpu.prefill_share_for(fmt)


def ggml_window_scale(cpu, key: str, tokens_per_expert: float, threads: int) -> float:
    """Rate of ggml's path `key` at that many tokens an expert over its rate at the profile's
    ggml_prefill_ref_tokens: an expert's m tokens run in ceil(m / 256) windows (specs.formats.
    LLAMACPP_TILED_WINDOW_TOKENS), each costing m0 tokens' worth of multiply-adds beyond its tokens' own (the profile's
    ggml_prefill_fixed_tokens), so the rate goes as m / (m + ceil(m / 256) m0). 1 where the profile has no m0."""
    m0, ref = cpu.ggml_prefill_fixed_tokens_for(key, threads), cpu.ggml_prefill_ref_tokens
    if not m0 or not ref:
        return 1.0

    def share(m: float) -> float:  # the multiply-adds' share of the time
        return m / (m + math.ceil(m / LLAMACPP_TILED_WINDOW_TOKENS) * m0)
    return share(max(tokens_per_expert, 1.0)) / share(float(ref))


def executor_prefill_gflops(c: Constants, tokens_per_expert: float, groups: float = 1.0) -> float:
    """GFLOP/s per core of the executor's CPU expert GEMM at that many tokens an expert, taken in `groups` token
    groups (each decoding the weights again: specs.formats.executor_expert_groups): the measured rate at
    cpu_prefill_ref_tokens (one group) times m / (m + groups m0) over its value there (m0 = cpu_prefill_fixed_tokens)."""
    m0 = c.cpu_prefill_fixed_tokens
    if m0 <= 0:
        return c.cpu_prefill_gflops_per_core
    m, ref = max(tokens_per_expert, 1.0), c.cpu_prefill_ref_tokens
    return c.cpu_prefill_gflops_per_core * (m / (m + groups * m0)) / (ref / (ref + m0))


def llamacpp_dense_prefill_gflops(hw, model, threads: int, c: Constants) -> float:
    """GFLOP/s per core of llama.cpp's dense products on a prefill batch, the head aside: each dense weight type's
    multiply-adds at the rate of ggml's path for it where the profile has one (specs.formats.llamacpp_dense_prefill_key:
    F16 on llamafile's tinyBLAS), else at the expert GEMM's (cpu_prefill_gflops_per_core)."""
    def rate(fmt) -> float:
        key = llamacpp_dense_prefill_key(fmt.name, hw.cpu.isa)
        own = hw.cpu.ggml_prefill_gflops_for(key, threads) if key else None
        return own or c.cpu_prefill_gflops_per_core
    return model.prefill_dense_rate(rate)


def llamacpp_weighting_s(hw, model, tokens: int, k: int, threads: int) -> float:
    """Seconds llama.cpp's weighting of one MoE layer's expert outputs takes on `threads` host cores for `tokens`
    tokens (ggml's MUL of build_moe_ffn: the tokens x k rows of `hidden` values split evenly over the threads, the
    busiest thread's rows at the profile's 'F32:weighting' rate); 0 where the profile has no such rate. Only an
    all-CPU plan runs it on the host: with a device, ggml_backend_sched's "expand gpu up" pass gives the op, which holds
    no weights, the device of the next layer's norm (ggml-backend.cpp), and the outputs are copied over."""
    rate = hw.cpu.ggml_prefill_gflops_for(LLAMACPP_WEIGHTING_KEY, threads)
    if not rate or tokens <= 0:
        return 0.0
    rows = tokens * k
    return -(-rows // threads) * model.hidden / (rate * 1e9)


def host_dense_s(dense_flops: float, attention_flops: float, c: Constants, threads: int, engine: str,
                 llamacpp_dense_gflops: float | None = None) -> float:
    """Seconds `threads` host cores take for a prefill batch's dense products and attention (FLOPs): for the
    executor at its measured dense and attention rates where the profile has them; for llama.cpp its dense products
    at llamacpp_dense_gflops (per core) where given; else, and its attention, at the expert GEMM's rate
    (cpu_prefill_gflops_per_core)."""
    base = c.cpu_prefill_gflops_per_core
    own = engine != "llamacpp"
    dense = c.cpu_dense_gflops_per_core if own and c.cpu_dense_gflops_per_core > 0 else base
    attn = c.cpu_attention_gflops_per_core if own and c.cpu_attention_gflops_per_core > 0 else dense
    if not own and llamacpp_dense_gflops:  # its products only: attention (flash attention on the CPU) is not tinyBLAS
        dense = llamacpp_dense_gflops
    return (dense_flops / dense + attention_flops / attn) / (1e9 * threads)


def cpu_pair_s(model, c: Constants, threads: int) -> float:
    """Seconds of one further (token, expert) product on `threads` cores: the prefill GEMM rate, since
    the expert's weights are already being read for its first token."""
    return model.expert_flops / (c.cpu_prefill_gflops_per_core * 1e9 * threads)


class Machine:
    """One machine's resources inside a `Sim`, sized from a HardwareSpec and a Plan."""

    def __init__(self, sim: Sim, model, hw, plan, consts: Constants):
        self.sim, self.model, self.hw, self.c = sim, model, hw, consts
        self.net = FluidNet(sim)
        self.threads = int(plan.cpu_threads or hw.cpu.threads_used)
        self.has_gpu = hw.gpu is not None
        self.shares_host = bool(self.has_gpu and hw.gpu.shares_host)
        self.gpu = Serial(sim, "gpu")
        self.copy = Serial(sim, "copy_engine")
        self.cpu = Pool(sim, "cpu", self.threads)
        pcie = hw.pcie
        self.pcie = self.net.link("pcie_h2d", (pcie.h2d_gbs if pcie else 1.0) * GB)
        self.ddr = self.net.link("ddr", hw.memory.usable_gbs * GB)
        self.nvme = self.net.link("nvme", hw.nvme.seq_read_gbs * GB)
        self.zc_rate = (pcie.zero_copy_gbs if pcie else 1.0) * GB * consts.zc_efficiency
        self.h2d_rate = (consts.copy_h2d_gbs or (pcie.h2d_gbs if pcie else 1.0)) * GB
        self.cpu_expert_rate = cpu_expert_gbs(hw, model, self.threads, plan) * GB
        # a job of whole experts per thread (the executor's decode where its experts split evenly): its own rate
        self.whole_jobs = whole_jobs(hw, plan, self.threads)
        self.cpu_whole_rate = cpu_expert_gbs(hw, model, self.threads, plan, whole=True) * GB
        self.cpu_dense_rate = cpu_dense_gbs(hw, model, self.threads, plan) * GB
        self.gpu_bw = (hw.gpu.bw_gbs * GB * consts.gpu_bw_efficiency) if self.has_gpu else 0.0
        self.gpu_flops = (hw.gpu.fp16_tflops * 1e12 * consts.gemm_efficiency) if self.has_gpu else 0.0
        self.rand_rate = hw.nvme.rand_4k_iops * hw.page_bytes
        self.moved = {"gpu": 0.0, "copy_engine": 0.0, "cpu": 0.0}  # bytes each engine processed
        self.dev_expert_bytes = (model.params_per_expert * consts.dev_bytes_per_param
                                 if consts.dev_bytes_per_param else model.expert_bytes)
        self.dev_expert_rate = (consts.dev_expert_gbs * GB if consts.dev_expert_gbs
                                else self.gpu_bw * consts.gpu_expert_efficiency)
        self.nvme_latency = hw.nvme.latency_us * 1e-6
        dev = hw.expert_device if plan.device_tier.slots else None
        self.device = Serial(sim, "expert_device") if dev is not None else None  # the second card's worker
        if dev is not None:  # its own link from host RAM; its products at the GPU's GEMV efficiency
            self.device_link = self.net.link("device_h2d", dev.h2d_gbs * GB)
            self.device_hit_s = model.expert_bytes / (dev.bw_gbs * GB * consts.gpu_expert_efficiency)
            self.moved["expert_device"] = 0.0

    def cpu_job_rate(self, counts) -> float:
        """Bytes/s of a CPU job of experts routed by `counts` tokens each: the whole-expert rate where the engine
        runs this job's experts whole on their threads (whole_jobs, whole_experts_per_thread), else the rows'."""
        if self.whole_jobs and whole_experts_per_thread(counts, self.threads):
            return self.cpu_whole_rate
        return self.cpu_expert_rate

    # ---- transfers and jobs (sizes in bytes, done() when finished) --------------------------
    def zero_copy(self, nbytes: float, done) -> None:
        """GPU kernel reading mapped host memory: crosses PCIe and DDR."""
        self.net.start(nbytes, (self.pcie, self.ddr), done, cap=self.zc_rate, name="zero-copy")

    def dma(self, nbytes: float, done=None) -> None:
        """Copy-engine H2D copy (FIFO on the copy engine) at the pinned rate, or copy_h2d_gbs for an engine
        copying from pageable memory."""
        self.moved["copy_engine"] += nbytes
        def go():
            self.net.start(nbytes, (self.pcie, self.ddr), lambda: self._dma_end(done),
                           cap=self.h2d_rate, name="dma")
        self.copy.acquire(go)

    def _dma_end(self, done) -> None:
        self.copy.release()
        if done is not None:
            done()

    def cpu_read(self, nbytes: float, done, rate: float | None = None, extra_s: float = 0.0) -> None:
        """All CPU threads compute over `nbytes` of weights in DDR (each core capped by its
        arithmetic rate, all of them by their DDR share); `extra_s` of arithmetic beyond the read."""
        rate = self.cpu_expert_rate if rate is None else rate
        threads = self.threads
        self.moved["cpu"] += nbytes
        job_s = self.c.cpu_job_ms * 1e-3 + extra_s

        def flow():
            self.net.start(nbytes, (self.ddr,), lambda: self._cpu_end(done), cap=rate,
                           weight=threads, name="cpu")
        go = (lambda: self.sim.after(job_s, flow)) if job_s else flow
        self.cpu.acquire(threads, go)

    def _cpu_end(self, done) -> None:
        self.cpu.release(self.threads)
        done()

    def nvme_read(self, nbytes: float, done, random: bool = False) -> None:
        """Read from NVMe into the page cache (fills cross DDR); random 4 KiB reads are IOPS-capped."""
        cap = self.rand_rate if random else self.hw.nvme.seq_read_gbs * GB
        self.sim.after(self.nvme_latency, lambda: self.net.start(
            nbytes, (self.nvme, self.ddr), done, cap=cap, name="nvme"))

    def device_job(self, n_held: int, n_staged: int, tier, done) -> None:
        """One job on the second card's worker (one at a time): its fixed cost, the staged experts copied
        over the card's link (and DDR) and converted, then the products of every expert in the job."""
        eb = self.model.expert_bytes
        self.moved["expert_device"] += (n_held + n_staged) * eb
        compute_s = n_staged * tier.convert_ms * 1e-3 + (n_held + n_staged) * self.device_hit_s
        end = lambda: (self.device.release(), done())  # noqa: E731
        products = lambda: self.sim.after(compute_s, end)  # noqa: E731

        def go():
            if n_staged:
                self.sim.after(tier.job_ms * 1e-3, lambda: self.net.start(
                    n_staged * eb, (self.device_link, self.ddr), products, name="device-stage"))
            else:
                self.sim.after(tier.job_ms * 1e-3, products)
        self.device.acquire(go)

    # ---- a host-sharing pseudo-GPU: its work holds the device stream and reads host DDR ----------
    def dense_dispatch_s(self, tokens: int = 1) -> float:
        """Seconds of host time to issue one layer's dense path for `tokens` tokens (fitted constants)."""
        return (self.c.layer_overhead_ms + (tokens - 1) * self.c.token_overhead_ms) * 1e-3

    def host_dense(self, nbytes: float, done, tokens: int = 1) -> None:
        """One layer's dense path on a host-sharing device: fixed host cost (per layer, and per
        further token of the step), then `nbytes` of weights read at the host kernels' rate for
        the dense format, over DDR."""
        self.moved["gpu"] += nbytes
        over = self.dense_dispatch_s(tokens)
        if tokens > 1:  # each further token's dense products at the host GEMM rate
            over += (tokens - 1) * self.gpu_flops_s(self.model.dense_flops_per_token / self.model.n_layers)

        def flow():
            self.net.start(nbytes, (self.ddr,), lambda: (self.gpu.release(), done()),
                           cap=self.cpu_dense_rate, name="host-dense")
        self.gpu.acquire(lambda: self.sim.after(over, flow) if over else flow())

    def host_experts(self, n: int, done, extra_pairs: int = 0, hold_s: float = 0.0) -> None:
        """`n` resident experts on a host-sharing device: their device copies read over DDR
        (contending with CPU expert jobs) at the measured per-hit rate; `extra_pairs` further
        (token, expert) products at the host GEMM rate; `hold_s` seconds more on the cores (sharing
        them with a CPU job)."""
        nbytes = n * self.dev_expert_bytes
        self.moved["gpu"] += nbytes
        extra_s = self.gpu_flops_s(extra_pairs * self.model.expert_flops) + hold_s

        def end():
            self.cpu.release(self.threads)
            self.gpu.release()
            done()

        def flow():  # the host device's threads are the CPU tier's cores: it waits for them
            self.net.start(nbytes, (self.ddr,), end, cap=self.dev_expert_rate, name="host-experts")
        self.gpu.acquire(lambda: self.cpu.acquire(self.threads, lambda: self.sim.after(extra_s, flow)
                                                  if extra_s else flow()))

    def cpu_pairs_s(self, extra_pairs: int) -> float:
        """Seconds of CPU arithmetic for (token, expert) products beyond one token per expert."""
        return extra_pairs * cpu_pair_s(self.model, self.c, self.threads) if extra_pairs else 0.0

    def gpu_read_s(self, nbytes: float) -> float:
        """Seconds for the GPU to stream `nbytes` of weights from VRAM."""
        self.moved["gpu"] += nbytes
        return nbytes / self.gpu_bw if self.gpu_bw else 0.0

    def gpu_expert_s(self, nbytes: float) -> float:
        """Seconds for the GPU to run experts of `nbytes` (quantised) resident in VRAM: their device
        copies (dev_bytes_per_param, else the same bytes) at dev_expert_gbs (an engine's fitted
        per-hit rate, dispatch included), else at the VRAM bandwidth x the GEMV efficiency."""
        self.moved["gpu"] += nbytes
        return nbytes / self.model.expert_bytes * self.dev_expert_bytes / self.dev_expert_rate \
            if self.dev_expert_rate else 0.0

    def gpu_flops_s(self, flops: float) -> float:
        """Seconds for `flops` of fp16 GEMM work on the GPU."""
        return flops / self.gpu_flops if self.gpu_flops else 0.0

    # ---- results ------------------------------------------------------------------------------
    def report(self, elapsed_s: float) -> dict:
        """{name: {busy_fraction, bytes}} over `elapsed_s` seconds."""
        el = max(elapsed_s, 1e-12)
        out = {name: {"busy_fraction": min(1.0, srv.busy_s / el), "bytes": self.moved[name]}
               for name, srv in (("gpu", self.gpu), ("copy_engine", self.copy), ("cpu", self.cpu))}
        for ln in (self.pcie, self.ddr, self.nvme):
            out[ln.name] = {"busy_fraction": min(1.0, ln.busy_s / el), "bytes": ln.bytes}
        if self.device is not None:
            out["expert_device"] = {"busy_fraction": min(1.0, self.device.busy_s / el),
                                    "bytes": self.moved["expert_device"]}
            out["device_h2d"] = {"busy_fraction": min(1.0, self.device_link.busy_s / el), "bytes": self.device_link.bytes}
        return out
