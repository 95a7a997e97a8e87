"""ggml's AVX2 gemv of Q4_K weights repacked at load (calibration.ggml_gemv_q4_k): llama.cpp's block_q4_Kx8 layout
(make_block_q4_Kx8) (its products: tests/calibration/test_ggml_gemv_kx8.py)."""
from __future__ import annotations

import numpy as np
import pytest

from calibration import ggml_gemv_q4_k as G
from calibration.bench_kernel import _synth_tensor

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

