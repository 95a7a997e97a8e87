"""The executor's prefill products per format against the job format's (calibration.bench_prefill_formats): real
kernels on synthetic matrices, one core, in cache."""
from __future__ import annotations

import numba

from calibration.bench_prefill_formats import prefill_format_shares


def test_each_format_gets_its_rate_over_the_job_formats():
    """Q4_0 (the job's format) 1 by definition; Q8_0, Q4_K (the integer GEMM) and F16 (the float one) each a positive
    share and a GFLOP/s figure, and the method names the reference, the tokens and every rate."""
    prev = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        r = prefill_format_shares(["Q8_0", "Q4_K", "F16"], "Q4_0", hidden=512, ffn=256, tokens=32, rounds=3)
    finally:
        numba.set_num_threads(prev)
    assert list(r.shares) == ["Q4_0", "Q8_0", "Q4_K", "F16"]
    assert r.shares["Q4_0"] == 1.0
    assert all(v > 0 for v in r.shares.values()) and all(v > 0 for v in r.gflops.values())
    for f, g in r.gflops.items():
        assert abs(r.shares[f] - g / r.gflops["Q4_0"]) < 1e-9  # the same products: shares are the rates' ratios
    m = r.method()
    assert "over Q4_0's" in m and "32 tokens" in m and all(f in m for f in r.shares)
