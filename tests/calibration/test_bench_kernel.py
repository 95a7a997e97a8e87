"""CPU expert kernel benchmark on tiny jobs: the fit, the hook, the executor adapter (never timing bars)."""
import time

import numpy as np
import pytest

from hypothesis import assume, given, strategies as st

from calibration.bench_kernel import (_ROW_BYTES, KernelBench, KernelFit, _synth_tensor, bench_expert_kernel,
                                      executor_expert_job, executor_kernel_available, fit_job_costs,
                                      prefill_fixed_tokens, toy_expert_job, kernel_sources, kernel_version)
from simulator.resources import Constants, executor_prefill_gflops


def test_fit_recovers_line_exactly():
    ks = [1, 2, 4, 6, 8]
    c_a, c_b, res = fit_job_costs(ks, [0.11 + 0.2 * k for k in ks])
    assert c_a == pytest.approx(0.11, rel=1e-4) and c_b == pytest.approx(0.2, rel=1e-4)
    assert np.abs(res).max() < 1e-6


def test_fit_is_bounded_non_negative():
    c_a, c_b, res = fit_job_costs([1, 2, 4], [3.0, 2.0, 1.0])  # falling times: no negative cost
    assert c_a >= 0 and c_b >= 0 and len(res) == 3


def test_degenerate_fit_still_gives_a_finite_rate():
    f = KernelFit(label="x", expert_bytes=1000, ks=[1, 2], t_ms=[1.0, 1.0], c_a_ms=1.0, c_b_ms=0.0,
                  residuals_ms=[0, 0], rms_rel=0.0, threads=1, repeats=1)
    assert f.expert_gbs == pytest.approx(1000 / 1e-3 / 1e9)  # the costliest job per expert


def test_expert_kernel_hook_fits_a_known_job():
    # a job whose cost is 1 ms + 2 ms per expert: the fit must find the per-expert cost dominant
    def job(k, i):
        time.sleep(0.001 + 0.002 * k)
    f = bench_expert_kernel(job, [1, 2, 4], expert_bytes=1_000_000, repeats=3, label="sleep", threads=1,
                          budget_s=0.3)
    assert f.ks == [1, 2, 4] and len(f.t_ms) == 3 and len(f.residuals_ms) == 3
    assert f.t_ms[0] < f.t_ms[1] < f.t_ms[2]
    assert 1.0 < f.c_b_ms < 8 and f.c_b_ms > f.c_a_ms >= 0
    assert f.expert_gbs == pytest.approx(1e6 / (f.c_b_ms * 1e-3) / 1e9)
    assert "least-squares" in f.method()
    # the median rounds' fit beside it (the machine's typical state): never under the fastest rounds' times
    assert all(m >= t for m, t in zip(f.t_ms_median, f.t_ms)) and f.expert_gbs_median > 0
    assert f"median rounds: {f.expert_gbs_median:.2f} GB/s" in f.method()


def test_expert_kernel_hook_with_own_numba_kernel():
    job, eb = toy_expert_job(rows=32, cols=64, pool=8)
    assert eb == 32 * 64 * 4
    f = bench_expert_kernel(job, [1, 2, 4], eb, repeats=3, label="toy", budget_s=0.3)
    assert all(t > 0 for t in f.t_ms) and f.c_a_ms >= 0 and f.c_b_ms >= 0 and f.rms_rel >= 0
    assert f.threads >= 1


@pytest.mark.skipif(not executor_kernel_available(), reason="executor kernel not there yet")
@pytest.mark.parametrize("fmt", ["Q4_0", "Q8_0", "F16", "Q4_K", "Q6_K"])
def test_executor_kernel_job(fmt):
    H, F = (256, 256) if fmt.endswith("_K") else (64, 32)  # K-quant rows are 256-weight super-blocks
    job, eb = executor_expert_job(fmt, hidden=H, ffn=F, pool_bytes=1 << 16, max_k=4)
    rb = _ROW_BYTES[fmt]
    assert eb == 2 * F * rb(H) + H * rb(F)
    f = bench_expert_kernel(job, [1, 2, 4], eb, repeats=2, label=fmt, budget_s=0.3)
    assert all(t > 0 for t in f.t_ms) and f.c_b_ms >= 0


@pytest.mark.skipif(not executor_kernel_available(), reason="executor kernel not there yet")
def test_synthetic_experts_have_finite_outputs():
    from executor import kernels
    rng = np.random.default_rng(1)
    for fmt in ("Q4_0", "Q8_0", "F16", "Q4_K", "Q6_K"):
        cols = 256 if fmt.endswith("_K") else 64
        w = _synth_tensor(fmt, 2, 32, cols, rng)
        y = kernels.expert_matmul(w, 1, rng.standard_normal((1, cols)).astype(np.float32))
        assert y.shape == (1, 32) and np.isfinite(y).all() and np.abs(y).max() > 0


def test_prefill_batch_reports_routed_flops_per_thread():
    """A prefill batch of T tokens x top-k experts does 6 H F T k FLOPs (three H x F matrices, 2 per
    weight); the rate is those FLOPs over the batch time per thread."""
    from calibration.bench_kernel import bench_prefill, executor_prefill_job
    run, flops = executor_prefill_job("Q8_0", hidden=64, ffn=32, n_experts=4, top_k=2, tokens=8)
    assert flops == 6 * 64 * 32 * 8 * 2
    r = bench_prefill(run, flops, repeats=2, tokens=8, experts=4, top_k=2, threads=2, budget_s=0.2)
    assert r.gflops_per_core == pytest.approx(flops / (r.t_ms * 1e-3) / 1e9 / 2)
    assert "8 tokens x top-2 of 4 experts" in r.method()


def test_synthetic_block_scales_spread_like_real_ones():
    """The synthetic pool's Q8_0 / Q4_0 block scales are not one value (session 16: one scale for every block
    made a scale-table kernel look 1.2x faster than on `small-q4`'s real scales, 0.97x): make_model's
    0.5-1.5x spread about std / (the quants' std)."""
    rng = np.random.default_rng(2)
    for fmt, blk in (("Q8_0", 34), ("Q4_0", 18)):
        w = _synth_tensor(fmt, 2, 16, 256, rng)
        d = w.data.reshape(-1, blk)[:, :2].copy().view(np.float16).astype(np.float32).ravel()
        assert d.size == 2 * 16 * 256 // 32
        assert len(np.unique(d)) > d.size // 4
        assert 0.45 * d.mean() < d.min() and d.max() < 1.55 * d.mean()


def test_jobs_walk_the_pool_so_no_expert_is_read_again_from_cache():
    """Each job's first expert is where the job before it ended, warm-up included: the experts read, in
    order, are 0, 1, 2, ... (mod the pool). Jobs that began at i * k re-read what the previous k's job had
    just left in the cache: the rowwise Q8_0 rate fitted 42.3 GB/s against 37.2 walking, side by side."""
    firsts = []

    def job(k, first):
        firsts.append(list(range(first, first + k)))
    kb = KernelBench(job, [1, 2, 4, 6, 8], expert_bytes=1000, threads=1)
    kb.sample(3, budget_s=1.0)
    read = [e for j in firsts for e in j]
    assert len(firsts) >= 5 * 4 and read == list(range(len(read)))


def test_jobs_on_the_same_experts_share_one_pool_while_alive():
    """calibrate times one format's synthetic experts in several structures and thread counts: jobs of the same
    arguments share one pool (expert_pool), and a pool no job holds is freed, not kept."""
    import gc
    from calibration.bench_kernel import _POOLS, expert_pool
    from calibration.bench_rowwise import rowwise_expert_job
    a = expert_pool("Q8_0", 64, 32, 1 << 16, 4, seed=3)
    job, eb = rowwise_expert_job("Q8_0", 64, 32, 1 << 16, 4, seed=3)
    assert expert_pool("Q8_0", 64, 32, 1 << 16, 4, seed=3) is a and eb == a.expert_bytes
    assert expert_pool("Q8_0", 64, 32, 1 << 16, 4, seed=4) is not a
    key = ("Q8_0", 64, 32, 1 << 16, 4, 3)
    del a
    gc.collect()
    assert key in _POOLS  # the job still holds it
    del job
    gc.collect()
    assert key not in _POOLS


def test_kernel_version_covers_every_kernel_source():
    """A calibration names the kernel build it belongs to by a hash of the kernel sources, found through the imports
    (a hand-kept list missed row_products.py, kernel_table.py and vnni.py): the row kernels of every type, the table
    the drivers call them through, the drivers and attention."""
    names = {f.name for f in kernel_sources()}
    assert {"cpu_experts.py", "dense_kernels.py", "attention.py", "kernels.py", "kernel_table.py", "row_products.py",
            "gemm.py", "simd.py", "vnni.py", "kquants.py", "iquants.py"} <= names
    assert len(kernel_version()) == 12


@given(m0=st.floats(0.0, 200.0), rate=st.floats(5.0, 500.0), m1=st.floats(2.0, 32.0), k=st.floats(2.0, 16.0))
def test_fixed_tokens_come_back_from_the_rates_the_simulator_gives(m0, rate, m1, k):
    """Rates at m1 and m2 = k m1 tokens an expert drawn from the simulator's model (simulator.resources.
    executor_prefill_gflops with cpu_prefill_fixed_tokens = m0) give m0 back (to 1e-6 of m1 + m0)."""
    c = Constants(cpu_prefill_gflops_per_core=rate, cpu_prefill_ref_tokens=m1, cpu_prefill_fixed_tokens=m0)
    m2 = k * m1
    got = prefill_fixed_tokens(m1, executor_prefill_gflops(c, m1), m2, executor_prefill_gflops(c, m2))
    assert got == pytest.approx(m0, abs=1e-6 * (m1 + m0))


@given(m0=st.floats(0.0, 200.0), rate=st.floats(5.0, 500.0), m1=st.floats(2.0, 32.0), k=st.floats(2.0, 16.0),
       g2=st.floats(1.0, 4.0))
def test_fixed_tokens_come_back_from_rates_in_token_groups(m0, rate, m1, k, g2):
    """The larger batch in g2 token groups (each paying m0: executor_prefill_gflops' groups), the smaller in one:
    its rates give m0 back with the groups given (to 1e-6 of m1 + m0), where its groups hold at least twice the
    smaller batch's tokens (with m2 / g2 = m1 the two rates are alike whatever m0)."""
    assume(k >= 2 * g2)
    c = Constants(cpu_prefill_gflops_per_core=rate, cpu_prefill_ref_tokens=m1, cpu_prefill_fixed_tokens=m0)
    m2 = k * m1
    got = prefill_fixed_tokens(m1, executor_prefill_gflops(c, m1), m2, executor_prefill_gflops(c, m2, g2), 1.0, g2)
    assert got == pytest.approx(m0, abs=1e-6 * (m1 + m0))


def test_no_faster_at_the_larger_batch_gives_no_fixed_tokens():
    """A larger batch no faster (a loaded host, or a kernel with no per-expert cost): m0 = 0, one rate at every m."""
    assert prefill_fixed_tokens(16, 100.0, 128, 100.0) == 0.0
    assert prefill_fixed_tokens(16, 100.0, 128, 90.0) == 0.0


def test_a_pool_beyond_its_drawn_experts_reorders_their_blocks_into_pages_of_its_own():
    """A pool of more experts than DRAWN_EXPERTS quantises only those; each further expert holds a drawn one's
    blocks (the same multiset: real blocks), its rows and blocks in another order, so that no two 4 KiB pages of
    the pool are alike (a pool larger than the cache must read DRAM, even where a host merges equal pages)."""
    import hashlib
    from calibration.bench_kernel import DRAWN_EXPERTS, ExpertPool
    p = ExpertPool("Q4_K", 512, 256, 8 << 20, 4, seed=1)  # 216 KiB an expert: 37 of them
    assert p.n > 2 * DRAWN_EXPERTS
    for t in (p.gate, p.down):
        blocks = t.data.reshape(p.n, -1, 144)  # Q4_K super-blocks
        for e in (DRAWN_EXPERTS, p.n - 1):
            src = blocks[e % DRAWN_EXPERTS]
            assert sorted(map(bytes, blocks[e])) == sorted(map(bytes, src))
            assert not np.array_equal(blocks[e], src)
        pages = t.data.reshape(-1)[: t.data.size // 4096 * 4096].reshape(-1, 4096)
        assert len({hashlib.md5(pg.tobytes()).digest() for pg in pages}) == len(pages)


def test_a_pool_in_files_holds_the_same_experts_repeated_to_the_bytes_asked(tmp_path):
    """pool_in_files: the pool's gate, up and down copied into files written in shuffled 4 KiB runs, repeated to at
    least `total_bytes` (a layout costs more the more memory its pages span): 3x a 0.2 MiB pool for 0.5 MiB, expert
    e + n the same bytes as expert e; the files are gone from the folder once mapped."""
    from calibration.bench_kernel import ExpertPool, pool_in_files
    p = ExpertPool("Q8_0", 64, 32, 200 << 10, 4, seed=5)
    size = sum(t.data.nbytes for t in (p.gate, p.up, p.down))
    f = pool_in_files(p, 4096, tmp_path, total_bytes=500 << 10)
    reps = -(-(500 << 10) // size)
    assert f.n == reps * p.n and reps == 3
    for name in ("gate", "up", "down"):
        a, b = getattr(p, name).data, getattr(f, name).data
        assert b.shape == (reps * a.shape[0],) + a.shape[1:]
        assert all(np.array_equal(b[i * p.n:(i + 1) * p.n], a) for i in range(reps))
    assert not list(tmp_path.iterdir())


def test_the_dense_path_is_the_blocks_time_less_its_attentions():
    """calibrate times an attention block whole (attention_step and norm_route, as the executor's CPU step runs them:
    its norms, RoPE and residual add too) and its attention alone; the dense path's result is the block's time less
    the attention's at the block's dense FLOPs (13.7 - 2.7 = 11.0 ms: `small`'s 512-token layer, session 57), the
    block's whole time where the difference is not positive."""
    from calibration.bench_kernel import PrefillResult, dense_less_attention
    blk = PrefillResult(label="block", tokens=512, experts=0, top_k=0, t_ms=13.7, flops=3.29e9, threads=2, repeats=7)
    att = PrefillResult(label="attention", tokens=512, experts=0, top_k=0, t_ms=2.7, flops=0.27e9, threads=2, repeats=7)
    d = dense_less_attention(blk, att)
    assert d.t_ms == pytest.approx(11.0) and d.flops == 3.29e9 and "less its attention" in d.label
    assert d.gflops_per_core == pytest.approx(3.29e9 / 11.0e-3 / 1e9 / 2)
    assert dense_less_attention(blk, PrefillResult(**{**att.__dict__, "t_ms": 14.0})).t_ms == 13.7


def test_the_dense_block_job_runs_the_executors_attention_block():
    """executor_dense_prefill_jobs' first job is the whole block: on 32 tokens of a 256-wide block it writes the K/V
    caches' 32 positions and changes the residual stream (x += the block's output); its FLOPs are the products'."""
    from calibration.bench_kernel import executor_dense_prefill_jobs
    (block, flops), (attention, aflops) = executor_dense_prefill_jobs(256, 64, 8, 32)
    cells = block.__closure__
    x = next(c.cell_contents for c in cells if getattr(c.cell_contents, "shape", None) == (32, 256))
    kc = next(c.cell_contents for c in cells if getattr(c.cell_contents, "ndim", 0) == 4)
    before = x.copy()
    block()
    assert not np.array_equal(x, before) and np.abs(kc).sum(axis=-1).all()
    nh, nkv = 1, 1  # 256 / (4 x 64) query heads, at least one K/V head
    assert flops == 2.0 * 32 * (2 * nh * 64 * 256 + 2 * nkv * 64 * 256 + 8 * 256)
    assert aflops == 4.0 * nh * 64 * 32 * 31 / 2
    attention()
