"""ggml's prefill structures rebuilt on this machine (calibration.bench_ggml_prefill): a dot product per (row, token)
in 16 x 16 blocks with ggml's int8 vec_dot, and a gemv per token over each thread's share of rows (repacked Q4_0).
Each must compute the whole product."""
import numpy as np
import pytest
from gguf import dequantize

from calibration.bench_kernel import _synth_tensor
from calibration.ggml_tiled import HAVE_TILED, TILED_ISA
from executor.simd import HAVE_AVX2

avx2 = pytest.mark.skipif(not HAVE_AVX2, reason="ggml's vec_dot is rebuilt for AVX2 only")


def _experts(fmt: str, n_exp: int, rows: int, cols: int, tokens: int):
    """(flat bytes [E, ...], code, x [E, T, cols], dequantised weights [E, rows, cols]) of synthetic experts."""
    rng = np.random.default_rng(5)
    w = _synth_tensor(fmt, n_exp, rows, cols, rng)
    flat = w.data.reshape(n_exp, -1)
    x = rng.standard_normal((n_exp, tokens, cols)).astype(np.float32)
    deq = np.stack([dequantize(w.data[e], w.qtype).reshape(rows, cols) for e in range(n_exp)])
    return flat, w.code, x, deq


@avx2
@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "IQ4_NL"])
def test_vecdot_blocks_are_ggml_arithmetic_for_every_row_and_token(fmt):
    """2 experts, 40 rows x 20 tokens (neither a multiple of the 16 x 16 block) of `fmt`: each output is the
    dequantised row . the token quantised to Q8_0 (ggml's int8 activations), to float rounding."""
    from calibration.bench_ggml_prefill import _vecdot_matrix, quantize_q8_0
    flat, code, x, deq = _experts(fmt, 2, 40, 256, 20)
    x8, dx = quantize_q8_0(x)
    xq = x8.astype(np.float32) * np.repeat(dx, 32, axis=2)  # [E, T, cols]
    ref = np.einsum("erc,etc->etr", deq, xq)
    out = np.zeros_like(ref)
    _vecdot_matrix(flat, code, 40, x8, dx, out)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_q8_0_activations_are_within_half_a_step_of_the_input():
    """ggml's quantize_row_q8_0: x8 = round(x 127 / max|x|) per 32-block, within half a step of x 127 / max|x|; the
    scale max|x| / 127 kept as an fp16 (within 2^-11 of it, relative)."""
    from calibration.bench_ggml_prefill import quantize_q8_0
    x = np.random.default_rng(1).standard_normal((2, 3, 64)).astype(np.float32)
    x8, dx = quantize_q8_0(x)
    m = np.abs(x.reshape(2, 3, 2, 32)).max(axis=3)
    assert np.all(np.abs(x.reshape(2, 3, 2, 32) * (127 / m)[..., None] - x8.reshape(2, 3, 2, 32)) <= 0.5 + 1e-5)
    assert np.all(np.abs(dx - m / 127) <= 2.0 ** -11 * m / 127)
    assert np.allclose(np.abs(x8).max(axis=2), 127)


def _q4_0x8_rows(flat: np.ndarray, rows: int) -> np.ndarray:
    """An expert's bytes read as llama.cpp's block_q4_0x8 (repack.cpp: 8 rows' blocks side by side, their 8 fp16
    scales, then 128 bytes; row k's values j and j + 16 in the low / high nibble of byte 64 (j % 16 // 8) +
    32 (k // 4) + 8 (k % 4) + j % 8, stored xor 8, so a nibble n is n for n < 8, else n - 16) -> [rows, cols]."""
    blocks = flat.reshape(rows // 8, -1, 144)  # [groups, nb, 144]
    d = blocks[..., :16].copy().view(np.float16).astype(np.float32)  # [groups, nb, 8]
    qs = blocks[..., 16:].astype(np.int32)
    j = np.arange(32)
    k = np.arange(8)[:, None]
    byte = qs[..., 64 * ((j % 16) // 8) + 32 * (k // 4) + 8 * (k % 4) + j % 8]  # [groups, nb, 8, 32]
    nib = np.where(j < 16, byte & 15, byte >> 4)
    vals = np.where(nib < 8, nib, nib - 16) * d[..., None]
    return vals.transpose(0, 2, 1, 3).reshape(rows, -1)


@avx2
def test_repacked_gemv_is_ggml_arithmetic_for_every_row_and_token():
    """2 experts, 48 rows (6 groups of 8: the threads' eighth-aligned shares) x 6 tokens, as block_q4_0x8: each
    output is the row's values . the token quantised to Q8_0, to float rounding (ggml's q4_0 8x8 gemv)."""
    from calibration.bench_ggml_prefill import _repacked_matrix, quantize_q8_0
    rng = np.random.default_rng(7)
    blocks = rng.integers(0, 256, (2, 6 * 8, 144), dtype=np.uint8)  # [E, groups x blocks, 144]: 256 columns
    blocks[..., :16] = rng.uniform(0.5, 1.5, (2, 48, 8)).astype(np.float16).view(np.uint8)
    flat = blocks.reshape(2, -1)
    x = rng.standard_normal((2, 6, 256)).astype(np.float32)
    x8, dx = quantize_q8_0(x)
    xq = x8.astype(np.float32) * np.repeat(dx, 32, axis=2)
    ref = np.stack([_q4_0x8_rows(flat[e], 48) @ xq[e].T for e in range(2)]).transpose(0, 2, 1)  # [E, T, rows]
    out = np.full((2, 6, 48), np.nan, np.float32)
    _repacked_matrix(flat, 48, x8, dx, out, 4)  # 4 shares: 16, 8, 16, 8 rows (eighth-aligned)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@avx2
def test_a_job_counts_its_routed_flops():
    """tokens x top_k / experts tokens an expert, 2 FLOPs a weight, three matrices: 6 h f per expert-token."""
    from calibration.bench_ggml_prefill import ggml_prefill_job
    run, flops = ggml_prefill_job("Q8_0", "vecdot", hidden=256, ffn=64, n_experts=4, top_k=2, tokens=8)
    run()
    assert flops == 6 * 256 * 64 * (8 * 2 // 4) * 4


def test_structures_without_a_rebuild_are_refused():
    """Repacked Q8_0 (ARM only) and IQ4_NL are not rebuilt here; ggml tiles no Q8_0."""
    from calibration.bench_ggml_prefill import ggml_prefill_job
    for fmt, path in (("Q8_0", "tiled"), ("Q8_0", "repacked"), ("IQ4_NL", "repacked"), ("Q8_0", "gemm")):
        with pytest.raises(ValueError, match="no rebuild of ggml's"):
            ggml_prefill_job(fmt, path)


def test_calibrate_times_the_rebuilt_paths_llamacpp_takes_on_this_isa():
    """AVX2: Q4_0 in place and repacked, Q8_0 and IQ4_NL in place, Q4_K repacked (calibration.ggml_gemv_q4_k); the
    K-quants' tiled GEMM (VNNI only), IQ4_NL repacked and F16 are not rebuilt; without AVX2 (an ARM CPU here) ggml's
    kernels are other code and nothing is timed."""
    from calibration.bench_ggml_prefill import profile_jobs
    fmts = ("Q4_0", "Q8_0", "F16", "Q4_K", "Q6_K", "IQ4_NL")
    assert profile_jobs(fmts, ["avx", "avx2"]) == [("Q4_0", "vecdot"), ("Q4_0", "repacked"), ("Q8_0", "vecdot"),
                                                   ("Q4_K", "repacked"), ("IQ4_NL", "vecdot")]
    assert profile_jobs(("Q8_0", "Q4_K"), ["asimd"]) == []


def test_calibrate_times_the_tiled_gemm_where_ggml_compiles_its_vnni_microtile():
    """AVX-512 with VNNI: the K-quants and IQ4_XS in place take ggml's tiled GEMM (calibration.ggml_tiled), timed
    where this CPU runs the rebuild; Q6_K is never repacked, Q4_K repacks too (its gemv timed as well)."""
    from calibration.bench_ggml_prefill import profile_jobs
    jobs = profile_jobs(("Q8_0", "Q4_K", "Q6_K", "IQ4_XS"), ["avx", "avx2", *TILED_ISA])
    tiled = [(f, p) for f in ("Q4_K", "Q6_K", "IQ4_XS") for p in ("tiled", "tiled-narrow")]
    assert jobs == [("Q8_0", "vecdot"), ("Q4_K", "repacked")] + (tiled if HAVE_TILED else [])


@avx2
@pytest.mark.parametrize("fmt", ["Q4_K", "Q2_K"])
def test_a_repacked_k_quant_job_runs_its_own_ggml_gemv(fmt):
    """Q4_K / Q2_K SwiGLU experts repacked, 16 tokens an expert: 6 h f FLOPs per expert-token through ggml's q4_K /
    q2_K 8x8 gemv on Q8_K tokens."""
    from calibration.bench_ggml_prefill import ggml_prefill_job, label
    run, flops = ggml_prefill_job(fmt, "repacked", hidden=512, ffn=256, n_experts=4, top_k=2, tokens=32)
    run()
    assert flops == 6 * 512 * 256 * 16 * 4
    assert f"{fmt[:2].lower()}_K 8x8 int8 gemv on Q8_K tokens" in label(fmt, "repacked", 512, 256)
    assert "q4_0 8x8 int8 gemv" in label("Q4_0", "repacked", 512, 256)


@avx2
@pytest.mark.parametrize("fmt", ["Q4_K", "Q2_K"])
def test_repacked_k_quant_gemv_is_the_dequantised_product_for_every_row_and_token(fmt):
    """2 experts, 48 rows x 512 copied into llama.cpp's block_q4_Kx8 / block_q2_Kx8, 5 tokens, on 4 threads'
    eighth-aligned shares: each output is the row's dequantised values . the token quantised to Q8_K, to float
    rounding (ggml's q4_K / q2_K 8x8 gemv)."""
    from calibration.bench_ggml_prefill import REPACK_X8, _repacked_matrix
    from calibration.ggml_tiled import quantize_q8_k
    rng = np.random.default_rng(8)
    w = _synth_tensor(fmt, 2, 48, 512, rng)
    flat = np.stack([REPACK_X8[fmt](w.data[e].reshape(-1), 48).reshape(-1) for e in range(2)])
    x8, dx, bs = quantize_q8_k(rng.standard_normal((2, 5, 512)).astype(np.float32))
    xq = (x8.astype(np.float64).reshape(2, 5, 2, 256) * dx[..., None]).reshape(2, 5, 512)
    ref = np.stack([dequantize(w.data[e], w.qtype).reshape(48, 512) @ xq[e].T for e in range(2)]).transpose(0, 2, 1)
    out = np.full((2, 5, 48), np.nan, np.float32)
    _repacked_matrix(flat, 48, x8, dx, out, 4, bs, w.code)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_q2_k_is_timed_repacked_where_llamacpp_repacks_it_on_avx512():
    """llama.cpp repacks Q2_K only on a CPU with AVX-512 F (ggml_repack_get_optimal_repack_type): there its gemv is
    timed; on AVX2 alone Q2_K stays in place (its tiled GEMM, where this CPU runs the rebuild)."""
    from calibration.bench_ggml_prefill import profile_jobs
    assert ("Q2_K", "repacked") in profile_jobs(("Q2_K",), ["avx", "avx2", "avx512f"])
    assert ("Q2_K", "repacked") not in profile_jobs(("Q2_K",), ["avx", "avx2"])


@pytest.mark.skipif(not HAVE_TILED, reason="ggml's VNNI microtile needs AVX-512 VNNI")
def test_a_tiled_job_runs_ggmls_three_products():
    """Q4_K SwiGLU experts, 16 tokens an expert: 6 h f FLOPs per expert-token, as the vec_dot job counts them."""
    from calibration.bench_ggml_prefill import ggml_prefill_job, label
    run, flops = ggml_prefill_job("Q4_K", "tiled", hidden=512, ffn=256, n_experts=4, top_k=2, tokens=32)
    run()
    assert flops == 6 * 512 * 256 * 16 * 4
    assert "VNNI microtiles" in label("Q4_K", "tiled", 512, 256)


def test_the_narrow_path_is_timed_at_sixteen_tokens_an_expert():
    """calibrate's batch (64 tokens, each on all of 4 experts) shrinks to 16 tokens for the tiled GEMM's narrow path;
    every other path keeps it."""
    from calibration.bench_ggml_prefill import job_tokens
    assert job_tokens("tiled-narrow", 64, 4, 4) == 16
    assert job_tokens("tiled-narrow", 64, 32, 8) == 64
    assert job_tokens("tiled", 64, 4, 4) == job_tokens("vecdot", 64, 4, 4) == 64


def test_calibrate_times_llamas_f16_dense_products_where_llamafile_takes_them():
    """llamafile's tinyBLAS takes F16 weights with AVX-512 F, or AVX2 and F16C (calibration.ggml_sgemm): calibrate
    times that dense job there (where this CPU runs the rebuild), nowhere else."""
    from calibration.bench_ggml_prefill import dense_job
    from calibration.ggml_sgemm import HAVE_F16C
    assert dense_job(["avx", "avx2", "f16c"]) == (("F16", "sgemm") if HAVE_F16C else None)
    assert dense_job(["avx", "avx2"]) is None and dense_job(["asimd"]) is None


@pytest.mark.skipif(not HAVE_AVX2, reason="tinyBLAS's F16 path is rebuilt for x86")
def test_the_dense_job_runs_an_attention_blocks_four_products():
    """hidden 256, head_dim 64: one query head (64 rows), one K and one V head, the output projection back to
    256; 2 FLOPs a weight and token, as the simulator counts the dense path."""
    from calibration.bench_ggml_prefill import ggml_dense_prefill_job, label
    run, flops = ggml_dense_prefill_job(hidden=256, head_dim=64, tokens=24)
    run()
    assert flops == 2 * 24 * (64 * 256 + 64 * 256 + 64 * 256 + 256 * 64)
    assert "tinyBLAS" in label("F16", "sgemm", 256, 0)
