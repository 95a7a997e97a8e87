"""`execute` times the run after a warm-up of the same shape (llama-bench's warm-up run); the warm-up
leaves nothing behind: the timed run gives the tokens, logits, routing, hits and misses of a cold one."""
from __future__ import annotations

import json

import numpy as np
import pytest

from executor.runner import Runner, default_prompts, execute
from specs.plan import ExpertCache, MissPolicy, Plan

P, G = 8, 6
N_EXPERTS = 4 * 32  # tiny: 4 layers x 32 experts

PLANS = {
    "all-cpu": Plan(),
    "cache-50%-lru": Plan(expert_cache=ExpertCache(slots=N_EXPERTS // 2, policy="lru")),
    "cache-10%-decayed-auction": Plan(expert_cache=ExpertCache(slots=N_EXPERTS // 10, policy="decayed-count",
                                                               swap_every=2),
                                      miss_policy=MissPolicy(kind="auction")),
    "two-streams-engram": Plan(streams=2, placement={"engram": "ram"}),
}


def _records(r: dict) -> list[tuple]:
    """Each trace record's step, phase, layer, routing, hits, misses and CPU / PCIe experts."""
    keys = ("step", "phase", "layer", "routed", "hits", "misses", "cpu", "pcie", "engram_pages")
    return [tuple(json.dumps(x.get(k)) for k in keys) for x in map(json.loads, open(r["trace"]))]


@pytest.mark.parametrize("name", list(PLANS))
def test_the_warm_up_leaves_the_timed_run_as_a_cold_one(tiny, name):
    """Tokens, logits (to 1e-6) and every record's routing, hits and misses, with and without the warm-up."""
    runs = [execute(PLANS[name], tiny, P, G, trace_path=tiny.parent / f"warm-{name}-{w}.jsonl", keep_logits=True,
                    warmup=w) for w in (False, True)]
    cold, warm = runs
    assert warm["tokens"] == cold["tokens"]
    np.testing.assert_allclose(np.stack(warm["logits"]), np.stack(cold["logits"]), rtol=1e-6, atol=1e-6)
    assert _records(warm) == _records(cold)
    assert warm["cache_hit_rate"] == cold["cache_hit_rate"]


def test_the_warm_up_ttft_is_reported_and_none_without_it(tiny):
    """warmup_ttft_s: the warm-up's TTFT (s, > 0); null when the timed run is the cold first prompt."""
    warm = execute(Plan(), tiny, P, G, trace_path=tiny.parent / "warm-ttft.jsonl")
    cold = execute(Plan(), tiny, P, G, trace_path=tiny.parent / "cold-ttft.jsonl", warmup=False)
    assert warm["warmup_ttft_s"] > 0 and cold["warmup_ttft_s"] is None
    assert len(_records(warm)) == len(_records(cold)) == 4 * G  # the warm-up's records are not in the trace


def test_reset_forgets_the_tokens_and_the_expert_cache(tiny):
    """A run after Runner.reset() gives the first run's tokens and records, the cache refilled as at load."""
    plan = Plan(expert_cache=ExpertCache(slots=N_EXPERTS // 4, policy="lru"))
    r = Runner(plan, tiny, P + G)
    try:
        prompts = default_prompts(1, P, r.c.vocab, seed=5)
        first, _, _ = r.generate(prompts, G)
        recs = [(x["routed"], x["hits"], x["misses"]) for x in r.trace]
        r.reset()
        assert r.kv.len == 0 and r.trace == [] and r.hist == [[]]
        again, _, _ = r.generate(prompts, G)
        assert np.array_equal(again, first)
        assert [(x["routed"], x["hits"], x["misses"]) for x in r.trace] == recs
    finally:
        r.experts.close()
