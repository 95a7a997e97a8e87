"""The numpy dense path (executor/cpu_step.py), its kernels called from Python, gives the bits of the
torch-glued step and the same trace records, whatever the expert tiers; its fused runs of layers give the
same tokens and records; it is taken whenever the dense weights are read in place on the CPU."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from executor import kernels as K
from executor.cpu_step import CpuStep, fits
from executor.runner import Runner, default_prompts
from specs.plan import ExpertCache, MissPolicy, Placement, Plan

TIMES = {"t_dense_ms", "t_engram_ms", "t_experts_ms", "t_cpu_ms", "t_dev_ms", "t_wait_ms", "t_host_ms",
         "engram_major_faults"}  # measured, so free to differ between the runs (faults: the page cache's state)


def _run(tiny, plan, cpu_path: bool, prompt=6, gen=5, fused=False):
    r = Runner(plan, tiny, prompt + gen)
    assert (r.cpu is not None) == fits(r)
    if not cpu_path:
        r.cpu = None  # the general step (torch tensors between the same kernels)
    elif not fused:
        r.cpu = CpuStep(r, fused=False)  # each layer's kernels called from Python
    try:
        toks, _, logits = r.generate(default_prompts(plan.streams, prompt, r.c.vocab, seed=5), gen, keep_logits=True)
    finally:
        r.experts.close()
    return toks, np.stack(logits), r.trace


@pytest.mark.parametrize("plan", [
    Plan(placement=Placement(engram="none")),
    Plan(),  # Engram rows added to the residual
    Plan(streams=3, placement=Placement(engram="none")),
    Plan(experts_per_token=2, placement=Placement(engram="none")),
    Plan(expert_cache=ExpertCache(slots=40, policy="lru")),  # device hits, CPU misses beside them
    Plan(expert_cache=ExpertCache(slots=40, policy="decayed-count", swap_every=1),
         miss_policy=MissPolicy(kind="auction")),
    Plan(placement=Placement(gpu_expert_layers=[1, 3])),  # static layers
    Plan(miss_policy=MissPolicy(kind="copy")),
], ids=["one-stream", "engram", "three-streams", "top-2", "cache-lru", "cache-auction", "static", "copy"])
def test_cpu_step_bitwise_equal_to_torch_step(tiny, plan):
    a_tok, a_lg, a_tr = _run(tiny, plan, True)
    b_tok, b_lg, b_tr = _run(tiny, plan, False)
    assert np.array_equal(a_tok, b_tok)
    assert np.array_equal(a_lg, b_lg)  # same kernels, same order of adds: the same bits
    assert len(a_tr) == len(b_tr)
    for x, y in zip(a_tr, b_tr):
        assert list(x) == list(y)  # same fields in the same order (the JSONL lines match)
        assert {k: v for k, v in x.items() if k not in TIMES} == {k: v for k, v in y.items() if k not in TIMES}
        assert all(x[k] >= 0 for k in TIMES)


FUSED = {"one-stream": Plan(placement=Placement(engram="none")), "engram": Plan(),
         "three-streams": Plan(streams=3, placement=Placement(engram="none")),
         "top-2": Plan(experts_per_token=2, placement=Placement(engram="none"))}


@pytest.mark.parametrize("name", list(FUSED))
def test_fused_layers_give_the_per_layer_tokens_within_1e4_of_its_logits(tiny, name):
    """Plans whose layers are all plain CPU work run whole runs of layers in one numba call (Engram layers
    end a run); its kernels are compiled again in that call and may round differently in the last bits:
    the same tokens and trace records, logits within 1e-4 of their largest magnitude."""
    plan = FUSED[name]
    r = Runner(plan, tiny, 8)
    assert r.cpu is not None and r.cpu.tables is not None
    r.experts.close()
    a_tok, a_lg, a_tr = _run(tiny, plan, True, fused=True)
    b_tok, b_lg, b_tr = _run(tiny, plan, True, fused=False)
    assert np.array_equal(a_tok, b_tok)
    assert np.abs(a_lg - b_lg).max() <= 1e-4 * np.abs(b_lg).max()
    assert len(a_tr) == len(b_tr)
    for x, y in zip(a_tr, b_tr):
        assert list(x) == list(y)
        assert {k: v for k, v in x.items() if k not in TIMES} == {k: v for k, v in y.items() if k not in TIMES}


def test_device_tiers_keep_the_per_layer_step(tiny):
    """Slots, static layers or another miss policy decide per layer and routing: no fused runs."""
    for plan in (Plan(expert_cache=ExpertCache(slots=8, policy="lru")), Plan(placement=Placement(gpu_expert_layers=[1])),
                 Plan(miss_policy=MissPolicy(kind="copy"))):
        r = Runner(plan, tiny, 8)
        r.experts.close()
        assert r.cpu is None or r.cpu.tables is None


def test_cpu_step_taken_when_dense_is_read_in_place_on_the_cpu(tiny):
    """Plans placing the dense path on the GPU fall back to the CPU without CUDA, and take the numpy step
    there; with CUDA they run on it (no numpy step); torch dense weights never take it."""
    import torch
    plans = [Plan(placement=Placement(engram="none")), Plan(expert_cache=ExpertCache(slots=8, policy="lru")),
             Plan(placement=Placement(gpu_expert_layers=[1])), Plan(miss_policy=MissPolicy(kind="copy"))]
    runners = [Runner(p, tiny, 8) for p in plans] + [Runner(Plan(), tiny, 8, dense_inplace=False)]
    try:
        assert [r.cpu is not None for r in runners] == [not torch.cuda.is_available()] * len(plans) + [False]
    finally:
        for r in runners:
            r.experts.close()


@pytest.fixture(scope="module")
def dense(tiny):
    r = Runner(Plan(placement=Placement(dense="cpu", kv="cpu", engram="none")), tiny, 8)
    r.experts.close()
    return r.dense


@settings(max_examples=20, deadline=None)
@given(T=st.integers(1, 9), seed=st.integers(0, 2**31))
def test_serial_and_parallel_products_same_bits(dense, T, seed):
    """kernels._SERIAL_BYTES may move without changing results: both forms give the same bits."""
    rng = np.random.default_rng(seed)
    for lin in (dense.layers[0]["wqkv"], dense.layers[1]["wo"], dense.out):
        args, _ = lin._stack
        x = rng.standard_normal((T, lin.parts[0][3])).astype(np.float32)
        a, b = np.empty((T, lin.rows), np.float32), np.empty((T, lin.rows), np.float32)
        K._parts_serial(*args, x, a)
        K._parts(*args, x, b)
        assert np.array_equal(a, b)


def test_step_records_add_up_to_the_inter_token_latency(tiny):
    """A decode step's host time outside its layers (sampling, bookkeeping) is on its last record as
    t_host_ms, so its records' times add up to its measured inter-token latency; 0 on the others."""
    plan = Plan(placement=Placement(engram="none"))
    r = Runner(plan, tiny, 12)
    try:
        _, times, _ = r.generate(default_prompts(1, 4, r.c.vocab), 6)
    finally:
        r.experts.close()
    L = r.c.n_layers
    dec = [x for x in r.trace if x["phase"] == "decode"]
    steps = [dec[i:i + L] for i in range(0, len(dec), L)]
    assert len(steps) == len(times["itl_s"]) == 5
    for s, itl in zip(steps, times["itl_s"]):
        assert all(x["t_host_ms"] == 0.0 for x in s[:-1]) and s[-1]["t_host_ms"] > 0
        total = sum(x["t_dense_ms"] + x["t_experts_ms"] + x["t_engram_ms"] + x["t_host_ms"] for x in s)
        assert total == pytest.approx(itl * 1e3, rel=1e-9)
