"""ggml's F16 vec_dot rebuilt (calibration.ggml_vec_dot_f16): the token converted to fp16 as ggml converts it, the
products in ggml's order (four accumulators of EPR lanes, GCC's lane reduction, the leftovers in double) to the bit,
and, where a llama.cpp build is at hand, ggml_vec_dot_f16's own floats exactly. calibrate's rowwise F16 job runs it."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from calibration import ggml_library as L
from calibration.bench_rowwise import label, rowwise_expert_job
from executor.simd import HAVE_AVX2

pytestmark = pytest.mark.skipif(not HAVE_AVX2, reason="ggml's F16 vec_dot is rebuilt for x86's vector loops")

if HAVE_AVX2:
    from calibration.ggml_vec_dot_f16 import EPR, STEP, fp32_to_fp16_row, vec_dot_f16

    @njit  # not cached: numba would not see a change to the intrinsics it inlines
    def matvec(w, xh, out):
        """out[r] = row r of w ([rows, 2 n] fp16 bytes) . the fp16 token xh, one vec_dot_f16 a row."""
        n = np.int64(xh.shape[0])
        for r in range(w.shape[0]):
            vec_dot_f16(w[r], np.int64(0), xh, n, out, np.int64(r))

    @njit
    def to_fp16(x, xh):
        fp32_to_fp16_row(x, xh, np.int64(x.shape[0]))


def ggml_order(w: np.ndarray, xh: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16's floats by numpy: each fp16 product is exact in float32 (11 x 11 significant bits), so the
    fused multiply-add of each lane is the float32 sum; accumulators 0-3, then (x0 + x2) + (x1 + x3), the lanes as
    GCC's _mm512_reduce_add_ps (16 lanes) or AVX's halves and hadds (8), the leftovers added in double."""
    n = xh.shape[0]
    wf = w.view(np.float16).astype(np.float32)
    xf = xh.view(np.float16).astype(np.float32)
    main = n - n % STEP
    out = np.zeros(w.shape[0], np.float32)
    for r in range(w.shape[0]):
        acc = np.zeros((4, EPR), np.float32)
        for i in range(0, main, STEP):
            for j in range(4):
                s = slice(i + j * EPR, i + (j + 1) * EPR)
                acc[j] = acc[j] + wf[r, s] * xf[s]
        x0 = (acc[0] + acc[2]) + (acc[1] + acc[3])
        if EPR == 16:
            t3 = x0[8:] + x0[:8]
            t6 = t3[4:] + t3[:4]
            t8 = t6 + t6[[2, 3, 0, 1]]
            red = t8[0] + t8[1]
        else:
            t0 = x0[:4] + x0[4:]
            red = (t0[0] + t0[1]) + (t0[2] + t0[3])
        tot = np.float64(red)
        for i in range(main, n):
            tot += np.float64(wf[r, i]) * np.float64(xf[i])
        out[r] = np.float32(tot)
    return out


def _case(cols: int, rows: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16).view(np.uint16)
    x = rng.standard_normal(cols).astype(np.float32)
    xh = np.zeros(cols, np.uint16)
    to_fp16(x, xh)
    return w.view(np.uint8).reshape(rows, -1), x, xh


def test_the_token_is_converted_to_fp16_to_nearest_even():
    """fp32_to_fp16_row gives numpy's float16 bits (round to nearest even), halfway cases and subnormals included."""
    x = np.concatenate([np.random.default_rng(1).standard_normal(4096).astype(np.float32) * 4,
                        np.float32([1 + 2 ** -11, 1 + 3 * 2 ** -11, 2 ** -20, -2 ** -24, 65504.0, 0.0])])
    xh = np.zeros(x.shape[0], np.uint16)
    to_fp16(x, xh)
    assert np.array_equal(xh, x.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("cols", [2048, 768, 64 + 17])
def test_products_follow_ggmls_order_to_the_bit(cols):
    """2048 and 768 columns (whole passes of STEP values) and 81 (a pass and 17 leftovers): the floats of ggml's order
    of additions, by numpy."""
    w, _, xh = _case(cols)
    out = np.zeros(w.shape[0], np.float32)
    matvec(w, xh, out)
    assert np.array_equal(out, ggml_order(w, xh))


FOUND = L.find_ggml_cpu("auto")


@pytest.mark.skipif(FOUND is None, reason=f"no llama.cpp build here (${L.ENV}, or llama-bench on PATH)")
@pytest.mark.parametrize("cols", [2048, 512, 64 + 17])
def test_products_are_ggmls_own_to_the_bit(cols):
    """The same rows and token through the build's ggml_vec_dot_f16: its floats exactly, the token as its own
    ggml_cpu_fp32_to_fp16 makes it."""
    g = L.load_ggml_cpu(FOUND, formats=("F16",))
    w, x, xh = _case(cols, seed=2)
    assert np.array_equal(L.quantise_token(g, "f16", x).view(np.uint16), xh)
    out, own = np.zeros(w.shape[0], np.float32), np.zeros(w.shape[0], np.float32)
    matvec(w, xh, out)
    for r in range(w.shape[0]):
        g.vec_dot["F16"](cols, own[r:].ctypes.data, 0, w[r].ctypes.data, 0, xh.ctypes.data, 0, 1)
    assert np.array_equal(out, own)


def test_calibrates_f16_job_runs_ggmls_vec_dot_f16():
    """rowwise_expert_job('F16') is ggml's structure on the rebuilt vec_dot, and its profile line says so."""
    run, expert_bytes = rowwise_expert_job("F16", hidden=256, ffn=128, pool_bytes=4 << 20, max_k=2)
    run(2, 0)
    assert expert_bytes == 3 * 256 * 128 * 2
    assert "ggml's vec_dot_f16, fp16 token" in label("F16", 256, 128)
