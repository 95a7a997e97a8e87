"""ggml's AVX2 gemv of Q4_K weights repacked at load (calibration.ggml_gemv_q4_k): llama.cpp's block_q4_Kx8 layout
(make_block_q4_Kx8) and its products, the dequantised weights times the Q8_K token to float rounding."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from numba import njit

from calibration import ggml_gemv_q4_k as G
from calibration.bench_kernel import _synth_tensor
from calibration.ggml_tiled import quantize_q8_k

avx2 = pytest.mark.skipif(not G.HAVE_AVX2, reason="ggml's q4_K 8x8 gemv needs AVX2")


def test_the_repacked_layout_interleaves_eight_rows_eight_bytes_at_a_time():
    """make_block_q4_Kx8: the 8 rows' d, then their dmin, 96 bytes of scales, then nibble byte j of row r at
    128 + (j // 8) * 64 + r * 8 + j % 8; sub-block k's 12 bytes pack the 8 rows' scale and min as Q4_K packs its
    own 8 (the low 6 bits of rows 0-3, then of their mins, the high bits of rows 4-7 above them)."""
    rng = np.random.default_rng(1)
    w = _synth_tensor("Q4_K", 1, 16, 512, rng).data.reshape(16, 2, G.Q4_K_BYTES)
    out = G.repack_q4_k_x8(w.reshape(-1), 16).reshape(2, 2, G.Q4_KX8_BYTES)  # [group, super-block, bytes]
    g, b, r, j = 1, 1, 5, 77
    blk = w[8 * g + r, b]
    assert out[g, b, 2 * r:2 * r + 2].tobytes() == blk[0:2].tobytes()
    assert out[g, b, 16 + 2 * r:18 + 2 * r].tobytes() == blk[2:4].tobytes()
    assert out[g, b, 128 + (j // 8) * 64 + r * 8 + j % 8] == blk[16 + j]
    s, m = G._scales_mins(w[8 * g:8 * g + 8, b, 4:16])  # [8 rows, 8 sub-blocks]
    k = 6
    sc = out[g, b, 32 + 12 * k:44 + 12 * k]
    assert list(sc[0:4] & 63) == list(s[0:4, k]) and list(sc[4:8] & 63) == list(m[0:4, k])
    assert list((sc[8:12] & 15) | ((sc[0:4] >> 6) << 4)) == list(s[4:8, k])
    assert list((sc[8:12] >> 4) | ((sc[4:8] >> 6) << 4)) == list(m[4:8, k])


def test_rows_not_a_multiple_of_eight_are_refused():
    with pytest.raises(ValueError, match="groups of 8 rows"):
        G.repack_q4_k_x8(np.zeros(12 * G.Q4_K_BYTES, np.uint8), 12)


if G.HAVE_AVX2:
    @njit(cache=True)
    def _matvec(w, rows, x8, dx, bs, out):
        nb = np.int64(x8.shape[0] // 256)
        for g in range(rows // 8):
            G.gemv_q4_kx8(w[g], np.int64(0), x8, dx, bs, nb, out, np.int64(8 * g))


@avx2
@pytest.mark.parametrize("cols", [256, 2048])
def test_gemv_products_are_the_dequantised_weights_times_the_q8_k_token(cols):
    """Each of 32 rows times one Q8_K token: the integer sums are exact, so only float rounding is left (max error
    1e-5 of the largest product)."""
    rng = np.random.default_rng(cols)
    rows = 32
    t = _synth_tensor("Q4_K", 1, rows, cols, rng)
    wx8 = G.repack_q4_k_x8(t.data.reshape(-1), rows)
    a = rng.standard_normal((1, 1, cols)).astype(np.float32)
    x8, dx, bs = quantize_q8_k(a)
    out = np.zeros(rows, np.float32)
    _matvec(wx8, rows, x8[0, 0], dx[0, 0], bs[0, 0], out)
    w = dequantize(t.data.reshape(rows, -1), QT.Q4_K).astype(np.float64)
    x = (x8[0, 0].astype(np.float64).reshape(-1, 256) * dx[0, 0][:, None]).reshape(cols)
    ref = w @ x
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
