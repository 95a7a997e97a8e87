"""The ceiling report of `moe-offload plan` as one dict (the --json interface contract)."""
from __future__ import annotations

from simulator.ceilings import STANDARD_BUSES, dense_time_ms, expert_ceilings, profile_buses
from specs.hardware import HardwareSpec
from specs.memory import memory_map
from specs.model import ModelSpec
from specs.plan import Plan

from .predict import Prediction


def plan_summary(model: ModelSpec, hw: HardwareSpec, plan: Plan, pred: Prediction) -> dict:
    """Bytes per token, ceilings, memory map, Engram rates and the prediction for `plan`."""
    mm = memory_map(model, hw, plan)
    eng = model.engram
    engram_bpt = model.engram_bytes_per_token(hw.page_bytes)
    tok_s = pred.decode_tok_s
    return {
        "model": {
            "name": model.name,
            "routed_experts": model.routed_experts,
            "routed_params": model.routed_params,
            "params_per_expert": model.params_per_expert,
            "expert_format": model.fmt_experts.name,
            "expert_bits": model.fmt_experts.bits,
            "expert_bytes": model.expert_bytes,
            "routed_bytes": model.routed_bytes,
            "routed_bytes_per_token": model.routed_bytes_per_token(plan.experts_per_token),
            "dense_bytes_per_token": model.dense_bytes_per_token,
            "dense_ms_per_token": dense_time_ms(model, hw),
            "engram_bytes_per_token": engram_bpt,
            "engram_used_bytes_per_token": eng.used_bytes_per_token() if eng else 0.0,
            "engram_rows_per_token": eng.rows_per_token if eng else 0,
            "engram_page_crossing": eng.page_crossing_fraction(hw.page_bytes) if eng else 0.0,
        },
        "hardware": hw.name,
        "has_gpu": hw.gpu is not None,
        "ceilings": expert_ceilings(model, profile_buses(hw, model), plan.experts_per_token),
        "standard_ceilings": expert_ceilings(model, STANDARD_BUSES, plan.experts_per_token),
        "memory": {
            "vram": mm.vram, "ram": mm.ram, "nvme": mm.nvme, "card": mm.card, "card_slots": plan.device_tier.slots,
            "vram_capacity": mm.vram_capacity, "ram_capacity": mm.ram_capacity,
            "vram_free": mm.vram_free, "cache_slots": plan.expert_cache.slots,
            "cache_bytes": plan.expert_cache.slots * model.expert_bytes,
            "free_slots": mm.free_slots, "kv_tokens_fit": mm.kv_tokens_fit,
        },
        "engram": {
            "reads_per_s": (eng.rows_per_token * tok_s) if eng else 0.0,
            "bytes_per_s": engram_bpt * tok_s,
            "share_of_nvme": engram_bpt * tok_s / (float(hw.nvme.seq_read_gbs) * 1e9),
        },
        "plan": plan.model_dump(mode="json"),
        "predicted": pred.to_dict(),
    }


def pareto_rows(front) -> list[dict]:
    """The (plan, prediction) pairs of a Pareto front as report rows."""
    return [{"engine": p.engine, "miss_policy": p.miss_policy.kind, "cache_slots": p.expert_cache.slots,
             "gpu_expert_layers": len(p.placement.gpu_expert_layers), "prefill": p.prefill.strategy,
             "chunk_tokens": p.prefill.chunk_tokens, **r.to_dict(), "plan": p.model_dump(mode="json")}
            for p, r in front]
