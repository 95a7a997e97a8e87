"""The prefill GEMM (executor/gemm.py): packed token panels, 6-row x 16-token register tiles over 256-column
slices of rows dequantised in place, against gguf.dequantize then a float matmul."""
from __future__ import annotations

from functools import lru_cache

import gguf
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import njit

from executor import gemm, kernels as K
from executor.row_products import py_deq_matmul

QT = gguf.GGMLQuantizationType
BLOCK = {QT.F16: 32, QT.Q8_0: 32, QT.Q4_0: 32, QT.Q4_K: 256, QT.Q6_K: 256}  # columns a test shape steps by


def _product(w, x, r0, r1, off=0):
    """gemm.deq_matmul of expert 1's rows [r0, r1) of w with tokens x, into columns off.. of a fresh result."""
    flat = K.flat(w)[1]
    res = np.full((x.shape[0], off + r1 - r0), np.nan, np.float32)
    py_deq_matmul(w.code, flat, r0, r1, flat.shape[0] // w.rows, gemm.pack_tokens(x), x.shape[0], res, off)
    return res


def test_packed_panels_hold_sixteen_tokens_a_column_zero_padded():
    """pack_tokens(X [m, cols]) -> [ceil(m / 16), cols, 16]: P[kb, c, t] = X[16 kb + t, c], zeros past m."""
    x = np.arange(20 * 3, dtype=np.float32).reshape(20, 3) + 1
    P = gemm.pack_tokens(x)
    assert P.shape == (2, 3, 16)
    for t in range(20):
        assert np.array_equal(P[t // 16, :, t % 16], x[t])
    assert not P[1, :, 4:].any()


@settings(max_examples=40, deadline=None)
@given(qt=st.sampled_from(list(BLOCK)), rows=st.integers(1, 40), nblk=st.integers(1, 11), m=st.integers(1, 40),
       seed=st.integers(0, 2**31))
def test_deq_matmul_matches_dequantised(qk, qt, rows, nblk, m, seed):
    """Every type, any rows (6-row panels with a short last one), tokens (16-token tiles, an 8-token tail
    tile; with gemm.ZMM 32-token tiles first) and
    columns (256-column slices with a short last one: up to 352 Q8_0 / Q4_0 / F16 columns, up to
    2,816 K-quant ones), from a row offset into an output column offset: gguf.dequantize then x W^T."""
    rng = np.random.default_rng(seed)
    cols = nblk * BLOCK[qt] if BLOCK[qt] == 256 else nblk * 32
    w = qk.tensor(rng, qt, 2, rows, cols)
    x = rng.standard_normal((m, cols)).astype(np.float32)
    r0 = int(rng.integers(0, rows))
    got = _product(w, x, r0, rows, off=3)
    assert not np.isnan(got[:, 3:]).any()
    W = qk.deq(w, 1)[r0:]
    qk.close(got[:, 3:], x @ W.T, np.abs(x) @ np.abs(W).T, tol=1e-5)


def test_a_tokens_products_do_not_depend_on_the_tokens_beside_it(qk):
    """Each token is a lane of the tile: its products are bit for bit those it gets alone, whatever the batch
    (so a stream's prefill does not depend on the streams batched with it)."""
    rng = np.random.default_rng(5)
    w = qk.tensor(rng, QT.Q4_0, 2, 13, 320)
    x = rng.standard_normal((37, 320)).astype(np.float32)
    batch = _product(w, x, 0, 13)
    for k in (0, 15, 16, 36):
        assert np.array_equal(batch[k], _product(w, x[k:k + 1], 0, 13)[0])


def test_row_ranges_give_the_rows_of_the_whole(qk):
    """A matrix split into row ranges (the executor's parallel items) gives each row the bits of one call over
    all rows: a row's sums do not depend on its panel."""
    rng = np.random.default_rng(6)
    w = qk.tensor(rng, QT.Q4_K, 2, 29, 512)
    x = rng.standard_normal((21, 512)).astype(np.float32)
    whole = _product(w, x, 0, 29)
    parts = np.concatenate([_product(w, x, a, b) for a, b in ((0, 7), (7, 18), (18, 29))], axis=1)
    assert np.array_equal(whole, parts)


@lru_cache(maxsize=None)
def _tiled(code: int, wide: bool):
    """gemm's float GEMM of type `code` with (wide) or without its 32-token zmm tile."""
    mm = gemm._deq_matmul(wide)

    @njit(fastmath=True)
    def run(w, rows, rb, P, m, res):
        mm(code, w, 0, rows, rb, P, m, res, 0)
    return run


@pytest.mark.skipif(not gemm.HAVE_AVX512, reason="zmm tiles need AVX-512")
@pytest.mark.parametrize("qt", [QT.F16, QT.Q4_K], ids=lambda q: q.name)
def test_the_zmm_tile_gives_the_ymm_tiles_bits(qk, qt):
    """The 32-token zmm tile (gemm.ZMM) gives every product the bits of two 16-token ymm tiles, at 1-70 tokens (a
    lane's FMAs are the same, in the same order)."""
    rng = np.random.default_rng(int(qt))
    w = qk.tensor(rng, qt, 2, 13, 512)
    flat = K.flat(w)[1]
    for m in (1, 9, 16, 17, 32, 33, 48, 49, 70):
        x = rng.standard_normal((m, 512)).astype(np.float32)
        P = gemm.pack_tokens(x)
        out = {}
        for wide in (False, True):
            out[wide] = np.zeros((m, 13), np.float32)
            _tiled(w.code, wide)(flat, 13, flat.shape[0] // w.rows, P, m, out[wide])
        assert np.array_equal(out[False], out[True]), m
        assert np.isfinite(out[True]).all() and np.abs(out[True]).max() > 0
