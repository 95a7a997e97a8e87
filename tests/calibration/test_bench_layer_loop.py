"""The CPU decode layer loop (calibration.bench_layer_loop): each token paired with jobs of the kernel benchmark's
pool, so that what a layer costs beyond its bytes is read at the kernels' rate of its own round."""
import numba
import pytest

from calibration import calibrate as cal
from calibration.bench_kernel import KernelFit, executor_expert_job
from calibration.bench_layer_loop import LayerLoop, LayerLoopBench
from calibration.profile import build_profile, typical_state
from specs.loaders import load_hardware

EB = 5_000_000  # bytes of one pool expert


def _fit(gbs: float, median_gbs: float, c_a_ms: float = 0.01) -> KernelFit:
    c_b, c_b_med = EB / (gbs * 1e6), EB / (median_gbs * 1e6)
    return KernelFit(label="synthetic", expert_bytes=EB, ks=[1, 8], t_ms=[c_a_ms + c_b, c_a_ms + 8 * c_b],
                     c_a_ms=c_a_ms, c_b_ms=c_b, residuals_ms=[0.0, 0.0], rms_rel=0.0, threads=2, repeats=3,
                     t_ms_median=[c_a_ms + c_b_med, c_a_ms + 8 * c_b_med], c_b_ms_median=c_b_med)


def _loop(dense: int, expert: int, extra_ms: float, states=(1.0, 1.25, 1.1, 1.4)):
    """A loop whose every round took `extra_ms` beyond its bytes at 30 GB/s times the round's state (the factor
    by which that round's kernels ran slower than the fits' 30 GB/s) plus both job costs (0.01 ms each)."""
    f = _fit(30.0, 25.0)
    rounds = [s * (dense + expert) / 30e6 + 0.02 + extra_ms for s in states]
    jobs = [f.c_a_ms + s * 8 * f.c_b_ms for s in states]
    return LayerLoop(t_layer_ms=min(rounds), dense_bytes=dense, expert_bytes=expert, fmt="Q8_0",
                     threads=2, repeats=len(states), t_layer_ms_median=sorted(rounds)[len(rounds) // 2],
                     round_layer_ms=rounds, round_job_ms=jobs, job_k=8, job_n=9)


def test_paired_rounds_cancel_the_machines_state():
    """Rounds 1.0-1.4x slower than the fits, the jobs beside them as much: the paired figure is what each round took
    beyond its bytes at its own rate (0.05 ms), whatever state the round caught."""
    f = _fit(30.0, 25.0)
    assert _loop(6_300_000, 40_100_000, 0.05).paired_rest_ms(f, f) == pytest.approx(0.05)
    assert _loop(6_300_000, 40_100_000, 0.05, states=(1.3, 1.3, 1.3)).paired_rest_ms(f, f) == pytest.approx(0.05)


def test_a_loop_run_alone_has_no_paired_figure():
    f = _fit(30.0, 25.0)
    ll = LayerLoop(t_layer_ms=1.6, dense_bytes=6_300_000, expert_bytes=40_100_000, fmt="Q8_0", threads=2, repeats=7)
    assert ll.paired_rest_ms(f, f) is None
    assert ll.rest_ms(f, f) == pytest.approx(1.6 - 46.4 / 30 - 0.02)


def test_the_typical_profile_takes_the_paired_figure_the_default_the_lower_quintile():
    """Big (46.4 MB) and small (2.1 MB) layers, 0.05 and 0.01 ms beyond their bytes paired: the typical-state profile
    splits those (per MB 0.04 / 44.3); the default profile splits the loops' fastest rounds against the kernels'
    fastest rates, which carry no extra state here (the fastest round is at the fits' rate): the same 0.05 / 0.01."""
    r = cal.Results(settings=cal.QUICK)
    r.kernels = {"Q8_0": _fit(30.0, 25.0), "F16": _fit(30.0, 25.0)}
    r.layer_loop = _loop(6_300_000, 40_100_000, 0.05)
    r.layer_loop_small = _loop(400_000, 1_700_000, 0.01)
    base = load_hardware("epyc8ch-3090")
    per = 0.04 / 44.3
    for res in (r, typical_state(r)):
        c = build_profile(res, base).constants
        assert float(c["cpu_layer_ms_per_mb"]) == pytest.approx(per)
        assert float(c["cpu_layer_ms"]) == pytest.approx(0.05 - per * 46.4)
    typ = build_profile(typical_state(r), base).constants
    assert "the paired figure is taken" in typ["cpu_layer_ms"].ref
    assert "the paired figure is taken" not in build_profile(r, base).constants["cpu_layer_ms"].ref


def test_a_slow_loop_round_moves_the_default_profile_not_the_typical_one():
    """The big loop's lower quintile caught a slow spell (+0.3 ms on every round and the jobs beside them 25%
    slower): the default profile's residual grows by it, the typical profile's paired figure does not."""
    r = cal.Results(settings=cal.QUICK)
    r.kernels = {"Q8_0": _fit(30.0, 25.0), "F16": _fit(30.0, 25.0)}
    slow = _loop(6_300_000, 40_100_000, 0.05, states=(1.25, 1.25, 1.25))
    r.layer_loop, r.layer_loop_small = slow, _loop(400_000, 1_700_000, 0.01)
    base = load_hardware("epyc8ch-3090")
    fast = float(build_profile(r, base).constants["cpu_layer_ms_per_mb"])
    typ = float(build_profile(typical_state(r), base).constants["cpu_layer_ms_per_mb"])
    assert typ == pytest.approx(0.04 / 44.3)
    assert fast == pytest.approx((0.05 + 0.25 * 46.4 / 30 - 0.01) / 44.3)


def test_each_token_runs_next_to_jobs_of_the_kernel_benchmarks_pool():
    """A real loop (64-wide layers, top-2 of 4 Q8_0 experts) beside a real pool job: every clean round gives a token
    and its jobs, at least one job of top_k experts, as many as cover about the token's bytes."""
    run_job, eb = executor_expert_job("Q8_0", 64, 32, 1 << 20, max_k=4)
    lb = LayerLoopBench("Q8_0", threads=numba.get_num_threads(), job=(run_job, eb), hidden=64, ffn=32, n_experts=4,
                        top_k=2, layers=2)
    lb.sample(3, 1.0)
    ll = lb.result()
    # a token reads 2 layers x (32,768 B of attention + 13,056 of experts) = 91,648 B; a job 2 x 6,528: 7 jobs
    assert (ll.dense_bytes, ll.expert_bytes, eb) == (32_768, 13_056, 6_528)
    assert ll.job_k == 2 and ll.job_n == 7
    assert len(ll.round_layer_ms) == len(ll.round_job_ms) >= 3
    assert min(ll.round_job_ms) > 0 and 0 < ll.t_layer_ms <= ll.t_layer_ms_median
