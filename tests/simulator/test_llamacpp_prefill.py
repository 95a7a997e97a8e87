"""llama.cpp plans' CPU prefill: each format at the rate of the structure ggml's MUL_MAT_ID gives it
(specs.formats.llamacpp_prefill_path; calibration.bench_ggml_prefill times them), the executor's plans at the
profile's one prefill rate."""
import pytest
from hypothesis import given, settings, strategies as st

from simulator.run import simulate
from simulator.screen import screen
from specs.figure import Figure

from sim_fixtures import machine, tiered, tiny_model


def _cpu_only(fmt: str, rates: dict[str, float], isa=("avx2",), repack: bool = True):
    """tiny with `fmt` experts, all-CPU, as a llama.cpp plan and as the executor's, on a profile whose
    ggml_prefill_gflops are `rates` (GFLOP/s per core) and whose one prefill rate is 10 GFLOP/s per core."""
    hw = machine().model_copy(update={"gpu": None, "pcie": None,
                                      "constants": {"cpu_prefill_gflops_per_core": Figure(10.0, "measured", "test")}})
    hw = hw.model_copy(update={"cpu": hw.cpu.model_copy(update={
        "isa": list(isa), "ggml_prefill_gflops": {k: Figure(v, "measured", "test") for k, v in rates.items()}})})
    model = tiny_model().model_copy(update={"expert_format": fmt})
    plan = tiered(slots=0, kind="cpu")
    plan = plan.model_copy(update={"placement": plan.placement.model_copy(update={"dense": "cpu", "kv": "cpu"})})
    return model, hw, plan.model_copy(update={"engine": "llamacpp", "cpu_repack": repack}), plan


def _ttft(model, hw, plan, prompt: int = 256) -> float:
    return simulate(model, hw, plan, prompt_tokens=prompt, gen_tokens=1, routing="uniform", warm_steps=0).ttft_s


def test_llamacpp_prefill_reads_the_rate_of_the_path_ggml_takes():
    """Q4_K experts in place at a 256-token prompt (tiny: 32 tokens an expert, >= 8) take ggml's tiled GEMM:
    a faster tiled rate shortens the llama.cpp plan's TTFT, a faster dot-product rate does not, and the
    executor's plan keeps the profile's one rate."""
    slow = _cpu_only("Q4_K", {"Q4_K:tiled": 10.0, "Q4_K": 10.0}, repack=False)
    fast_tiled = _cpu_only("Q4_K", {"Q4_K:tiled": 80.0, "Q4_K": 10.0}, repack=False)
    fast_dots = _cpu_only("Q4_K", {"Q4_K:tiled": 10.0, "Q4_K": 80.0}, repack=False)
    assert _ttft(*fast_tiled[:3]) < 0.7 * _ttft(*slow[:3])
    assert _ttft(*fast_dots[:3]) == pytest.approx(_ttft(*slow[:3]), rel=1e-12)
    assert _ttft(*fast_tiled[:2], fast_tiled[3]) == pytest.approx(_ttft(*slow[:2], slow[3]), rel=1e-12)


def test_sixteen_tokens_an_expert_or_fewer_read_the_tiled_gemms_narrow_rate():
    """tiny's 256-token prompt puts 32 tokens on an expert (the standard tiled path), a 64-token one 8 or a few more
    (the narrow path, ggml's slabs long in K): each reads its own rate; a profile without a narrow rate gives the
    standard one."""
    rates = {"Q4_K:tiled": 80.0, "Q4_K:tiled-narrow": 20.0}
    both, wide = _cpu_only("Q4_K", rates, repack=False)[:3], _cpu_only("Q4_K", {"Q4_K:tiled": 80.0}, repack=False)[:3]
    assert _ttft(*both, prompt=64) > 1.5 * _ttft(*wide, prompt=64)
    assert _ttft(*both, prompt=256) == pytest.approx(_ttft(*wide, prompt=256), rel=1e-12)


def test_repacked_q4_0_prefill_reads_the_repacked_rate_unless_no_repack():
    """Q4_0 on an AVX2 CPU is repacked at load (a gemv per token over 8 interleaved rows): its prefill runs at
    the repacked rate; with --no-repack, at the dot-product rate; the screen agrees with the events."""
    rates = {"Q4_0:repacked": 60.0, "Q4_0": 10.0}
    rep, norep = _cpu_only("Q4_0", rates)[:3], _cpu_only("Q4_0", rates, repack=False)[:3]
    assert _ttft(*rep) < 0.7 * _ttft(*norep)
    for m, h, p in (rep, norep):
        assert screen(m, h, p, prompt_tokens=256).ttft_s == pytest.approx(_ttft(m, h, p), rel=0.05)


def test_a_format_without_a_ggml_rate_keeps_the_profiles_one_rate():
    """A profile with ggml rates for other formats only: Q8_0 experts prefill at cpu_prefill_gflops_per_core."""
    m, h, ll, _ = _cpu_only("Q8_0", {"Q4_K:tiled": 80.0})
    m0, h0, ll0, _ = _cpu_only("Q8_0", {})
    assert _ttft(m, h, ll) == pytest.approx(_ttft(m0, h0, ll0), rel=1e-12)


def test_a_rate_measured_on_one_core_serves_one_thread_plans():
    """'KEY@1t' is the per-core rate on one thread: a one-thread plan reads it, a two-thread plan the other."""
    rates = {"Q8_0": 20.0, "Q8_0@1t": 40.0}
    m, h, ll, _ = _cpu_only("Q8_0", rates)
    one = ll.model_copy(update={"cpu_threads": 1})
    ref = _cpu_only("Q8_0", {"Q8_0": 40.0})
    assert _ttft(m, h, one) == pytest.approx(_ttft(ref[0], ref[1], one), rel=1e-12)
    assert _ttft(m, h, ll) > _ttft(ref[0], ref[1], ll)


@settings(max_examples=12, deadline=None)
@given(st.floats(5.0, 100.0), st.floats(1.0, 4.0))
def test_a_faster_ggml_prefill_rate_never_lengthens_ttft(gflops, factor):
    """More GFLOP/s on the path ggml takes never lengthens a llama.cpp plan's simulated TTFT."""
    a = _cpu_only("Q8_0", {"Q8_0": gflops})[:3]
    b = _cpu_only("Q8_0", {"Q8_0": gflops * factor})[:3]
    assert _ttft(*b, prompt=64) <= _ttft(*a, prompt=64) * (1 + 1e-9)


def test_repacked_q4_k_prefill_runs_at_the_rebuilt_q4_0_gemvs_rate():
    """Q4_K on an AVX2 CPU is repacked too and prefills through repack.cpp's same gemv per token: without a Q4_K
    figure on that path it takes Q4_0's (specs.formats.LLAMACPP_REPACKED_STAND_IN), exactly as a Q4_K:repacked
    figure of the same rate would; not the profile's one rate (the executor's integer GEMM), and its own figure
    wins where the profile has one."""
    stand_in = _cpu_only("Q4_K", {"Q4_0:repacked": 60.0, "Q4_0": 10.0})[:3]
    own = _cpu_only("Q4_K", {"Q4_K:repacked": 60.0})[:3]
    none = _cpu_only("Q4_K", {"Q4_0": 10.0})[:3]
    both = _cpu_only("Q4_K", {"Q4_K:repacked": 20.0, "Q4_0:repacked": 60.0})[:3]
    assert _ttft(*stand_in) == pytest.approx(_ttft(*own), rel=1e-12)
    assert _ttft(*stand_in) < 0.7 * _ttft(*none)
    assert _ttft(*both) > 1.5 * _ttft(*own)


def _tiled_cpu(m0: float | None, ref: float | None = 8.0):
    """tiny's Q4_K experts in place on ggml's tiled GEMM at 80 GFLOP/s a core, timed at `ref` tokens an expert, with
    m0 tokens of a window's shared unpacking (None: the profile has no m0)."""
    model, hw, ll, _ = _cpu_only("Q4_K", {"Q4_K:tiled": 80.0}, repack=False)
    update = {"ggml_prefill_ref_tokens": Figure(ref, "measured", "test") if ref else None}
    if m0 is not None:
        update["ggml_prefill_fixed_tokens"] = {"Q4_K:tiled": Figure(m0, "measured", "test")}
    return model, hw.model_copy(update={"cpu": hw.cpu.model_copy(update=update)}), ll


def test_a_windows_fixed_tokens_scale_the_tiled_rate_from_its_timed_batch():
    """m0 = 16 tokens a window, rates timed at 64 tokens an expert: at 64 the rate as timed; at 128 (pp512 of a top-8
    of 32 model) (128 / 144) / (64 / 80) = 1.111x; at 256, one full window, 1.176x; at 257 a second window's
    unpacking, 257 / 289 over 0.8 = 1.112x; the same figure '@1t' serves one thread; no m0 or no reference batch, 1."""
    from simulator.resources import ggml_window_scale
    _, hw, _ = _tiled_cpu(16.0, ref=64.0)
    scale = lambda m, threads=2: ggml_window_scale(hw.cpu, "Q4_K:tiled", m, threads)  # noqa: E731
    assert scale(64) == pytest.approx(1.0, rel=1e-12)
    assert scale(128) == pytest.approx((128 / 144) / 0.8, rel=1e-12)
    assert scale(256) == pytest.approx((256 / 272) / 0.8, rel=1e-12)
    assert scale(257) == pytest.approx((257 / 289) / 0.8, rel=1e-12)
    one = hw.cpu.model_copy(update={"ggml_prefill_fixed_tokens": {"Q4_K:tiled@1t": Figure(0.0, "measured", "t")}})
    assert ggml_window_scale(one, "Q4_K:tiled", 128, 1) == 1.0
    assert ggml_window_scale(one, "Q4_K:tiled", 128, 2) == 1.0  # no m0 for two threads
    assert ggml_window_scale(_tiled_cpu(16.0, ref=None)[1].cpu, "Q4_K:tiled", 128, 2) == 1.0


def test_a_tiled_prefill_above_the_timed_batch_runs_faster_with_fixed_tokens():
    """tiny's 256-token prompt puts 32 tokens on an expert, four times the 8 the rate was timed at: with m0 = 8 its
    expert products run (32 / 40) / (8 / 16) = 1.6x the timed rate, so its TTFT shortens; a 64-token prompt (8 an
    expert, as timed: a hair more where the draw leaves an expert out) keeps the TTFT of the profile without m0 to
    0.1%; the screen agrees with the events."""
    plain, fixed = _tiled_cpu(None), _tiled_cpu(8.0)
    assert _ttft(*fixed) < 0.9 * _ttft(*plain)
    assert _ttft(*fixed, prompt=64) == pytest.approx(_ttft(*plain, prompt=64), rel=1e-3)
    assert screen(*fixed, prompt_tokens=256).ttft_s == pytest.approx(_ttft(*fixed), rel=0.05)


@settings(max_examples=30, deadline=None)
@given(m0=st.floats(0.0, 50.0), m=st.floats(1.0, 256.0), more=st.floats(1.0, 8.0))
def test_more_tokens_an_expert_within_a_window_never_lower_the_tiled_rate(m0, m, more):
    """Within one window (up to 256 tokens an expert) more tokens an expert never lower ggml's tiled rate."""
    from simulator.resources import ggml_window_scale
    cpu = _tiled_cpu(m0, ref=64.0)[1].cpu
    hi = min(256.0, m * more)
    assert ggml_window_scale(cpu, "Q4_K:tiled", hi, 2) >= ggml_window_scale(cpu, "Q4_K:tiled", m, 2) * (1 - 1e-12)


@settings(max_examples=30, deadline=None)
@given(m0=st.floats(0.0, 50.0), m=st.floats(1.0, 512.0), more=st.floats(1.0, 8.0))
def test_more_tokens_an_expert_never_lower_the_executors_prefill_rate(m0, m, more):
    """The executor's GEMM at m / (m + m0) of its peak (simulator.resources.executor_prefill_gflops): at the
    calibration batch's tokens an expert it is the measured rate, and more tokens an expert never lower it."""
    from simulator.resources import Constants, executor_prefill_gflops
    c = Constants(cpu_prefill_gflops_per_core=100.0, cpu_prefill_ref_tokens=16.0, cpu_prefill_fixed_tokens=m0)
    assert executor_prefill_gflops(c, 16.0) == pytest.approx(100.0)
    assert executor_prefill_gflops(c, m * more) >= executor_prefill_gflops(c, m) * (1 - 1e-12)


def test_the_executors_plan_prefills_a_long_prompt_faster_with_fixed_tokens():
    """An all-CPU executor plan on a profile with cpu_prefill_fixed_tokens = 4.4 (session 32's calibrate on the Zen 4
    VM: 105.5 GFLOP/s a core at 16 tokens an expert, 130 at 128): a 512-token prompt's tokens a second rise over
    the 64-token one's, by more than on the same profile with one rate."""
    model, hw, _, plan = _cpu_only("Q8_0", {})
    fixed = hw.model_copy(update={"constants": {**hw.constants, "cpu_prefill_fixed_tokens": Figure(4.4, "measured", "test"),
                                                "cpu_prefill_ref_tokens": Figure(16.0, "measured", "test")}})
    def tok_s(h, n):
        return n / _ttft(model, h, plan, prompt=n)
    assert tok_s(fixed, 512) / tok_s(fixed, 64) > 1.05 * tok_s(hw, 512) / tok_s(hw, 64)


def _with_constants(hw, **vals):
    return hw.model_copy(update={"constants": {**hw.constants, **{k: Figure(v, "measured", "test") for k, v in vals.items()}}})


def test_the_executors_dense_path_runs_at_its_measured_dense_and_attention_rates():
    """All-CPU prefill's dense products and attention (simulator.resources.host_dense_s): the executor's plan at
    cpu_dense_gflops_per_core / cpu_attention_gflops_per_core where the profile has them, so slower attention
    lengthens a 2,048-token prompt's TTFT by more than a 64-token one's; a llama.cpp plan keeps the expert GEMM's
    rate for them (ggml's own dense products are not timed), and the screen agrees with the events."""
    model, hw, ll, ex = _cpu_only("Q8_0", {})
    fast = _with_constants(hw, cpu_dense_gflops_per_core=10.0, cpu_attention_gflops_per_core=10.0)
    slow = _with_constants(hw, cpu_dense_gflops_per_core=10.0, cpu_attention_gflops_per_core=1.0)
    grow = [_ttft(model, slow, ex, prompt=n) / _ttft(model, fast, ex, prompt=n) for n in (64, 2048)]
    assert 1.0 < grow[0] < grow[1]
    assert _ttft(model, slow, ll) == pytest.approx(_ttft(model, hw, ll), rel=1e-12)
    assert _ttft(model, fast, ex) == pytest.approx(_ttft(model, hw, ex), rel=1e-12)  # 10 = the expert rate
    for h in (fast, slow):
        assert screen(model, h, ex, prompt_tokens=256).ttft_s == pytest.approx(_ttft(model, h, ex), rel=0.05)


@settings(max_examples=12, deadline=None)
@given(st.floats(1.0, 50.0), st.floats(1.0, 4.0), st.sampled_from(["cpu_dense_gflops_per_core",
                                                                   "cpu_attention_gflops_per_core"]))
def test_a_faster_host_dense_rate_never_lengthens_ttft(gflops, factor, name):
    """More GFLOP/s for the host's dense products or its attention never lengthens an all-CPU executor plan's TTFT."""
    model, hw, _, ex = _cpu_only("Q8_0", {})
    a, b = _with_constants(hw, **{name: gflops}), _with_constants(hw, **{name: gflops * factor})
    assert _ttft(model, b, ex, prompt=512) <= _ttft(model, a, ex, prompt=512) * (1 + 1e-9)


def test_llamacpp_dense_prefill_reads_llamafiles_f16_rate():
    """llama.cpp's F16 dense products on a batch run on llamafile's tinyBLAS (specs.formats.llamacpp_dense_prefill_key):
    a profile's 'F16:sgemm' rate of 40 GFLOP/s a core, 4x the expert GEMM's 10, shortens the llama.cpp plan's TTFT by
    exactly its dense products' FLOPs x (1/10 - 1/40) ns over the threads (tiny's dense path is all F16; attention,
    flash attention on the CPU, keeps its rate), on the events and the screen alike; the executor's plan keeps its
    own dense rate."""
    slow = _cpu_only("Q8_0", {"Q8_0": 10.0}, isa=("avx2", "f16c"))
    fast = _cpu_only("Q8_0", {"Q8_0": 10.0, "F16:sgemm": 40.0}, isa=("avx2", "f16c"))
    model, hw, plan = fast[:3]
    saved = model.prefill_dense_flops(256, 1) * (1 / 10.0 - 1 / 40.0) / (1e9 * (plan.cpu_threads or hw.cpu.threads_used))
    assert _ttft(*slow[:3]) - _ttft(*fast[:3]) == pytest.approx(saved, rel=1e-6)
    assert screen(*fast[:3], prompt_tokens=256).ttft_s == pytest.approx(_ttft(*fast[:3]), rel=0.05)
    assert _ttft(*fast[:2], fast[3]) == pytest.approx(_ttft(*slow[:2], slow[3]), rel=1e-12)


def test_without_f16c_llamafile_does_not_take_f16_and_the_rate_is_not_read():
    """tinyBLAS's F16 path needs AVX-512 F, or AVX2 and F16C: on a CPU with AVX2 alone the 'F16:sgemm' rate is not
    llama.cpp's path there and the dense products keep the expert GEMM's rate."""
    no_f16c = _cpu_only("Q8_0", {"Q8_0": 10.0, "F16:sgemm": 40.0}, isa=("avx2",))
    none = _cpu_only("Q8_0", {"Q8_0": 10.0}, isa=("avx2",))
    assert _ttft(*no_f16c[:3]) == pytest.approx(_ttft(*none[:3]), rel=1e-12)


def _tok_s(model, hw, plan) -> float:
    return simulate(model, hw, plan, prompt_tokens=1, gen_tokens=16, routing="uniform", warm_steps=0).decode_tok_s


def test_llamacpp_weighting_of_the_expert_outputs_lengthens_prefill_by_its_values():
    """llama.cpp multiplies each MoE layer's expert outputs by their router weights on the CPU (ggml's MUL of
    build_moe_ffn, calibration.ggml_binary): a profile's 'F32:weighting' rate of 0.5 giga-values a second a core
    lengthens the llama.cpp plan's 256-token TTFT by exactly n_moe_layers x (ceil(256 x k / threads) + ceil(k /
    threads)) rows x hidden values / 0.5e9 (ggml splits the rows evenly over the threads; the TTFT holds the first
    token's decode step too), on the events and the screen alike; the executor's plan, which weights inside its own
    products, does not move."""
    without = _cpu_only("Q8_0", {"Q8_0": 10.0})
    model, hw, plan, ex = _cpu_only("Q8_0", {"Q8_0": 10.0, "F32:weighting": 0.5})
    threads = plan.cpu_threads or hw.cpu.threads_used
    rows = -(-256 * model.top_k // threads) + -(-model.top_k // threads)
    added = model.n_moe_layers * rows * model.hidden / 0.5e9
    assert _ttft(model, hw, plan) - _ttft(*without[:3]) == pytest.approx(added, rel=1e-6)
    assert screen(model, hw, plan, prompt_tokens=256).ttft_s - screen(*without[:3], prompt_tokens=256).ttft_s \
        == pytest.approx(added, rel=1e-6)
    assert _ttft(model, hw, ex) == pytest.approx(_ttft(*without[:2], without[3]), rel=1e-12)


def test_llamacpp_weighting_slows_all_cpu_decode_by_one_tokens_rows():
    """In decode the same multiply covers one token's k rows a layer: a token takes n_moe_layers x ceil(k / threads)
    x hidden / rate longer on an all-CPU llama.cpp plan, on the events and the screen alike."""
    without = _cpu_only("Q8_0", {"Q8_0": 10.0})
    model, hw, plan, _ = _cpu_only("Q8_0", {"Q8_0": 10.0, "F32:weighting": 0.5})
    threads = plan.cpu_threads or hw.cpu.threads_used
    added = model.n_moe_layers * -(-model.top_k // threads) * model.hidden / 0.5e9
    assert 1 / _tok_s(model, hw, plan) - 1 / _tok_s(*without[:3]) == pytest.approx(added, rel=1e-3)
    assert 1 / screen(model, hw, plan).decode_tok_s - 1 / screen(*without[:3]).decode_tok_s \
        == pytest.approx(added, rel=1e-6)


@settings(max_examples=12, deadline=None)
@given(st.floats(0.05, 5.0), st.floats(1.0, 4.0))
def test_a_faster_weighting_rate_never_lengthens_ttft(rate, factor):
    """More giga-values a second for llama.cpp's weighting never lengthens its plan's TTFT."""
    a = _cpu_only("Q8_0", {"Q8_0": 10.0, "F32:weighting": rate})
    b = _cpu_only("Q8_0", {"Q8_0": 10.0, "F32:weighting": rate * factor})
    assert _ttft(*b[:3]) <= _ttft(*a[:3]) * (1 + 1e-9)


def test_with_a_device_the_weighting_is_not_the_hosts():
    """With a GPU, ggml's scheduler runs the weighting (a MUL holding no weights) on the device (its "expand gpu up"
    pass): a hybrid llama.cpp plan whose RAM experts prefill on the CPU (no op offload at 256 tokens) does not read the
    host's 'F32:weighting' rate, in its TTFT or its decode."""
    model = tiny_model().model_copy(update={"expert_format": "Q8_0"})
    base = machine()
    plan = tiered(slots=0, kind="cpu").model_copy(update={"engine": "llamacpp"})
    plan = plan.model_copy(update={"prefill": plan.prefill.model_copy(update={"op_offload_min_batch": 4096})})  # CPU experts
    rated = base.model_copy(update={"cpu": base.cpu.model_copy(update={
        "ggml_prefill_gflops": {"F32:weighting": Figure(0.01, "measured", "test")}})})
    for hw in (base, rated):
        assert hw.gpu is not None
    a, b = (simulate(model, h, plan, prompt_tokens=256, gen_tokens=8, routing="uniform", warm_steps=0) for h in (base, rated))
    assert b.ttft_s == pytest.approx(a.ttft_s, rel=1e-12) and b.decode_tok_s == pytest.approx(a.decode_tok_s, rel=1e-12)
