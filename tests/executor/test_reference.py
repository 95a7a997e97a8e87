"""Logits on `tiny` match an independent plain fp32 reference (weights via gguf.dequantize) within 1e-3."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from executor.engram import Engram
from executor.make_model import PRESETS, write_model
from executor.runner import execute
from specs.plan import MissPolicy, Placement, Plan

P, G = 6, 5


def _check(path, reference, plan, engram=None):
    r = execute(plan, path, P, G, trace_path=path.parent / "ref.jsonl", keep_logits=True)
    toks = r["tokens"][0]
    prompt = list(np.random.default_rng(0).integers(0, 510, P))
    ref = reference(path, prompt + toks[:-1], engram=engram)  # [P + G - 1, V]
    got = np.stack([lg[0] for lg in r["logits"]])  # [G, V] at positions P-1 .. P+G-2
    want = ref[P - 1:]
    rel = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    assert rel.max() < 1e-3, rel
    assert toks == [int(t) for t in want.argmax(-1)]
    return rel.max()


@pytest.mark.parametrize("plan", [
    Plan(placement=Placement(engram="none")),  # all experts on the CPU (numba, in place)
    Plan(placement=Placement(engram="none", gpu_expert_layers=[0, 1, 2, 3])),  # all on the device (torch)
    Plan(placement=Placement(engram="none"), miss_policy=MissPolicy(kind="copy")),  # copied per use
], ids=["cpu-tier", "device-tier", "pcie-copy"])
def test_logits_match_reference(tiny, reference, plan):
    _check(tiny, reference, plan)


def test_logits_match_reference_with_engram(tiny, reference, engram_of):
    eg = Engram(engram_of(tiny), 256)
    _check(tiny, reference, Plan(), engram=eg)
    # and the Engram rows really change the result
    a = execute(Plan(), tiny, P, 2, trace_path=tiny.parent / "e1.jsonl", keep_logits=True)["logits"][0]
    b = execute(Plan(placement=Placement(engram="none")), tiny, P, 2, trace_path=tiny.parent / "e2.jsonl",
                keep_logits=True)["logits"][0]
    assert np.abs(a - b).max() > 1e-3


def test_mixtral_style_llama_arch(tmp_path, reference):
    p = replace(PRESETS["tiny"], arch="llama", n_layers=2)
    path = write_model(p, tmp_path / "mixtral.gguf", seed=3)
    _check(path, reference, Plan(placement=Placement(engram="none")))


@pytest.mark.parametrize("plan", [
    Plan(placement=Placement(engram="none")),
    Plan(placement=Placement(engram="none", gpu_expert_layers=[0, 1, 2, 3])),
], ids=["cpu-tier", "device-tier"])
@pytest.mark.parametrize("preset", ["tiny-k", "tiny-k5", "tiny-k3", "tiny-iq4"])
def test_k_quant_experts_match_reference(tmp_path_factory, reference, plan, preset):
    """A model whose experts are llama.cpp's Q4_K_M types (Q4_K, Q6_K, and mixed with Q8_0: PRESETS["tiny-k"]) or its
    Q5_K_M ones (Q5_K, Q6_K, and mixed with Q4_K and Q8_0: "tiny-k5"), Q3_K and Q2_K beside Q4_K, Q5_K and Q8_0
    ("tiny-k3"), or IQ4_XS and IQ4_NL beside Q4_K and Q8_0 ("tiny-iq4") gives the reference's logits within 1e-3 on
    the CPU kernels (dequantised in place) and the device tier."""
    path = tmp_path_factory.getbasetemp() / f"{preset}.gguf"
    if not path.exists():
        write_model(PRESETS[preset], path, seed=5)
    _check(path, reference, plan)


def test_dense_torch_path_matches_inplace(tiny):
    """The torch dense path (CUDA's, weights dequantised) gives the logits of the in-place CPU path."""
    from executor.runner import Runner, default_prompts
    plan = Plan(placement=Placement(engram="none"))
    out = []
    for inplace in (True, False):
        r = Runner(plan, tiny, 16, dense_inplace=inplace)
        toks, _, logits = r.generate(default_prompts(1, 6, 512), 4, keep_logits=True)
        r.experts.close()
        out.append((toks, np.stack(logits)))
    assert (out[0][0] == out[1][0]).all()
    assert np.abs(out[0][1] - out[1][1]).max() / np.abs(out[1][1]).max() < 1e-4


def test_logits_match_reference_longer_prompts(tiny, reference):
    """Longer prompts (prefill with more than 8 tokens per expert): the CPU tier still matches."""
    from executor.runner import default_prompts
    for seed in (100, 101, 102):
        prompts = default_prompts(1, 16, 512, seed=seed)
        r = execute(Plan(placement=Placement(engram="none")), tiny, 16, 4, trace_path=tiny.parent / "long.jsonl",
                    keep_logits=True, prompts=prompts)
        want = reference(tiny, list(prompts[0]) + r["tokens"][0][:-1])[15:]
        got = np.stack([lg[0] for lg in r["logits"]])
        assert (np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)).max() < 1e-3
