"""device_step: decode as static-shape calls (CUDA graphs on CUDA; here the same calls, eagerly, on the
CPU torch path) gives the tokens and logits of the eager per-op step, on every tier."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from calibration.local import device_check_plans
from executor.device_step import resident_experts
from executor.runner import Runner, default_prompts
from specs.plan import ExpertCache, Placement, Plan

PLANS = device_check_plans(4, 32)  # tiny: 4 layers x 32 experts
P, G = 6, 6


def _decode(tiny, plan, static: bool, prompts):
    r = Runner(plan, tiny, P + G, dense_inplace=False, static_decode=static)
    try:
        assert (r.static is not None) == static and r.cpu is None
        assert r.decode_path() == ("eager" if not static else "cuda-graphs" if r.device.type == "cuda" else "static")
        toks, _, logits = r.generate(prompts, G, keep_logits=True)
        return toks, np.stack(logits), r.trace
    finally:
        r.experts.close()


@pytest.mark.parametrize("name", [n for n in PLANS if n != "cpu-only"])
def test_static_decode_matches_eager_step(tiny, name):
    """Every device_check plan (dense on the device with CPU experts, 25% cache + auction, 100% cache,
    copied misses, static split): the static calls give the eager step's tokens, logits within 1e-4
    (attention over the whole cache under a mask, resident experts summed in routing order; a CPU
    expert kernel's int16 activations turn a last-bit difference into up to 1.53e-5 of a block), and the
    same hits and misses in the trace."""
    prompts = default_prompts(1, P, 512)
    t0, l0, tr0 = _decode(tiny, PLANS[name], False, prompts)
    t1, l1, tr1 = _decode(tiny, PLANS[name], True, prompts)
    assert (t0 == t1).all()
    assert np.abs(l0 - l1).max() / np.abs(l0).max() < 1e-4
    key = lambda tr: [(x["layer"], x["hits"], x["misses"], x["cpu"], x["pcie"]) for x in tr]  # noqa: E731
    assert key(tr0) == key(tr1)


def test_static_decode_four_streams(tiny):
    """Four streams decoded together through the static calls give the eager step's tokens."""
    plan = Plan(streams=4, placement=Placement(engram="none"), expert_cache=ExpertCache(slots=40, policy="lru"))
    prompts = default_prompts(4, P, 512, seed=3)
    t0, l0, _ = _decode(tiny, plan, False, prompts)
    t1, l1, _ = _decode(tiny, plan, True, prompts)
    assert (t0 == t1).all() and np.abs(l0 - l1).max() / np.abs(l0).max() < 1e-4


def test_static_decode_with_engram(tiny):
    """The Engram rows are added to the static residual stream in place: the eager step's tokens."""
    plan = Plan(expert_cache=ExpertCache(slots=32, policy="lru"))
    prompts = default_prompts(1, P, 512, seed=4)
    t0, l0, _ = _decode(tiny, plan, False, prompts)
    t1, l1, _ = _decode(tiny, plan, True, prompts)
    assert (t0 == t1).all() and np.abs(l0 - l1).max() / np.abs(l0).max() < 1e-4


def test_slot_map_follows_the_cache(tiny):
    """Experts.slot_map holds each (layer, expert)'s slot, -1 where not resident, after fills,
    swaps and a release."""
    plan = PLANS["gpu-cache-25%+auction"]
    r = Runner(plan, tiny, P + G, dense_inplace=False, static_decode=True)
    try:
        ex = r.experts

        def check():
            want = torch.full_like(ex.slot_map, -1)
            for (layer, e), s in ex.slot.items():
                want[layer, e] = s
            assert torch.equal(ex.slot_map, want)
        r.generate(default_prompts(1, P, 512), G)
        assert ex.slot
        check()
        ex.release()
        check()
    finally:
        r.experts.close()


def test_resident_experts_match_one_by_one(tiny):
    """resident_experts (gathered slots, batched) equals the resident experts run one by one, and adds
    nothing for pairs not resident, even where the slot they read (0) is empty and holds NaN."""
    plan = Plan(placement=Placement(engram="none"),
                expert_cache=ExpertCache(slots=100, policy="static", release_during_prefill=False))
    r = Runner(plan, tiny, P + G, dense_inplace=False, static_decode=True)
    try:
        r.generate(default_prompts(1, P, 512), 3)
        ex, c = r.experts, r.c
        (l0, e0), = [le for le, s in ex.slot.items() if s == 0]  # pairs not resident read slot 0: empty it
        ex.apply([(l0, -1, e0)])
        ex.slot_g[0] = float("nan")
        rng = np.random.default_rng(0)
        layer = next(iter(ex.slot))[0]
        dev = ex.slot_g.device
        h = torch.from_numpy(rng.standard_normal((3, c.hidden)).astype(np.float32)).to(dev)
        ids = np.stack([rng.choice(c.n_experts, c.top_k, replace=False) for _ in range(3)])
        w = rng.random(ids.shape).astype(np.float32)
        got = resident_experts(ex, layer, h, torch.from_numpy(w).to(dev), torch.from_numpy(ids).to(dev))
        want = torch.zeros_like(h)
        for t in range(3):
            for j, e in enumerate(ids[t]):
                s = ex.slot.get((layer, int(e)))
                if s is not None:
                    g, u, d = ex.slot_g[s], ex.slot_u[s], ex.slot_d[s]
                    want[t] += (torch.nn.functional.silu(g @ h[t]) * (u @ h[t])) @ d.T * float(w[t, j])
        assert torch.isfinite(got).all()
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
    finally:
        r.experts.close()
