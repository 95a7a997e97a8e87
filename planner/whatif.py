"""What-ifs: the same machine with one resource changed, and sweeps of a prediction over it."""
from __future__ import annotations

from dataclasses import dataclass

from specs.hardware import HardwareSpec

GB = 1e9


def _replace(hw: HardwareSpec, section: str, **figures) -> HardwareSpec:
    part = getattr(hw, section)
    new = {k: (getattr(part, k).with_value(v) if hasattr(getattr(part, k), "with_value") else v)
           for k, v in figures.items()}
    return hw.model_copy(update={section: part.model_copy(update=new)})


def scale_cpu_rate(hw: HardwareSpec, factor: float) -> HardwareSpec:
    """CPU expert-kernel rates scaled by `factor` (more or faster cores)."""
    rates = {k: v.with_value(float(v) * factor) for k, v in hw.cpu.expert_gbs.items()}
    rowwise = {k: v.with_value(float(v) * factor) for k, v in hw.cpu.rowwise_gbs.items()}
    repacked = {k: v.with_value(float(v) * factor) for k, v in hw.cpu.repacked_gbs.items()}
    whole = {k: v.with_value(float(v) * factor) for k, v in hw.cpu.whole_gbs.items()}
    cpu = hw.cpu.model_copy(update={"expert_gbs": rates, "rowwise_gbs": rowwise, "repacked_gbs": repacked,
                                    "whole_gbs": whole,
                                    "threads_used": max(1, round(hw.cpu.threads_used * factor)),
                                    "cores": max(hw.cpu.cores, round(hw.cpu.threads_used * factor))})
    return hw.model_copy(update={"cpu": cpu})


def with_ddr_channels(hw: HardwareSpec, channels: int) -> HardwareSpec:
    """The machine with `channels` DDR channels (the CPU tier is capped by DDR where it is read)."""
    return hw.model_copy(update={"memory": hw.memory.model_copy(update={"channels": channels})})


def with_vram(hw: HardwareSpec, extra_bytes: float) -> HardwareSpec:
    """The machine with `extra_bytes` more VRAM (bytes)."""
    return _replace(hw, "gpu", vram_bytes=float(hw.gpu.vram_bytes) + extra_bytes)


def with_nvme(hw: HardwareSpec, factor: float) -> HardwareSpec:
    """A drive `factor` times faster (sequential and random)."""
    return _replace(hw, "nvme", seq_read_gbs=float(hw.nvme.seq_read_gbs) * factor,
                    rand_4k_iops=float(hw.nvme.rand_4k_iops) * factor)


@dataclass(frozen=True)
class WhatIf:
    label: str
    hw: HardwareSpec


def standard_whatifs(hw: HardwareSpec) -> list[WhatIf]:
    """+1 DDR channel, +8 GB VRAM, 2x cores, a 2x faster drive (the planner's explanation)."""
    out = [WhatIf(f"+1 DDR channel ({hw.memory.channels + 1}ch)", with_ddr_channels(hw, hw.memory.channels + 1))]
    if hw.gpu is not None:
        out.append(WhatIf("+8 GB VRAM", with_vram(hw, 8 * GB)))
    out.append(WhatIf("2x CPU cores", scale_cpu_rate(hw, 2.0)))
    out.append(WhatIf("2x faster NVMe", with_nvme(hw, 2.0)))
    return out



def _series(points, xlabel, ylabel, marker):
    return {"x": [p[0] for p in points], "y": [p[1] for p in points], "bound": [p[2] for p in points],
            "xlabel": xlabel, "ylabel": ylabel, "marker": marker}


def sweeps(model, hw: HardwareSpec, plan, predict, prompt_tokens: int = 512) -> dict:
    """tok/s against cache slots, DDR bandwidth and CPU cores; TTFT against prompt length.

    `predict(model, hw, plan, prompt_tokens)` returns an object with decode_tok_s, ttft_s, bottleneck.
    """
    from specs.memory import memory_map

    out = {}
    if hw.gpu is not None and plan.expert_cache.policy != "none":
        base = plan.model_copy(update={"expert_cache": plan.expert_cache.model_copy(update={"slots": 0})})
        most = min(memory_map(model, hw, base).free_slots, model.routed_experts)
        pts = []
        for s in sorted({int(most * f) for f in (0, .1, .2, .35, .5, .65, .8, 1.0)}):
            p = plan.model_copy(update={"expert_cache": plan.expert_cache.model_copy(update={"slots": s})})
            r = predict(model, hw, p, prompt_tokens)
            pts.append((s, r.decode_tok_s, r.bottleneck))
        out["cache_slots"] = _series(pts, "expert cache slots (experts)", "decode (tok/s)", plan.expert_cache.slots)
    def over_hw(machines, x_of):
        return [(x_of(h), r.decode_tok_s, r.bottleneck)
                for h in machines for r in [predict(model, h, plan, prompt_tokens)]]

    out["ddr_bandwidth"] = _series(over_hw([with_ddr_channels(hw, ch) for ch in (1, 2, 4, 6, 8, 12, 16)],
                                           lambda h: h.memory.peak_gbs),
                                   "DDR peak bandwidth (GB/s)", "decode (tok/s)", hw.memory.peak_gbs)
    out["cpu_cores"] = _series(over_hw([scale_cpu_rate(hw, f) for f in (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)],
                                       lambda h: h.cpu.threads_used),
                               "CPU threads for experts (cores)", "decode (tok/s)", hw.cpu.threads_used)
    pts = []
    top = min(model.context_length or 262144, plan.kv.context if plan.kv.context > 1024 else 262144)
    for n in sorted({n for n in (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144) if n <= top}):
        r = predict(model, hw, plan, n)
        pts.append((n, r.ttft_s, r.bottleneck))
    out["ttft"] = _series(pts, "prompt length (tokens)", "time to first token (s)", prompt_tokens)
    return out


def explain(model, hw: HardwareSpec, plan, predict, prompt_tokens: int = 512) -> list[dict]:
    """The plan's predicted figures on each standard what-if machine (cache re-sized to its VRAM)."""
    from specs.memory import size_cache

    base = predict(model, hw, plan, prompt_tokens)
    # the gains are against the same closed form on this machine (the headline figure is simulated)
    # the closed form has no second card (simulator.screen): its what-ifs are of the machine without it
    label = "this machine (closed form" + (", without the second card)" if plan.device_tier.slots else ")")
    rows = [{"what_if": label, "decode_tok_s": base.decode_tok_s, "ttft_s": base.ttft_s,
             "decode_gain": 0.0, "bottleneck": base.bottleneck}]
    for w in standard_whatifs(hw):
        p = size_cache(model, w.hw, plan) if w.hw.gpu is not None else plan
        r = predict(model, w.hw, p, prompt_tokens)
        rows.append({"what_if": w.label, "decode_tok_s": r.decode_tok_s, "ttft_s": r.ttft_s,
                     "decode_gain": r.decode_tok_s / base.decode_tok_s - 1, "bottleneck": r.bottleneck})
    return rows
