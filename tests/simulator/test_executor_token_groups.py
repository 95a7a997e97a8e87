"""The executor's prefill GEMM in token groups (executor.qgemm.q_matmul; specs.formats.executor_group_tokens): an
expert's tokens past a group's L2 share decode its weights again, so the simulator prices each group's fixed part
(cpu_prefill_fixed_tokens, m0) where the profile has the core's L2."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from simulator.resources import Constants, cpu_expert_prefill_gflops, executor_prefill_gflops
from specs.figure import Figure
from specs.formats import executor_expert_groups, executor_group_bytes, executor_group_tokens
from specs.model import ModelSpec

from sim_fixtures import machine, tiered

M0 = 10.0  # session 56's Zen 5 profiles: 10.0 tokens (cpu_prefill_fixed_tokens)


def _small():
    """`small`'s expert shape (make-model's preset: hidden 2,048, experts of 768, top-8 of 32), Q4_0."""
    return ModelSpec(name="small-shape", n_layers=8, hidden=2048, vocab=32000, n_experts=32, top_k=8, expert_ffn=768,
                     expert_format="Q4_0", attention={"n_heads": 8, "n_kv_heads": 4, "head_dim": 64})


def _hw(l2: int | None, isa=("avx2", "fma", "f16c", "avx512f", "avx512vl", "avx512_vnni")):
    """epyc8ch-3090 without its GPU, the executor's prefill constants of a Zen 5 profile, and this L2 and ISA."""
    hw = machine().model_copy(update={"gpu": None, "pcie": None, "constants": {
        "cpu_prefill_gflops_per_core": Figure(175.0, "measured", "test"),
        "cpu_prefill_ref_tokens": Figure(16.0, "measured", "test"),
        "cpu_prefill_fixed_tokens": Figure(M0, "measured", "test")}})
    return hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"l2_bytes": l2, "isa": list(isa)})})


def test_smalls_gate_and_up_take_128_tokens_a_group_its_down_320_on_a_1_mb_l2():
    """Panels of 20 floats a 32 values (int16), 16-token blocks, 5/8 of 1 MB: 2,048 columns 80 KB a block, 8 blocks;
    768 columns 30 KB a block, 20 blocks (an even count); int8 panels (12 floats) 12 blocks at 2,048."""
    g = executor_group_bytes(1 << 20)
    assert g == 655360
    assert executor_group_tokens(2048, g) == 128 and executor_group_tokens(768, g) == 320
    assert executor_group_tokens(2048, g, "int8") == 192
    assert executor_group_tokens(7168, g) == 64  # a 4,096-column slice: 160 KB a block, 4 blocks


def test_an_experts_groups_are_the_mean_over_its_three_products():
    """512 tokens an expert of `small`: gate and up 4 groups of 128, down 2 of 320 -> 10 / 3; up to 128 tokens one;
    no L2 known: one group whatever the tokens."""
    g = executor_group_bytes(1 << 20)
    assert executor_expert_groups(2048, 768, 512, g) == pytest.approx(10 / 3)
    assert executor_expert_groups(2048, 768, 128, g) == 1.0
    assert executor_expert_groups(2048, 768, 512, None) == 1.0


def test_up_to_a_group_the_executors_prefill_rate_is_as_before():
    """pp512 of `small` (128 tokens an expert): one group, the rate of a profile without the L2; 512 tokens an
    expert (a 2,048-token micro-batch): the rate falls by (512 + m0) / (512 + 10 / 3 m0)."""
    model, plan = _small(), tiered(slots=0, kind="cpu")
    with_l2, without = _hw(1 << 20), _hw(None)
    for m in (16.0, 64.0, 128.0):
        assert cpu_expert_prefill_gflops(with_l2, plan, model, m, 2, Constants.from_hw(with_l2)) == \
            pytest.approx(cpu_expert_prefill_gflops(without, plan, model, m, 2, Constants.from_hw(without)), rel=1e-12)
    ratio = (cpu_expert_prefill_gflops(with_l2, plan, model, 512.0, 2, Constants.from_hw(with_l2))
             / cpu_expert_prefill_gflops(without, plan, model, 512.0, 2, Constants.from_hw(without)))
    assert ratio == pytest.approx((512 + M0) / (512 + 10 / 3 * M0), rel=1e-12)


def test_an_int8_profiles_groups_hold_192_tokens_at_2048_columns():
    """A profile calibrated on the int8 build (`calibrate --gemm-int8`: cpu.executor_gemm_activations int8) prices
    its panels of 12 floats a 32 values: at 160 tokens an expert of `small` the gate and up take one group (192
    tokens), not the int16 build's two (128), and the rate falls by (160 + m0) / (160 + g m0) against one group,
    g = 1 (int8) or 5 / 3 (int16)."""
    model, plan = _small(), tiered(slots=0, kind="cpu")
    g = executor_group_bytes(1 << 20)
    assert executor_expert_groups(2048, 768, 160, g, "int8") == 1.0
    assert executor_expert_groups(2048, 768, 160, g) == executor_expert_groups(2048, 768, 160, g, "int16") == 5 / 3
    int16, one = _hw(1 << 20), _hw(None)
    int8 = int16.model_copy(update={"cpu": int16.cpu.model_copy(update={"executor_gemm_activations": "int8"})})
    rate = {k: cpu_expert_prefill_gflops(hw, plan, model, 160.0, 2, Constants.from_hw(hw))
            for k, hw in (("int8", int8), ("int16", int16), ("one", one))}
    assert rate["int8"] == pytest.approx(rate["one"], rel=1e-12)
    assert rate["int16"] / rate["one"] == pytest.approx((160 + M0) / (160 + 5 / 3 * M0), rel=1e-12)


def test_without_avx512_vnni_the_float_gemm_takes_one_group():
    """The integer GEMM runs where the CPU has AVX-512 VNNI (specs.formats.EXECUTOR_QGEMM_ISA); on an AVX2 core the
    float GEMM's 256-column slices keep every token in L2: one group at 512 tokens an expert, whatever its L2."""
    from specs.formats import executor_prefill_group_bytes
    model, plan = _small(), tiered(slots=0, kind="cpu")
    avx2, one = _hw(1 << 20, isa=("avx2", "fma", "f16c", "avx_vnni")), _hw(None)
    assert executor_prefill_group_bytes(1 << 20, avx2.cpu.isa) is None
    assert executor_prefill_group_bytes(1 << 20, _hw(1 << 20).cpu.isa) == 655360
    assert cpu_expert_prefill_gflops(avx2, plan, model, 512.0, 2, Constants.from_hw(avx2)) == \
        pytest.approx(cpu_expert_prefill_gflops(one, plan, model, 512.0, 2, Constants.from_hw(one)), rel=1e-12)


def test_a_llama_cpp_plan_takes_no_executor_groups():
    """The groups are the executor's GEMM: a llama.cpp plan on a profile without ggml's prefill rates (the
    executor's job rate stands in for them) runs one group at 512 tokens an expert."""
    model, plan = _small(), tiered(slots=0, kind="cpu").model_copy(update={"engine": "llamacpp"})
    with_l2, without = _hw(1 << 20), _hw(None)
    assert cpu_expert_prefill_gflops(with_l2, plan, model, 512.0, 2, Constants.from_hw(with_l2)) == \
        pytest.approx(cpu_expert_prefill_gflops(without, plan, model, 512.0, 2, Constants.from_hw(without)), rel=1e-12)


def test_a_group_pays_the_fixed_part_once():
    """executor_prefill_gflops with g groups: the measured rate at the reference tokens times m / (m + g m0) over
    its value there."""
    c = Constants(cpu_prefill_gflops_per_core=100.0, cpu_prefill_ref_tokens=16.0, cpu_prefill_fixed_tokens=M0)
    assert executor_prefill_gflops(c, 256.0, 2.0) == pytest.approx(100.0 * (256 / (256 + 2 * M0)) / (16 / (16 + M0)))


@settings(max_examples=40, deadline=None)
@given(m=st.floats(1.0, 2048.0), kb=st.integers(64, 4096), more=st.floats(1.0, 8.0),
       cols=st.sampled_from([512, 768, 2048, 4096, 7168]))
def test_more_l2_never_slows_the_executors_prefill(m, kb, more, cols):
    """A larger L2 gives groups at least as large, so never more of them, and never a lower prefill rate."""
    small, large = executor_group_bytes(kb << 10), executor_group_bytes(int((kb << 10) * more))
    assert executor_group_tokens(cols, large) >= executor_group_tokens(cols, small)
    assert executor_expert_groups(cols, 768, m, large) <= executor_expert_groups(cols, 768, m, small)
    c = Constants(cpu_prefill_gflops_per_core=100.0, cpu_prefill_ref_tokens=16.0, cpu_prefill_fixed_tokens=M0)
    assert executor_prefill_gflops(c, m, executor_expert_groups(cols, 768, m, large)) >= \
        executor_prefill_gflops(c, m, executor_expert_groups(cols, 768, m, small))
    assert math.isfinite(executor_prefill_gflops(c, m, executor_expert_groups(cols, 768, m, small)))
