"""Without contention the event simulation equals the closed-form screen (same constants)."""
import pytest

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


def test_host_device_and_cpu_tier_take_turns_on_the_cores():
    """A device that is the host's own cores (gpu.shares_host) cannot compute resident experts while
    the CPU tier computes misses on those cores: started together, the second finishes after the
    two times added up, not after the longer one."""
    from simulator.engine import Sim
    from simulator.resources import Machine
    from specs.figure import Figure
    model = tiny_model()
    base = machine()
    hw = base.model_copy(update={"gpu": base.gpu.model_copy(update={"shares_host": True}),
                                 "constants": {"dev_expert_gbs": Figure(66.0, "derived", "test")}})
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


def test_cpu_layer_cost_is_paid_once_per_moe_layer_in_both_models():
    """calibrate's cpu_layer_ms (alternating attention and experts on the host cores) adds exactly
    that much per MoE layer to a CPU-only step, in the event simulation and in the closed form."""
    model = tiny_model()
    hw = machine().model_copy(update={"gpu": None, "pcie": None})
    plan = tiered(slots=0, kind="cpu")
    plan = plan.model_copy(update={"placement": plan.placement.model_copy(update={"dense": "cpu", "kv": "cpu"})})
    base, extra = Constants(), Constants(cpu_layer_ms=0.25)
    s0, s1 = (simulate(model, hw, plan, gen_tokens=1, routing="uniform", warm_steps=0, constants=c) for c in (base, extra))
    step_ms = lambda r: 1e3 / r.decode_tok_s  # noqa: E731
    assert step_ms(s1) - step_ms(s0) == pytest.approx(model.n_moe_layers * 0.25, rel=1e-6)
    assert screen(model, hw, plan, constants=extra).decode_tok_s == pytest.approx(s1.decode_tok_s, rel=1e-9)


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
