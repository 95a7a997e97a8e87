"""The numba matrix kernels (executor/kernels.py) match dequantise-then-matmul (gguf.dequantize),
over shapes and types."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import njit

from executor import kernels as K
from executor import row_products as RP
from executor import simd
from executor.gguf_model import EXPERT_TYPES, ExpertTensor

QT = gguf.GGMLQuantizationType
TYPES = [QT.Q8_0, QT.Q4_0, QT.F16, QT.IQ4_NL]  # 32-weight blocks
KQUANTS = [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS]  # 256-weight super-blocks (Q2_K .. Q5_K_M, IQ4_XS files)
FP16_AT = {QT.Q6_K: [208], QT.Q3_K: [108], QT.Q2_K: [80, 82], QT.IQ4_XS: [0], QT.IQ4_NL: [0]}  # d / d, dmin in a block


@settings(max_examples=60, deadline=None)
@given(qt=st.sampled_from(TYPES), rows=st.integers(1, 70), nb=st.integers(1, 12),
       T=st.integers(1, 20), seed=st.integers(0, 2**31))
def test_matmul_matches_dequantised(qk, qt, rows, nb, T, seed):
    rng = np.random.default_rng(seed)
    w = qk.tensor(rng, qt, 3, rows, nb * 32)
    x = rng.standard_normal((T, nb * 32)).astype(np.float32)
    got = K.expert_matmul(w, 1, x)
    W = qk.deq(w, 1)
    want = x @ W.T
    qk.close(got, want, np.abs(x) @ np.abs(W).T)


@pytest.mark.parametrize("qt", TYPES + KQUANTS, ids=lambda q: q.name)
def test_each_type_on_both_sides_of_its_fused_threshold_matches_dequantised(qk, qt):
    """At row_products._FUSED[code] tokens an expert (the fused in-place path: fours, pairs, one), one more (rows
    dequantised against each token, gemm.deq_dots) and from gemm.GEMM_TOKENS (the packed register-tile GEMM,
    gemm.deq_matmul, 16 row-range items), every type matches gguf.dequantize then a float matmul."""
    rng = np.random.default_rng(int(qt))
    cols = 512 if qt in KQUANTS else 96
    w = qk.tensor(rng, qt, 2, 13, cols)
    W = qk.deq(w, 1)
    for T in (K._FUSED[w.code], K._FUSED[w.code] + 1, K.GEMM_TOKENS - 1, K.GEMM_TOKENS):
        x = rng.standard_normal((T, cols)).astype(np.float32)
        qk.close(K.expert_matmul(w, 1, x), x @ W.T, np.abs(x) @ np.abs(W).T)


@settings(max_examples=30, deadline=None)
@given(qt=st.sampled_from(KQUANTS), rows=st.integers(1, 40), nsb=st.integers(1, 4),
       T=st.integers(1, 20), seed=st.integers(0, 2**31))
def test_k_quant_matmul_matches_dequantised(qk, qt, rows, nsb, T, seed):
    """Q2_K / Q3_K / Q4_K / Q5_K / Q6_K rows (256-weight super-blocks) read in place match gguf.dequantize then a float matmul:
    up to row_products._FUSED tokens through the int16 kernels (kquants.py), more dequantised a row at a time (gemm.py)."""
    rng = np.random.default_rng(seed)
    w = qk.tensor(rng, qt, 2, rows, nsb * 256)
    x = rng.standard_normal((T, nsb * 256)).astype(np.float32)
    W = qk.deq(w, 1)
    qk.close(K.expert_matmul(w, 1, x), x @ W.T, np.abs(x) @ np.abs(W).T)


@settings(max_examples=30, deadline=None)
@given(qt=st.sampled_from(KQUANTS + [QT.IQ4_NL]), rows=st.integers(1, 6), nsb=st.integers(1, 3),
       seed=st.integers(0, 2**31))
def test_k_quant_rows_dequantise_bitwise(qt, rows, nsb, seed):
    """Arbitrary K-quant and IQ4 (super-)blocks (every scale, min and quant bit pattern; finite fp16 d / dmin)
    decode to gguf.dequantize's values bit for bit, both in numba (gemm.deq_rows: embeddings, prefill) and in torch
    (experts.torch_dequant: the device tier's slots)."""
    import torch
    from executor.experts import torch_dequant
    from executor.gemm import deq_rows
    rng = np.random.default_rng(seed)
    width, size = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(rows, nsb, size), dtype=np.uint8)
    for o in FP16_AT.get(qt, [0, 2]):  # the fp16 fields
        raw[..., o:o + 2] = rng.uniform(-0.1, 0.1, (rows, nsb, 1)).astype(np.float16).view(np.uint8)
    raw = raw.reshape(rows, -1)
    want = gguf.dequantize(raw, qt).reshape(rows, nsb * width)
    got = np.empty_like(want)
    code = EXPERT_TYPES[qt]
    deq_rows(code, raw, got)
    assert np.array_equal(got, want)
    assert np.array_equal(torch_dequant(torch.from_numpy(raw), code, nsb * width).numpy(), want)


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


@settings(max_examples=40, deadline=None)
@given(qt=st.sampled_from(TYPES[:2] + TYPES[3:] + KQUANTS), rows=st.integers(1, 40), nb=st.integers(1, 12),
       seed=st.integers(0, 2**31))
def test_token_pairs_give_each_tokens_bits(qk, qt, rows, nb, seed):
    """Two tokens through one row group (row_products._PAIR's: 2, 4 or 8 rows; each row decoded once,
    row_products.rows_pair) give the bits of
    each token alone (rows_token): the same int16 products, scales and float adds per row (the K-quants'
    rows in 256-weight super-blocks: nb of them)."""
    rng = np.random.default_rng(seed)
    cols = nb * (256 if qt in KQUANTS else 32)
    w = qk.tensor(rng, qt, 2, rows, cols)
    x = (rng.standard_normal((3, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
    X16, DX = K._quant_rows(x)
    flat = K.flat(w)[1]
    rb = flat.shape[0] // rows
    pair, alone = np.full((3, rows + 2), np.nan, np.float32), np.full((3, rows + 2), np.nan, np.float32)
    RP.py_rows_pair(w.code, flat, 0, rows, rb, X16, DX, 1, pair, 2)
    for k in (1, 2):
        RP.py_rows_token(w.code, flat, 0, rows, rb, X16, DX, k, alone, 2)
    assert np.array_equal(pair[1:, 2:], alone[1:, 2:]) and np.isnan(pair[0]).all() and np.isnan(pair[:, :2]).all()


@settings(max_examples=40, deadline=None)
@given(qt=st.sampled_from(TYPES[:2] + TYPES[3:] + KQUANTS), rows=st.integers(1, 40), nb=st.integers(1, 6),
       m=st.integers(4, 11), seed=st.integers(0, 2**31))
def test_tokens_four_at_a_time_give_each_tokens_bits(qk, qt, rows, nb, m, seed):
    """m tokens through the fused path (row_products.rows_fused: four tokens a row group, 8 rows for Q4_0, 2 for the
    K-quants and IQ4s; Q8_0 in pairs; then a pair, then one) give the bits of each token alone (rows_token)."""
    rng = np.random.default_rng(seed)
    cols = nb * (256 if qt in KQUANTS else 32)
    w = qk.tensor(rng, qt, 2, rows, cols)
    x = (rng.standard_normal((m, cols)) * rng.uniform(0.01, 10)).astype(np.float32)
    X16, DX = K._quant_rows(x)
    flat = K.flat(w)[1]
    rb = flat.shape[0] // rows
    fused, alone = np.full((m, rows + 3), np.nan, np.float32), np.full((m, rows + 3), np.nan, np.float32)
    RP.py_rows_fused(w.code, flat, 0, rows, rb, X16, DX, fused, 3)
    for k in range(m):
        RP.py_rows_token(w.code, flat, 0, rows, rb, X16, DX, k, alone, 3)
    assert np.array_equal(fused[:, 3:], alone[:, 3:]) and np.isnan(fused[:, :3]).all()


_ROWS8_Q8 = simd._qkernel(False, 8, 1)  # Q8_0 8 rows a pass, as the decode kernel ran before session 15


@njit
def _q8_eight_rows_a_pass(w, rows, x16, dx, out):
    rb = np.int64(w.shape[0] // rows)
    nb = np.int64(x16.shape[1] // 32)
    r = 0
    while r + 8 <= rows:
        _ROWS8_Q8(w, np.int64(r * rb), rb, x16, dx, 0, nb, out, np.int64(r))
        r += 8
    while r < rows:
        simd.rows1_q8(w, np.int64(r * rb), rb, x16, dx, 0, nb, out, np.int64(r))
        r += 1


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 40), nb=st.integers(1, 12), seed=st.integers(0, 2**31))
def test_q8_0_two_rows_a_pass_give_the_bits_of_eight(qk, rows, nb, seed):
    """Q8_0 decodes 2 rows a pass (row_products.rows_token; from DRAM 1.3x its 8-row rate, bench_q8_rows.py):
    each row's products and adds are those of 8 rows a pass, so its bits are too."""
    rng = np.random.default_rng(seed)
    w = qk.tensor(rng, QT.Q8_0, 1, rows, nb * 32).data[0].reshape(-1)
    x16, dx = np.empty((1, nb * 32), np.int16), np.empty((1, 2 * nb), np.float32)
    simd.quant16(rng.standard_normal(nb * 32).astype(np.float32), x16[0], dx[0])
    got, want = np.zeros((1, rows), np.float32), np.zeros((1, rows), np.float32)
    RP.py_rows_token(K.Q8_0, w, 0, rows, w.shape[0] // rows, x16, dx, 0, got, 0)
    _q8_eight_rows_a_pass(w, rows, x16, dx, want)
    assert np.array_equal(got, want) and np.abs(want).max() > 0


@pytest.mark.parametrize("qt", KQUANTS + [QT.IQ4_NL], ids=lambda q: q.name)
def test_portable_loops_match_dequantised(qk, qt):
    """The loops the K-quant and IQ4 kernels fall back to without AVX2 (kquants._slow_* / iquants._slow_iq4_*, and
    kquant_blocks._block / iquants.iq4_unit for rows dequantised) match gguf.dequantize: the products within the int16
    kernels' tolerance, the values bit for bit."""
    from executor import iquants, kquant_blocks, kquants
    iq = qt in (QT.IQ4_NL, QT.IQ4_XS)
    rng = np.random.default_rng(int(qt))
    rows, cols = 3, 512
    w = qk.tensor(rng, qt, 1, rows, cols)
    W = qk.deq(w, 0)
    x = rng.standard_normal((1, cols)).astype(np.float32)
    X16, DX = K._quant_rows(x)
    flat = K.flat(w)[0]
    got = np.zeros((1, rows), np.float32)
    slow = getattr(iquants if iq else kquants, f"_slow_{qt.name.lower()}")
    slow(rows, flat, 0, flat.shape[0] // rows, X16, DX, 0, cols // 32, got, 0)
    qk.close(got, x @ W.T, np.abs(x) @ np.abs(W).T)
    width, size = gguf.GGML_QUANT_SIZES[qt]
    buf = np.empty(width, np.float32)
    if iq:  # row 0's second (super-)block
        iquants.iq4_unit(qt == QT.IQ4_XS, flat, np.uint64(size), buf, 0)
    else:
        kquant_blocks._block(size, flat, np.uint64(size), buf, 0)
    assert np.array_equal(buf, W[0, width:2 * width])



def test_a_type_code_outside_the_table_gives_nan_not_a_crash():
    """kernel_table's entry 0 (and any code past the last) computes nothing and writes NaN: a jump to address 0
    would end the process. No loaded model reaches it (gguf_model checks every tensor's type)."""
    x = np.ones((1, 64), np.float32)
    for code in (0, -1):
        got = K.linear(np.zeros(4 * 68, np.uint8), code, 4, x)
        assert np.isnan(got).all()
