"""Microbenchmarks on tiny inputs: structure, positivity and relations (never timing bars)."""
import itertools
import os
import time

import numpy as np
import pytest

from calibration import bench


def test_thread_counts():
    assert bench.default_thread_counts(1) == [1]
    assert bench.default_thread_counts(2) == [1, 2]
    assert bench.default_thread_counts(6) == [1, 2, 4, 6]
    assert bench.default_thread_counts(8) == [1, 2, 4, 8]


def test_memory_structure():
    ticks = []
    m = bench.bench_memory(1 << 20, threads=[1, 2], repeats=3, tick=lambda: ticks.append(1),
                           budget_s=0.3)
    assert len(ticks) == 3  # one per clean round (filled up when the budget runs out)
    assert set(m.best) == {"read", "copy", "triad"}
    for k in m.best:
        assert set(m.best[k]) == {1, 2}
        for t in (1, 2):
            assert m.best[k][t] > 0 and m.best[k][t] >= m.median[k][t] > 0
    t, v = m.peak("read")
    assert v == max(m.best["read"].values()) and t in (1, 2)
    assert "1 thread" in m.method("read", 1)


def test_memory_bench_merges_sampling_calls():
    m = bench.MemoryBench(1 << 20, threads=[1], kernels=("read",))
    m.sample(2, budget_s=0.3)
    m.sample(2, budget_s=0.3)
    r = m.result()
    assert r.repeats == 4 and len(m.times[("read", 1)]) >= 4 and r.noise.windows >= 2
    assert r.best["read"][1] >= r.median["read"][1] > 0
    m.free()


def test_fit_recovers_line_exactly():
    ks = [1, 2, 4, 6, 8]
    c_a, c_b, res = bench.fit_job_costs(ks, [0.11 + 0.2 * k for k in ks])
    assert c_a == pytest.approx(0.11, rel=1e-4) and c_b == pytest.approx(0.2, rel=1e-4)
    assert np.abs(res).max() < 1e-6


def test_fit_is_bounded_non_negative():
    c_a, c_b, res = bench.fit_job_costs([1, 2, 4], [3.0, 2.0, 1.0])  # falling times: no negative cost
    assert c_a >= 0 and c_b >= 0 and len(res) == 3


def test_degenerate_fit_still_gives_a_finite_rate():
    f = bench.KernelFit(label="x", expert_bytes=1000, ks=[1, 2], t_ms=[1.0, 1.0], c_a_ms=1.0, c_b_ms=0.0,
                        residuals_ms=[0, 0], rms_rel=0.0, threads=1, repeats=1)
    assert f.expert_gbs == pytest.approx(1000 / 1e-3 / 1e9)  # the costliest job per expert


def test_expert_kernel_hook_fits_a_known_job():
    # a job whose cost is 1 ms + 2 ms per expert: the fit must find the per-expert cost dominant
    def job(k, i):
        time.sleep(0.001 + 0.002 * k)
    f = bench.bench_expert_kernel(job, [1, 2, 4], expert_bytes=1_000_000, repeats=3, label="sleep", threads=1,
                                budget_s=0.3)
    assert f.ks == [1, 2, 4] and len(f.t_ms) == 3 and len(f.residuals_ms) == 3
    assert f.t_ms[0] < f.t_ms[1] < f.t_ms[2]
    assert 1.0 < f.c_b_ms < 8 and f.c_b_ms > f.c_a_ms >= 0
    assert f.expert_gbs == pytest.approx(1e6 / (f.c_b_ms * 1e-3) / 1e9)
    assert "least-squares" in f.method()


def test_expert_kernel_hook_with_own_numba_kernel():
    job, eb = bench.toy_expert_job(rows=32, cols=64, pool=8)
    assert eb == 32 * 64 * 4
    f = bench.bench_expert_kernel(job, [1, 2, 4], eb, repeats=3, label="toy", budget_s=0.3)
    assert all(t > 0 for t in f.t_ms) and f.c_a_ms >= 0 and f.c_b_ms >= 0 and f.rms_rel >= 0
    assert f.threads >= 1


@pytest.mark.skipif(not bench.executor_kernel_available(), reason="executor kernel not there yet")
@pytest.mark.parametrize("fmt", ["Q4_0", "Q8_0", "F16"])
def test_executor_kernel_job(fmt):
    job, eb = bench.executor_expert_job(fmt, hidden=64, ffn=32, pool_bytes=1 << 16, max_k=4)
    rb = bench._ROW_BYTES[fmt]
    assert eb == 2 * 32 * rb(64) + 64 * rb(32)
    f = bench.bench_expert_kernel(job, [1, 2, 4], eb, repeats=2, label=fmt, budget_s=0.3)
    assert all(t > 0 for t in f.t_ms) and f.c_b_ms >= 0


@pytest.mark.skipif(not bench.executor_kernel_available(), reason="executor kernel not there yet")
def test_synthetic_experts_have_finite_outputs():
    from executor import kernels
    rng = np.random.default_rng(1)
    for fmt in ("Q4_0", "Q8_0", "F16"):
        w = bench._synth_tensor(fmt, 2, 32, 64, rng)
        y = kernels.expert_matmul(w, 1, rng.standard_normal((1, 64)).astype(np.float32))
        assert y.shape == (1, 32) and np.isfinite(y).all() and np.abs(y).max() > 0


def test_hit_and_dense():
    h = bench.bench_hit(hidden=64, ffn=32, pool_bytes=1 << 16, calls=3, repeats=2, budget_s=0.3)
    esize = 2 if h.device == "cuda" else 4
    assert h.expert_bytes == 3 * 64 * 32 * esize and h.pool >= 2
    assert h.t_hit_ms > 0 and h.gbs > 0
    d = bench.bench_dense(1 << 20, hidden=256, repeats=2, budget_s=0.3)
    assert d.matrix_bytes > 0 and d.gbs >= d.median_gbs > 0
    assert d.device == bench.torch_device().type


def test_h2d_without_cuda_is_none():
    import torch
    if torch.cuda.is_available():
        r = bench.bench_h2d(1 << 20, repeats=2, hidden=64, ffn=32, miss_calls=2)
        assert r.pinned_gbs > 0 and r.pageable_gbs > 0 and r.t_miss_ms > 0
    else:
        assert bench.bench_h2d(1 << 20) is None


def test_disk_uncached_and_cached(tmp_path):
    ticks = []
    d = bench.bench_disk(1 << 20, qd1_reads=20, qd_reads=40, qd=4, cached_reads=50, directory=tmp_path,
                         tick=lambda: ticks.append(1))
    assert len(ticks) == 5
    assert d.bypass in ("O_DIRECT", "posix_fadvise DONTNEED")
    assert d.file_bytes == 1 << 20 and d.reads >= 40 and d.qd == 4
    for v in (d.qd1_latency_us, d.qd1_iops, d.qd_iops, d.seq_gbs, d.cached_us, d.cached_iops):
        assert v > 0
    assert os.listdir(tmp_path) == []  # the temporary file is gone
    assert "QD4" in d.method("qd") and d.bypass in d.method("qd1")


def test_disk_falls_back_to_fadvise(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "O_DIRECT", raising=False)
    d = bench.bench_disk(1 << 20, qd1_reads=10, qd_reads=10, qd=2, cached_reads=10, directory=tmp_path)
    assert d.bypass == "posix_fadvise DONTNEED" and d.qd1_latency_us > 0


def test_handover():
    aff = os.sched_getaffinity(0)
    h = bench.bench_handover(iters=20, budget_s=0.3, block=10)
    assert h.sync_ms > 0 and h.thread_ms > 0 and h.iters == 20
    assert h.device in h.method() and h.same_core and "one core" in h.method()
    assert os.sched_getaffinity(0) == aff  # pinning undone
    c = bench.bench_handover(iters=20, budget_s=0.3, block=10, same_core=False)
    assert not c.same_core and c.sync_ms > 0 and os.sched_getaffinity(0) == aff  # affinity restored


def test_sample_clean_keeps_clean_windows_and_reports_noise(monkeypatch):
    calls = []

    def unit(i):
        calls.append(i)
        return [("a", float(i)), ("b", -float(i))]
    # no outside load: stops once every key has `want` samples
    monkeypatch.setattr(bench.Window, "others", lambda self: 0.0)
    got, noise = bench.sample_clean(unit, want=4, budget_s=5, min_window_s=0.0, keys=2)
    assert len(got["a"]) == 4 and len(got["b"]) == 4 and noise.clean == noise.windows == 4
    assert not noise.used_all and "4/4 windows" in noise.describe()
    # always loaded: runs out its budget, then falls back to every sample and says so
    monkeypatch.setattr(bench.Window, "others", lambda self: 0.9)
    ticks = []
    got, noise = bench.sample_clean(unit, want=3, budget_s=0.05, min_window_s=0.01, keys=2,
                                    tick=lambda: ticks.append(1))
    assert noise.used_all and noise.clean == 0 and noise.others == pytest.approx(0.9)
    assert len(got["a"]) >= 2 and len(ticks) == 3 and "least disturbed" in noise.describe()
    # some windows disturbed more than others: the fallback takes the quietest first
    calls.clear()
    shares = itertools.cycle([0.9, 0.3, 0.8, 0.5, 0.95, 0.6])
    monkeypatch.setattr(bench.Window, "others", lambda self: next(shares))
    got, noise = bench.sample_clean(unit, want=6, budget_s=0.02, min_window_s=0.0, keys=2)
    assert noise.used_all and noise.fallback_others == 0.3
    assert got["a"][:2] == [calls[1], calls[7]]  # the first windows that saw the least load (0.3)


def test_window_measures_outside_load():
    w = bench.Window()
    time.sleep(0.05)
    assert 0.0 <= w.others() <= 1.0 and w.wall() >= 0.05
