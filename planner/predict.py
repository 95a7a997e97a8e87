"""Predicted speed of a plan: the simulator's closed-form screen (no torch, no event loop)."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from simulator.ceilings import ceiling_tok_s
from specs.hardware import HardwareSpec
from specs.model import ModelSpec
from specs.plan import Plan


@dataclass(frozen=True)
class Prediction:
    decode_tok_s: float
    ttft_s: float
    bottleneck: str
    prefill_tok_s: float = 0.0
    cache_hit_rate: float = 0.0
    method: str = "roofline"

    def to_dict(self) -> dict:
        return asdict(self)


def roofline(model: ModelSpec, hw: HardwareSpec, plan: Plan, prompt_tokens: int = 512) -> Prediction:
    """Serial roofline: dense read + each expert source at its bandwidth, uniform routing (s/token)."""
    k = plan.experts_per_token or model.top_k
    per_tok = model.routed_bytes_per_token(k)
    n_moe = model.n_moe_layers
    static_frac = len(plan.placement.gpu_expert_layers) / n_moe
    cpu_side = model.routed_experts * (1 - static_frac)
    cache_frac = min(1.0, plan.expert_cache.slots / cpu_side) if cpu_side else 1.0
    hit = static_frac + (1 - static_frac) * cache_frac  # uniform routing: hits = resident share
    gpu_bw = float(hw.gpu.bw_gbs) if hw.gpu is not None else hw.memory.usable_gbs
    dense_bw = gpu_bw if plan.placement.dense == "gpu" else hw.memory.usable_gbs
    cpu_bw = min(hw.cpu.expert_gbs_for(model.fmt_experts), hw.memory.usable_gbs)
    miss_bw = {"cpu": cpu_bw, "auction": cpu_bw + (float(hw.pcie.zero_copy_gbs) if hw.pcie else 0.0),
               "zero-copy": float(hw.pcie.zero_copy_gbs) if hw.pcie else cpu_bw,
               "copy": float(hw.pcie.h2d_gbs) if hw.pcie else cpu_bw}[plan.miss_policy.kind]
    ram_experts = plan.placement.expert_ram_bytes
    cpu_bytes = model.routed_bytes * (1 - static_frac)
    disk_frac = 0.0 if ram_experts is None else max(0.0, 1 - ram_experts / cpu_bytes)
    parts = {
        "VRAM (dense path)": model.dense_bytes_per_token / (dense_bw * 1e9),
        "VRAM (resident experts)": per_tok * hit / (gpu_bw * 1e9),
        "CPU/DDR (missed experts)": per_tok * (1 - hit) * (1 - disk_frac) / (miss_bw * 1e9),
        "NVMe (experts beyond RAM)": per_tok * (1 - hit) * disk_frac / (float(hw.nvme.seq_read_gbs) * 1e9),
        "NVMe (Engram pages)": (model.engram_bytes_per_token(hw.page_bytes) / (float(hw.nvme.seq_read_gbs) * 1e9)
                                if plan.placement.engram == "nvme" else 0.0),
    }
    t = sum(parts.values())
    tok_s = plan.mtp.tokens_per_step / t if plan.mtp.enabled else 1.0 / t
    # prefill: every weight once per chunk at the slowest of PCIe/DDR, plus 2 FLOPs per weight
    flops = (model.dense_flops_per_token + k * n_moe * model.expert_flops) * prompt_tokens
    tflops = float(hw.gpu.fp16_tflops) if hw.gpu is not None else 1.0
    chunks = -(-prompt_tokens // plan.prefill.chunk_tokens)
    stream_bw = float(hw.pcie.h2d_gbs) if hw.pcie is not None else hw.memory.usable_gbs
    ttft = flops / (tflops * 1e12) + chunks * cpu_bytes * (1 - hit) / (stream_bw * 1e9)
    return Prediction(decode_tok_s=tok_s, ttft_s=ttft, bottleneck=max(parts, key=parts.get),
                      prefill_tok_s=prompt_tokens / ttft if ttft else 0.0, cache_hit_rate=hit)


def predict(model: ModelSpec, hw: HardwareSpec, plan: Plan, prompt_tokens: int = 512) -> Prediction:
    """The best analytic prediction available for `plan` (tok/s, s)."""
    return roofline(model, hw, plan, prompt_tokens)


__all__ = ["Prediction", "predict", "roofline", "ceiling_tok_s"]
