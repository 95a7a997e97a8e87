"""ggml's AVX2 vec_dots of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS rows with a Q8_K token, rebuilt (calibration.ggml_vec_dot_k):
their products are the dequantised weights times the token to float rounding, and, where a llama.cpp build is at hand,
ggml's own to the bit."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize
from numba import njit

from calibration import ggml_library as L
from calibration.bench_kernel import _synth_tensor
from calibration.ggml_tiled import quantize_q8_k
from executor.simd import HAVE_AVX2

pytestmark = pytest.mark.skipif(not HAVE_AVX2, reason="ggml's K-quant vec_dots are its AVX2 loops")

FORMATS = ("Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "Q2_K", "Q3_K")

if HAVE_AVX2:
    from calibration.ggml_vec_dot_k import (vec_dot_iq4_xs, vec_dot_q2_k, vec_dot_q3_k, vec_dot_q4_k, vec_dot_q5_k,
                                            vec_dot_q6_k)

    @njit  # not cached: numba would not see a change to the intrinsics it inlines
    def matvec(kind, w, x8, dx, bs, out):
        """out[r] = row r of w ([rows, row bytes] of FORMATS[kind]) . the Q8_K token, one vec_dot a row."""
        nb = np.int64(x8.shape[0] // 256)
        for r in range(w.shape[0]):
            if kind == 0:
                vec_dot_q4_k(w[r], np.int64(0), x8, dx, bs, nb, out, np.int64(r))
            elif kind == 1:
                vec_dot_q5_k(w[r], np.int64(0), x8, dx, bs, nb, out, np.int64(r))
            elif kind == 2:
                vec_dot_q6_k(w[r], np.int64(0), x8, dx, bs, nb, out, np.int64(r))
            elif kind == 3:
                vec_dot_iq4_xs(w[r], np.int64(0), x8, dx, bs, nb, out, np.int64(r))
            elif kind == 4:
                vec_dot_q2_k(w[r], np.int64(0), x8, dx, bs, nb, out, np.int64(r))
            else:
                vec_dot_q3_k(w[r], np.int64(0), x8, dx, bs, nb, out, np.int64(r))


def _case(fmt: str, cols: int, rows: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed + cols)
    w = np.ascontiguousarray(_synth_tensor(fmt, 1, rows, cols, rng).data[0])  # [rows, row bytes]
    a = rng.standard_normal((1, 1, cols)).astype(np.float32)
    x8, dx, bs = quantize_q8_k(a)
    return w, a[0, 0], x8[0, 0], dx[0, 0], bs[0, 0].astype(np.int16)  # block_q8_K's int16 sums


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cols", [256, 2048])
def test_products_are_the_dequantised_weights_times_the_q8_k_token(fmt, cols):
    """32 rows: the integer sums are exact, so only float rounding is left (within 1e-5 of the largest product)."""
    w, _, x8, dx, bs = _case(fmt, cols)
    out = np.zeros(w.shape[0], np.float32)
    matvec(FORMATS.index(fmt), w, x8, dx, bs, out)
    ref = dequantize(w.reshape(-1), QT[fmt]).reshape(w.shape[0], cols).astype(np.float64)
    want = ref @ (x8.astype(np.float64).reshape(-1, 256) * dx[:, None]).reshape(cols)
    assert np.abs(out - want).max() <= 1e-5 * np.abs(want).max()


FOUND = L.find_ggml_cpu("auto")


@pytest.mark.skipif(FOUND is None, reason=f"no llama.cpp build here (${L.ENV}, or llama-bench on PATH)")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cols", [256, 2048])
def test_products_are_ggmls_own_to_the_bit(fmt, cols):
    """The same rows against the token as ggml's quantize_row_q8_K gives it: ggml_vec_dot_<type>_q8_K's floats
    exactly."""
    g = L.load_ggml_cpu(FOUND, formats=(fmt,))
    w, x, _, _, _ = _case(fmt, cols)
    q = L.quantise_token(g, "q8_K", x)
    blocks = q.reshape(-1, 292)  # block_q8_K: float d, 256 int8 codes, 16 int16 sums
    dx = blocks[:, :4].copy().view(np.float32).reshape(-1)
    x8 = blocks[:, 4:260].copy().view(np.int8).reshape(-1)
    bs = blocks[:, 260:].copy().view(np.int16).reshape(-1)
    out, own = np.zeros(w.shape[0], np.float32), np.zeros(w.shape[0], np.float32)
    matvec(FORMATS.index(fmt), w, x8, dx, bs, out)
    for r in range(w.shape[0]):
        g.vec_dot[fmt](cols, own[r:].ctypes.data, 0, w[r].ctypes.data, 0, q.ctypes.data, 0, 1)
    assert np.array_equal(out, own)
