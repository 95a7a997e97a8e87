"""Without contention the event simulation equals the closed-form screen (same constants)."""
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from simulator.resources import Constants
from simulator.run import simulate
from simulator.screen import screen

from sim_fixtures import machine, tiered, tiny_model

CONSTS = Constants(zc_efficiency=0.6, handover_ms=0.3, step_overhead_ms=0.5)


@pytest.mark.parametrize("kind", ["zero-copy", "cpu", "copy"])
def test_uncontended_step_equals_closed_form(kind):
    """No cache, uniform routing, one stream: every layer has k misses served one way only, so the
    simulated step time equals dense + layers x (that path's time) + overheads, to 1e-9."""
    model, hw = tiny_model(), machine()
    plan = tiered(slots=0, kind=kind)
    sim = simulate(model, hw, plan, gen_tokens=1, routing="uniform", warm_steps=0, constants=CONSTS)
    scr = screen(model, hw, plan, constants=CONSTS)
    assert sim.decode_tok_s == pytest.approx(scr.decode_tok_s, rel=1e-9)


def test_static_gpu_layers_equal_closed_form():
    """llama.cpp static split: layers 0-1 in VRAM, 2-3 on the CPU: equals the closed form."""
    model, hw = tiny_model(), machine()
    plan = tiered(slots=0, kind="cpu")
    plan = plan.model_copy(update={"placement": plan.placement.model_copy(
        update={"gpu_expert_layers": [0, 1]})})
    sim = simulate(model, hw, plan, gen_tokens=1, routing="uniform", warm_steps=0, constants=CONSTS)
    scr = screen(model, hw, plan, constants=CONSTS)
    assert sim.decode_tok_s == pytest.approx(scr.decode_tok_s, rel=1e-9)


def test_screen_tracks_simulation_with_cache_and_auction():
    """With a skewed-routing cache and the auction the screen is an expectation: within 6%."""
    from specs.loaders import load_hardware, load_model
    from specs.plan import ExpertCache, plan_template
    model, hw = load_model("deepseek-v4.1-flash-3.02"), load_hardware("epyc8ch-3090")
    plan = plan_template("tiered-cache").model_copy(update={
        "expert_cache": ExpertCache(slots=709, policy="decayed-count")})
    c = Constants(zc_efficiency=0.6, handover_ms=0.25)
    sim = simulate(model, hw, plan, gen_tokens=200, constants=c)
    scr = screen(model, hw, plan, constants=c)
    print(f"sim {sim.decode_tok_s:.2f} tok/s, screen {scr.decode_tok_s:.2f} tok/s")
    assert scr.decode_tok_s == pytest.approx(sim.decode_tok_s, rel=0.06)


def test_cpu_only_step_with_job_costs_equals_closed_form():
    """No device: each layer's dense path and expert job pay a fixed CPU job cost (calibrate's
    measured c_a_ms when no fitted cpu_job_ms); the event simulation still equals the closed form."""
    from specs.figure import Figure
    model = tiny_model()
    hw = machine().model_copy(update={"gpu": None, "pcie": None,
                                      "constants": {"c_a_ms": Figure(0.15, "measured", "test")}})
    c = Constants.from_hw(hw)
    assert c.cpu_job_ms == 0.15
    plan = tiered(slots=0, kind="cpu")
    plan = plan.model_copy(update={"placement": plan.placement.model_copy(update={"dense": "cpu", "kv": "cpu"})})
    sim = simulate(model, hw, plan, gen_tokens=1, routing="uniform", warm_steps=0, constants=c)
    scr = screen(model, hw, plan, constants=c)
    assert sim.decode_tok_s == pytest.approx(scr.decode_tok_s, rel=1e-9)
    fitted = hw.model_copy(update={"constants": {**hw.constants, "cpu_job_ms": Figure(0.05, "derived", "fit")}})
    assert Constants.from_hw(fitted).cpu_job_ms == 0.05


def test_llamacpp_pays_no_per_call_job_cost():
    """calibrate's c_a_ms is the executor's cost of calling a kernel; llama.cpp computes a token's graph on a
    persistent thread pool, so its plans get no such cost (a fitted cpu_job_ms would still apply)."""
    from specs.figure import Figure
    hw = machine().model_copy(update={"constants": {"c_a_ms": Figure(0.15, "measured", "test")}})
    assert Constants.from_hw(hw).cpu_job_ms == Constants.from_hw(hw, "custom").cpu_job_ms == 0.15
    assert Constants.from_hw(hw, "llamacpp").cpu_job_ms == 0.0
    fitted = hw.model_copy(update={"constants": {"cpu_job_ms": Figure(0.05, "derived", "fit")}})
    assert Constants.from_hw(fitted, "llamacpp").cpu_job_ms == 0.05


def _shared_host():
    """epyc8ch-3090 with its GPU marked as the host's own cores (torch on the CPU), 66 GB/s per hit."""
    from specs.figure import Figure
    base = machine()
    return base.model_copy(update={"gpu": base.gpu.model_copy(update={"shares_host": True}),
                                   "constants": {"dev_expert_gbs": Figure(66.0, "derived", "test")}})


def test_host_device_and_cpu_tier_take_turns_on_the_cores():
    """A device that is the host's own cores (gpu.shares_host) cannot compute resident experts while
    the CPU tier computes misses on those cores: started together, the second finishes after the
    two times added up, not after the longer one."""
    from simulator.engine import Sim
    from simulator.resources import Machine
    model, hw = tiny_model(), _shared_host()
    plan = tiered(slots=0, kind="cpu")
    sim = Sim()
    m = Machine(sim, model, hw, plan, Constants.from_hw(hw))
    eb = model.expert_bytes
    t_dev, t_cpu = 4 * eb / m.dev_expert_rate, 4 * eb / m.cpu_expert_rate
    ends = {}
    m.host_experts(4, lambda: ends.setdefault("dev", sim.now))
    m.cpu_read(4 * eb, lambda: ends.setdefault("cpu", sim.now))
    sim.run()
    assert max(ends.values()) == pytest.approx(t_dev + t_cpu, rel=1e-6)


def test_hits_holding_the_cores_longer_delay_the_cpu_job_as_long():
    """On a host-sharing device, hits beside a CPU job hold the cores hold_s longer (what sharing them
    costs, trace_fit's overlap_dev_ms): the job, started with them, ends hold_s later."""
    from simulator.engine import Sim
    from simulator.resources import Machine
    model, hw = tiny_model(), _shared_host()
    ends = {}
    for hold in (0.0, 2e-4):
        sim = Sim()
        m = Machine(sim, model, hw, tiered(slots=0, kind="cpu"), Constants.from_hw(hw))
        m.host_experts(2, lambda: None, hold_s=hold)
        m.cpu_read(2 * model.expert_bytes, lambda h=hold: ends.setdefault(h, sim.now))
        sim.run()
    assert ends[2e-4] - ends[0.0] == pytest.approx(2e-4, rel=1e-9)


@pytest.mark.parametrize("slots", [0, 16, 48, 64])
@pytest.mark.parametrize("overlap", [False, True])
def test_screen_tracks_simulation_on_a_host_sharing_device(slots, overlap):
    """torch on the host's cores as the device (gpu.shares_host): the dense path at the host kernels'
    rate, a layer without hits inline (no hand-off), hits and a CPU job in turn on the cores after the
    hand-off (overlap_layer_ms, overlap_dev_ms where fitted) in both models. The screen is an
    expectation over the hit count at the simulation's hit rate: within 8% (all-CPU and all-hit
    layers within 2%); it had been 48% fast on the all-CPU plan (the dense path at the GPU's rate)."""
    model, hw = tiny_model(), _shared_host()
    plan = tiered(slots=slots, kind="cpu")
    more = dict(overlap_layer_ms=0.2, overlap_dev_ms=0.1) if overlap else {}
    c = Constants.from_hw(hw, handover_ms=0.03, device_layer_ms=0.05, **more)
    sim = simulate(model, hw, plan, gen_tokens=200, constants=c, routing="uniform")
    scr = screen(model, hw, plan, constants=c, hit_rate=sim.cache_hit_rate)
    tol = 0.02 if slots in (0, 64) else 0.08
    assert scr.decode_tok_s == pytest.approx(sim.decode_tok_s, rel=tol)


def _step_ms(model, hw, plan, c: Constants) -> float:
    """One uncontended decode step of `plan` (uniform routing, a cold start), ms."""
    return 1e3 / simulate(model, hw, plan, gen_tokens=1, routing="uniform", warm_steps=0, constants=c).decode_tok_s


def _cpu_only_step_with(extra: Constants):
    """(model, hw, plan, ms the constants `extra` add to a CPU-only step, extra) on the tiny model."""
    model = tiny_model()
    hw = machine().model_copy(update={"gpu": None, "pcie": None})
    plan = tiered(slots=0, kind="cpu")
    plan = plan.model_copy(update={"placement": plan.placement.model_copy(update={"dense": "cpu", "kv": "cpu"})})
    return model, hw, plan, _step_ms(model, hw, plan, extra) - _step_ms(model, hw, plan, Constants()), extra


def test_cpu_layer_cost_is_paid_once_per_moe_layer_in_both_models():
    """calibrate's cpu_layer_ms (alternating attention and experts on the host cores) adds exactly
    that much per MoE layer to a CPU-only step, in the event simulation and in the closed form."""
    model, hw, plan, added_ms, extra = _cpu_only_step_with(Constants(cpu_layer_ms=0.25))
    assert added_ms == pytest.approx(model.n_moe_layers * 0.25, rel=1e-6)
    assert screen(model, hw, plan, constants=extra).decode_tok_s == pytest.approx(
        simulate(model, hw, plan, gen_tokens=1, routing="uniform", warm_steps=0, constants=extra).decode_tok_s, rel=1e-9)


def test_cpu_layer_cost_per_mb_grows_with_what_the_layer_reads_in_both_models():
    """cpu_layer_ms_per_mb: a CPU-only MoE layer pays it per MB of its own dense bytes (not the output
    head's, read once after the last layer) and of the experts it computes (the kernels run slower
    between attention blocks); the step grows by exactly that in
    the event simulation (uniform routing, one token: top-k distinct experts a layer), and the
    closed form agrees."""
    model, hw, plan, added_ms, extra = _cpu_only_step_with(Constants(cpu_layer_ms_per_mb=0.01))
    per_layer_mb = (model.layer_dense_bytes + model.top_k * model.expert_bytes) / 1e6  # the head is not a layer's
    assert added_ms == pytest.approx(model.n_moe_layers * 0.01 * per_layer_mb, rel=1e-6)
    assert screen(model, hw, plan, constants=extra).decode_tok_s == pytest.approx(1e3 / (_step_ms(
        model, hw, plan, Constants()) + added_ms), rel=1e-9)


@pytest.mark.parametrize("text", ["seen", "new"])
def test_inline_engram_gather_equals_closed_form(text):
    """An inline Engram gather (cold rows: one page fault after another) lengthens the step by the
    same amount in the event simulation and in the closed form, to 1e-9."""
    model, hw = tiny_model(engram=True), machine()
    plan = tiered(slots=0, kind="cpu")
    plan = plan.model_copy(update={"placement": plan.placement.model_copy(
        update={"engram": "nvme", "engram_gather": "inline"})})
    sim = simulate(model, hw, plan, gen_tokens=1, routing="uniform", warm_steps=0, constants=CONSTS,
                   engram_text=text)
    scr = screen(model, hw, plan, constants=CONSTS, engram_text=text)
    assert sim.decode_tok_s == pytest.approx(scr.decode_tok_s, rel=1e-9)


# ----------------------------------------------------------------------------- several tokens a step

def _d141(streams_case: str = "D141-1stream"):
    """Model, hardware and sized plan of a D141 case (calibration.cases, as calibration.fit runs it)."""
    from calibration.cases import get_case
    from specs.loaders import load_hardware, load_model
    from specs.memory import size_cache
    case = get_case(streams_case)
    model, hw = load_model(case.model), load_hardware(case.hardware)
    return case, model, hw, size_cache(model, hw, case.plan)


def _miss(plan, **upd):
    """`plan` with its miss policy updated."""
    return plan.model_copy(update={"miss_policy": plan.miss_policy.model_copy(update=upd)})


@pytest.mark.parametrize("kind", ["auction", "cpu", "zero-copy", "copy"])
def test_one_token_a_step_ignores_the_token_aware_terms(kind):
    """One stream, no MTP: every distinct expert is routed by one token, so neither the auction's
    c_tok (DSV41_CT_TOK) nor the CPU rate of further products (cpu_prefill_gflops_per_core) can
    move the screen: it equals the c_tok 0 screen (the single-token path), bit for bit."""
    _, model, hw, plan = _d141()
    for mdl, machine_, p in ((model, hw, _miss(plan, kind=kind)), (tiny_model(), machine(), tiered(kind=kind))):
        old = screen(mdl, machine_, _miss(p, c_tok=0.0), streams=1, constants=CONSTS)
        slow = replace(CONSTS, cpu_prefill_gflops_per_core=1e-3)
        new = screen(mdl, machine_, _miss(p, c_tok=0.35), streams=1, constants=slow)
        assert (new.decode_tok_s, new.step_ms) == (old.decode_tok_s, old.step_ms)


@pytest.mark.parametrize("streams", [2, 4])
def test_token_aware_split_moves_screen_toward_simulation(streams, monkeypatch):
    """D141 (auction, c_tok 0.35, at most 384 CPU experts): with several streams a distinct expert
    is routed by ntok k / n tokens on average, and a CPU expert costs c_b (1 + c_tok (m - 1)) plus
    its further products (dsv41-flash-offload ct/ft_tier_cu_v.cu, as simulator/decode.py). The
    screen's error against the event simulation is no larger than the single-token split's."""
    import simulator.screen as scr_mod
    case, model, hw, plan = _d141()
    sim = simulate(model, hw, plan, streams=streams, gen_tokens=case.gen_tokens,
                   warm_steps=case.warm_steps).decode_tok_s
    new = screen(model, hw, plan, streams=streams).decode_tok_s
    monkeypatch.setattr(scr_mod, "_tokens_per_expert", lambda ntok, k, n: 1.0)
    old = screen(model, hw, plan, streams=streams).decode_tok_s
    print(f"{streams} streams: sim {sim:.3f}, screen {new:.3f} (single-token {old:.3f}) tok/s")
    assert abs(new - sim) <= abs(old - sim)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 8), st.sampled_from([0, 4, 8]), st.floats(0, 2), st.floats(0, 2))
def test_raising_c_tok_never_hands_the_cpu_more_misses(streams, slots, a, b):
    """The screen's split prices a CPU expert routed by m tokens at c_b (1 + c_tok (m - 1)): a dearer
    further token never moves a miss to the CPU, for any hit count of the layer. (The screen's
    tok/s itself need not fall: the auction prices with the plan's constants, the screen times
    with the machine's.)"""
    from simulator.routing import distinct_per_layer
    from simulator.screen import _cpu_count, _tokens_per_expert
    model, plan = tiny_model(), tiered(slots=slots)
    lo, hi = sorted((a, b))
    k = model.top_k
    n = int(round(distinct_per_layer(streams, model.n_experts, k)))
    m = _tokens_per_expert(streams, k, n)
    for nh in range(n + 1):
        k_lo = _cpu_count(nh, n - nh, _miss(plan, c_tok=lo), True, {}, m)
        k_hi = _cpu_count(nh, n - nh, _miss(plan, c_tok=hi), True, {}, m)
        assert k_hi <= k_lo


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 8), st.sampled_from(["auction", "cpu"]), st.floats(1, 500), st.floats(1, 500))
def test_slower_further_products_never_speed_the_screen(streams, kind, a, b):
    """A CPU expert routed by m tokens pays m - 1 further products at the CPU GEMM rate
    (Machine.cpu_pairs_s, on any machine): a slower rate never makes the screen faster."""
    lo, hi = sorted((a, b))
    model, hw, plan = tiny_model(), machine(), tiered(kind=kind)
    fast = replace(CONSTS, cpu_prefill_gflops_per_core=hi)
    slow = replace(CONSTS, cpu_prefill_gflops_per_core=lo)
    assert (screen(model, hw, plan, streams=streams, constants=slow).decode_tok_s
            <= screen(model, hw, plan, streams=streams, constants=fast).decode_tok_s)


def test_cpu_experts_pay_further_products_whether_read_from_ram_or_nvme():
    """With 4 streams a CPU expert routed by several tokens pays the further products at the CPU GEMM
    rate (Machine.cpu_pairs_s) in the event simulation, also when the layer's CPU experts stream from
    NVMe (RAM holds 20 of the tiny model's 64 experts): slowing that rate 1000x adds as much time per
    token (within 10%) as it adds with every expert in RAM."""
    model, hw = tiny_model(), machine()

    def added_s(ram_experts):  # s per token added by the slow GEMM rate
        plan = tiered(slots=0, kind="cpu")
        if ram_experts is not None:
            plan = plan.model_copy(update={"placement": plan.placement.model_copy(
                update={"expert_ram_bytes": ram_experts * model.expert_bytes})})
        rate = lambda g: simulate(model, hw, plan, streams=4, gen_tokens=16,  # noqa: E731
                                  constants=replace(CONSTS, cpu_prefill_gflops_per_core=g)).decode_tok_s
        return 1 / rate(0.5) - 1 / rate(500.0)

    ram, nvme = added_s(None), added_s(20)
    assert ram > 0 and nvme == pytest.approx(ram, rel=0.1)



def _cpu_only_llamacpp(rowwise: float | None):
    """tiny, all-CPU, as a llama.cpp plan and as the executor's; the profile's rowwise rates (GB/s, every
    format) when given."""
    from specs.figure import Figure
    hw = machine().model_copy(update={"gpu": None, "pcie": None, "constants": {}})
    if rowwise is not None:
        hw = hw.model_copy(update={"cpu": hw.cpu.model_copy(update={
            "rowwise_gbs": {"default": Figure(rowwise, "measured", "test")}})})
    plan = tiered(slots=0, kind="cpu")
    plan = plan.model_copy(update={"placement": plan.placement.model_copy(update={"dense": "cpu", "kv": "cpu"})})
    return hw, plan.model_copy(update={"engine": "llamacpp"}), plan


def test_llamacpp_plans_read_the_rowwise_rates():
    """llama.cpp's ggml computes one row per dot product without software prefetch: its plans run at the
    profile's rowwise rates (calibration.bench_rowwise) where it has them, in the event simulation and the
    screen alike; the executor's plans keep the expert-kernel rates."""
    model = tiny_model()
    hw0, ll, own = _cpu_only_llamacpp(None)
    hw, _, _ = _cpu_only_llamacpp(float(hw0.cpu.expert_gbs_for(model.fmt_experts)) / 2)
    run = lambda h, p: simulate(model, h, p, gen_tokens=1, routing="uniform", warm_steps=0).decode_tok_s  # noqa: E731
    assert run(hw, own) == pytest.approx(run(hw0, own), rel=1e-12)  # the executor: unchanged
    assert run(hw, ll) < run(hw0, ll) * 0.75  # llama.cpp: at half the rate, CPU bound
    assert run(hw, ll) == pytest.approx(screen(model, hw, ll).decode_tok_s, rel=1e-9)


@settings(max_examples=15, deadline=None)
@given(st.floats(2.0, 40.0), st.floats(1.0, 3.0))
def test_more_rowwise_bandwidth_never_slows_llamacpp(gbs, factor):
    """A higher rowwise rate never lowers a llama.cpp plan's simulated decode."""
    model = tiny_model()
    (hw, ll, _), (hw2, _, _) = _cpu_only_llamacpp(gbs), _cpu_only_llamacpp(gbs * factor)
    a = simulate(model, hw, ll, gen_tokens=4, routing="uniform", warm_steps=0).decode_tok_s
    b = simulate(model, hw2, ll, gen_tokens=4, routing="uniform", warm_steps=0).decode_tok_s
    assert b >= a * (1 - 1e-9)


def _q4_llamacpp(isa: list[str], repack: bool, repacked_gbs: float, rowwise_gbs: float):
    """tiny with Q4_0 experts, all-CPU as a llama.cpp plan (cpu_repack as given) on a CPU with `isa`, whose
    profile has Q4_0 at `repacked_gbs` in llama.cpp's repacked layout and `rowwise_gbs` a row at a time."""
    from specs.figure import Figure
    model = tiny_model().model_copy(update={"expert_format": "Q4_0"})
    hw, ll, _ = _cpu_only_llamacpp(rowwise_gbs)
    hw = hw.model_copy(update={"cpu": hw.cpu.model_copy(update={
        "isa": isa, "repacked_gbs": {"Q4_0": Figure(repacked_gbs, "measured", "test")}})})
    return model, hw, ll.model_copy(update={"cpu_repack": repack})


def test_llamacpp_plans_read_the_repacked_rate_of_the_formats_llamacpp_repacks():
    """llama.cpp copies Q4_0 at load into 8 interleaved rows on an AVX2 CPU and computes 8 rows a pass
    (ggml_gemv_q4_0_8x8_q8_0): such plans run at the profile's repacked Q4_0 rate; with --no-repack
    (cpu_repack off), or on a CPU without AVX2, at the rowwise rate; the screen agrees with the events."""
    run = lambda m, h, p: simulate(m, h, p, gen_tokens=1, routing="uniform", warm_steps=0).decode_tok_s  # noqa: E731
    fast = run(*_q4_llamacpp(["avx2"], True, 20.0, 5.0))
    assert fast > 1.3 * run(*_q4_llamacpp(["avx2"], False, 20.0, 5.0))
    assert fast > 1.3 * run(*_q4_llamacpp(["avx"], True, 20.0, 5.0))
    m, h, p = _q4_llamacpp(["avx2"], True, 20.0, 5.0)
    assert fast == pytest.approx(screen(m, h, p).decode_tok_s, rel=1e-9)
