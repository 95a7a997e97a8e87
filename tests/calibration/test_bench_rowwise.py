"""llama.cpp's structure on this machine (calibration.bench_rowwise): one row per dot product in 64-row
chunks, no software prefetch; and its repacked Q4_0, 8 interleaved rows a pass. Where ggml's arithmetic is rebuilt
(Q8_0, Q4_0, IQ4_NL: int8 vec_dot, the q4_0 8x8 gemv; the K-quants and IQ4_XS on a Q8_K token) the jobs run it and must compute ggml's product (the weights . the
token quantised to Q8_0); the other formats run the executor's rows (same arithmetic, only the access pattern
differs) and must compute what they compute. Each job must time like the executor's job does."""
import numpy as np
import pytest
from gguf import dequantize

from calibration.bench_kernel import _synth_tensor, bench_expert_kernel

from calibration.bench_rowwise import (FORMATS, GGML_INT8_FORMATS, REPACKED_FORMATS, _rowwise_matvec,
                                       label, repacked_expert_job, rowwise_expert_job)
from executor import kernels as K
from executor.vnni import HAVE_VNNI512

from .test_bench_ggml_prefill import _q4_0x8_rows


@pytest.mark.parametrize("fmt", FORMATS)
def test_rowwise_matvec_is_the_executors_product(fmt):
    """The executor's single-row arithmetic, which the formats without a ggml rebuild run: 300 rows (not a multiple
    of the 64-row chunk) x 512 of real `fmt` blocks, on 1 and 3 threads' chunks in turn, the rowwise product equal to
    kernels._matmul (8-row groups with prefetch) bit for bit; Q4_0 on an AVX-512 VNNI CPU, whose executor rows sum the
    offset term in 8 lanes (vnni.py) where the rowwise loop runs simd.py's, to float rounding (1e-6 of the terms)."""
    rng = np.random.default_rng(3)
    w = _synth_tensor(fmt, 1, 300, 512, rng)
    flat = w.data.reshape(1, -1)[0]
    x = rng.standard_normal((1, 512)).astype(np.float32)
    b = np.zeros((1, 300), np.float32)
    K._matmul(flat, w.code, 300, x, b)
    rounding = fmt == "Q4_0" and HAVE_VNNI512
    mag = np.abs(x) @ np.abs(dequantize(w.data[0], w.qtype).reshape(300, 512)).T if rounding else None
    for nthr in (1, 3):
        a = np.zeros((1, 300), np.float32)
        _rowwise_matvec(flat, w.code, 300, x, a, nthr)
        assert np.abs(b).max() > 0
        if rounding:
            assert (np.abs(a - b) <= 1e-6 * mag).all()
        else:
            assert np.array_equal(a, b)


def test_rowwise_job_times_like_an_expert_job():
    """k SwiGLU experts per job (gate, up, down), fitted as the executor's job: bytes per expert as the
    format's rows, a positive rate."""
    run, eb = rowwise_expert_job("Q4_K", hidden=256, ffn=256, pool_bytes=1 << 20, max_k=4)
    assert eb == 3 * 256 * 144  # 256 rows of one 256-weight super-block (144 bytes), three matrices
    kf = bench_expert_kernel(run, [1, 2, 4], eb, repeats=3, threads=1, budget_s=1.0)
    assert kf.expert_gbs > 0 and len(kf.t_ms) == 3


def test_a_format_without_a_single_row_kernel_is_refused():
    with pytest.raises(ValueError, match="no single-row kernel for Q5_0"):
        rowwise_expert_job("Q5_0")


def _q8_0_token(x: np.ndarray) -> np.ndarray:
    """x [1, n] as ggml computes with it: quantised to Q8_0 (int8 and a scale a 32-block), back in float32."""
    from calibration.bench_ggml_prefill import quantize_q8_0
    x8, dx = quantize_q8_0(x[None])
    return (x8.astype(np.float32) * np.repeat(dx, 32, axis=2))[0, 0]


@pytest.mark.skipif(not GGML_INT8_FORMATS, reason="ggml's vec_dot is rebuilt for AVX2 only")
@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "IQ4_NL"])
def test_rowwise_matvec_of_a_rebuilt_format_is_ggml_arithmetic_for_every_expert(fmt):
    """Experts 2, 0, 3 of four, 300 rows (not a multiple of the 64-row chunk) x 512 of real `fmt` blocks, in one
    parallel region, the chunks handed to 1 and 3 threads in turn: output j is expert es[j]'s dequantised rows . the
    token quantised to Q8_0, to float rounding."""
    from calibration.bench_rowwise import _ggml_matvec
    rng = np.random.default_rng(3)
    w = _synth_tensor(fmt, 4, 300, 512, rng)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    es = np.array([2, 0, 3], np.int64)
    ref = np.stack([dequantize(w.data[e], w.qtype).reshape(300, 512) @ _q8_0_token(x) for e in es])
    for nthr in (1, 3):
        out = np.full((3, 300), np.nan, np.float32)
        _ggml_matvec(w.data.reshape(4, -1), es, w.code, 300, x, out, nthr)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.skipif(not GGML_INT8_FORMATS, reason="ggml's vec_dot is rebuilt for AVX2 only")
@pytest.mark.parametrize("fmt", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"])
def test_rowwise_matvec_of_a_rebuilt_k_quant_is_ggml_arithmetic_on_a_q8_k_token(fmt):
    """Experts 2, 0, 3 of four, 300 rows x 512 of Q2_K / Q3_K / Q4_K / Q5_K / Q6_K / IQ4_XS, the chunks handed to 1 and 3 threads
    in turn: output j is expert es[j]'s dequantised rows . the token quantised to Q8_K, to float rounding
    (ggml_vec_dot_<type>_q8_K, calibration.ggml_vec_dot_k)."""
    from calibration.bench_rowwise import _ggml_matvec
    from calibration.ggml_tiled import quantize_q8_k
    rng = np.random.default_rng(4)
    w = _synth_tensor(fmt, 4, 300, 512, rng)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    es = np.array([2, 0, 3], np.int64)
    x8, dx, _ = quantize_q8_k(x[None])
    xq = (x8[0, 0].astype(np.float64).reshape(-1, 256) * dx[0, 0][:, None]).reshape(512)
    ref = np.stack([dequantize(w.data[e], w.qtype).reshape(300, 512) @ xq for e in es])
    for nthr in (1, 3):
        out = np.full((3, 300), np.nan, np.float32)
        _ggml_matvec(w.data.reshape(4, -1), es, w.code, 300, x, out, nthr)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.skipif(not REPACKED_FORMATS, reason="no AVX2: llama.cpp repacks nothing 8 rows at a time here")
def test_repacked_matvec_is_ggml_gemv_arithmetic_for_every_expert():
    """Experts 1 and 0 of two, 96 rows x 256 in llama.cpp's block_q4_0x8 layout, on 3 threads' eighth-aligned shares
    (32, 32, 32 rows): output j is expert es[j]'s rows . the token quantised to Q8_0, to float rounding (ggml's q4_0
    8x8 gemv)."""
    from calibration.bench_rowwise import _repacked_matvec
    rng = np.random.default_rng(5)
    blocks = rng.integers(0, 256, (2, 12 * 8, 144), dtype=np.uint8)  # [E, row groups x blocks, 144]: 256 columns
    blocks[..., :16] = rng.uniform(0.5, 1.5, (2, 96, 8)).astype(np.float16).view(np.uint8)
    flat = blocks.reshape(2, -1)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    es = np.array([1, 0], np.int64)
    out = np.full((2, 96), np.nan, np.float32)
    _repacked_matvec(flat, es, 96, x, out, 3)
    ref = np.stack([_q4_0x8_rows(flat[e], 96) @ _q8_0_token(x) for e in es])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.skipif(not REPACKED_FORMATS, reason="no AVX2: llama.cpp repacks nothing 8 rows at a time here")
@pytest.mark.parametrize("fmt", ["Q4_K", "Q2_K"])
def test_repacked_k_quant_matvec_is_its_ggml_gemv_arithmetic_for_every_expert(fmt):
    """Experts 1 and 0 of two, 96 rows x 512 of Q4_K / Q2_K copied into llama.cpp's block_q4_Kx8 / block_q2_Kx8
    layout, on 3 threads' eighth-aligned shares: output j is expert es[j]'s rows . the token quantised to Q8_K, to
    float rounding (ggml's q4_K / q2_K 8x8 gemv, calibration.ggml_gemv_q4_k / _q2_k)."""
    from calibration.bench_ggml_prefill import REPACK_X8
    from calibration.bench_rowwise import _repacked_k_matvec
    from calibration.ggml_tiled import quantize_q8_k
    rng = np.random.default_rng(6)
    w = _synth_tensor(fmt, 2, 96, 512, rng)
    flat = np.stack([REPACK_X8[fmt](w.data[e].reshape(-1), 96).reshape(-1) for e in range(2)])
    x = rng.standard_normal((1, 512)).astype(np.float32)
    es = np.array([1, 0], np.int64)
    out = np.full((2, 96), np.nan, np.float32)
    _repacked_k_matvec(flat, w.code, es, 96, x, out, 3)
    x8, dx, _ = quantize_q8_k(x[None])
    xq = (x8[0, 0].astype(np.float64).reshape(-1, 256) * dx[0, 0][:, None]).reshape(512)
    ref = np.stack([dequantize(w.data[e], w.qtype).reshape(96, 512) @ xq for e in es])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.skipif(not GGML_INT8_FORMATS, reason="ggml's vec_dot is rebuilt for AVX2 only")
def test_a_rebuilt_formats_job_times_like_an_expert_job_and_says_its_arithmetic():
    """Q8_0's rowwise job (ggml's vec_dot, three ops a token): bytes per expert as Q8_0's rows, a positive rate; its
    label names ggml's int8 vec_dot, the rebuilt K-quants' ggml's with a Q8_K token, F16's ggml's vec_dot_f16."""
    run, eb = rowwise_expert_job("Q8_0", hidden=256, ffn=256, pool_bytes=1 << 20, max_k=4)
    assert eb == 3 * 256 * 8 * 34  # 256 rows of 8 blocks (34 bytes), three matrices
    kf = bench_expert_kernel(run, [1, 2, 4], eb, repeats=3, threads=1, budget_s=1.0)
    assert kf.expert_gbs > 0 and len(kf.t_ms) == 3
    assert "ggml's int8 vec_dot" in label("Q8_0", 256, 256) and "vec_dot_f16" in label("F16", 256, 256)
    for fmt in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"):
        assert "ggml's int8 vec_dot, Q8_K token" in label(fmt, 256, 256)


@pytest.mark.skipif(not REPACKED_FORMATS, reason="no AVX2")
@pytest.mark.parametrize("fmt, bytes_per_256", [("Q4_0", 8 * 18), ("Q4_K", 144), ("Q2_K", 84)])
def test_repacked_job_times_like_an_expert_job(fmt, bytes_per_256):
    """The repacked job of Q4_0, of Q4_K and of Q2_K: three ops a token (gate, up, down of all k experts), bytes per
    expert as the format's rows; its label names the format's gemv."""
    run, eb = repacked_expert_job(fmt, hidden=256, ffn=256, pool_bytes=1 << 20, max_k=4)
    assert eb == 3 * 256 * bytes_per_256  # 256 rows of 256 weights, three matrices
    kf = bench_expert_kernel(run, [1, 2, 4], eb, repeats=3, threads=1, budget_s=1.0)
    assert kf.expert_gbs > 0 and len(kf.t_ms) == 3
    assert f"{fmt.lower().replace('_k', '_K')} 8x8" in label(fmt, 256, 256, repacked=True)


def test_a_format_llama_cpp_does_not_repack_here_is_refused():
    with pytest.raises(ValueError, match="no repacked kernel for Q8_0"):
        repacked_expert_job("Q8_0")
