"""calibrate's prefill stages (calibration.prefill_stage): ggml's structures timed into calibrate's Results."""
import os
from dataclasses import replace

import pytest

import calibration.calibrate as cal
from calibration.prefill_stage import ggml_prefill
from calibration.settings import TINY


def test_the_tiled_gemm_timed_again_at_a_full_window_gives_its_fixed_tokens(tmp_path):
    """Where the tiled GEMM's rebuild runs (AVX-512 VNNI), calibrate times it at ggml_prefill_tokens an expert and
    again at ggml_prefill_window_tokens (here 32 and 64, top-2 of 2 experts), on all the threads and on one; the
    profile gets m0 from the two (bench_kernel.prefill_fixed_tokens) under the rate's key and the first batch's
    tokens an expert, and the store a row for each window rate."""
    from calibration.bench_kernel import prefill_fixed_tokens
    from calibration.detect import detect_hardware
    from calibration.ggml_tiled import HAVE_TILED
    from calibration.profile import build_profile, store_rows
    if not HAVE_TILED:
        pytest.skip("ggml's VNNI microtile needs AVX-512 VNNI")
    s = replace(TINY, kernel_formats=("Q4_K",), kernel_hidden=512, kernel_ffn=256, ggml_prefill_tokens=32,
                ggml_prefill_experts=2, ggml_prefill_window_tokens=64, dense_prefill_tokens=0)
    r = cal.Results(settings=s)
    maxt = min(2, os.cpu_count() or 1)
    ggml_prefill(s, r, s.kernel_formats, maxt, cal._Progress(False), cal._Budget(s, 0, False))
    keys = {"Q4_K:tiled"} | ({"Q4_K:tiled@1t"} if maxt > 1 else set())
    assert set(r.ggml_prefill_window) == keys
    assert all(r.ggml_prefill_window[k].tokens_per_expert == 64 for k in keys)
    hw = build_profile(r, detect_hardware(measure=False, path=str(tmp_path)))
    assert float(hw.cpu.ggml_prefill_ref_tokens) == 32
    for k in keys:
        a, w = r.ggml_prefill[k], r.ggml_prefill_window[k]
        m0 = hw.cpu.ggml_prefill_fixed_tokens[k]
        assert m0.source == "measured" and "at 64" in m0.ref
        assert float(m0) == pytest.approx(prefill_fixed_tokens(32, a.gflops_per_core, 64, w.gflops_per_core))
    cases = {row["case"] for row in store_rows(r)}
    assert "cpu_ggml_prefill_Q4_K_tiled_window" in {c.split(":", 1)[-1] for c in cases}
