"""Placement policies shared with the executor: the miss auction and the expert caches."""
import numpy as np
from hypothesis import given, settings, strategies as st

from simulator.policies import (auction_cost_ms, auction_split, expected_touched, make_cache,
                                mtp_tokens, op_offload)
from specs.plan import ExpertCache, chunks, ubatches


def test_auction_worked_example():
    """2 hits, 4 misses with the published constants: 3 misses to the CPU, 0.71 ms per layer."""
    k, t = auction_split(2, 4, 0.03, 0.58, 0.11, 0.20)
    assert k == 3
    assert abs(t - 0.71) < 1e-9


def test_auction_no_misses_costs_hits_only():
    """Without misses nothing goes to the CPU and c_a is not paid."""
    assert auction_split(6, 0, 0.03, 0.58, 0.11, 0.20) == (0, 6 * 0.03)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12), st.integers(0, 12), st.floats(0.001, 2), st.floats(0.001, 5),
       st.floats(0, 2), st.floats(0.001, 2))
def test_auction_optimal_against_brute_force(nh, nm, th, tz, ca, cb):
    """The chosen k attains the minimum of t(k) over every k in [0, n_miss]."""
    k, t = auction_split(nh, nm, th, tz, ca, cb)
    brute = min(auction_cost_ms(j, nh, nm, th, tz, ca, cb) for j in range(nm + 1))
    assert 0 <= k <= nm
    assert abs(t - brute) < 1e-9
    assert abs(auction_cost_ms(k, nh, nm, th, tz, ca, cb) - t) < 1e-12


def _drive(cache, steps, rng, n_layers, n_experts, k, p=None):
    hits = total = 0
    for _ in range(steps):
        for layer in range(n_layers):
            ex = rng.choice(n_experts, size=k, replace=False, p=p)
            hits += sum(cache.contains(layer, int(e)) for e in ex)
            total += k
            cache.observe(layer, ex)
        cache.end_step()
    return hits / total


def test_decayed_count_swaps_at_most_swap_max_every_swap_every():
    """Once full, residency changes only on multiples of swap_every and by at most swap_max pairs."""
    L, E = 4, 64
    cache = make_cache(ExpertCache(slots=32, policy="decayed-count", swap_every=4, swap_max=3), L, E)
    rng = np.random.default_rng(1)
    for step in range(40):
        for layer in range(L):
            cache.observe(layer, rng.integers(0, E, 6))
        changes = cache.end_step()
        assert cache.n_resident <= 32
        if step >= 2 and cache.n_resident == 32:
            outs = [c for c in changes if c[2] >= 0]
            assert len(outs) <= 3
            if (step + 1) % 4:
                assert outs == []


def test_decayed_count_learns_hot_set():
    """With a fixed hot set routed to most, the cache converges on it (hit rate near its share)."""
    L, E = 2, 100
    p = np.full(E, 0.2 / 90)
    p[:10] = 0.08
    cache = make_cache(ExpertCache(slots=20, policy="decayed-count", decay=0.99, swap_every=4,
                                   swap_max=4), L, E)
    rng = np.random.default_rng(2)
    _drive(cache, 200, rng, L, E, 1, p)
    assert cache.resident(0)[:10].all() and cache.resident(1)[:10].all()


def test_release_then_rewarm_after_rewarm_steps():
    """release() empties the cache; free slots are refilled only after rewarm_steps steps."""
    cache = make_cache(ExpertCache(slots=8, policy="decayed-count", rewarm_steps=4), 1, 16)
    for _ in range(3):
        cache.observe(0, np.arange(8))
        cache.end_step()
    assert cache.n_resident == 8
    cache.release()
    assert cache.n_resident == 0
    for _ in range(4):
        cache.observe(0, np.arange(8))
        cache.end_step()
        assert cache.n_resident == 0
    cache.observe(0, np.arange(8))
    cache.end_step()
    assert cache.n_resident == 8


def test_lru_per_layer_evicts_least_recent():
    """LRU with 2 slots per layer: routing 0,1 then 2 evicts 0; changes name expert in and out."""
    cache = make_cache(ExpertCache(slots=2, policy="lru"), 1, 8)
    cache.observe(0, [0]); cache.end_step()
    cache.observe(0, [1]); cache.end_step()
    cache.observe(0, [2])
    assert cache.end_step() == [(0, 2, 0)]
    assert list(np.flatnonzero(cache.resident(0))) == [1, 2]


def test_static_hot_list_never_changes():
    """A static cache holds exactly its hot list, whatever is routed."""
    hot = np.zeros((2, 10)); hot[0, 3] = 5; hot[1, 7] = 4; hot[1, 1] = 1
    cache = make_cache(ExpertCache(slots=2, policy="static"), 2, 10, hot=hot)
    for _ in range(5):
        cache.observe(0, [1, 2]); cache.end_step()
    assert cache.contains(0, 3) and cache.contains(1, 7) and not cache.contains(1, 1)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["decayed-count", "lru", "static"]), st.integers(0, 1000))
def test_cache_holding_every_expert_hits_one(policy, seed):
    """A cache with a slot for every expert hits 1.0 once warm (hot list = everything for static)."""
    L, E = 3, 16
    hot = np.ones((L, E)) if policy == "static" else None
    cache = make_cache(ExpertCache(slots=L * E, policy=policy, swap_every=2), L, E, hot=hot)
    rng = np.random.default_rng(seed)
    for _ in range(30):  # warm: every expert routed at least once
        for layer in range(L):
            cache.observe(layer, np.arange(E))
        cache.end_step()
    assert _drive(cache, 20, rng, L, E, 4) == 1.0


def test_prefill_helpers():
    """Chunks, micro-batches, the op-offload threshold, MTP tokens and the touched-expert form."""
    assert chunks(5000, 2048) == [2048, 2048, 904]
    assert ubatches(904, 512) == [512, 392]
    assert op_offload(32) and not op_offload(31)
    assert mtp_tokens(3.29, 0.87) == 4  # 1 + .87 + .87^2 + .87^3 = 3.29
    assert mtp_tokens(1.0, 0.0) == 1
    assert abs(expected_touched(1, 384, 6) - 6) < 1e-9
    assert expected_touched(1024, 384, 6) > 383


def _engine_cache(**upd):
    """dsv41-flash-offload's schedule (ct/ct_vllm.py ec_step) on 1 layer x 64 experts."""
    cfg = dict(slots=10, policy="decayed-count", swap_every=4, swap_max=3, fill="at-replan", warmup_steps=8)
    return make_cache(ExpertCache(**{**cfg, **upd}), 1, 64)


def test_at_replan_no_pool_before_warmup_steps():
    """The slot pool exists only from step `warmup_steps` (EC_WARMUP 64 in the engine): nothing is
    resident before it, however hot the routing."""
    cache = _engine_cache()
    for step in range(1, 8):
        cache.observe(0, np.arange(6))
        cache.end_step()
        assert cache.n_resident == 0, step
    cache.observe(0, np.arange(6))
    cache.end_step()  # step 8: pool allocated, 8 % 4 == 0 -> first replan
    assert cache.n_resident == 3


def test_at_replan_admits_at_most_swap_max_per_replan_fills_included():
    """Free slots fill only at replans (every swap_every steps) and at most swap_max at a time:
    10 slots need 4 replans; each admission names its expert, hottest first."""
    cache = _engine_cache(warmup_steps=0)
    counts = []
    for step in range(1, 17):
        cache.observe(0, np.arange(12))
        changes = cache.end_step()
        assert (changes != []) == (step % 4 == 0)
        assert len(changes) <= 3
        counts.append(cache.n_resident)
    assert counts[3::4] == [3, 6, 9, 10]


def test_at_replan_release_then_kept_set_restored_at_once():
    """release() hands the pool back and keeps the residents; `rewarm_steps` decode steps later all
    of them return in one step, flagged as copies on the compute stream (ec_rewarm)."""
    cache = _engine_cache(warmup_steps=0, rewarm_steps=4)
    for _ in range(16):
        cache.observe(0, np.arange(10))
        cache.end_step()
    kept = cache.resident(0)
    cache.release()
    assert cache.n_resident == 0
    for _ in range(3):
        cache.observe(0, np.arange(20, 30))
        assert cache.end_step() == [] and not cache.stream_ordered
    cache.observe(0, np.arange(20, 30))
    changes = cache.end_step()
    assert len(changes) == 10 and cache.stream_ordered
    assert (cache.resident(0) == kept).all()


def test_at_replan_release_before_the_pool_exists_is_a_no_op():
    """A prefill before the pool is allocated releases nothing (ec_release returns early)."""
    cache = _engine_cache(warmup_steps=8)
    cache.release()
    for _ in range(8):
        cache.observe(0, np.arange(6))
        cache.end_step()
    assert cache.n_resident == 3


def test_auction_charges_each_further_token_of_a_cpu_expert():
    """dsv41-flash-offload's split kernel (ct/ft_tier_cu_v.cu): a CPU expert routed by n tokens
    costs c_b (1 + c_tok (n - 1)). 2 hits, 4 misses routed by 1, 1, 2, 3 tokens (coldest first),
    c_tok 0.35: k = 3 still, at 0.11 + 0.20 x 3.35 = 0.78 ms; at most 2 CPU experts: k = 2, 1.28 ms."""
    k, t = auction_split(2, 4, 0.03, 0.58, 0.11, 0.20, tokens=[1, 1, 2, 3], c_tok=0.35)
    assert k == 3 and abs(t - 0.78) < 1e-9
    k, t = auction_split(2, 4, 0.03, 0.58, 0.11, 0.20, tokens=[1, 1, 2, 3], c_tok=0.35, max_cpu=2)
    assert k == 2 and abs(t - 1.28) < 1e-9


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10), st.lists(st.integers(1, 4), max_size=10), st.floats(0, 1), st.integers(0, 10))
def test_token_aware_auction_optimal_against_brute_force(nh, tokens, c_tok, cap):
    """With tokens per miss and a cap, the chosen k minimises t(k) over every k <= min(n_miss, cap)."""
    nm = len(tokens)
    k, t = auction_split(nh, nm, 0.03, 0.58, 0.11, 0.20, tokens=tokens, c_tok=c_tok, max_cpu=cap)
    brute = min(auction_cost_ms(j, nh, nm, 0.03, 0.58, 0.11, 0.20, tokens, c_tok) for j in range(min(nm, cap) + 1))
    assert 0 <= k <= min(nm, cap) and abs(t - brute) < 1e-9


def test_whole_experts_per_thread_when_a_job_balances():
    """The executor's CPU job structure (executor.cpu_experts takes this rule): a decode token's top-8 on 2 threads
    runs whole experts (4 + 4); 3 one-token experts on 2 threads do not (2 / 1.5 = 1.33 > 1.1), nor 11 on 4 (3 /
    2.75 = 1.09 is within 1.1: they do); several tokens an expert by longest-first loads, up to 8 tokens an expert."""
    from simulator.policies import thread_loads, whole_experts_per_thread
    assert whole_experts_per_thread([1] * 8, 2) and not whole_experts_per_thread([1] * 3, 2)
    assert whole_experts_per_thread([1] * 11, 4) and not whole_experts_per_thread([1] * 7, 4)
    assert sorted(thread_loads([3, 2, 2, 1], 2)) == [4, 4] and whole_experts_per_thread([3, 2, 2, 1], 2)
    assert not whole_experts_per_thread([9, 9], 2) and not whole_experts_per_thread([], 2)
    assert whole_experts_per_thread([1], 1)
