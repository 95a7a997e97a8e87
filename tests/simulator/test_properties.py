"""Hypothesis properties of simulated decode on a tiny model (fast) and on DeepSeek-V4.1-Flash."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from simulator.resources import Constants
from simulator.run import simulate

from sim_fixtures import machine, tiered, tiny_model

FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CONSTS = Constants(zc_efficiency=0.6, handover_ms=0.2)
plans = st.tuples(st.integers(0, 64), st.sampled_from(["auction", "cpu", "zero-copy", "copy"]),
                  st.sampled_from(["decayed-count", "lru", "static"]), st.integers(1, 4))


def _plan(slots, kind, policy, streams):
    return tiered(slots, kind, policy).model_copy(update={"streams": streams})


@FAST
@given(plans, st.integers(0, 10_000))
def test_never_beats_the_analytic_ceiling(p, seed):
    """Decode tok/s <= streams / (dense read + layers x k experts, all from VRAM at full bandwidth)."""
    model, hw = tiny_model(), machine()
    plan = _plan(*p)
    r = simulate(model, hw, plan, gen_tokens=20, seed=seed, warm_steps=10, constants=CONSTS)
    step_floor = (model.dense_bytes_per_token + model.n_moe_layers * model.top_k * model.expert_bytes) \
        / (hw.gpu.bw_gbs * 1e9)
    assert r.decode_tok_s <= plan.streams / step_floor * (1 + 1e-9)


@FAST
@given(plans, st.sampled_from(["gpu_bw", "pcie", "ddr", "cpu"]), st.floats(1.0, 4.0),
       st.integers(0, 10_000))
def test_more_bandwidth_or_cores_never_lowers_tok_s(p, what, factor, seed):
    """Scaling up any one resource (same routing seed) never lowers decode tok/s."""
    model, plan = tiny_model(), _plan(*p)
    base = simulate(model, machine(), plan, gen_tokens=20, seed=seed, warm_steps=10, constants=CONSTS)
    more = simulate(model, machine(**{what: factor}), plan, gen_tokens=20, seed=seed, warm_steps=10,
                    constants=CONSTS)
    assert more.decode_tok_s >= base.decode_tok_s * (1 - 1e-9)


@FAST
@given(st.integers(1, 8), st.integers(0, 10_000))
def test_more_threads_never_lowers_tok_s(threads, seed):
    """More CPU threads for the expert tier never lowers decode tok/s."""
    model, hw = tiny_model(), machine()
    plan = tiered(8, "cpu")
    few = simulate(model, hw, plan.model_copy(update={"cpu_threads": threads}), gen_tokens=20,
                   seed=seed, constants=CONSTS)
    many = simulate(model, hw, plan.model_copy(update={"cpu_threads": threads + 4}), gen_tokens=20,
                    seed=seed, constants=CONSTS)
    assert many.decode_tok_s >= few.decode_tok_s * (1 - 1e-9)


@FAST
@given(plans, st.integers(0, 10_000))
def test_bytes_moved_equal_bytes_routed(p, seed):
    """Every distinct routed expert is read once from exactly one tier, and the links carry those
    bytes: PCIe = zero-copy + copies + cache fills; DDR = CPU + zero-copy + copies + fills."""
    model, hw = tiny_model(), machine()
    plan = _plan(*p)
    r = simulate(model, hw, plan, gen_tokens=20, seed=seed, warm_steps=10, constants=CONSTS)
    b = r.bytes_by_tier
    routed = b["vram"] + b["zero_copy"] + b["cpu"] + b["copy"]
    assert routed == pytest.approx(r.reads * model.expert_bytes, rel=1e-9)
    pcie, ddr = r.resources["pcie_h2d"]["bytes"], r.resources["ddr"]["bytes"]
    assert pcie == pytest.approx(b["zero_copy"] + b["copy"] + b["fills"], rel=1e-6)
    assert ddr == pytest.approx(b["cpu"] + b["zero_copy"] + b["copy"] + b["fills"], rel=1e-6)


@FAST
@given(st.sampled_from(["decayed-count", "lru", "static"]), st.integers(1, 4), st.integers(0, 10_000))
def test_cache_holding_every_expert_hits_one(policy, streams, seed):
    """A warm cache with a slot for every expert serves every read from VRAM."""
    model = tiny_model()
    plan = _plan(model.routed_experts, "auction", policy, streams)
    r = simulate(model, machine(), plan, gen_tokens=20, seed=seed, warm_steps=200, routing="uniform")
    assert r.cache_hit_rate == 1.0


def test_deterministic_for_a_seed():
    """Same inputs and seed give identical results; another seed differs."""
    model, hw, plan = tiny_model(engram=True), machine(), tiered(8)
    plan = plan.model_copy(update={"placement": plan.placement.model_copy(update={"engram": "nvme"})})
    a = simulate(model, hw, plan, prompt_tokens=64, gen_tokens=30, seed=7).to_dict()
    b = simulate(model, hw, plan, prompt_tokens=64, gen_tokens=30, seed=7).to_dict()
    c = simulate(model, hw, plan, prompt_tokens=64, gen_tokens=30, seed=8).to_dict()
    assert a == b and a != c


def test_full_dsv4_cache_hits_one():
    """DeepSeek-V4.1-Flash with a slot for each of the 15,360 experts: hit rate 1.0."""
    from specs.loaders import load_hardware, load_model
    from specs.plan import ExpertCache, plan_template
    model = load_model("deepseek-v4.1-flash")
    plan = plan_template("tiered-cache").model_copy(update={
        "expert_cache": ExpertCache(slots=model.routed_experts, policy="decayed-count")})
    r = simulate(model, load_hardware("epyc8ch-3090"), plan, gen_tokens=20, warm_steps=200,
                 routing="uniform")
    assert r.cache_hit_rate == 1.0
    assert np.isfinite(r.decode_tok_s)


staging = st.tuples(st.integers(1, 6), st.integers(1, 8), st.booleans(), st.sampled_from([64, 200]))


def _staged(slots, batch, prefetch, chunk):
    from specs.plan import Prefill
    return tiered(0).model_copy(update={"prefill": Prefill(
        strategy="stream-all", chunk_tokens=chunk, ubatch_tokens=chunk, dma_batch_experts=batch,
        dma_slots=slots, dma_prefetch=prefetch)})


@FAST
@given(staging, st.sampled_from(["pcie", "gpu_bw"]), st.floats(1.0, 4.0))
def test_stream_all_prefill_never_slower_with_a_faster_link_or_prefetch(s, what, factor):
    """Stream-all prefill: a faster link or the next-layer prefetch never lengthens the prompt's
    prefill, and every touched expert is copied once per chunk whatever the staging. (One more
    slot can be slower: batch j goes to slot j % slots, so the next layer's first batch may wait
    for a later last reader, in the engine as here.)"""
    model = tiny_model()
    slots, batch, prefetch, chunk = s
    run = lambda plan, hw: simulate(model, hw, plan, prompt_tokens=400, gen_tokens=1, warm_steps=0)  # noqa: E731
    base = run(_staged(*s), machine())
    assert run(_staged(*s), machine(**{what: factor})).ttft_s <= base.ttft_s * (1 + 1e-9)
    assert run(_staged(slots, batch, True, chunk), machine()).ttft_s <= base.ttft_s * (1 + 1e-9)
    other = run(_staged(1, 1, False, chunk), machine())
    assert base.resources["copy_engine"]["bytes"] == pytest.approx(other.resources["copy_engine"]["bytes"], rel=1e-9)
