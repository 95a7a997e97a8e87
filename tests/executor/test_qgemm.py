"""The integer GEMM (executor/qgemm.py, executor/qdecode.py): rows decoded to their integers and scales, the token
panels' layout, and its products against gguf.dequantize-then-matmul and against the fused int16 rows."""
from __future__ import annotations

from functools import lru_cache

import gguf
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import njit

from executor import qdecode, qgemm
from executor import row_products as RP
from executor.gemm import NT
from executor.gguf_model import EXPERT_TYPES
from executor.kernels import _quant_rows, int_panels, panels

QT = gguf.GGMLQuantizationType
TYPES = [QT.Q8_0, QT.Q4_0, QT.IQ4_NL, QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS]
FP16_AT = {QT.Q6_K: [208], QT.Q3_K: [108], QT.Q2_K: [80, 82], QT.IQ4_XS: [0], QT.IQ4_NL: [0], QT.Q4_0: [0],
           QT.Q8_0: [0], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2]}  # d / d, dmin in a block


def _raw_rows(rng, qt, rows, units):
    """Arbitrary blocks of type qt (every scale, min and quant bit pattern; finite fp16 d / dmin), rows x units."""
    size = gguf.GGML_QUANT_SIZES[qt][1]
    raw = rng.integers(0, 256, size=(rows, units, size), dtype=np.uint8)
    for o in FP16_AT[qt]:
        raw[..., o:o + 2] = rng.uniform(-0.1, 0.1, (rows, units, 1)).astype(np.float16).view(np.uint8)
    return np.ascontiguousarray(raw.reshape(rows, -1))


@lru_cache(maxsize=None)
def _decoder(code: int, fast: bool):
    """Every row of a matrix through qdecode.q_decode (fast: the intrinsics; else the plain loops)."""
    @njit(fastmath=True)
    def run(w, rows, cols, A, S, N):
        for r in range(rows):
            qdecode.q_decode(code, w[r], np.uint64(0), A[r], S[r], N[r], cols, fast)
    return run


@settings(max_examples=30, deadline=None)
@given(qt=st.sampled_from(TYPES), rows=st.integers(1, 5), units=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_rows_decode_to_integers_and_scales_that_rebuild_gguf_values_bitwise(qt, rows, units, seed):
    """For every type, scale x integer + min (qdecode's docstring) is gguf.dequantize's value bit for bit, and the
    intrinsics write the plain loops' integers, scales and mins exactly."""
    rng = np.random.default_rng(seed)
    width = gguf.GGML_QUANT_SIZES[qt][0]
    raw = _raw_rows(rng, qt, rows, units)
    cols = units * width
    want = gguf.dequantize(raw, qt).reshape(rows, cols)
    code = EXPERT_TYPES[qt]
    sub = qgemm.SUB[code]
    got = {}
    for fast in (True, False):
        A = np.zeros((rows, cols), np.int16)
        S = np.zeros((rows, cols // sub), np.float32)
        N = np.zeros((rows, cols // sub), np.float32)
        _decoder(code, fast)(raw, rows, cols, A, S, N)
        got[fast] = A, S, N
    for a, b in zip(got[True], got[False]):
        np.testing.assert_array_equal(a, b)
    A, S, N = got[True]
    rebuilt = np.repeat(S, sub, axis=1) * A.astype(np.float32)
    if qgemm.MINS[code]:
        rebuilt = rebuilt + np.repeat(N, sub, axis=1)
    np.testing.assert_array_equal(rebuilt, want)


def test_token_panels_hold_value_pairs_then_scales_and_sums():
    """qpack_into's block [panel_width(cols), NT]: token t's pair p is int16 values 2p, 2p + 1 of its row as one
    int32 (low half first), then each 32-block's dx, dx x the block's x16 sum and dx x each 16-value half's; tokens
    past m are zeros."""
    rng = np.random.default_rng(3)
    m, cols = 3, 64
    x = rng.standard_normal((m, cols)).astype(np.float32)
    x16, dx = _quant_rows(x)
    P = panels(x, x16, dx, True, True)
    assert P.shape == (1, qgemm.panel_width(cols), NT) == (1, 40, 16)
    nat = np.empty((m, cols), np.int32)  # quant16 keeps each block's even values first: back to natural order
    for b in range(cols // 32):
        nat[:, 32 * b:32 * b + 32:2] = x16[:, 32 * b:32 * b + 16]
        nat[:, 32 * b + 1:32 * b + 32:2] = x16[:, 32 * b + 16:32 * b + 32]
    pairs = P[0, :cols // 2].view(np.int32)  # [pairs, NT]
    for t in range(m):
        lo, hi = (pairs[:, t] << 16) >> 16, pairs[:, t] >> 16
        np.testing.assert_array_equal(lo, nat[t, 0::2])
        np.testing.assert_array_equal(hi, nat[t, 1::2])
        d = dx[t, :2]
        np.testing.assert_array_equal(P[0, 32:34, t], d)
        np.testing.assert_array_equal(P[0, 34:36, t], d * nat[t].reshape(2, 32).sum(1).astype(np.float32))
        np.testing.assert_array_equal(P[0, 36:40, t], np.repeat(d, 2) * nat[t].reshape(4, 16).sum(1).astype(np.float32))
    assert not P[0, :, m:].any()


def test_integer_panels_are_never_as_wide_as_a_row():
    """rows_matmul tells integer panels from float ones by their width (5 / 8 of a row's values against all)."""
    for cols in (32, 96, 256, 2048, 7168):
        assert qgemm.panel_width(cols) != cols


def test_panels_are_integer_unless_an_f16_product_reads_them():
    """One set of panels feeds gate and up: integer where qgemm runs and neither is F16 (F16 has no integers)."""
    q4k, f16 = EXPERT_TYPES[QT.Q4_K], EXPERT_TYPES[QT.F16]
    assert int_panels(q4k, q4k, R1=1) == qgemm.HAVE_QGEMM
    assert not int_panels(q4k, f16, R1=1)
    assert int_panels(q4k, f16, R1=0) == qgemm.HAVE_QGEMM  # a second matrix that is absent reads nothing


def _q_products(code, raw, x):
    x16, dx = _quant_rows(x)
    P = panels(x, x16, dx, True, True)
    res = np.zeros((x.shape[0], raw.shape[0] + 3), np.float32)
    RP.py_q_matmul(code, raw.reshape(-1), 0, raw.shape[0], raw.shape[1], P, x.shape[0], res, 3)
    return res[:, 3:], x16, dx


@settings(max_examples=40, deadline=None)
@given(qt=st.sampled_from(TYPES), rows=st.integers(1, 20), units=st.integers(1, 3), T=st.integers(1, 40),
       seed=st.integers(0, 2**31))
def test_integer_gemm_matches_dequantised_then_matmul(qk, qt, rows, units, T, seed):
    """q_matmul over any rows (short last 6-row panels), tokens (short last 16-token blocks: the 8- and 24-token tiles) and
    columns (several KC slices for 32-blocks) matches gguf.dequantize then a float matmul (qk.close: the int16
    activations' error, relative to the sum of |terms|)."""
    rng = np.random.default_rng(seed)
    width = gguf.GGML_QUANT_SIZES[qt][0]
    units = units * (12 if width == 32 else 1)  # 32-blocks: up to 1,152 columns, past one 256-column slice
    raw = _raw_rows(rng, qt, rows, units)
    W = gguf.dequantize(raw, qt).reshape(rows, units * width)
    x = rng.standard_normal((T, units * width)).astype(np.float32)
    got, _, _ = _q_products(EXPERT_TYPES[qt], raw, x)
    qk.close(got, x @ W.T, np.abs(x) @ np.abs(W).T)


@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q2_K, QT.IQ4_XS], ids=lambda q: q.name)
@pytest.mark.parametrize("T", [8, 16, 17, 24, 25, 40, 41])
def test_each_token_tiling_matches_dequantised_then_matmul(qk, qt, T):
    """ymm tiles: tokens tile as 16s, then a last 1-8 in the 8-token tile, 9-16 in the 16-token one, 17-24 in one
    24-token tile over two blocks (40 = 16 + 24, 41 = 16 + 16 + 8); zmm tiles (qgemm.WIDE): 32s, then 17-32 in 32,
    9-16 in 16, 1-8 in the ymm 8 (40 = 32 + 8, 41 = 32 + 16); each matches gguf.dequantize then a float matmul (32-value
    sub-blocks with mins, 16-value ones with mins, 32-blocks without)."""
    rng = np.random.default_rng(T)
    raw = _raw_rows(rng, qt, 13, 2)
    W = gguf.dequantize(raw, qt).reshape(13, 512)
    x = rng.standard_normal((T, 512)).astype(np.float32)
    got, _, _ = _q_products(EXPERT_TYPES[qt], raw, x)
    qk.close(got, x @ W.T, np.abs(x) @ np.abs(W).T)


@pytest.mark.parametrize("qt", TYPES, ids=lambda q: q.name)
def test_integer_gemm_sums_the_fused_rows_integers(qt):
    """The same int16 activations and weight integers as the fused rows (row_products.rows_fused): the two differ
    only in the order of their float adds (1e-6 of the sum of |terms|)."""
    rng = np.random.default_rng(int(qt))
    raw = _raw_rows(rng, qt, 14, 8 if gguf.GGML_QUANT_SIZES[qt][0] == 32 else 2)
    cols = raw.shape[1] // gguf.GGML_QUANT_SIZES[qt][1] * gguf.GGML_QUANT_SIZES[qt][0]
    x = rng.standard_normal((9, cols)).astype(np.float32)
    got, x16, dx = _q_products(EXPERT_TYPES[qt], raw, x)
    fused = np.zeros_like(got)
    RP.py_rows_fused(EXPERT_TYPES[qt], raw.reshape(-1), 0, raw.shape[0], raw.shape[1], x16, dx, fused, 0)
    W = gguf.dequantize(raw, qt).reshape(raw.shape[0], cols)
    mag = np.abs(x) @ np.abs(W).T
    assert (np.abs(got - fused) / mag).max() < 1e-6



@pytest.mark.parametrize("qt", [QT.Q8_0, QT.Q4_K], ids=lambda q: q.name)
def test_rows_wider_than_a_slice_match_dequantised(qk, qt):
    """Rows of 4,352 values: q_matmul's first slice takes qgemm.QKC = 4,096 columns, the second the last 256."""
    rng = np.random.default_rng(9)
    width = gguf.GGML_QUANT_SIZES[qt][0]
    cols = qgemm.QKC + 256
    raw = _raw_rows(rng, qt, 7, cols // width)
    W = gguf.dequantize(raw, qt).reshape(7, cols)
    x = rng.standard_normal((11, cols)).astype(np.float32)
    got, _, _ = _q_products(EXPERT_TYPES[qt], raw, x)
    qk.close(got, x @ W.T, np.abs(x) @ np.abs(W).T)


@lru_cache(maxsize=None)
def _tiled(code: int, int8: bool, wide: bool, group_bytes: int = qgemm.GROUP_BYTES):
    """qgemm's GEMM of type `code` on int16 / int8 activations with its ymm (wide False) or zmm tiles, its tokens in
    groups of group_bytes of panel slice (0: one group)."""
    mm = qgemm._q_matmul(int8, wide, group_bytes)

    @njit(fastmath=True)
    def run(w, rows, rb, P, m, res):
        mm(code, w, 0, rows, rb, P, m, res, 0)
    return run


@pytest.mark.skipif(not qgemm.HAVE_VNNI512, reason="zmm tiles need AVX-512 VNNI")
@pytest.mark.parametrize("int8", [False, True], ids=["int16", "int8"])
@pytest.mark.parametrize("qt", [QT.Q4_K, QT.Q6_K, QT.IQ4_XS], ids=lambda q: q.name)
def test_zmm_tiles_give_the_ymm_tiles_bits(qt, int8):
    """The zmm tiles (qgemm.WIDE: 32 tokens, a last 9-16 in 16, 1-8 in the ymm 8) give every product the bits of the
    ymm tiles (16 tokens, 24, 8) at 1-70 tokens: each lane's integer sums and float steps are the same (32-value
    sub-blocks with mins, 16-value ones without, 32-blocks with a codebook)."""
    from .test_qgemm_int8 import _pack8
    rng = np.random.default_rng(int(qt) + 100 * int8)
    raw = _raw_rows(rng, qt, 13, 8 if gguf.GGML_QUANT_SIZES[qt][0] == 32 else 2)
    cols = raw.shape[1] // gguf.GGML_QUANT_SIZES[qt][1] * gguf.GGML_QUANT_SIZES[qt][0]
    code = EXPERT_TYPES[qt]
    for T in (1, 8, 9, 16, 17, 24, 25, 32, 33, 40, 48, 49, 70):
        x = rng.standard_normal((T, cols)).astype(np.float32)
        x16, dx = _quant_rows(x)
        P = _pack8(x) if int8 else panels(x, x16, dx, True, True)
        out = {}
        for wide in (False, True):
            out[wide] = np.zeros((T, 13), np.float32)
            _tiled(code, int8, wide)(raw.reshape(-1), 13, raw.shape[1], P, T, out[wide])
        assert np.array_equal(out[False], out[True]), T
        assert np.isfinite(out[True]).all() and np.abs(out[True]).max() > 0


@pytest.mark.parametrize("wide", [False, True] if qgemm.HAVE_VNNI512 else [False], ids=["ymm", "zmm"][:1 + qgemm.HAVE_VNNI512])
@pytest.mark.parametrize("int8", [False, True], ids=["int16", "int8"])
@pytest.mark.parametrize("qt", [QT.Q4_0, QT.Q4_K, QT.Q6_K], ids=lambda q: q.name)
def test_token_groups_give_one_groups_bits(qt, int8, wide):
    """Tokens in groups (qgemm.GROUP_BYTES: each group through every row panel, the rows decoded again) give the bits
    of one group of all the tokens at 1-100 tokens: groups of two 16-token blocks (the least), of four, and one."""
    from .test_qgemm_int8 import _pack8
    rng = np.random.default_rng(int(qt) + 10 * int8 + 100 * wide)
    raw = _raw_rows(rng, qt, 13, 8 if gguf.GGML_QUANT_SIZES[qt][0] == 32 else 2)
    cols = raw.shape[1] // gguf.GGML_QUANT_SIZES[qt][1] * gguf.GGML_QUANT_SIZES[qt][0]
    code = EXPERT_TYPES[qt]
    block = (qgemm.panel_width8 if int8 else qgemm.panel_width)(cols) * NT * 4  # bytes of a 16-token block's panel
    for T in (1, 17, 32, 33, 40, 64, 65, 100):
        x = rng.standard_normal((T, cols)).astype(np.float32)
        x16, dx = _quant_rows(x)
        P = _pack8(x) if int8 else panels(x, x16, dx, True, True)
        out = {}
        for g in (0, 1, 4 * block):
            out[g] = np.zeros((T, 13), np.float32)
            _tiled(code, int8, wide, g)(raw.reshape(-1), 13, raw.shape[1], P, T, out[g])
        assert np.array_equal(out[0], out[1]) and np.array_equal(out[0], out[4 * block]), T
        assert np.abs(out[0]).max() > 0


@pytest.mark.parametrize("act", ["int16", "int8"])
@pytest.mark.parametrize("cols", [256, 768, 2048, 4096, 7168, 18432])
def test_the_simulators_token_groups_are_the_gemms(cols, act):
    """specs.formats.executor_group_tokens (the simulator's statement) gives q_matmul's groups (group_blocks x 16
    tokens) for rows of any width, int16 or int8 panels, at a 1 MB and a 2 MB L2 and at the least group (two
    blocks); `small`'s 2,048-column gate / up at 1 MB: 128 tokens a group (int16), its 768-column down 320."""
    from specs.formats import executor_group_bytes, executor_group_tokens
    width = (qgemm.panel_width8 if act == "int8" else qgemm.panel_width)(cols)
    for g in (executor_group_bytes(1 << 20), executor_group_bytes(2 << 20), 1):
        assert qgemm.group_blocks(width, min(cols, qgemm.QKC), cols, 10**6, g) * NT == executor_group_tokens(cols, g, act)
    assert qgemm.group_blocks(width, min(cols, qgemm.QKC), cols, 7, 0) == 7  # 0: one group of every block
    if act == "int16":
        assert {2048: 128, 768: 320}.get(cols, 0) in (0, executor_group_tokens(cols, executor_group_bytes(1 << 20)))
