"""Every numba kernel matches dequantise-then-matmul (gguf.dequantize), over shapes and types."""
from __future__ import annotations

import gguf
import numpy as np
from hypothesis import given, settings, strategies as st

from executor import kernels as K
from executor.gguf_model import EXPERT_TYPES, ExpertTensor
from executor.make_model import _rand_tensor

QT = gguf.GGMLQuantizationType
TYPES = [QT.Q8_0, QT.Q4_0, QT.F16]


def _tensor(rng, qt, E, rows, cols) -> ExpertTensor:
    raw = _rand_tensor(rng, (E, rows, cols), qt, cols ** -0.5)
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(E, rows, -1)
    return ExpertTensor(data=data, qtype=qt, code=EXPERT_TYPES[qt], rows=rows, cols=cols)


def _deq(w: ExpertTensor, e: int) -> np.ndarray:
    raw = w.data[e] if w.qtype != QT.F16 else w.data[e].view(np.float16)
    return gguf.dequantize(raw, w.qtype).astype(np.float32).reshape(w.rows, w.cols)


def _close(got, want, mag, tol=1e-4):
    """|got - want| <= tol * mag elementwise, mag = the sum of |terms| (the one-token Q8_0/Q4_0 path
    quantises activations to int16 per 32-block, <= 1.5e-5 of the block's largest value, so the
    error scales with the terms, not with a result that cancels)."""
    err = np.abs(got - want) / (mag + 1e-30)
    assert err.max() < tol, err.max()


@settings(max_examples=60, deadline=None)
@given(qt=st.sampled_from(TYPES), rows=st.integers(1, 70), nb=st.integers(1, 12),
       T=st.integers(1, 20), seed=st.integers(0, 2**31))
def test_matmul_matches_dequantised(qt, rows, nb, T, seed):
    rng = np.random.default_rng(seed)
    w = _tensor(rng, qt, 3, rows, nb * 32)
    x = rng.standard_normal((T, nb * 32)).astype(np.float32)
    got = K.expert_matmul(w, 1, x)
    W = _deq(w, 1)
    want = x @ W.T
    _close(got, want, np.abs(x) @ np.abs(W).T)


@settings(max_examples=40, deadline=None)
@given(types=st.tuples(*[st.sampled_from(TYPES)] * 3), H32=st.integers(1, 6), F32=st.integers(1, 6),
       T=st.integers(1, 24), k=st.integers(1, 4), seed=st.integers(0, 2**31))
def test_moe_matches_dequantised(types, H32, F32, T, k, seed):
    rng = np.random.default_rng(seed)
    E, H, F = 6, H32 * 32, F32 * 32
    g, u = _tensor(rng, types[0], E, F, H), _tensor(rng, types[1], E, F, H)
    d = _tensor(rng, types[2], E, H, F)
    x = rng.standard_normal((T, H)).astype(np.float32)
    ids = np.stack([rng.choice(E, k, replace=False) for _ in range(T)])
    wts = rng.random((T, k)).astype(np.float32)
    got = K.moe_cpu(g, u, d, x, *K.csr(ids, wts))
    want = np.zeros((T, H), np.float32)
    mag = np.zeros((T, H), np.float32)
    for t in range(T):
        for e, we in zip(ids[t], wts[t]):
            a = _deq(g, e) @ x[t]
            act = a / (1 + np.exp(-a)) * (_deq(u, e) @ x[t])
            want[t] += we * (_deq(d, e) @ act)
            mag[t] += we * (np.abs(_deq(d, e)) @ np.abs(act))
    _close(got, want, mag + np.abs(want).max(axis=1, keepdims=True), tol=2e-4)


def test_moe_subset_of_experts():
    """csr(keep=...) computes only the kept experts (the CPU tier's share of a layer)."""
    rng = np.random.default_rng(1)
    g, u, d = (_tensor(rng, QT.Q8_0, 5, 64, 64) for _ in range(3))
    x = rng.standard_normal((2, 64)).astype(np.float32)
    ids, wts = np.array([[0, 1], [1, 2]]), np.ones((2, 2), np.float32)
    full = K.moe_cpu(g, u, d, x, *K.csr(ids, wts))
    part = K.moe_cpu(g, u, d, x, *K.csr(ids, wts, keep=lambda e: e != 1))
    rest = K.moe_cpu(g, u, d, x, *K.csr(ids, wts, keep=lambda e: e == 1))
    np.testing.assert_allclose(part + rest, full, rtol=1e-5, atol=1e-6)


def test_fp16_special_values_exact():
    """F16 decoding is exact for subnormals, zeros, signs and the largest finite value."""
    vals = np.array([0.0, -0.0, 6e-8, -6e-8, 1e-5, 65504.0, -2.5, 1.0] * 4, np.float16)
    w = ExpertTensor(data=vals.view(np.uint8).reshape(1, 1, -1).copy(), qtype=QT.F16, code=K.F16, rows=1, cols=32)
    x = np.zeros((1, 32), np.float32)
    for j in range(32):
        x[:] = 0
        x[0, j] = 1
        assert K.expert_matmul(w, 0, x)[0, 0] == np.float32(vals[j])


def test_kernels_read_in_place(tiny):
    """Expert tensors are views of the file mapping, not copies."""
    from executor.gguf_model import GGUFModel
    m = GGUFModel(tiny)
    w = m.experts(0, "gate")
    base = w.data
    while base.base is not None and not isinstance(base, np.memmap):
        base = base.base
    assert isinstance(base, np.memmap) or np.shares_memory(w.data, m.reader.data)
    assert not w.data.flags.owndata


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
def test_parallel_moe_paths_match_serial(types, H32, F32, T, k, nthr, seed):
    """The parallel kernel gives the serial kernel's output on both of its paths: whole experts per
    thread (any nthr, balanced or not) and each matrix's rows split across the threads."""
    rng = np.random.default_rng(seed)
    E, H, F = 8, H32 * 32, F32 * 32
    g, u = _tensor(rng, types[0], E, F, H), _tensor(rng, types[1], E, F, H)
    d = _tensor(rng, types[2], E, H, F)
    x = rng.standard_normal((T, H)).astype(np.float32)
    routing = K.csr(np.stack([rng.choice(E, k, replace=False) for _ in range(T)]),
                    rng.random((T, k)).astype(np.float32))
    want = _moe_direct(K._moe_serial, g, u, d, x, routing, 1, False)
    for whole in (True, False):
        got = _moe_direct(K._moe, g, u, d, x, routing, nthr, whole)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_whole_experts_per_thread_when_the_job_balances():
    """A CPU job runs whole experts per thread (the executor's decode) when, tokens as the load and
    most tokens first onto the least loaded thread, the busiest thread has at most 1.1x the mean and
    no expert has more than 8 tokens: one token's top-8 on 2 threads does (4 / 4); 3 experts on 2
    threads do not (2 / 1: rows split); nor do 16-token prefill experts."""
    assert list(K.thread_loads([1] * 8, 2)) == [4, 4] and K.whole_experts_per_thread([1] * 8, 2)
    assert sorted(K.thread_loads([1] * 3, 2)) == [1, 2] and not K.whole_experts_per_thread([1] * 3, 2)
    assert K.whole_experts_per_thread([2, 1, 1], 2)  # 2 / 2
    assert not K.whole_experts_per_thread([16] * 4, 2)
    assert K.whole_experts_per_thread([1], 1) and not K.whole_experts_per_thread([], 2)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), threads=st.integers(1, 8))
def test_decode_kernel_choice_agrees_with_whole_experts_per_thread(n, threads):
    """moe_kernel decides a decode job (one token an expert) from offs alone, without numpy; it picks
    whole experts per thread exactly when whole_experts_per_thread does on the same counts."""
    import numba
    offs = np.arange(n + 1, dtype=np.int32)
    with_threads = min(threads, numba.config.NUMBA_NUM_THREADS)
    numba.set_num_threads(with_threads)
    try:
        _, nthr, whole = K.moe_kernel(n, K._SERIAL_BYTES, offs)
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert whole == K.whole_experts_per_thread([1] * n, nthr)
