"""`simulate(model, hw, plan, ...)`: prefill then decode on one simulated machine -> SimResult."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from specs.errors import SpecError
from specs.memory import check_device_tier

from .decode import DecodeRun
from .device_tier import ExpertDeviceTier
from .engine import Sim
from .engram import EngramText, ram_room
from .policies import LRUCache, make_cache, mtp_tokens
from .prefill import PrefillRun
from .resources import Constants, Machine
from .routing import ROUTING_MODELS, Replay, Routing, make_routing

DEFAULT_ROUTING = "fitted"  # 4.6% of experts serve 41% of reads (dsv41-flash-offload D107)


@dataclass
class SimResult:
    """Simulated metrics (interface contract of `moe-offload simulate`)."""

    decode_tok_s: float
    ttft_s: float
    prefill_tok_s: float
    itl_p50_ms: float
    itl_p95_ms: float
    cache_hit_rate: float
    resources: dict
    bottleneck: str
    bottleneck_by_metric: dict = field(default_factory=dict)
    bytes_by_tier: dict = field(default_factory=dict)
    steps: int = 0
    reads: int = 0  # distinct (step, layer, expert) reads
    events: int = 0

    def to_dict(self) -> dict:
        """Plain JSON-ready dict."""
        return asdict(self)


def resolve_routing(routing, model, k: int, seed: int) -> Routing:
    """A Routing from None (default), a name ('uniform', 'fitted', 'drifting', 'skewed:1.1'), a JSONL trace
    path, a list of [L, k] arrays, or a Routing object."""
    L, E = model.n_moe_layers, model.n_experts
    if isinstance(routing, Routing):
        return routing
    if routing is None:
        routing = DEFAULT_ROUTING
    if isinstance(routing, (str, Path)):
        s = str(routing)
        if s.endswith(".jsonl") or Path(s).is_file() or (Path(s).is_dir() and s not in ROUTING_MODELS):
            return Replay.from_jsonl(s, E)  # a folder given for a trace: named as one by read_text
        if s.startswith("skewed:"):
            try:
                exponent = float(s.split(":", 1)[1])
            except ValueError:
                raise SpecError(None, "--routing", f"{s!r}: skewed:EXP needs a number, as skewed:1.1") from None
            return make_routing("skewed", L, E, k, seed, exponent=exponent)
        if s not in ROUTING_MODELS:
            raise SpecError(None, "--routing", f"no such file or routing model {s!r} "
                                               f"({', '.join(ROUTING_MODELS)}, skewed:EXP or a trace .jsonl)")
        return make_routing(s, L, E, k, seed)
    return Replay(routing, E)


def simulate(model, hw, plan, prompt_tokens: int = 0, gen_tokens: int = 256, streams: int | None = None,
             seed: int = 0, routing=None, warm_steps: int = 300, constants: Constants | None = None,
             trace: bool = False, history: tuple = (), engram_text: str = "seen") -> SimResult:
    """Simulate one request per stream: prefill `prompt_tokens`, decode `gen_tokens` per stream.
    `warm_steps` decode steps of routing warm the cache scores first (a server that has been
    serving); 0 = a cold start (first request). `history`: (prompt_tokens, gen_tokens) requests
    the same server served before this one, in order (cache state carries over; not timed).
    `engram_text`: whether the requests' Engram rows are cached ("seen", "new", "shared"; see
    simulator.engram.EngramText)."""
    streams = int(streams or plan.streams)
    consts = constants or Constants.from_hw(hw, plan.engine)
    k = plan.experts_per_token or model.top_k
    rng = np.random.default_rng(seed)
    rt = resolve_routing(routing, model, k, seed)
    L, E = model.n_moe_layers, model.n_experts
    cache = make_cache(plan.expert_cache, L, E, seed, hot=rt.popularity)
    page = None
    ram = plan.placement.expert_ram_bytes
    if ram is not None and ram < model.routed_bytes:  # experts beyond RAM come from NVMe
        page = LRUCache(int(ram // model.expert_bytes), L, E)
    device = None
    if plan.device_tier.slots:
        check_device_tier(model, hw, plan)
        device = ExpertDeviceTier(plan.device_tier, L, E)
    if warm_steps:
        for r in rt.sample(warm_steps, rng):
            for i in range(L):
                if device is not None:  # the card's slots fill as the splits of a serving engine fill them
                    hit = cache.res[i, r[i]]
                    device.route(i, int(hit.sum()), r[i][~hit], None, plan.miss_policy, 1)
                cache.observe(i, r[i])
                if page is not None:
                    page.observe(i, r[i][~cache.res[i, r[i]]])
            cache.end_step()
            page is not None and page.end_step()
            device is not None and device.end_step()
    text = EngramText(engram_text, ram_room(model, hw, plan),
                      model.engram_bytes_per_token(hw.page_bytes) if plan.placement.engram == "nvme" else 0.0)
    serve = lambda p, g: _serve(model, hw, plan, consts, rt, cache, page, rng, p, g, streams, trace,
                                text.request(p, g * streams), device)
    for p_tok, g_tok in history:
        serve(int(p_tok), int(g_tok))
    sim, m, dec, state = serve(prompt_tokens, gen_tokens)
    committed = dec.committed

    t_pre = state["t_prefill"]
    steps = np.asarray(dec.step_s)
    dec_s = float(steps.sum())
    itl = steps / committed * 1e3
    decode_tok_s = streams * committed * len(steps) / dec_s if dec_s > 0 else 0.0
    ttft = t_pre + (float(steps[0]) if len(steps) else 0.0)
    crit = {("ddr" if k_ == "cpu" and m.ddr.busy_s > 0.95 * sim.now else k_): v for k_, v in dec.crit.items()}
    bottleneck = max(crit, key=crit.get)
    pre_bn = "none"
    if prompt_tokens:
        pre_bn = "copy_engine" if m.copy.busy_s > m.gpu.busy_s - dec_s else "gpu"
    return SimResult(
        decode_tok_s=decode_tok_s, ttft_s=ttft,
        prefill_tok_s=(streams * prompt_tokens / t_pre) if t_pre > 0 else 0.0,
        itl_p50_ms=float(np.percentile(itl, 50)) if len(itl) else 0.0,
        itl_p95_ms=float(np.percentile(itl, 95)) if len(itl) else 0.0,
        cache_hit_rate=dec.hit_rate, resources=m.report(sim.now), bottleneck=bottleneck,
        bottleneck_by_metric={"decode_tok_s": bottleneck, "ttft_s": pre_bn if prompt_tokens else bottleneck,
                              "decode_critical_s": crit},
        bytes_by_tier=dec.bytes_by_tier, steps=len(steps), reads=dec.reads, events=sim.events)


def _serve(model, hw, plan, consts, rt, cache, page, rng, prompt_tokens, gen_tokens, streams, trace, cold,
           device=None):
    """One request on a fresh clock: prefill, then decode; the cache, routing and Engram page cache
    carry state (`cold`: fractions of the prompt's and the answer's Engram rows not cached)."""
    verify = mtp_tokens(plan.mtp.tokens_per_step, plan.mtp.acceptance) if plan.mtp.enabled else 1
    committed = plan.mtp.tokens_per_step if plan.mtp.enabled else 1.0
    sim = Sim(trace=trace)
    m = Machine(sim, model, hw, plan, consts)
    pre = PrefillRun(m, model, plan, prompt_tokens, streams, engram_cold=cold[0])
    n_steps = max(1, int(np.ceil(gen_tokens / committed)))
    rt.new_context(rng)  # this request's prompt (or, without one, a new conversation)
    # an engine that pads its decode batches to a captured graph size routes the padding rows as tokens
    routed = -(-plan.padded_tokens(streams * verify) // verify)
    dec = DecodeRun(m, model, plan, rt, cache, page, rng, streams * verify, committed, prompt_tokens, streams,
                    engram_cold=cold[1], device=device, routed_streams=routed)
    state = {}

    def after_prefill():
        state["t_prefill"] = sim.now
        if prompt_tokens and plan.expert_cache.release_during_prefill:
            cache.release()
        elif prompt_tokens and cache.slots and m.has_gpu and getattr(cache, "hot", None) is None:
            # the prompt's routing reaches the cache as the engine's prefill ran it (a shipped hot list
            # does not look), and the prefill's step end admits experts before the first token
            routes = rt.prompt_routes(prompt_tokens * streams, rng)  # [P, L, k]
            if len(routes):
                for i in range(model.n_moe_layers):
                    cache.observe(i, routes[:, i].ravel())
                dec.admit(cache.end_step())
        dec.start(n_steps, lambda: state.setdefault("t_end", sim.now))

    if prompt_tokens and plan.expert_cache.release_during_prefill:
        cache.release()
    pre.start(after_prefill)
    sim.run()
    return sim, m, dec, state
