"""Closed-form steady-state screen for the planner: the event simulation's physics and constants
without events or contention, vectorised over the hit count of a layer.

`screen(model, hw, plan)` -> Screen(decode_tok_s, ttft_s, bottleneck). Without contention and with
deterministic routing it equals the event simulation exactly (tests/simulator/test_screen.py). A second card's
expert tier (plan.device_tier, simulator.device_tier) is not in it: its slots fill from the split's staged
misses by LRU, a state only the event simulation follows, so the screen ranks such a plan as if the card
were absent and the planner's headline figure (simulated) carries the card.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import math


from .engram import EngramText, gathers_inline, layer_gather_s, ram_room
from .policies import auction_split, expected_touched, mtp_tokens, whole_experts_per_thread
from .prefill import TOUCH_LOCALITY, attention_flops
from .resources import (GB, Constants, cpu_dense_gbs, cpu_expert_gbs, cpu_expert_prefill_gflops, cpu_pair_s, host_dense_s,
                        llamacpp_dense_prefill_gflops, llamacpp_weighting_s, whole_jobs)
from .routing import distinct_per_layer, inclusion, make_routing


@dataclass
class Screen:
    decode_tok_s: float
    ttft_s: float
    bottleneck: str
    step_ms: dict = field(default_factory=dict)  # time per decode step by resource, ms
    hit_rate: float = 0.0


def binom_pmf(n: int, h: float) -> np.ndarray:
    """P(j hits of n) for j = 0..n, hits independent with probability h (scipy.stats-free import)."""
    return np.array([math.comb(n, j) * h**j * (1 - h) ** (n - j) for j in range(n + 1)])


def expected_hit_rate(model, plan, routing=None, seed: int = 0) -> float:
    """Share of routed experts a warm cache of `slots` serves: the most popular slots' share."""
    slots = plan.expert_cache.slots
    if slots <= 0:
        return 0.0
    k = plan.experts_per_token or model.top_k
    rt = routing or make_routing("fitted", model.n_moe_layers, model.n_experts, k, seed)
    pi = np.concatenate([inclusion(p, k) for p in rt.popularity])
    top = np.sort(pi)[::-1][:slots]
    return float(top.sum() / pi.sum())


def _tokens_per_expert(ntok: int, k: int, n: int) -> float:
    """Mean tokens routed to each of a layer's n distinct experts in a step of ntok tokens (top-k)."""
    return ntok * k / n if ntok > 1 and n else 1.0


def _cpu_count(nh: int, nm: int, plan, has_gpu: bool, memo: dict, m: float = 1.0) -> int:
    """Misses the plan hands to the CPU tier; the auction prices a CPU expert routed by m tokens as
    c_b (1 + c_tok (m - 1)) (policies.auction_split, as decode.py does with each expert's count)."""
    mp = plan.miss_policy
    if nm == 0 or not has_gpu or mp.kind == "cpu":
        return nm
    if mp.kind != "auction":
        return 0
    if (nh, nm) not in memo:
        tokens = np.full(nm, m) if m > 1 and mp.c_tok else None
        memo[nh, nm] = auction_split(nh, nm, mp.t_hit_ms, mp.t_zc_ms, mp.c_a_ms, mp.c_b_ms, tokens=tokens,
                                     c_tok=mp.c_tok if tokens is not None else 0.0, max_cpu=mp.max_cpu)[0]
    return memo[nh, nm]


@dataclass(frozen=True)
class ExpertTimes:
    """What one expert costs each tier in a decode step, ms (ssd_frac: share of CPU-side experts that
    come from NVMe; job and handover: per CPU job; pair: a CPU expert's product for a further token)."""

    hit: float  # a resident expert on the device (dispatch included where fitted)
    zc: float  # a zero-copy read over PCIe
    copy: float  # a copy into a staging slot (copy_miss_ms included)
    cpu: float  # a CPU expert, at the kernel rate capped by DDR
    ssd: float  # an expert read from NVMe
    ssd_frac: float
    job: float
    handover: float
    pair: float
    alt: float = 0.0  # a CPU expert read between attention blocks on the same cores (cpu_layer_ms_per_mb)
    cpu_whole: float = 0.0  # a CPU expert in a job of whole experts per thread (resources.whole_jobs); 0: as cpu
    threads: int = 1  # the CPU tier's threads (whether a job's experts split evenly over them)

    def cpu_ms(self, k: int, m: float = 1.0) -> float:
        """ms of one CPU expert in a job of k experts routed by m tokens each: whole experts per thread where the
        engine runs them so (policies.whole_experts_per_thread), else rows split."""
        if self.cpu_whole and whole_experts_per_thread([max(1, round(m))] * k, self.threads):
            return self.cpu_whole
        return self.cpu


def expert_times(model, hw, plan, c: Constants, threads: int) -> ExpertTimes:
    """Per-expert tier costs of `model` under `plan` on `hw` (the rates decode.py charges), ms."""
    eb = model.expert_bytes
    has_gpu = hw.gpu is not None
    gpu_bw = hw.gpu.bw_gbs * GB * c.gpu_bw_efficiency if has_gpu else 0.0
    cpu_rate = cpu_expert_gbs(hw, model, threads, plan) * GB
    ddr = hw.memory.usable_gbs * GB
    whole = whole_jobs(hw, plan, threads)
    zc = hw.pcie.zero_copy_gbs * GB * c.zc_efficiency if hw.pcie else 1.0
    dev_eb = model.params_per_expert * c.dev_bytes_per_param if c.dev_bytes_per_param else eb
    dev_rate = c.dev_expert_gbs * GB if c.dev_expert_gbs else gpu_bw * c.gpu_expert_efficiency
    t_zc = eb / zc * 1e3
    copy_gbs = c.copy_h2d_gbs or (hw.pcie.h2d_gbs if hw.pcie else 0.0)
    ssd_frac = 0.0
    ram = plan.placement.expert_ram_bytes
    if ram is not None and ram < model.routed_bytes:
        off_gpu = model.routed_experts - plan.expert_cache.slots
        ssd_frac = max(0.0, 1 - (ram // eb) / max(off_gpu, 1))
    return ExpertTimes(hit=dev_eb / dev_rate * 1e3 if has_gpu and dev_rate else 0.0, zc=t_zc,
                       copy=(eb / (copy_gbs * GB) * 1e3 if copy_gbs else t_zc) + c.copy_miss_ms,
                       cpu=eb / min(cpu_rate, ddr) * 1e3, threads=threads,
                       cpu_whole=eb / min(cpu_expert_gbs(hw, model, threads, plan, whole=True) * GB, ddr) * 1e3
                       if whole else 0.0,
                       ssd=eb / (hw.nvme.seq_read_gbs * GB) * 1e3, ssd_frac=ssd_frac,
                       job=c.cpu_job_ms, handover=c.handover_ms, pair=cpu_pair_s(model, c, threads) * 1e3,
                       alt=c.cpu_layer_ms_per_mb * eb / 1e6 if not (has_gpu and plan.placement.dense == "gpu") else 0.0)


def _layer_ms(n, h, t: ExpertTimes, plan, has_gpu, discrete, c: Constants, memo, m=1.0):
    """Expected ms of one MoE layer with n distinct experts, hit probability h (binomial); each routed
    by m tokens, a CPU expert's m - 1 further products cost t.pair each; `c`'s fitted host costs of the
    device's layers as decode.py charges them (discrete: a real GPU, where hits beside a CPU job pay
    the overlap costs; else a host-sharing device, where they take turns on the cores) -> (ms,
    expected [gpu side, cpu side, pcie part])."""
    j = np.arange(n + 1)
    p = binom_pmf(n, h)
    out = np.zeros((n + 1, 3))  # per j: gpu side, cpu side, pcie part
    per_j = np.zeros(n + 1)
    mp = plan.miss_policy
    copying = mp.kind == "copy" or (mp.kind == "auction" and mp.gpu_path == "copy")
    sync = plan.expert_cache.copies == "sync"
    for nh in j:
        nm = n - nh
        kc = _cpu_count(nh, nm, plan, has_gpu, memo, m)
        ng = nm - kc
        ssd_c, ssd_g = kc * t.ssd_frac, ng * t.ssd_frac
        gpu = nh * t.hit + ng * t.zc + ssd_g * t.ssd if has_gpu else 0.0
        if copying and has_gpu and sync:  # copies on the compute stream: after the hits, then GEMVs
            gpu = nh * t.hit + ng * t.copy + ssd_g * t.ssd + ng * t.hit
        elif copying and has_gpu:  # copy engine runs beside the hits, then GEMVs
            gpu = max(nh * t.hit, ng * t.copy + ssd_g * t.ssd) + ng * t.hit
        both = discrete and (nh or ng) and kc
        shared = has_gpu and not discrete and nh and kc  # decode.py's shared_both: the cores in turn
        pre = c.overlap_layer_ms if both else 0.0
        if shared:
            gpu += c.overlap_dev_ms
        elif has_gpu and (nh or ng):
            gpu += (pre + c.overlap_dev_ms) if both else c.device_layer_ms
        cpu = 0.0
        if kc:
            tail = min(ssd_c, 1.0)  # pages stream in while the CPU computes; one expert trails
            # a host-sharing device runs a layer without device work inline (no hand-off), and one with
            # hits hands off behind them (shared); a discrete GPU always hands off
            ho = t.handover if has_gpu and (discrete or ng) and not shared else 0.0
            tc = t.cpu_ms(kc, m)
            cpu = t.job + ho + max((kc - tail) * tc, ssd_c * t.ssd) + tail * tc + kc * t.alt
            cpu += (pre + c.overlap_cpu_ms) if both else 0.0
            if m > 1:  # the further (token, expert) products, on any machine (decode.py: cpu_pairs_s)
                cpu += kc * (m - 1) * t.pair
        out[nh] = (gpu, cpu, ng * (t.copy if copying else t.zc))
        if shared:  # the hand-off, then the hits; the job, submitted with them, gets the cores after both
            pre_s = c.overlap_layer_ms or c.device_layer_ms
            per_j[nh] = pre_s + max(gpu, t.handover) + cpu
            out[nh, 0] += pre_s
        else:
            per_j[nh] = max(gpu, cpu)
    return float(p @ per_j), p @ out


def screen(model, hw, plan, prompt_tokens: int = 0, streams: int | None = None,
           constants: Constants | None = None, routing=None, hit_rate: float | None = None,
           engram_text: str = "seen") -> Screen:
    """Steady-state decode tok/s, TTFT (s) and the bounding resource, in closed form."""
    c = constants or Constants.from_hw(hw, plan.engine)
    streams = int(streams or plan.streams)
    k = plan.experts_per_token or model.top_k
    has_gpu = hw.gpu is not None
    threads = plan.cpu_threads or hw.cpu.threads_used
    gpu_bw = hw.gpu.bw_gbs * GB * c.gpu_bw_efficiency if has_gpu else 0.0
    t = expert_times(model, hw, plan, c, threads)
    h = expected_hit_rate(model, plan, routing) if hit_rate is None else hit_rate
    verify = mtp_tokens(plan.mtp.tokens_per_step, plan.mtp.acceptance) if plan.mtp.enabled else 1
    committed = plan.mtp.tokens_per_step if plan.mtp.enabled else 1.0
    ntok = streams * verify
    rtok = plan.padded_tokens(ntok)  # rows the MoE layers route (a graph-padded step's padding rows too)
    n = int(round(distinct_per_layer(rtok, model.n_experts, k)))
    memo: dict = {}
    m = _tokens_per_expert(rtok, k, n)
    lay, parts = _layer_ms(n, h, t, plan, has_gpu, has_gpu and not hw.gpu.shares_host, c, memo, m)
    if plan.engine == "llamacpp" and not has_gpu:  # its multiply of the outputs by their weights (decode.py's weigh_s)
        weigh_ms = llamacpp_weighting_s(hw, model, rtok, k, threads) * 1e3
        lay, parts = lay + weigh_ms, parts + np.array([0.0, weigh_ms, 0.0])
    gpu_layers = set(plan.placement.gpu_expert_layers)
    n_static = sum(1 for x in model.layers_moe if x in gpu_layers)
    n_dyn = model.n_moe_layers - n_static
    ctx = prompt_tokens
    dense_b = model.dense_bytes_per_token + model.kv_bytes_per_token(plan.kv.dtype) * ctx * ntok
    if has_gpu and plan.placement.dense == "gpu":  # the host issues each layer, the GPU streams its weights
        # (a host-sharing device reads them at the host kernels' rate: decode.py's host_dense)
        rate = cpu_dense_gbs(hw, model, threads, plan) * GB if hw.gpu.shares_host else gpu_bw
        dense_ms = dense_b / rate * 1e3 + model.n_layers * (c.layer_overhead_ms + (ntok - 1) * c.token_overhead_ms)
    else:
        dense_ms = (dense_b / (cpu_dense_gbs(hw, model, threads, plan) * GB) * 1e3
                    + model.n_layers * c.cpu_job_ms  # one CPU job per layer, as the event simulation
                    # attention and experts alternating on the cores
                    + model.n_moe_layers * (c.cpu_layer_ms + c.cpu_layer_ms_per_mb * (
                        model.layer_dense_bytes + (dense_b - model.dense_bytes_per_token) / model.n_layers) / 1e6))
    eng_ms = gather_ms = 0.0
    cold = engram_cold_fractions(model, hw, plan, engram_text, prompt_tokens)
    if gathers_inline(model, plan):
        gather_ms = len(model.engram.layers) * 1e3 * layer_gather_s(model, hw, c, ntok, cold[1])
    elif model.engram is not None and plan.placement.engram == "nvme" and cold[1] > 0:
        pages = ntok * model.engram_bytes_per_token(hw.page_bytes) * cold[1]
        eng_ms = hw.nvme.latency_us * 1e-3 + pages / (hw.nvme.rand_4k_iops * hw.page_bytes) * 1e3
    step = {"gpu": dense_ms + n_static * n * t.hit + c.step_overhead_ms,
            "pcie_h2d": n_dyn * float(parts[2]),
            "cpu": n_dyn * (lay - float(parts[2])) if parts[1] >= parts[0] else 0.0}
    step["gpu"] += n_dyn * lay - step["pcie_h2d"] - step["cpu"]
    if not (has_gpu and plan.placement.dense == "gpu"):  # the dense path ran on the host cores
        step["cpu (dense path)"] = step.pop("gpu")
    if gather_ms:
        step["nvme (Engram gather)"] = gather_ms
    step_ms = dense_ms + n_static * n * t.hit + n_dyn * lay + c.step_overhead_ms + gather_ms
    step_ms = max(step_ms, eng_ms)
    tok_s = streams * committed / step_ms * 1e3
    ttft = (prefill_s(model, hw, plan, prompt_tokens, c, cold[0]) * streams + step_ms / 1e3 if prompt_tokens
            else step_ms / 1e3)
    return Screen(tok_s, ttft, max(step, key=step.get), step, h)


def engram_cold_fractions(model, hw, plan, engram_text: str, prompt_tokens: int) -> tuple[float, float]:
    """Cold fractions of a lone request's (prompt, answer) Engram rows (simulator.engram.EngramText)."""
    if model.engram is None or plan.placement.engram != "nvme":
        return 0.0, 0.0
    text = EngramText(engram_text, ram_room(model, hw, plan), model.engram_bytes_per_token(hw.page_bytes))
    return text.request(prompt_tokens, 0)


def prefill_s(model, hw, plan, prompt_tokens: int, c: Constants, engram_cold: float = 0.0) -> float:
    """Seconds to prefill one prompt: per chunk, copy and compute overlapped (stream-all) or
    serial (op offload), or experts on the CPU; plus an inline Engram gather of the prompt's rows
    (`engram_cold` of them not cached)."""
    if prompt_tokens <= 0:
        return 0.0
    gather = 0.0
    if gathers_inline(model, plan):
        threads = plan.placement.engram_threads or plan.cpu_threads or hw.cpu.threads_used
        for n in plan.prefill.passes(prompt_tokens):
            gather += len(model.engram.layers) * layer_gather_s(model, hw, c, n, engram_cold, threads)
    return gather + _prefill_compute_s(model, hw, plan, prompt_tokens, c)


def _prefill_compute_s(model, hw, plan, prompt_tokens: int, c: Constants) -> float:
    """prefill_s without the Engram gather."""
    k = plan.experts_per_token or model.top_k
    threads = plan.cpu_threads or hw.cpu.threads_used

    def experts_s(n: int, layers: int) -> float:  # an n-token batch's expert products on the host cores
        touched = expected_touched(n, model.n_experts, k, TOUCH_LOCALITY)
        gflops = cpu_expert_prefill_gflops(hw, plan, model, n * k / max(touched, 1e-9), threads, c)
        # llama.cpp's multiply of the outputs by their weights, all-CPU (prefill.py's)
        weigh = llamacpp_weighting_s(hw, model, n, k, threads) if plan.engine == "llamacpp" and hw.gpu is None else 0.0
        return layers * (n * k * model.expert_flops / (gflops * 1e9 * threads) + weigh)
    if hw.gpu is None:  # no device: dense path, attention and experts all on the host cores
        total, pos = 0.0, 0
        dense_gflops = llamacpp_dense_prefill_gflops(hw, model, threads, c) if plan.engine == "llamacpp" else None
        for n, outputs in plan.prefill.passes_with_outputs(prompt_tokens):  # the head for a chunk's last token
            dense_s = host_dense_s(model.prefill_dense_flops(n, int(outputs)),
                                   attention_flops(model, pos, n), c, threads, plan.engine, dense_gflops)
            total += dense_s + experts_s(n, model.n_moe_layers) + model.n_moe_layers * c.cpu_job_ms * 1e-3
            pos += n
        return total
    flops_s = hw.gpu.fp16_tflops * 1e12 * c.gemm_efficiency
    h2d = hw.pcie.h2d_gbs * GB if hw.pcie else 1.0
    pf, eb = plan.prefill, model.expert_bytes
    ram_layers = model.n_moe_layers - len(plan.placement.gpu_expert_layers)
    total, pos = 0.0, 0
    for n, outputs in pf.passes_with_outputs(prompt_tokens):
        comp = (model.prefill_dense_flops(n, int(outputs)) + attention_flops(model, pos, n)
                + n * k * model.expert_flops * model.n_moe_layers) / flops_s
        if pf.strategy == "stream-all":
            total += _stream_all_chunk_s(model, pf, n, pos, k, ram_layers, flops_s, h2d)
        elif pf.strategy == "op-offload" and n >= pf.op_offload_min_batch:
            total += comp + ram_layers * model.n_experts * eb / h2d
        else:  # RAM layers' experts on the host cores (not in `comp`), the rest on the device
            comp -= n * k * model.expert_flops * ram_layers / flops_s
            total += comp + experts_s(n, ram_layers)
        pos += n
    return total


def _stream_all_chunk_s(model, pf, n: int, pos: int, k: int, ram_layers: int, flops_s: float,
                        h2d: float) -> float:
    """Seconds of one stream-all chunk: per layer the dense path and attention, then the layer's
    copies against its expert GEMMs (the first batch's copy exposed), less what the prefetch of
    the first `dma_slots` batches hides under attention."""
    L = model.n_layers
    touched = expected_touched(n, model.n_experts, k, TOUCH_LOCALITY)
    dense_l = (model.prefill_dense_flops(n) + attention_flops(model, pos, n)) / flops_s / L
    gemm_l = n * k * model.expert_flops / flops_s
    copy_l = touched * model.expert_bytes / h2d
    batch = min(pf.dma_batch_experts, touched) * model.expert_bytes / h2d
    pre = min(pf.dma_slots * batch, dense_l) if pf.dma_prefetch else 0.0
    moe_ram = dense_l + max(copy_l - pre, gemm_l) + (batch if pre < batch else 0.0)
    return ram_layers * moe_ram + (L - ram_layers) * dense_l + (model.n_moe_layers - ram_layers) * gemm_l
