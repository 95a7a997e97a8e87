"""llamafile's tinyBLAS F16 / F32 GEMM rebuilt (calibration.ggml_sgemm): its tile plan is tinyBLAS::matmul's, and its
products are the F16 values' products to float rounding, whatever the tile edges and the job split."""
from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibration import ggml_sgemm as GS

needs_f16c = pytest.mark.skipif(not GS.HAVE_F16C, reason="tinyBLAS's F16 path needs AVX2 and F16C (or AVX-512)")


def test_an_attention_projection_of_pp512_takes_4x6_tiles_16_rows_a_job_on_avx512():
    """sgemm.cpp matmul, VECTOR_REGISTERS 32: m % 16 == 0 and m / 16 >= nth -> mnpack<4, 6, 4>(..., BN 12); 512
    tokens in blocks of BLOCK_SIZE<6>(512) = 6."""
    assert GS.tile_plan(512, 512, 2048, 2, registers=32, kn=16) == (6, 4, 12)


def test_avx2_takes_4x3_tiles_and_24_token_tiles_a_job():
    """VECTOR_REGISTERS 16: mnpack<4, 3, 4>(..., BN 24)."""
    assert GS.tile_plan(512, 512, 2048, 2, registers=16, kn=8) == (3, 4, 24)


@pytest.mark.parametrize("n, rn", [(1, 1), (6, 6), (7, 4), (13, 5), (25, 5), (65, 6)])
def test_tokens_are_split_into_even_blocks_of_at_most_6(n, rn):
    """BLOCK_SIZE<6>(n) = ceil(n / ceil(n / 6)): 7 tokens as 4 + 3, 13 as 5 + 4 + 4, 25 as 5 x 5, 65 as
    10 x 6 + 5."""
    assert GS.tile_plan(64, n, 64, 1, registers=32, kn=16)[0] == rn


@pytest.mark.parametrize("m, nth, bm", [(64, 2, 4), (16, 2, 2), (24, 1, 2), (20, 1, 1)])
def test_rows_a_job_are_16_only_where_every_thread_gets_a_job(m, nth, bm):
    """BM 4 where m % 16 == 0 and m / 16 >= nth, else 2 where m % 8 == 0, else 1."""
    assert GS.tile_plan(m, 8, 64, nth, registers=32, kn=16)[1] == bm


@pytest.mark.parametrize("m, k", [(18, 64), (64, 40)])
def test_llamafile_declines_rows_not_a_multiple_of_4_or_k_of_a_vector(m, k):
    """matmul returns false (ggml then runs its vec_dot loop): m % 4, k % KN."""
    assert GS.tile_plan(m, 8, k, 1, registers=32, kn=16) is None
    assert GS.sgemm(np.zeros((m, k), np.uint16), np.zeros((8, k), np.float32), np.zeros((8, m), np.float32), 1) is False


@needs_f16c
def test_activations_become_f16_rounded_to_nearest_even():
    """ggml's from_float into wdata (vcvtps2ph): the same bits as numpy's float16 cast."""
    x = np.random.default_rng(0).standard_normal((5, 4 * GS.KN)).astype(np.float32) * 100
    out = np.empty(x.shape, np.uint16)
    GS.to_f16(x, out, numba.get_num_threads())
    assert np.array_equal(out, x.astype(np.float16).view(np.uint16))


def _check(w, x, out):
    wf = w.view(np.float16).astype(np.float64) if w.dtype == np.uint16 else w.astype(np.float64)
    xf = x.astype(np.float16).astype(np.float64) if w.dtype == np.uint16 else x.astype(np.float64)
    ref = xf @ wf.T
    scale = np.abs(xf) @ np.abs(wf).T  # float rounding of a k-long sum, relative to the sum of |products|
    assert np.all(np.abs(out - ref) <= 2e-6 * scale * np.sqrt(w.shape[1]) + 1e-30)


@needs_f16c
@settings(max_examples=40, deadline=None)
@given(m=st.sampled_from([4, 8, 12, 16, 24, 48, 64]), n=st.integers(1, 40), kb=st.integers(1, 12),
       f16=st.booleans(), seed=st.integers(0, 2**16))
def test_products_equal_the_f16_values_products_whatever_the_tiles(m, n, kb, f16, seed):
    """out[t, r] = sum_l x[t, l] w[r, l] over every tile shape and job split tinyBLAS makes of m x n x k."""
    rng = np.random.default_rng(seed)
    k = kb * GS.KN
    w = rng.standard_normal((m, k)).astype(np.float32)
    w = w.astype(np.float16).view(np.uint16) if f16 else w
    x = rng.standard_normal((n, k)).astype(np.float32)
    out = np.full((n, m), np.nan, np.float32)
    assert GS.sgemm(w, x, out, numba.get_num_threads())
    _check(w, x, out)


@needs_f16c
def test_a_projection_of_512_tokens_on_two_threads():
    """The calibrate job's shape: 512 rows of 2048, 512 tokens, every output written once."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((512, 2048)).astype(np.float32) * 0.02).astype(np.float16).view(np.uint16)
    x = rng.standard_normal((512, 2048)).astype(np.float32)
    out = np.full((512, 512), np.nan, np.float32)
    assert GS.sgemm(w, x, out, 2)
    _check(w, x, out)
