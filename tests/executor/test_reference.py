"""Logits on `tiny` match an independent plain fp32 reference (weights via gguf.dequantize) within 1e-3."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from executor.engram import Engram
from executor.make_model import PRESETS, write_model
from executor.runner import execute
from specs.plan import Plan, Placement

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


def test_logits_match_reference(tiny, reference):
    _check(tiny, reference, Plan(placement=Placement(engram="none")))


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
