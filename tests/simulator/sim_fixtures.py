"""Shared helpers: a tiny MoE model and machine so property tests run in milliseconds."""
from specs.hardware import HardwareSpec
from specs.loaders import load_hardware
from specs.model import ModelSpec
from specs.plan import ExpertCache, MissPolicy, Plan


def tiny_model(engram: bool = False) -> ModelSpec:
    """4 MoE layers x 16 experts, top-2, EXL3 3.0 bits; ~0.9 MB per expert."""
    d = dict(name="tiny", arch="moe", n_layers=4, hidden=512, n_experts=16, top_k=2, expert_ffn=640,
             vocab=1000, attention=dict(n_heads=4, n_kv_heads=1, head_dim=64),
             expert_format="EXL3:3.0", dense_format="F16")
    if engram:
        d["engram"] = dict(rows=10**6, row_values=256, format="IQ4_NL", layers=[1])
    return ModelSpec.model_validate(d)


def machine(**scale) -> HardwareSpec:
    """epyc8ch-3090 with figures scaled: gpu_bw, pcie, ddr, cpu (multipliers)."""
    hw = load_hardware("epyc8ch-3090").model_copy(deep=True)
    g, pc, mem, cpu = hw.gpu, hw.pcie, hw.memory, hw.cpu
    g.bw_gbs = g.bw_gbs.with_value(g.bw_gbs * scale.get("gpu_bw", 1.0))
    pc.zero_copy_gbs = pc.zero_copy_gbs.with_value(pc.zero_copy_gbs * scale.get("pcie", 1.0))
    pc.h2d_gbs = pc.h2d_gbs.with_value(pc.h2d_gbs * scale.get("pcie", 1.0))
    mem.mts = mem.mts.with_value(mem.mts * scale.get("ddr", 1.0))
    cpu.expert_gbs = {k: v.with_value(v * scale.get("cpu", 1.0)) for k, v in cpu.expert_gbs.items()}
    return hw


def tiered(slots: int = 8, kind: str = "auction", policy: str = "decayed-count") -> Plan:
    """A tiered-cache style plan for the tiny model (no Engram reads)."""
    p = Plan(engine="tiered-cache", miss_policy=MissPolicy(kind=kind),
             expert_cache=ExpertCache(slots=slots, policy=policy if slots else "none", swap_every=4,
                                      swap_max=4))
    return p.model_copy(update={"placement": p.placement.model_copy(update={"engram": "none"})})

