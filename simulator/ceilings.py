"""Closed-form roofs: tok/s <= bandwidth / bytes read per token (DESIGN.md "The physics")."""
from __future__ import annotations

from dataclasses import dataclass

from specs.hardware import HardwareSpec
from specs.model import ModelSpec


@dataclass(frozen=True)
class Bus:
    """A bus that could deliver the routed experts, with its peak bandwidth in GB/s."""

    tier: str
    bandwidth_gbs: float
    source: str


def ddr_peak_gbs(channels: int, mts: float) -> float:
    """DDR peak in GB/s: channels x MT/s x 8 bytes per transfer."""
    return channels * mts * 8 / 1000.0


# The six buses of the published ceiling table (seed article big-moe-one-3090).
STANDARD_BUSES = (
    Bus("DDR4-3200 2ch", ddr_peak_gbs(2, 3200), "JEDEC DDR4-3200, 2 channels"),
    Bus("DDR5-5200 2ch", ddr_peak_gbs(2, 5200), "JEDEC DDR5-5200, 2 channels"),
    Bus("DDR4-3200 4ch", ddr_peak_gbs(4, 3200), "JEDEC DDR4-3200, 4 channels"),
    Bus("DDR4-3200 8ch", ddr_peak_gbs(8, 3200), "JEDEC DDR4-3200, 8 channels"),
    Bus("PCIe 4.0 x16 (GPU reads host memory)", 25.0, "reported ~25 GB/s practical"),
    Bus("RTX 3090 VRAM", 936.0, "NVIDIA RTX 3090 datasheet"),
)


def ceiling_tok_s(bytes_per_token: float, bandwidth_gbs: float) -> float:
    """Upper bound on decode tok/s when `bytes_per_token` stream over `bandwidth_gbs` GB/s."""
    return bandwidth_gbs * 1e9 / bytes_per_token


def profile_buses(hw: HardwareSpec, model: ModelSpec) -> list[Bus]:
    """The expert source tiers of one machine: VRAM, DDR (peak and the CPU kernel's rate), PCIe, NVMe."""
    buses = []
    if hw.gpu is not None:
        buses.append(Bus("VRAM", float(hw.gpu.bw_gbs), hw.gpu.bw_gbs.source))
    buses.append(Bus(f"DDR peak ({hw.memory.channels}ch x {float(hw.memory.mts):.0f} MT/s)",
                     hw.memory.peak_gbs, hw.memory.mts.source))
    cpu_gbs = min(model.expert_rate(hw.cpu.expert_gbs_for), hw.memory.usable_gbs)
    by_type = model.expert_types()
    types = " + ".join(sorted(by_type, key=lambda f: -by_type[f][0]))  # most bytes first
    buses.append(Bus(f"CPU expert kernel ({types}, {hw.cpu.threads_used} threads)",
                     cpu_gbs, "min(cpu.expert_gbs, DDR peak x efficiency)"))
    if hw.pcie is not None:
        buses.append(Bus(f"PCIe {hw.pcie.gen}.0 x{hw.pcie.lanes} zero-copy", float(hw.pcie.zero_copy_gbs),
                         hw.pcie.zero_copy_gbs.source))
    buses.append(Bus("NVMe sequential", float(hw.nvme.seq_read_gbs), hw.nvme.seq_read_gbs.source))
    return buses


def expert_ceilings(model: ModelSpec, buses, experts_per_token: int | None = None) -> list[dict]:
    """`{tier, bandwidth_gbs, tok_s}` for the routed experts alone on each bus."""
    per_tok = model.routed_bytes_per_token(experts_per_token)
    return [{"tier": b.tier, "bandwidth_gbs": b.bandwidth_gbs, "tok_s": ceiling_tok_s(per_tok, b.bandwidth_gbs),
             "source": b.source} for b in buses]


def dense_time_ms(model: ModelSpec, hw: HardwareSpec) -> float:
    """Time to read the dense path once from VRAM (or DDR without a GPU), ms (upper estimate)."""
    bw = float(hw.gpu.bw_gbs) if hw.gpu is not None else hw.memory.usable_gbs
    return model.dense_bytes_per_token / (bw * 1e9) * 1e3


def tier_roofs_gbs(model: ModelSpec, hw: HardwareSpec, plan) -> dict[str, float]:
    """The rate (GB/s over the bytes each tier reads, as an executor trace counts them) at which the
    simulator runs each expert tier of `plan` on `hw`: CPU experts at the profile's kernel rate for
    each weight type and the threads (a decode token's top-k as one job: whole experts per thread where the
    engine runs them so), capped by DDR; resident experts at the fitted per-hit rate or the VRAM
    roof x GEMV efficiency (over their device copies); copies at the engine's copy rate."""
    from .policies import whole_experts_per_thread
    from .resources import Constants, cpu_expert_gbs
    c = Constants.from_hw(hw)
    threads = int(plan.cpu_threads or hw.cpu.threads_used)
    whole = whole_experts_per_thread([1] * (plan.experts_per_token or model.top_k), threads)
    out = {"cpu": min(cpu_expert_gbs(hw, model, threads, plan, whole=whole), hw.memory.usable_gbs)}
    if hw.gpu is not None:
        out["device"] = c.dev_expert_gbs or float(hw.gpu.bw_gbs) * c.gpu_bw_efficiency * c.gpu_expert_efficiency
        out["pcie"] = c.copy_h2d_gbs or (float(hw.pcie.h2d_gbs) if hw.pcie else 0.0)
    return out
