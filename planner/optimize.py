"""Inverse planning: the cheapest change to a machine (or the model's quant) that meets a target.

Prices are rough street prices (USD, late 2026), marked assumed: they rank the options, they are
not quotes. Each candidate is a whole new profile, re-planned and re-predicted from scratch.
"""
from __future__ import annotations

from dataclasses import dataclass

from specs.errors import SpecError
from specs.hardware import HardwareSpec
from specs.model import ModelSpec

from .search import base_plan
from .whatif import scale_cpu_rate, with_ddr_channels, with_nvme, with_vram

GB = 1e9
# assumed prices (USD) per unit of change
PRICE_PER_GB_VRAM = 45.0  # the step to a card with more memory, per GB gained
PRICE_PER_DDR_CHANNEL = 120.0  # a DIMM per channel (on a board that has the channel)
PRICE_PER_GB_RAM = 3.0
PRICE_PER_MTS_STEP = 60.0  # faster DIMMs, per 800 MT/s step per channel
PRICE_PER_CORE = 25.0
PRICE_NVME_PER_X = 120.0  # each doubling of drive speed
PRICE_QUANT = 0.0  # a smaller quant costs quality, not money


@dataclass(frozen=True)
class Option:
    change: str
    cost_usd: float
    decode_tok_s: float
    ttft_s: float
    bottleneck: str
    meets: bool
    hw: HardwareSpec
    model: ModelSpec


def _levels(hw: HardwareSpec, model: ModelSpec):
    """(label, cost, hw, model) for each single change, in rising cost within a kind."""
    for extra in (4, 8, 12, 16, 24, 32, 48, 72):
        if hw.gpu is not None:
            yield f"+{extra} GB VRAM", extra * PRICE_PER_GB_VRAM, with_vram(hw, extra * GB), model
    for ch in (2, 3, 4, 6, 8, 12):
        if ch > hw.memory.channels:
            yield (f"{ch} DDR channels (from {hw.memory.channels})", (ch - hw.memory.channels) * PRICE_PER_DDR_CHANNEL,
                   with_ddr_channels(hw, ch), model)
    for extra in (32, 64, 128, 192, 256):
        yield (f"+{extra} GB RAM", extra * PRICE_PER_GB_RAM,
               hw.model_copy(update={"memory": hw.memory.model_copy(update={
                   "capacity_bytes": hw.memory.capacity_bytes.with_value(float(hw.memory.capacity_bytes) + extra * GB)})}),
               model)
    for mts in (4800, 5600, 6400, 7200, 8000):
        if mts > hw.memory.mts:
            steps = (mts - float(hw.memory.mts)) / 800
            yield (f"DDR at {mts} MT/s (from {float(hw.memory.mts):.0f})", steps * PRICE_PER_MTS_STEP * hw.memory.channels,
                   hw.model_copy(update={"memory": hw.memory.model_copy(update={"mts": hw.memory.mts.with_value(mts)})}),
                   model)
    for f in (1.5, 2, 3, 4):
        add = round(hw.cpu.threads_used * (f - 1))
        yield f"{hw.cpu.threads_used + add} CPU cores for experts", add * PRICE_PER_CORE, scale_cpu_rate(hw, f), model
    for f in (2, 4):
        yield f"{f}x faster NVMe", PRICE_NVME_PER_X * (f.bit_length() - 1), with_nvme(hw, f), model
    bits = model.fmt_experts.bits
    if model.fmt_experts.block_weights == 0:  # a bits-per-weight format can be re-quantised
        for b in (4.5, 4.0, 3.5, 3.0, 2.5, 2.25, 2.0, 1.75, 1.5):
            if b < bits - 0.01:
                kind = model.fmt_experts.name.split(":")[0]
                yield (f"experts at {b} bpw (from {bits:g})", PRICE_QUANT + (bits - b),
                       hw, model.model_copy(update={"expert_format": f"{kind}:{b}"}))


def optimize(model: ModelSpec, hw: HardwareSpec, target_tok_s: float, predict, ttft_s: float | None = None,
             prompt_tokens: int = 512, context: int | None = None) -> list[Option]:
    """Changes that meet `target_tok_s` (and `ttft_s`), cheapest first, then the near misses."""
    def evaluate(label, cost, h, m):
        try:
            plan = base_plan(m, h, context=context)
        except SpecError:
            return None  # the change alone does not make the model fit
        r = predict(m, h, plan, prompt_tokens)
        meets = r.decode_tok_s >= target_tok_s and (ttft_s is None or r.ttft_s <= ttft_s)
        return Option(label, cost, r.decode_tok_s, r.ttft_s, r.bottleneck, meets, h, m)

    singles = [o for o in (evaluate(*lv) for lv in _levels(hw, model)) if o]
    options = list(singles)
    if not any(o.meets for o in singles):  # then pairs: the best single of each kind, plus a second change
        best = sorted(singles, key=lambda o: -o.decode_tok_s)[:4]
        for first in best:
            for label, cost, h, m in _levels(first.hw, first.model):
                o = evaluate(f"{first.change} and {label}", first.cost_usd + cost, h, m)
                if o:
                    options.append(o)
    return sorted(options, key=lambda o: (not o.meets, o.cost_usd if o.meets else -o.decode_tok_s))


def compare_models(models: list[ModelSpec], hw: HardwareSpec, target_tok_s: float, predict,
                   prompt_tokens: int = 512, context: int | None = None) -> list[dict]:
    """Which of several models meets the target on this machine (fastest first)."""
    rows = []
    for m in models:
        try:
            plan = base_plan(m, hw, context=context)
        except SpecError as e:
            rows.append({"model": m.name, "fits": False, "reason": e.reason, "meets": False})
            continue
        r = predict(m, hw, plan, prompt_tokens)
        rows.append({"model": m.name, "fits": True, "decode_tok_s": r.decode_tok_s, "ttft_s": r.ttft_s,
                     "bottleneck": r.bottleneck, "meets": r.decode_tok_s >= target_tok_s})
    return sorted(rows, key=lambda r: -r.get("decode_tok_s", -1))
