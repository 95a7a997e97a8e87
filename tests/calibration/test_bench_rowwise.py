"""llama.cpp's structure on this machine (calibration.bench_rowwise): one row per dot product in 64-row
chunks, no software prefetch; and its repacked Q4_0, 8 interleaved rows a pass. It must compute what the executor's kernels compute (same arithmetic,
only the access pattern differs), and its job must time like the executor's job does."""
import numpy as np
import pytest

from calibration.bench_kernel import _synth_tensor, bench_expert_kernel
from numba.typed import List

from calibration.bench_rowwise import (FORMATS, REPACKED_FORMATS, _repacked_matvec, _rowwise_matvec,
                                       repacked_expert_job, rowwise_expert_job)
from executor import kernels as K


@pytest.mark.parametrize("fmt", FORMATS)
def test_rowwise_matvec_is_the_executors_product_bitwise(fmt):
    """300 rows (not a multiple of the 64-row chunk) x 512 of real `fmt` blocks: the rowwise product equals
    kernels._matmul (8-row groups with prefetch) bit for bit."""
    rng = np.random.default_rng(3)
    w = _synth_tensor(fmt, 1, 300, 512, rng)
    flat = w.data.reshape(1, -1)[0]
    x = rng.standard_normal((1, 512)).astype(np.float32)
    a, b = np.zeros((1, 300), np.float32), np.zeros((1, 300), np.float32)
    _rowwise_matvec(flat, w.code, 300, x, a)
    K._matmul(flat, w.code, 300, x, b)
    assert np.array_equal(a, b) and np.abs(b).max() > 0


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


def _interleave(data: np.ndarray, rows: int, bs: int, nr: int = 8) -> np.ndarray:
    """Row-major blocks [rows, nb, bs] -> llama.cpp's repacked order: each group of nr rows block by block."""
    nb = data.size // rows // bs
    return np.ascontiguousarray(data.reshape(rows // nr, nr, nb, bs).transpose(0, 2, 1, 3)).reshape(-1)


@pytest.mark.skipif(not REPACKED_FORMATS, reason="no AVX2: llama.cpp repacks nothing 8 rows at a time here")
def test_repacked_matvec_is_the_executors_product_bitwise():
    """Two experts of 96 rows x 512 Q4_0, their blocks interleaved 8 rows at a time as llama.cpp repacks them:
    the repacked product (8 rows a pass, each thread a contiguous share) equals kernels._matmul on the
    row-major original bit for bit (the same blocks and arithmetic, another order of reading)."""
    rng = np.random.default_rng(5)
    w = _synth_tensor("Q4_0", 2, 96, 512, rng)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    got, want = np.zeros((2, 96), np.float32), np.zeros((2, 96), np.float32)
    _repacked_matvec(List([_interleave(w.data[e], 96, 18) for e in range(2)]), w.code, 96, x, got, 3)  # 3 shares of 32 rows
    for e in range(2):
        K._matmul(w.data[e].reshape(-1), w.code, 96, x, want[e:e + 1])
    assert np.array_equal(got, want) and np.abs(want).max() > 0


@pytest.mark.skipif(not REPACKED_FORMATS, reason="no AVX2")
def test_repacked_job_times_like_an_expert_job():
    """The repacked job: three ops a token (gate, up, down of all k experts), bytes per expert as Q4_0's rows."""
    run, eb = repacked_expert_job("Q4_0", hidden=256, ffn=256, pool_bytes=1 << 20, max_k=4)
    assert eb == 3 * 256 * 8 * 18  # 256 rows of 8 blocks (18 bytes), three matrices
    kf = bench_expert_kernel(run, [1, 2, 4], eb, repeats=3, threads=1, budget_s=1.0)
    assert kf.expert_gbs > 0 and len(kf.t_ms) == 3


def test_a_format_llama_cpp_does_not_repack_here_is_refused():
    with pytest.raises(ValueError, match="no repacked kernel for Q8_0"):
        repacked_expert_job("Q8_0")
