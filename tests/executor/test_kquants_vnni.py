"""The int8 build's K-quant and IQ4_XS rows with AVX-512 VNNI (executor/kquants_vnni.py): lanes8's whole blocks at the
K-quant places and their sums, and the rows against gguf's dequantised values times the int8 activations."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from executor import vnni
from executor.kquants_vnni import k_vnni_kernel

from .test_vnni import _kernel_loop

QT = gguf.GGMLQuantizationType
needs_vnni = pytest.mark.skipif(not vnni.HAVE_VNNI512, reason="no AVX-512 VNNI on this CPU")


@settings(max_examples=30, deadline=None)
@given(nb=st.integers(1, 17), scale=st.floats(1e-30, 1e30), seed=st.integers(0, 2**31))
def test_lanes8_writes_each_blocks_x8_at_its_k_quant_places_and_its_sums(qk, nb, scale, seed):
    """lanes8 writes block b's 32 x8 in order, the same x8 as at its split places, into the L8_KQ slots: at block
    (b & ~2)'s, 32 ((b >> 1) & 1) bytes in (blocks 4i and 4i + 2 in one 64-byte slot: sub-blocks 4i and 4i + 2 of a Q4_K
    super-block, one load of its nibbles), and where its four blocks are whole at block (b & ~3) + 2 + ((b >> 1) & 1)'s,
    32 (b & 1) bytes in (blocks 4i, 4i + 1 in one slot: Q6_K's ql); sums8 = dx8 x the block's sum of x8 at
    dx[sums8_at(nb) + b], and the same for its two 16-value runs at dx[sums8_at(nb) + nb + 2 b (+ 1)]."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((1, nb * 32)) * scale).astype(np.float32)
    x[0, :32] *= rng.integers(0, 2)  # sometimes an all-zero block
    _, dx = qk.int8_activations(x)
    d8, s8 = vnni.dx8_at(nb), vnni.sums8_at(nb)
    slots = dx[0, 2 * nb:2 * nb + vnni.SPLIT_FLOATS * nb].view(np.int8).reshape(nb, 4, 64)  # [block, slot, byte]
    for b in range(nb):
        x8 = np.array([slots[b, 0, vnni._split_pos(j)[0]] for j in range(32)], np.int64)
        np.testing.assert_array_equal(slots[b & ~2, vnni.L8_KQ, 32 * ((b >> 1) & 1):][:32], x8)
        if (b | 3) < nb:
            np.testing.assert_array_equal(slots[(b & ~3) + 2 + ((b >> 1) & 1), vnni.L8_KQ, 32 * (b & 1):][:32], x8)
        assert dx[0, s8 + b] == np.float32(np.float32(x8.sum()) * dx[0, d8 + b])
        for r in (0, 1):
            assert dx[0, s8 + nb + 2 * b + r] == np.float32(np.float32(x8[16 * r:16 * r + 16].sum()) * dx[0, d8 + b])


_KERNELS = {(qt, NR, MT): k_vnni_kernel(NR, MT, qt.name.lower()) for qt in (QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.Q3_K, QT.Q2_K, QT.IQ4_XS)
            for NR, MT in ((2, 1), (1, 1), (2, 2), (2, 4))} if vnni.HAVE_VNNI512 else {}


_LOOPS = {shape: _kernel_loop(k, shape[1]) for shape, k in _KERNELS.items()}


@needs_vnni
@settings(max_examples=30, deadline=None)
@given(shape=st.sampled_from(sorted(_LOOPS) or [(QT.Q4_K, 1, 1)]), groups=st.integers(1, 3), nsb=st.integers(1, 4),
       seed=st.integers(0, 2**31))
def test_int8_k_quant_rows_are_the_int8_activations_times_ggufs_values(qk, shape, groups, nsb, seed):
    """The int8 build's K-quant and IQ4_XS rows (2 or 1 rows a token, 4 rows x 2 tokens, 2 rows x 4): each token's result
    is its int8 activations (x8 dx8, lanes8's) times gguf's dequantised rows up to float32 rounding (1e-5 of the terms:
    the sub-blocks' and runs' integer sums are exact), the same bits as the token alone in single rows, and within int8
    precision (llama.cpp's) of the float product."""
    qt, NR, MT = shape
    rng = np.random.default_rng(seed)
    rows, cols = 4 * groups, 256 * nsb
    w = qk.tensor(rng, qt, 1, rows, cols)
    W = qk.deq(w, 0).astype(np.float64)
    x = rng.standard_normal((MT + 1, cols)).astype(np.float32)
    x[-1, 32:64] = 0.0  # an all-zero block: x8 and dx8 0
    x16, dx = qk.int8_activations(x)
    d8 = vnni.dx8_at(cols // 32)
    got = np.full((MT + 1, rows), np.nan, np.float32)
    _LOOPS[shape](w.data[0].reshape(-1), rows, x16, dx, 1, got)  # tokens from k0 = 1
    assert np.isnan(got[0]).all()
    xq = qk.int8_values(x, dx[:, d8:d8 + cols // 32])
    qk.close(got[1:], xq[1:] @ W.T, np.abs(xq[1:]) @ np.abs(W).T, tol=1e-5)
    one = np.full((MT + 1, rows), np.nan, np.float32)
    for k in range(1, MT + 1):
        _LOOPS[(qt, 1, 1)](w.data[0].reshape(-1), rows, x16, dx, k, one)
    assert np.array_equal(got[1:], one[1:])
    qk.close(got[1:], x[1:] @ W.T, np.abs(x[1:]) @ np.abs(W).T, tol=2e-2)
