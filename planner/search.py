"""Placement search. For now: the engine template that fits, sized to the machine."""
from __future__ import annotations

from specs.errors import SpecError
from specs.hardware import HardwareSpec
from specs.memory import memory_map, size_cache
from specs.model import ModelSpec
from specs.plan import KVCache, Placement, Plan, plan_template


def fit_context(model: ModelSpec, context: int | None) -> int:
    """The KV context to reserve: asked-for, else the model's (capped at 32,768) (tokens)."""
    if context is not None and model.context_length and context > model.context_length:
        raise SpecError(None, "--context", f"{context} tokens is longer than {model.name}'s "
                        f"context of {model.context_length} tokens")
    return context or min(model.context_length or 32768, 32768)


def base_plan(model: ModelSpec, hw: HardwareSpec, context: int | None = None, engine: str | None = None) -> Plan:
    """The engine's template for this machine: KV context set, cache sized to free VRAM, experts
    beyond RAM left on NVMe (bytes accounted by specs.memory)."""
    ctx = fit_context(model, context)
    if engine is None:
        engine = "tiered-cache" if hw.gpu is not None else "custom"
    plan = plan_template(engine)
    kv = KVCache(context=ctx, dtype=plan.kv.dtype if engine == "tiered-cache" else "f16")
    plan = plan.model_copy(update={"kv": kv})
    if hw.gpu is None:
        plan = plan.model_copy(update={"placement": Placement(dense="cpu", kv="cpu"),
                                       "expert_cache": plan.expert_cache.model_copy(update={"policy": "none", "slots": 0})})
    mm = memory_map(model, hw, plan)
    ram_room = mm.ram_capacity - (mm.ram_used - mm.ram.get("experts", 0.0))
    if mm.ram.get("experts", 0.0) > ram_room:  # experts beyond RAM are read from NVMe
        placement = plan.placement.model_copy(update={"expert_ram_bytes": int(max(0.0, ram_room))})
        plan = plan.model_copy(update={"placement": placement})
    plan = size_cache(model, hw, plan)
    memory_map(model, hw, plan).check_fits()
    return plan
