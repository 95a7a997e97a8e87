"""The executor prefills in the plan's passes (-b chunks in -ub micro-batches), each against the KV cache of the
passes before it: the tokens of one pass, a record per pass and layer."""
from __future__ import annotations

import json

import numpy as np
import pytest

from executor.runner import default_prompts, execute
from specs.plan import ExpertCache, Plan, Prefill

P, G = 40, 6
PASSES = Prefill(strategy="cpu", chunk_tokens=32, ubatch_tokens=16)  # 40 tokens: 16 + 16, then 8


def _records(r):
    return [json.loads(line) for line in open(r["trace"])]


@pytest.mark.parametrize("cache", [None, ExpertCache(slots=64, policy="lru")], ids=["all-cpu", "cache-50%"])
def test_prefill_in_micro_batches_gives_the_one_pass_tokens(tiny, cache):
    """Passes of 16, 16 and 8 tokens (kv_start 0, 16, 32) give the tokens of one 40-token pass, and logits within
    1e-4 of the largest (the fused CPU step, and the general one with a cache)."""
    kw = dict(expert_cache=cache) if cache else {}
    one = execute(Plan(**kw), tiny, P, G, trace_path=tiny.parent / "one.jsonl", keep_logits=True)
    parts = execute(Plan(prefill=PASSES, **kw), tiny, P, G, trace_path=tiny.parent / "parts.jsonl", keep_logits=True)
    assert parts["tokens"] == one["tokens"]
    a, b = np.stack(one["logits"]), np.stack(parts["logits"])
    assert np.abs(a - b).max() < 1e-4 * np.abs(a).max()
    pre = [x for x in _records(parts) if x["phase"] == "prefill"]
    layers = 4  # tiny
    assert [x["tokens"] for x in pre] == [16] * layers + [16] * layers + [8] * layers
    assert [x["kv_start"] for x in pre] == [0] * layers + [16] * layers + [32] * layers
    assert len(_records(parts)) == 3 * layers + (G - 1) * layers


def test_the_prefills_records_add_up_to_the_ttft(tiny):
    """The passes' records (dense, experts, host) add up to the measured TTFT, as one pass's do."""
    r = execute(Plan(prefill=PASSES), tiny, P, G, trace_path=tiny.parent / "ttft.jsonl")
    pre = [x for x in _records(r) if x["phase"] == "prefill"]
    total = sum(x["t_dense_ms"] + x["t_experts_ms"] + x["t_engram_ms"] + x["t_host_ms"] for x in pre)
    assert total == pytest.approx(r["ttft_s"] * 1e3, rel=1e-6)


def test_streams_prefilled_side_by_side_in_passes_match_alone(tiny):
    """4 streams under -ub 16: 4 tokens of each a pass (16 in all), 10 passes of a 40-token prompt; each stream's
    tokens are those it gives alone in one pass."""
    prompts = default_prompts(4, P, 512, seed=5)
    together = execute(Plan(streams=4, prefill=PASSES), tiny, P, G, trace_path=tiny.parent / "s4p.jsonl",
                       prompts=prompts)
    pre = [x for x in _records(together) if x["phase"] == "prefill"]
    assert len(pre) == 10 * 4 and all(x["tokens"] == 16 for x in pre)
    for s in range(4):
        alone = execute(Plan(), tiny, P, G, trace_path=tiny.parent / "s1p.jsonl", prompts=prompts[s:s + 1])
        assert together["tokens"][s] == alone["tokens"][0]


@pytest.mark.parametrize("cache", [None, ExpertCache(slots=64, policy="lru")], ids=["all-cpu", "cache-50%"])
def test_the_output_head_runs_on_each_chunks_last_pass_only(tiny, cache):
    """llama.cpp computes logits for the last token of each llama_decode call, a -b chunk, so in its last micro-batch
    only (the simulator's `outputs`): 40 tokens in passes of 16, 16 | 8 run the head twice, then once a decode step
    (the real head, its calls counted), on the fused CPU step and on the general one."""
    from executor.runner import Runner
    kw = dict(expert_cache=cache) if cache else {}
    r = Runner(Plan(prefill=PASSES, **kw), tiny, P + G)
    try:
        calls = []
        for name in ("head", "head_np"):
            real = getattr(r.dense, name)
            setattr(r.dense, name, lambda x, real=real, name=name: calls.append(name) or real(x))
        r.generate(default_prompts(1, P, r.c.vocab, seed=3), G)
        assert len(calls) == 2 + (G - 1)
    finally:
        r.experts.close()
