"""Published runs (DESIGN.md "Published runs") as declared reference cases for fit and regress.

Each case: a name starting with its run id, model preset, hardware profile, the Plan the engine
ran, the metric and measured value with its source, a tolerance, and the role: "fit" (in-sample,
used by calibration/fit.py) or "test" (out-of-sample). Request shapes the sources do not state
(generated tokens elsewhere) are assumptions written in `note`; D119's come from its
ctx_scan.json, and each of its rows replays the requests the server answered before it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specs.plan import DeviceTier, ExpertCache, MissPolicy, Plan, Prefill, plan_template

SRC_FT = "0xSero/dsv41-flash-offload README and results/ (seed article big-moe-one-3090)"
SRC_STRATA = "Strata README and DeepSeek notes (seed article 004, R. Ghumare 2026-11-02)"
SRC_QWEN = ("needmorevram's Strata dashboard recording (seed article big-moe-one-3090): i5-13600K, "
            "2ch DDR5-5200, RTX 3090, MTP 87% / 3.29 tokens per step")
SRC_B70 = ("0xSero/dsv41-flash-offload experimental/b70-tier README.md and NOTES.md (cand11, live, steady-state "
           "decode, no output caps; mirrored in HamidYaraliOfficial/dsv41-flash-offload)")
QWEN = "qwen3.8-flash-next-iq3_s"
I5 = "i5-13600k-ddr5-3090"
DSV = "deepseek-v4.1-flash-3.02"
EPYC = "epyc8ch-3090"
EPYC_B70 = "epyc8ch-3090+arc-pro-b70"


@dataclass(frozen=True)
class Case:
    """One published measurement and how to reproduce it."""

    name: str
    model: str
    hardware: str
    plan: Plan
    metric: str  # decode_tok_s | prefill_tok_s | ttft_s
    measured: float
    source: str
    tolerance: float  # relative, e.g. 0.15
    role: str = "test"  # fit | test
    prompt_tokens: int = 0
    gen_tokens: int = 256
    streams: int = 1
    warm_steps: int = 300
    history: tuple = ()  # (prompt_tokens, gen_tokens) requests served before this one, in order
    engram_text: str = "seen"  # whether the Engram rows of the requests' text are cached (simulate)
    routing: str | None = None  # None = the simulator's default (fitted 4.6% -> 41%)
    band: tuple[float, float] | None = None  # a published range instead of +-tolerance
    note: str = ""
    sized: bool = field(default=False)  # cache slots from specs.memory.size_cache

    def within(self, predicted: float) -> bool:
        """True when `predicted` meets the case (band, or measured +- tolerance)."""
        if self.band is not None:
            return self.band[0] <= predicted <= self.band[1]
        return abs(predicted / self.measured - 1) <= self.tolerance


def _tiered(**upd) -> Plan:
    p = plan_template("tiered-cache")
    return p.model_copy(update=upd)


def _ec(**upd) -> ExpertCache:
    """The engine's VRAM mirror cache with a run's own settings (its run.sh environment)."""
    return plan_template("tiered-cache").expert_cache.model_copy(update=upd)


def _strata_5070() -> Plan:
    """Strata Faster mode on the RTX 5070: ~3 GB of experts on the card (static hot profile),
    56 GB in RAM (64 GB minus 8 for the OS), the rest read from the SSD through the page cache."""
    p = plan_template("strata")
    slots = int(3.0e9 // 8.6e6)
    return p.model_copy(update={
        "expert_cache": ExpertCache(slots=slots, policy="static"),
        "experts_per_token": 5, "kv": p.kv.model_copy(update={"context": 8192}),
        "placement": p.placement.model_copy(update={"expert_ram_bytes": int(56e9)})})


def _strata_qwen_mtp() -> Plan:
    """Strata on the i5-13600K + RTX 3090 box serving the Qwen3.8 GSQ-RCO IQ3_S file with its MTP
    drafter (87% accepted, 3.29 tokens per step) at the dashboard's 262,144-token context; the hot
    profile fills the VRAM left (cache sized by specs.memory)."""
    p = plan_template("strata")
    return p.model_copy(update={
        "mtp": p.mtp.model_copy(update={"enabled": True, "tokens_per_step": 3.29, "acceptance": 0.87}),
        "kv": p.kv.model_copy(update={"context": 262144})})


def all_cases() -> list[Case]:
    """Every declared case, fit cases first."""
    d030 = _tiered(expert_cache=ExpertCache(), miss_policy=MissPolicy(kind="zero-copy"))
    # D107 and D119 run.sh set no DSV41_CT_*: the auction ran ct/ct_vllm.py's own defaults (_B 0.16,
    # _TOK 0.2, _MAXN 64); docker/entrypoint.sh (D130 on, the template) sets 0.20 / 0.35 / 384
    ct_code = MissPolicy(kind="auction", c_b_ms=0.16, c_tok=0.2, max_cpu=64)
    # D107 run.sh: DSV41_EC=1, margin 500 MB, not elastic, copies on the compute stream
    d107 = _tiered(expert_cache=_ec(slots=709, copies="sync", release_during_prefill=False), miss_policy=ct_code)
    default = _tiered()  # D141: docker/entrypoint.sh defaults; 262,144 context; cache sized by specs.memory
    # cand11 (lab_run_cand11.sh): D141's server (the same cache margin and CPU-tier settings) with an Arc B70 worker
    # of 2,200 slots (bt_worker_run.sh BT_SLOTS) and the split's default DSV41_BT_* estimates
    b70 = _tiered(device_tier=DeviceTier(slots=2200))
    # D119 run.sh: elastic (released for each prefill), copies on the compute stream; its prefill
    # is the stock DMA path, before the cross-layer prefetch of runtime/patch_dma_prefetch.py (D135)
    stock = Prefill(strategy="stream-all", chunk_tokens=16384, ubatch_tokens=16384, dma_prefetch=False)
    d119 = _tiered(expert_cache=_ec(copies="sync"), prefill=stock, miss_policy=ct_code)
    baseline = _tiered(prefill=Prefill(strategy="op-offload", chunk_tokens=1024, ubatch_tokens=1024))
    # DESIGN.md's stream-all row: 16,384-token chunks, the default's staging (8 slots x 8, prefetch)
    chunk16k = _tiered(prefill=plan_template("tiered-cache").prefill.model_copy(
        update={"chunk_tokens": 16384, "ubatch_tokens": 16384}))
    # D119 results/ctx_scan.json: one server, five requests in this order (prompt, completion
    # tokens, decode tok/s as (n - 1) / (t_last - t_first)); the cache state carries between them
    scan = [(8192, 151, 16.38, 13.91), (32768, 130, 19.42, 42.3), (65536, 157, 20.51, 80.59),
            (131072, 159, 20.91, 165.63), (196608, 141, 20.48, 251.7)]
    scan_names = ("D119-8k", "D119-32k", "D119-64k", "D119-long", "D119-192k")
    d119_cases = []
    for j, (name, (p, g, tok_s, ttft)) in enumerate(zip(scan_names, scan)):
        # one document and one answer throughout (answer_head is the same in all five rows), new
        # to the host at request 1: Engram rows are cold only past what earlier requests read
        shape = dict(prompt_tokens=p, gen_tokens=g, warm_steps=0, sized=True, engram_text="shared",
                     history=tuple((a, b) for a, b, _, _ in scan[:j]),
                     note=f"request {j + 1} of the context scan on a fresh server"
                          + (" (the pool exists only after 64 steps)" if j == 0 else
                             "; the kept set is restored 4 steps after each prefill"))
        src = SRC_FT + " results/D119/ctx_scan.json"
        d119_cases.append(Case(name, DSV, EPYC, d119, "decode_tok_s", tok_s, src, 0.15, **shape))
        d119_cases.append(Case(name + "-ttft", DSV, EPYC, d119, "ttft_s", ttft, src, 0.20, **shape))
    # D061 results/sweep.json: prefill only, no cache (DSV41_EC=0), stock DMA path, 16k chunks; each
    # of the 3 reps a new random-token prompt (prompt_seed), so every Engram row is read cold
    d061 = _tiered(expert_cache=ExpertCache(), prefill=stock)
    d061_cases = [Case(f"D061-{p // 1024}k-prefill", DSV, EPYC, d061, "prefill_tok_s", tok_s,
                       SRC_FT + " results/D061/sweep.json (median of 3)", 0.20, prompt_tokens=p,
                       gen_tokens=1, engram_text="new", note="random-token prompts, new each rep")
                  for p, tok_s in ((8192, 565.2), (32768, 744.9))]
    return [
        Case("D030-zero-copy", DSV, EPYC, d030, "decode_tok_s", 4.10, SRC_FT + " results/D030/sweep.json",
             0.15, "fit", note="experts zero-copy over PCIe, no CPU tier, no cache"),
        Case("D107-cpu-tier-cache", DSV, EPYC, d107, "decode_tok_s", 21.34,
             SRC_FT + " results/D107/sweep.json", 0.15, "fit", note="709-slot cache, hit rate 0.408"),
        Case("D141-1stream", DSV, EPYC, default, "decode_tok_s", 19.3, SRC_FT + " README", 0.15,
             sized=True),
        Case("D141-2streams", DSV, EPYC, default, "decode_tok_s", 24.0, SRC_FT + " README", 0.15,
             streams=2, sized=True),
        Case("D141-3streams", DSV, EPYC, default, "decode_tok_s", 22.4, SRC_B70 + " (D141 baseline table)", 0.15,
             streams=3, sized=True, note="below the 2-stream figure (24.0): the same dip as cand11's 3 streams"),
        Case("D141-4streams", DSV, EPYC, default, "decode_tok_s", 26.6, SRC_FT + " README", 0.15,
             streams=4, sized=True),
        *[Case(f"D141-B70-{n}stream{'s' if n > 1 else ''}", DSV, EPYC_B70, b70, "decode_tok_s", tok_s, SRC_B70, 0.15,
               streams=n, sized=True, note="experimental: a second card as a further expert tier")
          for n, tok_s in ((1, 24.7), (2, 34.6), (3, 35.0), (4, 41.3))],
        *d119_cases,
        *d061_cases,
        Case("prefill-baseline-1k", DSV, EPYC, baseline, "prefill_tok_s", 95.0,
             SRC_FT + " README (1,024-token chunks, experts streamed over PCIe per chunk)", 0.20,
             prompt_tokens=8192, gen_tokens=1, sized=True,
             note="every expert copied per 1,024-token chunk, serial with compute"),
        Case("prefill-stream-all-8k", DSV, EPYC, chunk16k, "prefill_tok_s", 690.0,
             SRC_FT + " README (D061: 16,384-token chunks, 690-790 tok/s from 8k to 261k)", 0.20,
             prompt_tokens=8192, gen_tokens=1, sized=True,
             note="DESIGN.md's low end of 690-790; the engine's runtime/patch_dma_prefetch.py reports "
                  "787 at 8k once the next layer's batches are prefetched (D135)"),
        Case("prefill-stream-all-261k", DSV, EPYC, d119, "ttft_s", 341.6,
             SRC_FT + " README (261k prompt = 341.6 s TTFT), results/D119/ctx_scan_261k.json", 0.20,
             prompt_tokens=261000, gen_tokens=1, sized=True,
             note="run on D119's server (stock DMA path, 16,384-token chunks)"),
        Case("strata-qwen3.8-mtp-2k", QWEN, I5, _strata_qwen_mtp(), "decode_tok_s", 97.0, SRC_QWEN, 0.15,
             prompt_tokens=2421, sized=True, note="request 7 of the dashboard; 256 generated tokens assumed"),
        Case("strata-qwen3.8-mtp-142k", QWEN, I5, _strata_qwen_mtp(), "decode_tok_s", 54.1, SRC_QWEN, 0.15,
             prompt_tokens=142550, sized=True, note="request 4 of the dashboard; 256 generated tokens assumed"),
        Case("rtx5070-even-spread-3.8", "deepseek-v4.1-flash-1017-gsq-2.00", "rtx5070-64g",
             _strata_5070(), "decode_tok_s", 3.8, SRC_STRATA + " (even-spread SSD ceiling)", 0.15,
             routing="uniform", note="Faster mode (5 of 6); uniform picks: 55.3% of bytes from SSD"),
        Case("rtx5070-skewed-4-6", "deepseek-v4.1-flash-1017-gsq-2.00", "rtx5070-64g",
             _strata_5070(), "decode_tok_s", 4.7, SRC_STRATA + " (reported 4-6 tok/s, 4.7 in notes)",
             0.15, band=(4.0, 6.0), note="skewed routing (fitted 4.6% -> 41%) with Strata's profile"),
    ]


def get_case(name: str) -> Case:
    """The case called `name`."""
    for c in all_cases():
        if c.name == name:
            return c
    raise KeyError(name)
