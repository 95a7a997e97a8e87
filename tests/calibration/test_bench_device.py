"""Torch device benchmarks on tiny inputs: structure, positivity and relations (never timing bars)."""
from calibration.bench_device import bench_dense, bench_h2d, bench_hit, torch_device


def test_hit_and_dense():
    h = bench_hit(hidden=64, ffn=32, pool_bytes=1 << 16, calls=3, repeats=2, budget_s=0.3)
    esize = 2 if h.device == "cuda" else 4
    assert h.expert_bytes == 3 * 64 * 32 * esize and h.pool >= 2
    assert h.t_hit_ms > 0 and h.gbs > 0
    d = bench_dense(1 << 20, hidden=256, repeats=2, budget_s=0.3)
    assert d.matrix_bytes > 0 and d.gbs >= d.median_gbs > 0
    assert d.device == torch_device().type


def test_h2d_without_cuda_is_none():
    import torch
    if torch.cuda.is_available():
        r = bench_h2d(1 << 20, repeats=2, hidden=64, ffn=32, miss_calls=2)
        assert r.pinned_gbs > 0 and r.pageable_gbs > 0 and r.t_miss_ms > 0
    else:
        assert bench_h2d(1 << 20) is None
