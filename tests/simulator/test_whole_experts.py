"""The executor's CPU jobs of whole experts per thread (simulator.policies.whole_experts_per_thread): where a job's
experts split evenly over the threads, as a decode token's top-8 does on 2, the executor runs each expert start to
end on one thread, and the simulator charges that job at the profile's whole-expert rate (cpu.whole_gbs); other
jobs, other engines and a device of torch on the same cores split rows (cpu.expert_gbs). Files: session 34's Zen 4
`small-q2k` and `small-q4k` headers and profile."""
from pathlib import Path

import pytest

from simulator.ceilings import tier_roofs_gbs
from simulator.resources import cpu_expert_gbs, whole_jobs
from simulator.run import simulate
from simulator.screen import screen
from specs.figure import Figure
from specs.loaders import load_hardware, load_model
from specs.plan import Plan

DATA = Path(__file__).resolve().parents[1] / "calibration" / "data" / "zen4-2026-12-05"
ROWS = load_hardware(str(DATA / "host-calibrated.yaml"))  # no whole-expert rates: every job at the rows' rate
Q2K = load_model(str(DATA / "small-q2k.yaml"))  # top-8 of 32 experts, 8 layers
EXECUTOR = Plan()
LLAMACPP = Plan(engine="llamacpp", cpu_repack=True)


def _whole(hw, factor: float = 1.4):
    """The profile with whole-expert rates `factor` x each timed format's rows-split rate."""
    whole = {k: Figure(float(v) * factor, "measured", "test") for k, v in hw.cpu.expert_gbs.items() if "@" not in k}
    return hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"whole_gbs": whole})})


WHOLE = _whole(ROWS)


def _decode(hw, plan, **kw) -> float:
    return simulate(Q2K, hw, plan, gen_tokens=16, warm_steps=0, **kw).decode_tok_s


def test_a_decode_token_of_whole_experts_runs_at_the_whole_rate():
    """All-CPU decode on the executor: each layer's top-8 on 2 threads is one job of whole experts, so a profile
    whose whole-expert rates are 1.4x the rows' predicts it faster (its dense path and overheads unchanged)."""
    rows, whole = _decode(ROWS, EXECUTOR), _decode(WHOLE, EXECUTOR)
    assert whole > rows * 1.15
    assert cpu_expert_gbs(WHOLE, Q2K, 2, EXECUTOR, whole=True) == pytest.approx(
        1.4 * cpu_expert_gbs(WHOLE, Q2K, 2, EXECUTOR))


def test_llamacpp_splits_rows_whatever_the_profile():
    """ggml splits each matrix's rows across the threads: llama.cpp's prediction ignores the whole-expert rates."""
    assert _decode(WHOLE, LLAMACPP) == pytest.approx(_decode(ROWS, LLAMACPP), rel=1e-12)
    assert not whole_jobs(WHOLE, LLAMACPP, 2)


def test_a_job_that_does_not_balance_splits_rows():
    """3 experts a token on 2 threads (loads 2 and 1): the executor splits rows, so the whole rates change nothing."""
    three = EXECUTOR.model_copy(update={"experts_per_token": 3})
    assert _decode(WHOLE, three) == pytest.approx(_decode(ROWS, three), rel=1e-12)


def test_one_thread_runs_whole_experts_where_the_profile_timed_them_on_one():
    """On one thread every decode job runs its experts whole (executor.cpu_experts._whole), so a profile with
    whole-expert rates timed on one thread ('Q2_K@1t', calibrate since session 53) prices one-thread decode at them:
    1.4x the rows' one-thread rates here. A profile with whole rates on two threads only keeps the rows' one-thread
    rates (scaled down, a bus-bound two-thread rate would halve)."""
    one = EXECUTOR.model_copy(update={"cpu_threads": 1})
    assert _decode(WHOLE, one) == pytest.approx(_decode(ROWS, one), rel=1e-12)
    assert not whole_jobs(WHOLE, one, 1)
    timed = {k: Figure(float(ROWS.cpu.expert_gbs[k]) * 1.4, "measured", "test") for k in ROWS.cpu.expert_gbs
             if k.endswith("@1t")}
    on_one = WHOLE.model_copy(update={"cpu": WHOLE.cpu.model_copy(update={"whole_gbs": {**WHOLE.cpu.whole_gbs,
                                                                                           **timed}})})
    assert whole_jobs(on_one, one, 1)
    assert cpu_expert_gbs(on_one, Q2K, 1, one, whole=True) == pytest.approx(1.4 * cpu_expert_gbs(ROWS, Q2K, 1, one))
    assert _decode(on_one, one) > _decode(ROWS, one) * 1.15


def test_a_device_of_torch_on_the_same_cores_splits_rows():
    """Where the plan gives experts to a host-sharing device (torch on the CPU tier's cores: a cache, static
    layers), the executor splits rows (executor.experts: a thread that loses its core would delay its whole
    experts); its all-CPU plan there, and any plan beside a discrete GPU, runs whole experts."""
    from specs.plan import ExpertCache, Placement
    cache = EXECUTOR.model_copy(update={"expert_cache": ExpertCache(slots=16, policy="decayed-count")})
    static = EXECUTOR.model_copy(update={"placement": Placement(gpu_expert_layers=[4, 5])})
    gpu = _whole(load_hardware("epyc8ch-3090"))
    host = gpu.model_copy(update={"gpu": gpu.gpu.model_copy(update={"shares_host": True})})
    assert not whole_jobs(host, cache, 2) and not whole_jobs(host, static, 2) and whole_jobs(host, EXECUTOR, 2)
    assert whole_jobs(gpu, cache, 2) and whole_jobs(gpu, EXECUTOR, 2)


def test_the_executors_cpu_roof_is_the_whole_rate():
    """The roof `execute --hw` prints beside the achieved GB/s: a decode token's top-8 as one job of whole
    experts, capped by DDR."""
    roof = tier_roofs_gbs(Q2K, WHOLE, EXECUTOR)["cpu"]
    assert roof == pytest.approx(min(cpu_expert_gbs(WHOLE, Q2K, 2, EXECUTOR, whole=True), WHOLE.memory.usable_gbs))
    assert roof > tier_roofs_gbs(Q2K, ROWS, EXECUTOR)["cpu"] * 1.3


def test_the_screen_charges_whole_jobs_as_the_event_simulation_does():
    """The closed-form screen and the event simulation agree on the all-CPU plan with whole-expert rates, as
    without them (within 3%)."""
    for hw in (ROWS, WHOLE):
        sc = screen(Q2K, hw, EXECUTOR).decode_tok_s
        assert sc == pytest.approx(_decode(hw, EXECUTOR), rel=0.03)
