"""The same tokens come out whatever the plan; 4 streams decoded together match each stream alone."""
from __future__ import annotations

import json

import pytest

from executor.runner import default_prompts, execute
from specs.plan import ExpertCache, MissPolicy, Placement, Plan

P, G = 8, 8
N_EXPERTS = 4 * 32  # tiny: 4 layers x 32 experts


def _run(tiny, plan, **kw):
    return execute(plan, tiny, P, G, trace_path=tiny.parent / "plans.jsonl", **kw)


PLANS = {
    "all-cpu": Plan(),
    "cache-10%-decayed": Plan(expert_cache=ExpertCache(slots=N_EXPERTS // 10, policy="decayed-count", swap_every=2)),
    "cache-50%-lru": Plan(expert_cache=ExpertCache(slots=N_EXPERTS // 2, policy="lru")),
    "cache-100%-static": Plan(expert_cache=ExpertCache(slots=N_EXPERTS, policy="static")),
    "cache-50%-auction": Plan(expert_cache=ExpertCache(slots=N_EXPERTS // 2, policy="decayed-count", swap_every=1),
                              miss_policy=MissPolicy(kind="auction")),
    "copy-misses": Plan(miss_policy=MissPolicy(kind="copy")),
    "static-split": Plan(engine="llamacpp", placement=Placement(gpu_expert_layers=[2, 3])),
}


@pytest.fixture(scope="module")
def baseline(tiny):
    return _run(tiny, Plan())


@pytest.mark.parametrize("name", list(PLANS))
def test_same_tokens_whatever_the_plan(tiny, baseline, name):
    r = _run(tiny, PLANS[name])
    assert r["tokens"] == baseline["tokens"]
    recs = [json.loads(line) for line in open(r["trace"])]
    dec = [x for x in recs if x["phase"] == "decode"]
    hits = sum(len(x["hits"]) for x in dec)
    if name == "all-cpu":
        assert hits == 0 and all(x["misses"] == x["cpu"] for x in recs)
    if name.startswith("cache-100%"):  # static: first come stays; the whole model fits
        assert hits > 0
    if name.startswith("cache-50%"):
        assert hits > 0 and sum(len(x["misses"]) for x in dec) > 0
    if name == "cache-50%-auction":
        assert all(x["k_cpu"] is not None for x in dec)
    if name == "copy-misses":
        assert all(x["cpu"] == [] for x in recs) and sum(len(x["pcie"]) for x in recs) > 0
    if name == "static-split":
        assert all((x["misses"] == []) == (x["layer"] in (2, 3)) for x in recs)


def test_four_streams_together_match_alone(tiny):
    prompts = default_prompts(4, P, 512, seed=11)
    together = execute(Plan(streams=4, expert_cache=ExpertCache(slots=40, policy="lru")), tiny, P, G,
                       trace_path=tiny.parent / "s4.jsonl", prompts=prompts)
    assert len(together["tokens"]) == 4
    for s in range(4):
        alone = execute(Plan(), tiny, P, G, trace_path=tiny.parent / "s1.jsonl", prompts=prompts[s:s + 1])
        assert together["tokens"][s] == alone["tokens"][0]
    # a step computes each layer's union of routed experts once for all streams
    rec = [json.loads(line) for line in open(together["trace"])]
    for x in rec:
        union = set(e for tok in x["routed"] for e in tok)
        assert sorted(x["hits"] + x["misses"]) == sorted(union)
    assert len({tuple(t) for t in together["tokens"]}) > 1  # the streams really differ


def test_trace_and_result_fields(tiny):
    r = _run(tiny, Plan(expert_cache=ExpertCache(slots=32, policy="lru")))
    for key in ("decode_tok_s", "ttft_s", "itl_p50_ms", "tokens", "trace", "bandwidth_gbs", "cache_hit_rate"):
        assert key in r
    assert r["decode_tok_s"] > 0 and r["ttft_s"] > 0
    assert r["decode_path"] == ("cuda-graphs" if r["device"] == "cuda" else "cpu-step")
    recs = [json.loads(line) for line in open(r["trace"])]
    assert len(recs) == 4 * G  # one per step and layer
    for key in ("step", "layer", "routed", "hits", "misses", "k_cpu", "t_dense_ms", "t_cpu_ms", "t_dev_ms",
                "t_wait_ms", "engram_pages"):
        assert key in recs[0]
    assert r["bandwidth_gbs"]["cpu"] > 0
    assert not list(tiny.parent.glob("*.tmp"))


def test_engram_pages_counted(tiny):
    r = _run(tiny, Plan(placement=Placement(engram="nvme")))
    recs = [json.loads(line) for line in open(r["trace"])]
    pages = [x["engram_pages"] for x in recs if x["phase"] == "decode" and x["layer"] == 1]
    # 24 rows of 272 bytes per token: at least one page per distinct row group, at most 2 per row
    assert all(12 <= p <= 48 for p in pages), pages
    assert all(x["engram_pages"] == 0 for x in recs if x["layer"] != 1)


def test_fewer_experts_per_token_runs(tiny):
    r = _run(tiny, Plan(experts_per_token=2))
    recs = [json.loads(line) for line in open(r["trace"])]
    assert all(len(t) == 2 for x in recs for t in x["routed"])


def test_each_kernel_compiles_once(cold_run):
    """Each executor kernel has one type signature. A literal 0 or True, or a prange's uint64 index, passed
    from one kernel to another made numba compile the callee again (0351e3a: _rows_quad had 10
    specialisations, a cold `execute` of tiny took 320-375 s, not 158 s; a literal True compiled
    moe_routed and attention_step twice)."""
    counts = cold_run["signatures"]
    assert sum(counts.values()) > 20  # the runs reached the kernels
    assert {k: n for k, n in counts.items() if n > 1} == {}


def test_a_cold_run_compiles_nothing_in_its_timed_steps(cold_run):
    """Runner loads or compiles every kernel before the first prefill, so that a cold first run's TTFT is
    not numba's compile time (the embedding's dequantiser compiled in the first prefill: TTFT 0.70 s cold
    against 0.009 s warm on tiny)."""
    assert cold_run["compiled_in_steps"] == []
