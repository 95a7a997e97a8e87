"""ggml's tiled K-quant GEMM rebuilt (calibration.ggml_tiled): its products are the dequantised weights times the
tokens as ggml quantises them (Q8_K), exact integer sums, on both of its paths (narrow: 16 tokens or fewer an expert;
standard: 256-wide slabs, windows of 256 tokens), for every type it takes in the stored models."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize

from calibration import ggml_tiled as GT
from calibration.bench_kernel import _synth_tensor

tiled = pytest.mark.skipif(not GT.HAVE_TILED, reason="ggml's VNNI microtile needs AVX-512 VNNI")


def _products(fmt: str, tokens: int, rows: int = 128, cols: int = 1024, experts: int = 2, seed: int = 0):
    """(tiled products, float64 reference) for `experts` synthetic experts of `fmt` and `tokens` tokens each."""
    rng = np.random.default_rng(seed)
    t = _synth_tensor(fmt, experts, rows, cols, rng)
    a = rng.standard_normal((experts, tokens, cols)).astype(np.float32)
    x8, dx, bs = GT.quantize_q8_k(a)
    out = np.zeros((experts, tokens, rows), np.float32)
    GT.tiled_matrix(GT.CODES[fmt], t.data.reshape(experts, -1), rows, x8, dx, bs, out, 2)
    w = dequantize(t.data.reshape(experts * rows, -1), QT[fmt]).reshape(experts, rows, cols).astype(np.float64)
    x = (x8.astype(np.float64).reshape(experts, tokens, cols // 256, 256) * dx[..., None]).reshape(experts, tokens, cols)
    return out, np.einsum("erk,etk->etr", w, x)


@tiled
@pytest.mark.parametrize("fmt", list(GT.TILED_TYPES))
@pytest.mark.parametrize("tokens", [9, 16, 40, 300])
def test_tiled_products_are_the_dequantised_weights_times_the_q8_k_tokens(fmt, tokens):
    """9 and 16 tokens an expert take the narrow path, 40 the standard one, 300 two windows (256 + 44); integer
    sums are exact, so only float rounding is left: max error 1.4e-7 of the largest product, when written."""
    out, ref = _products(fmt, tokens)
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


@tiled
@pytest.mark.parametrize("rows", [80, 72])
def test_a_ragged_last_group_is_stored_whole(rows):
    """A last 64-row group of 16 or 8 rows: the window's store (16-row runs a token, as tiled_store_window_scatter, then
    the rows past the last whole 16) writes every product, standard path and two windows."""
    for tokens in (40, 300):
        out, ref = _products("Q4_K", tokens, rows=rows)
        assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


def test_q8_k_maps_the_largest_magnitude_to_minus_127():
    """ggml's quantize_row_q8_K_ref: iscale = -127 / (the value of largest |x|), codes capped at 127, d = 1 / iscale,
    bsums the sums of each 16 codes."""
    x = np.linspace(-1.0, 2.0, 256, dtype=np.float32)
    x8, dx, bs = (np.empty(256, np.int8), np.empty(1, np.float32), np.empty(16, np.int32))
    GT.quantize_row_q8_k(x, x8, dx, bs)
    assert x8[-1] == -127 and x8[0] == 64
    assert dx[0] == pytest.approx(-2.0 / 127)
    assert list(bs) == [int(x8[16 * s:16 * s + 16].astype(np.int32).sum()) for s in range(16)]


def test_a_zero_block_quantises_to_zero():
    x8, dx, bs = (np.ones(256, np.int8), np.ones(1, np.float32), np.ones(16, np.int32))
    GT.quantize_row_q8_k(np.zeros(256, np.float32), x8, dx, bs)
    assert not x8.any() and dx[0] == 0 and not bs.any()


def test_the_narrow_path_keeps_sixteen_rows_in_l1():
    """ggml_tiled_narrow_k_extent: 31 KiB / (16 + max(tokens, 16)) bytes a K element, down to a multiple of 256
    that divides K: 2048 at 16 tokens -> 768 does not divide, 512; K = 768 -> 768; 2 tokens as 16; a K with no
    such multiple -> 0."""
    assert GT.narrow_k_extent(16, 2048) == 512
    assert GT.narrow_k_extent(16, 768) == 768
    assert GT.narrow_k_extent(2, 2048) == GT.narrow_k_extent(16, 2048)
    assert GT.narrow_k_extent(16, 256 * 7) == 256 * 7 // 7  # 1792: 768 and 512 do not divide it, 256 does
    assert GT.narrow_k_extent(16, 100) == 0


def test_every_type_ggml_tiles_in_the_stored_models_is_rebuilt():
    """The stored K-quant files mix Q2_K .. Q6_K; IQ4_XS is its own file (specs.formats.LLAMACPP_TILED_TYPES)."""
    from specs.formats import LLAMACPP_TILED_TYPES
    assert set(GT.TILED_TYPES) == {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}
    assert set(GT.TILED_TYPES) <= set(LLAMACPP_TILED_TYPES)
