"""Placement search. For now: the engine template that fits, sized to the machine."""
from __future__ import annotations

from specs.errors import SpecError
from specs.hardware import HardwareSpec
from specs.memory import LOADED, REPACKED, memory_map, size_cache, size_device_tier
from specs.model import ModelSpec
from specs.plan import KVCache, Placement, Plan, plan_template


def fit_context(model: ModelSpec, context: int | None) -> int:
    """The KV context to reserve: asked-for, else the model's (capped at 32,768) (tokens)."""
    if context is not None and model.context_length and context > model.context_length:
        raise SpecError(None, "--context", f"{context} tokens is longer than {model.name}'s "
                        f"context of {model.context_length} tokens")
    return context or min(model.context_length or 32768, 32768)


def base_plan(model: ModelSpec, hw: HardwareSpec, context: int | None = None, engine: str | None = None,
              host_only: bool = False, page_breaks: float = 0.0) -> Plan:
    """The engine's template for this machine: KV context set, cache sized to free VRAM, experts
    beyond RAM left on NVMe (bytes accounted by specs.memory); host_only (or no GPU): dense path, KV
    and experts on the host, the device left unused; page_breaks: the GGUF's page layout in the page cache
    (cpu_file_page_breaks: what the engines reading it in place pay)."""
    ctx = fit_context(model, context)
    if engine is None:
        engine = "tiered-cache" if hw.gpu is not None else "custom"
    plan = plan_template(engine)
    kv = KVCache(context=ctx, dtype=plan.kv.dtype if engine == "tiered-cache" else "f16")
    plan = plan.model_copy(update={"kv": kv, "cpu_file_page_breaks": page_breaks})
    if hw.gpu is None or host_only:
        plan = plan.model_copy(update={"placement": Placement(dense="cpu", kv="cpu"),
                                       "expert_cache": plan.expert_cache.model_copy(update={"policy": "none", "slots": 0})})
    mm = memory_map(model, hw, plan)
    experts = mm.ram.get("experts", 0.0) + mm.ram.get(REPACKED, 0.0) + mm.ram.get(LOADED, 0.0)
    ram_room = mm.ram_capacity - (mm.ram_used - experts)
    if experts > ram_room:  # experts beyond RAM are read from NVMe: through the mmap, so not repacked
        placement = plan.placement.model_copy(update={"expert_ram_bytes": int(max(0.0, ram_room))})
        plan = plan.model_copy(update={"placement": placement, "cpu_repack": False, "cpu_mmap": True})
    plan = size_cache(model, hw, plan)
    if engine == "tiered-cache" and not host_only:  # its split runs a second card's slots as a third engine
        plan = size_device_tier(model, hw, plan)
    memory_map(model, hw, plan).check_fits()
    return plan


# ---- placement search ---------------------------------------------------------------------------

PREFILLS = (("op-offload", 2048, 512), ("op-offload", 4096, 2048), ("stream-all", 8192, 8192),
            ("stream-all", 16384, 16384), ("cpu", 2048, 512))


def _with(plan: Plan, **upd) -> Plan:
    return plan.model_copy(update=upd)


def candidate_plans(model: ModelSpec, hw: HardwareSpec, context: int | None = None, streams: int = 1,
                    page_breaks: float = 0.0) -> list[Plan]:
    """Every placement worth screening on this machine, each sized to fit (cache fills free VRAM), each reading a
    GGUF whose page layout has that share of breaks (base_plan)."""
    from specs.plan import ExpertCache, MissPolicy

    fit_context(model, context)  # a context the model cannot take is the user's error, not a misfit
    out: list[Plan] = []
    whys: list[str] = []  # why plans did not fit, the engine default's first: the one a user would try
    host_only = None
    engines = ["tiered-cache", "llamacpp", "strata", "custom"] if hw.gpu is not None else ["custom"]
    for engine in engines:
        try:
            # "custom" beside a GPU: the device left unused (an overhead-bound engine's best)
            base = base_plan(model, hw, context=context, engine=engine,
                             host_only=engine == "custom" and hw.gpu is not None, page_breaks=page_breaks)
        except SpecError as e:
            whys.append(e.reason)
            continue
        base = _with(base, streams=streams)
        variants = []
        if engine == "tiered-cache":
            for kind in ("auction", "cpu", "zero-copy"):
                for policy in ("decayed-count", "lru"):
                    variants.append(_with(base, miss_policy=MissPolicy(kind=kind),
                                          expert_cache=base.expert_cache.model_copy(update={"policy": policy})))
        elif engine == "llamacpp":
            # --n-cpu-moe N: whole layers of experts on the GPU, as many as fit
            per_layer = model.routed_bytes / model.n_moe_layers
            free = memory_map(model, hw, base).vram_free
            most = min(model.n_moe_layers, int(free // per_layer)) if free > 0 else 0
            for n_gpu in sorted({0, most // 2, most}):
                layers = model.layers_moe[model.n_moe_layers - n_gpu:] if n_gpu else []
                variants.append(_with(base, placement=base.placement.model_copy(update={"gpu_expert_layers": layers})))
        elif engine == "strata":
            variants.append(size_cache(model, hw, _with(base, expert_cache=ExpertCache(policy="static"))))
        else:
            variants.append(base)
            host_only = base if hw.gpu is not None else None
        for v in variants:
            for strategy, chunk, ub in PREFILLS:
                if strategy != "cpu" and (hw.gpu is None or v is host_only):
                    continue
                out.append(_with(v, prefill=v.prefill.model_copy(update={
                    "strategy": strategy, "chunk_tokens": chunk, "ubatch_tokens": ub})))
    fitting = []
    for p in out:
        try:
            memory_map(model, hw, p).check_fits()
        except SpecError as e:
            whys.append(e.reason)
            continue
        fitting.append(p)
    if not fitting:
        why = whys[0] if whys else "no engine's plan could be sized"
        raise SpecError(None, "--model", f"{model.name} does not fit on {hw.name} with any placement: {why}")
    return fitting


def _score(objective: str, r) -> float:
    return -r.decode_tok_s if objective == "decode" else r.ttft_s


def search(model: ModelSpec, hw: HardwareSpec, objective: str = "decode", context: int | None = None,
           prompt_tokens: int = 512, streams: int = 1, top: int = 4, seed: int = 0, progress: bool = False,
           page_breaks: float = 0.0):
    """Screen every candidate in closed form, simulate the `top` most promising, return
    (best plan, its Prediction, rows of every simulated candidate, the decode/TTFT Pareto front); page_breaks: the
    GGUF's page layout (candidate_plans)."""
    from .predict import predict, simulate_plan

    cands = candidate_plans(model, hw, context, streams, page_breaks)
    screened = []
    track = _progress(progress, len(cands) + top + 1, "screening placements")
    for p in cands:
        screened.append((p, predict(model, hw, p, prompt_tokens)))
        track()
    # one row per decode placement: the prefill strategy with the shortest TTFT goes with it
    best_prefill: dict[str, tuple] = {}
    for p, r in screened:
        key = p.model_copy(update={"prefill": type(p.prefill)()}).model_dump_json()
        if key not in best_prefill or r.ttft_s < best_prefill[key][1].ttft_s:
            best_prefill[key] = (p, r)
    ranked = sorted(best_prefill.values(), key=lambda pr: (_score(objective, pr[1]), pr[0].model_dump_json()))
    # the default (first candidate: the first engine's template) is always simulated too, so the pick is
    # never slower than it as simulated when the closed form ranks it below others
    default = best_prefill[cands[0].model_copy(update={"prefill": type(cands[0].prefill)()}).model_dump_json()]
    chosen = ranked[:top] + ([default] if default not in ranked[:top] else [])
    rows = []
    for p, scr in chosen:
        sim = simulate_plan(model, hw, p, prompt_tokens=prompt_tokens, seed=seed)
        rows.append({"plan": p, "screen": scr, "sim": sim})
        track()
    rows.sort(key=lambda r: _score(objective, r["sim"]))
    front = pareto(screened)
    return rows[0]["plan"], rows[0]["sim"], rows, front


def pareto(points) -> list:
    """(plan, prediction) pairs not beaten on both decode tok/s and TTFT, fastest decode first."""
    pts = sorted(points, key=lambda pr: (-pr[1].decode_tok_s, pr[1].ttft_s))
    front, best_ttft = [], float("inf")
    for p, r in pts:
        if r.ttft_s < best_ttft:
            front.append((p, r))
            best_ttft = r.ttft_s
    return front


def _progress(enabled: bool, total: int, label: str):
    if not enabled:
        return lambda: None
    from rich.progress import Progress

    prog = Progress(transient=True)
    prog.start()
    task = prog.add_task(label, total=total)
    done = [0]

    def tick():
        done[0] += 1
        prog.advance(task)
        if done[0] >= total:
            prog.stop()
    return tick
