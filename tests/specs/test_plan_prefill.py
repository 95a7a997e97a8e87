"""A plan's prefill passes: the executor runs the prompt in the passes the simulator prices."""
from __future__ import annotations

from hypothesis import given, strategies as st

from specs.plan import Prefill, chunks, ubatches


@given(prompt=st.integers(1, 5000), chunk=st.integers(1, 3000), ub=st.integers(1, 3000),
       strategy=st.sampled_from(["op-offload", "stream-all", "cpu"]))
def test_one_streams_passes_are_the_simulators_chunks_and_ubatches(prompt, chunk, ub, strategy):
    """Prefill.passes(prompt) = simulator.prefill's jobs for one stream: -b chunks, each in -ub micro-batches
    (stream-all: whole chunks)."""
    ub = min(ub, chunk)
    pf = Prefill(strategy=strategy, chunk_tokens=chunk, ubatch_tokens=ub)
    want = [u for c in chunks(prompt, chunk) for u in (ubatches(c, ub) if strategy != "stream-all" else [c])]
    assert pf.passes(prompt) == want
    assert sum(pf.passes(prompt)) == prompt


@given(prompt=st.integers(1, 5000), chunk=st.integers(1, 3000), ub=st.integers(1, 3000),
       strategy=st.sampled_from(["op-offload", "stream-all", "cpu"]), streams=st.integers(1, 4))
def test_a_pass_outputs_logits_where_a_chunk_ends(prompt, chunk, ub, strategy, streams):
    """passes_with_outputs: outputs exactly on each chunk's last micro-batch (llama_decode outputs a batch's last
    token), so once a chunk and always on the prompt's last pass; its tokens are passes()'."""
    ub = min(ub, chunk)
    pf = Prefill(strategy=strategy, chunk_tokens=chunk, ubatch_tokens=ub)
    got = pf.passes_with_outputs(prompt, streams)
    assert [n for n, _ in got] == pf.passes(prompt, streams)
    assert got[-1][1] and sum(o for _, o in got) == len(chunks(prompt, max(1, chunk // streams)))
    ends, a = set(), 0
    for c in chunks(prompt, max(1, chunk // streams)):
        a += c
        ends.add(a)
    done = 0
    for n, outputs in got:
        done += n
        assert outputs == (done in ends)


def test_streams_side_by_side_share_a_pass():
    """4 streams under -ub 512: 128 tokens of each a pass (512 in all); -ub 2 still takes one token of each."""
    assert Prefill(strategy="cpu").passes(300, 4) == [128, 128, 44]
    assert Prefill(strategy="cpu", chunk_tokens=2, ubatch_tokens=2).passes(3, 4) == [1, 1, 1]


def test_the_default_plan_prefills_a_512_token_prompt_in_one_pass():
    """llama.cpp's defaults (-b 2048, -ub 512): 512 tokens one pass, 2,000 four passes (512 x 3 + 464)."""
    assert Prefill().passes(512) == [512]
    assert Prefill().passes(2000) == [512, 512, 512, 464]
