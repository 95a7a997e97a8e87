"""llama.cpp's structure on this machine (calibration.bench_rowwise): one row per dot product in 64-row
chunks, no software prefetch. It must compute what the executor's kernels compute (same arithmetic,
only the access pattern differs), and its job must time like the executor's job does."""
import numpy as np
import pytest

from calibration.bench_kernel import _synth_tensor, bench_expert_kernel
from calibration.bench_rowwise import FORMATS, _rowwise_matvec, rowwise_expert_job
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
    with pytest.raises(ValueError, match="no single-row kernel for IQ4_XS"):
        rowwise_expert_job("IQ4_XS")
