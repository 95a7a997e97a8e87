"""ggml's AVX2 gemvs of K-quants repacked at load (calibration.ggml_gemv_q4_k, calibration.ggml_gemv_q2_k, their
shared loop in calibration.ggml_gemv_kx8): each one's products, the dequantised weights times the Q8_K token to float
rounding."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from numba import njit

from calibration import ggml_gemv_q2_k, ggml_gemv_q4_k
from calibration.bench_ggml_prefill import REPACK_X8
from calibration.bench_kernel import _synth_tensor
from calibration.ggml_tiled import quantize_q8_k
from executor.simd import HAVE_AVX2

if HAVE_AVX2:
    @njit(cache=True)
    def matvec_q4_k(w, rows, x8, dx, bs, out):
        """out[:rows] = the block_q4_Kx8 groups of w ([rows / 8, bytes]) . the Q8_K token, 8 rows a gemv."""
        nb = np.int64(x8.shape[0] // 256)
        for g in range(rows // 8):
            ggml_gemv_q4_k.gemv_q4_kx8(w[g], np.int64(0), x8, dx, bs, nb, out, np.int64(8 * g))

    @njit(cache=True)
    def matvec_q2_k(w, rows, x8, dx, bs, out):
        """The same for block_q2_Kx8."""
        nb = np.int64(x8.shape[0] // 256)
        for g in range(rows // 8):
            ggml_gemv_q2_k.gemv_q2_kx8(w[g], np.int64(0), x8, dx, bs, nb, out, np.int64(8 * g))


@pytest.mark.skipif(not HAVE_AVX2, reason="ggml's 8x8 K-quant gemvs need AVX2")
@pytest.mark.parametrize("fmt", ["Q4_K", "Q2_K"])
@pytest.mark.parametrize("cols", [256, 2048])
def test_gemv_products_are_the_dequantised_weights_times_the_q8_k_token(fmt, cols):
    """Each of 32 rows times one Q8_K token: the integer sums are exact, so only float rounding is left (max error
    1e-5 of the largest product)."""
    rng = np.random.default_rng(cols)
    rows = 32
    t = _synth_tensor(fmt, 1, rows, cols, rng)
    wx8 = REPACK_X8[fmt](t.data.reshape(-1), rows)
    a = rng.standard_normal((1, 1, cols)).astype(np.float32)
    x8, dx, bs = quantize_q8_k(a)
    out = np.zeros(rows, np.float32)
    (matvec_q4_k if fmt == "Q4_K" else matvec_q2_k)(wx8, rows, x8[0, 0], dx[0, 0], bs[0, 0], out)
    w = dequantize(t.data.reshape(rows, -1), QT[fmt]).astype(np.float64)
    x = (x8[0, 0].astype(np.float64).reshape(-1, 256) * dx[0, 0][:, None]).reshape(cols)
    ref = w @ x
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()
