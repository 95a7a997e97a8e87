"""ggml's multiply of the expert outputs by their router weights, rebuilt (calibration.ggml_binary): the products, the
loop's dependency chain through a vector register, and the job calibrate times."""
import platform

import numba
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from calibration.ggml_binary import _apply_mul, weight_expert_outputs, weighting_job


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 9), st.integers(1, 8), st.integers(1, 70), st.integers(1, 3), st.integers(0, 2**31))
def test_products_are_the_outputs_times_their_weights(n, k, hidden, nthr, seed):
    """out [n, k, hidden] = experts x weights broadcast over hidden, bit for bit (one float multiply a value), however
    the rows split over the threads (ceil(rows / threads) each, the last short or empty)."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((n, k, hidden)).astype(np.float32)
    w = rng.random((n, k)).astype(np.float32)
    out = np.full_like(e, np.nan)
    weight_expert_outputs(e, w, out, nthr)
    assert np.array_equal(out, e * w[:, :, None])


def test_mismatched_shapes_are_refused():
    e = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="weights"):
        weight_expert_outputs(e, np.zeros((2, 4), np.float32), np.empty_like(e), 1)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 code")
def test_the_loop_moves_its_offset_through_a_vector_register_twice_a_value():
    """GCC's ggml_compute_forward_mul (12.2, -O3 -march=native) spills the repeat loop's src1 pointer to xmm7 and moves
    it back and forth twice a value: four vmovq between the register files a value set its pace (~13 cycles, 3.6 ns a
    value on one Zen 4 core in test-backend-ops). The rebuild's compiled loop carries the same four moves."""
    fresh = numba.njit(parallel=True, nogil=True)(_apply_mul.py_func)  # compiled here: a cached kernel has no asm
    z = np.zeros((1, 2), np.float32)
    fresh(z, np.zeros((1, 1), np.float32), z.copy(), np.int64(1), 1)
    asm = next(iter(fresh.inspect_asm().values()))
    gpr_xmm = [ln for ln in asm.splitlines() if ln.strip().startswith("vmovq") and "%xmm" in ln and "%r" in ln]
    assert len(gpr_xmm) == 4


def test_the_job_is_a_prefill_batchs_values():
    """calibrate's job: tokens x top_k rows of hidden values, one multiply each (its 'GFLOP/s' are giga-values)."""
    run, values = weighting_job(hidden=64, top_k=4, tokens=8)
    run()
    assert values == 8 * 4 * 64
