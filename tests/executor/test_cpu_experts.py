"""The routed SwiGLU experts on the CPU (executor/cpu_experts.py) match dequantise-then-matmul
(gguf.dequantize), over shapes, types and thread counts; the job's structure follows its balance."""
from __future__ import annotations

import gguf
import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from executor import cpu_experts as CE
from executor import kernels as K

QT = gguf.GGMLQuantizationType
TYPES = [QT.Q8_0, QT.Q4_0, QT.F16]


@settings(max_examples=40, deadline=None)
@given(types=st.tuples(*[st.sampled_from(TYPES)] * 3), H32=st.integers(1, 6), F32=st.integers(1, 6),
       T=st.integers(1, 24), k=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_moe_matches_dequantised(qk, types, H32, F32, T, k, seed):
    rng = np.random.default_rng(seed)
    E, H, F = 6, H32 * 32, F32 * 32
    g, u = qk.tensor(rng, types[0], E, F, H), qk.tensor(rng, types[1], E, F, H)
    d = qk.tensor(rng, types[2], E, H, F)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)])
    wts = rng.random((T, k)).astype(np.float32)
    got = CE.moe_cpu(g, u, d, x, *CE.csr(ids, wts))
    want = np.zeros((T, H), np.float32)
    mag = np.zeros((T, H), np.float32)
    for t in range(T):
        for e, we in zip(ids[t], wts[t]):
            a = qk.deq(g, e) @ x[t]
            act = a / (1 + np.exp(-a)) * (qk.deq(u, e) @ x[t])
            want[t] += we * (qk.deq(d, e) @ act)
            mag[t] += we * (np.abs(qk.deq(d, e)) @ np.abs(act))
    qk.close(got, want, mag + np.abs(want).max(axis=1, keepdims=True), tol=2e-4)


def _all_to_all_job(qk, types, E, H, F, T, seed):
    """T tokens each routed to all E synthetic experts of `types` (gate, up, down) -> (g, u, d, x, routing, out, sum of
    |terms|), the expected output in float from gguf.dequantize."""
    rng = np.random.default_rng(seed)
    g, u = qk.tensor(rng, types[0], E, F, H), qk.tensor(rng, types[1], E, F, H)
    d = qk.tensor(rng, types[2], E, H, F)
    x = rng.standard_normal((T, H)).astype(np.float32)
    wts = rng.random((T, E)).astype(np.float32)
    want = np.zeros((T, H), np.float32)
    mag = np.zeros_like(want)
    for e in range(E):
        a = x @ qk.deq(g, e).T
        act = a / (1 + np.exp(-a)) * (x @ qk.deq(u, e).T)
        want += wts[:, e:e + 1] * (act @ qk.deq(d, e).T)
        mag += wts[:, e:e + 1] * (np.abs(act) @ np.abs(qk.deq(d, e)).T)
    return g, u, d, x, CE.csr(np.tile(np.arange(E), (T, 1)), wts), want, mag + np.abs(want).max(axis=1, keepdims=True)


@pytest.mark.parametrize("types", [(QT.Q4_0, QT.Q4_0, QT.Q8_0), (QT.Q4_K, QT.Q4_K, QT.Q6_K), (QT.Q5_K, QT.Q5_K, QT.Q6_K),
                                   (QT.Q3_K, QT.Q3_K, QT.Q5_K),
                                   (QT.Q2_K, QT.Q2_K, QT.Q3_K), (QT.IQ4_XS, QT.IQ4_XS, QT.IQ4_NL)],
                         ids=["Q4_0", "Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "IQ4"])
def test_prefill_sized_job_takes_the_gemm_and_matches_dequantised(qk, types):
    """60 tokens, each routed to all 3 experts: 60 tokens an expert, over gemm.GEMM_TOKENS, so gate, up and down
    run the packed-panel GEMM in few large items; the parallel and the serial kernel match dequantise-then-matmul."""
    assert 60 >= K.GEMM_TOKENS
    g, u, d, x, routing, want, mag = _all_to_all_job(qk, types, 3, 512, 256, 60, 7)
    for fn, nthr in ((CE._moe, 2), (CE._moe_serial, 1)):
        qk.close(_moe_direct(fn, g, u, d, x, routing, nthr, False), want, mag, tol=2e-4)


@pytest.mark.parametrize("types", [(QT.Q4_K, QT.Q4_K, QT.Q6_K), (QT.F16, QT.Q8_0, QT.Q4_0), (QT.IQ4_XS, QT.F16, QT.Q2_K)],
                         ids=["Q4_K_M", "F16-gate", "F16-up"])
def test_experts_past_the_fused_rows_match_dequantised_on_every_path(qk, types):
    """8 tokens an expert, past every type's _FUSED with VNNI (4-7: the integer GEMM) and under gemm.GEMM_TOKENS: whole
    experts per thread (each packs its own panels, from its tokens' int16 rows), rows split across threads (one
    packing a job) and the serial kernel all match dequantise-then-matmul; where gate or up is F16 the pair's panels
    are float ones (kernels.int_panels) and the quantised matrix reads them through the float GEMM."""
    g, u, d, x, routing, want, mag = _all_to_all_job(qk, types, 4, 512, 256, 8, 11)
    for fn, nthr, whole in ((CE._moe, 2, True), (CE._moe, 2, False), (CE._moe_serial, 1, False)):
        qk.close(_moe_direct(fn, g, u, d, x, routing, nthr, whole), want, mag, tol=2e-4)


def test_moe_subset_of_experts(qk):
    """csr(keep=...) computes only the kept experts (the CPU tier's share of a layer)."""
    rng = np.random.default_rng(1)
    g, u, d = (qk.tensor(rng, QT.Q8_0, 5, 64, 64) for _ in range(3))
    x = rng.standard_normal((2, 64)).astype(np.float32)
    ids, wts = np.array([[0, 1], [1, 2]]), np.ones((2, 2), np.float32)
    full = CE.moe_cpu(g, u, d, x, *CE.csr(ids, wts))
    part = CE.moe_cpu(g, u, d, x, *CE.csr(ids, wts, keep=lambda e: e != 1))
    rest = CE.moe_cpu(g, u, d, x, *CE.csr(ids, wts, keep=lambda e: e == 1))
    np.testing.assert_allclose(part + rest, full, rtol=1e-5, atol=1e-6)


def _moe_direct(fn, g, u, d, x, routing, nthr, whole):
    experts, offs, tok, wts = routing
    out = np.zeros((x.shape[0], d.rows), np.float32)
    act = np.empty((max(1, tok.shape[0]), g.rows), np.float32)
    fn(K.flat(g), g.code, K.flat(u), u.code, K.flat(d), d.code, g.rows, d.rows, x, experts, offs, tok, wts, act,
       out, nthr, whole)
    return out


@settings(max_examples=25, deadline=None)
@given(types=st.tuples(*[st.sampled_from(TYPES)] * 3), H32=st.integers(1, 6), F32=st.integers(1, 6),
       T=st.integers(1, 3), k=st.integers(1, 6), nthr=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_parallel_moe_paths_match_serial(qk, types, H32, F32, T, k, nthr, seed):
    """The parallel kernel gives the serial kernel's output on both of its paths: whole experts per
    thread (any nthr, balanced or not) and each matrix's rows split across the threads."""
    rng = np.random.default_rng(seed)
    E, H, F = 8, H32 * 32, F32 * 32
    g, u = qk.tensor(rng, types[0], E, F, H), qk.tensor(rng, types[1], E, F, H)
    d = qk.tensor(rng, types[2], E, H, F)
    x = rng.standard_normal((T, H)).astype(np.float32)
    routing = CE.csr(np.stack([rng.choice(E, k, replace=False) for _ in range(T)]),
                    rng.random((T, k)).astype(np.float32))
    want = _moe_direct(CE._moe_serial, g, u, d, x, routing, 1, False)
    for whole in (True, False):
        got = _moe_direct(CE._moe, g, u, d, x, routing, nthr, whole)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_whole_experts_per_thread_when_the_job_balances():
    """A CPU job runs whole experts per thread (the executor's decode) when, tokens as the load and
    most tokens first onto the least loaded thread, the busiest thread has at most 1.1x the mean and
    no expert has more than 8 tokens: one token's top-8 on 2 threads does (4 / 4); 3 experts on 2
    threads do not (2 / 1: rows split); nor do 16-token prefill experts."""
    assert list(CE.thread_loads([1] * 8, 2)) == [4, 4] and CE.whole_experts_per_thread([1] * 8, 2)
    assert sorted(CE.thread_loads([1] * 3, 2)) == [1, 2] and not CE.whole_experts_per_thread([1] * 3, 2)
    assert CE.whole_experts_per_thread([2, 1, 1], 2)  # 2 / 2
    assert not CE.whole_experts_per_thread([16] * 4, 2)
    assert CE.whole_experts_per_thread([1], 1) and not CE.whole_experts_per_thread([], 2)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), threads=st.integers(1, 8))
def test_decode_kernel_choice_agrees_with_whole_experts_per_thread(n, threads):
    """moe_kernel decides a decode job (one token an expert) from offs alone, without numpy; it picks
    whole experts per thread exactly when whole_experts_per_thread does on the same counts."""
    offs = np.arange(n + 1, dtype=np.int32)
    with_threads = min(threads, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(with_threads)
    try:
        _, nthr, whole = CE.moe_kernel(n, K._SERIAL_BYTES, offs)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert whole == CE.whole_experts_per_thread([1] * n, nthr)


@settings(max_examples=80, deadline=None)
@given(counts=st.lists(st.integers(1, 12), min_size=1, max_size=24), threads=st.integers(1, 8))
def test_routed_kernel_choice_agrees_with_whole_experts_per_thread(counts, threads):
    """moe_routed's choice in numba (_whole) is whole_experts_per_thread's on any tokens per expert."""
    offs = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    assert CE._whole(offs, threads) == CE.whole_experts_per_thread(counts, threads)


@settings(max_examples=25, deadline=None)
@given(types=st.tuples(*[st.sampled_from(TYPES)] * 3), T=st.integers(1, 12), k=st.integers(1, 4),
       serial=st.sampled_from([0, 1 << 40]), seed=st.integers(0, 2**31))
def test_moe_routed_matches_moe_cpu(qk, types, T, k, serial, seed):
    """One call (CSR, kernel choice, experts) gives moe_cpu's output on the same routing, on the
    parallel path (serial_bytes 0) and the serial one, kept experts only where keep says so."""
    rng = np.random.default_rng(seed)
    E, H, F = 8, 64, 96
    g, u = qk.tensor(rng, types[0], E, F, H), qk.tensor(rng, types[1], E, F, H)
    d = qk.tensor(rng, types[2], E, H, F)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int64)
    wts = rng.random((T, k)).astype(np.float32)
    keep = rng.random(E) < 0.7
    want = CE.moe_cpu(g, u, d, x, *CE.csr(ids, wts, keep), serial_bytes=serial)
    got = np.zeros((T, H), np.float32)
    act = np.empty((T * k, F), np.float32)
    run = CE.moe_routed(K.flat(g), g.code, K.flat(u), u.code, K.flat(d), d.code, F, H, x, ids, wts, keep, act, got,
                        g.expert_bytes + u.expert_bytes + d.expert_bytes, serial, numba.get_num_threads(), False,
                        got[:0])
    assert sorted(run.tolist()) == sorted(set(ids[:, :][keep[ids]].tolist()))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


@settings(max_examples=15, deadline=None)
@given(types=st.tuples(*[st.sampled_from(TYPES)] * 3), T=st.integers(1, 6), serial=st.sampled_from([0, 1 << 40]),
       seed=st.integers(0, 2**31))
def test_moe_routed_fresh_and_resid_are_the_callers_fill_and_add(qk, types, T, serial, seed):
    """fresh=True, resid=x (the CPU step's call) leaves the bits that zeroing `out` first and adding it to x
    afterwards in numpy leave (Experts._forward_cpu's and the general step's way), in both."""
    rng = np.random.default_rng(seed)
    E, H, F, k = 8, 64, 96, 2
    g, u = qk.tensor(rng, types[0], E, F, H), qk.tensor(rng, types[1], E, F, H)
    d = qk.tensor(rng, types[2], E, H, F)
    h = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)]).astype(np.int64)
    wts = rng.random((T, k)).astype(np.float32)
    keep = np.ones(E, bool)
    args = (K.flat(g), g.code, K.flat(u), u.code, K.flat(d), d.code, F, H, h, ids, wts, keep,
            np.empty((T * k, F), np.float32))
    eb = g.expert_bytes + u.expert_bytes + d.expert_bytes
    x0 = rng.standard_normal((T, H)).astype(np.float32)
    y = np.zeros((T, H), np.float32)
    CE.moe_routed(*args, y, eb, serial, numba.get_num_threads(), False, y[:0])
    want = x0 + y
    x, junk = x0.copy(), np.full((T, H), 7.0, np.float32)
    CE.moe_routed(*args, junk, eb, serial, numba.get_num_threads(), True, x)
    assert np.array_equal(junk.view(np.uint32), y.view(np.uint32))
    assert np.array_equal(x.view(np.uint32), want.view(np.uint32))


def test_moe_prep_gathers_float_rows_only_where_a_product_reads_them():
    """_moe_prep: with floats (some product reads float rows: F16, the float GEMM) xg holds each CSR entry's token;
    without (integer panels and fused int16 rows only: a 4 MB copy at 64 tokens of `small`) xg is not written and
    the int16 rows, scales, tokens per expert and the tokens' own int16 rows are the same."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((12, 128)).astype(np.float32)
    ids = np.stack([rng.choice(6, 3, replace=False) for _ in range(12)])
    experts, offs, tok, _ = CE.csr(ids, np.ones((12, 3), np.float32))
    fused = int(np.median(offs[1:] - offs[:-1]))  # experts on both sides of it
    full = CE._moe_prep(x, experts, offs, tok, fused, True)
    lean = CE._moe_prep(x, experts, offs, tok, fused, False)
    np.testing.assert_array_equal(full[0], x[tok])
    for i in range(experts.shape[0]):
        if offs[i + 1] - offs[i] <= fused:
            s = slice(offs[i], offs[i + 1])
            np.testing.assert_array_equal(full[1][s], lean[1][s])
            np.testing.assert_array_equal(full[2][s], lean[2][s])
            np.testing.assert_array_equal(full[1][s], full[4][tok[s]])
    assert full[3] == lean[3] == (offs[1:] - offs[:-1]).max()
    for j in (4, 5):
        np.testing.assert_array_equal(full[j], lean[j])
