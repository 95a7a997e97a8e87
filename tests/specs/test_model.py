"""ModelSpec.expert_rate: one pass over experts of several weight types, each at its own rate."""
from hypothesis import given, strategies as st

from specs.loaders import load_model
from specs.model import ModelSpec

BASE = load_model("deepseek-v4.1-flash")


def _mixed(q4k_bytes: float, q6k_bytes: float) -> ModelSpec:
    """A spec whose experts are two tensors, Q4_K and Q6_K (a Q4_K_M file's gate / up and down), of those bytes."""
    tensors = [dict(name="blk.0.ffn_gate_exps.weight", type="Q4_K", shape=[256, 1, int(q4k_bytes // 144)],
                    bytes=int(q4k_bytes), group="experts"),
               dict(name="blk.0.ffn_down_exps.weight", type="Q6_K", shape=[256, 1, int(q6k_bytes // 210)],
                    bytes=int(q6k_bytes), group="experts")]
    return ModelSpec.model_validate({**BASE.model_dump(), "tensors": tensors})


def test_two_types_run_at_their_bytes_over_the_sum_of_their_times():
    """144 MB of Q4_K at 24 GB/s and 210 MB of Q6_K at 30 GB/s: 354 MB in 6 + 7 ms, 27.23 GB/s (not 24, the
    rate of the type that names the file)."""
    m = _mixed(144e6, 210e6)
    rate = m.expert_rate(lambda f: {"Q4_K": 24.0, "Q6_K": 30.0}[f.name])
    assert abs(rate - 354 / 13) < 1e-9


def test_per_weight_rates_weigh_each_type_by_its_weights():
    """per='weights' (GFLOP/s): 1e6 Q4_K weights at 100 and 1e6 Q6_K weights at 50 run at 2 / (1/100 + 1/50)."""
    m = _mixed(144 * 1e6 / 256, 210 * 1e6 / 256)
    rate = m.expert_rate(lambda f: {"Q4_K": 100.0, "Q6_K": 50.0}[f.name], per="weights")
    assert abs(rate - 2 / (1 / 100 + 1 / 50)) < 1e-9


def test_one_type_runs_at_its_own_rate():
    """A preset's experts, all of one format: exactly that format's rate."""
    assert BASE.expert_rate(lambda f: 17.5) == 17.5


@given(st.floats(1e6, 1e9), st.floats(1e6, 1e9), st.floats(1.0, 100.0), st.floats(1.0, 100.0), st.floats(1.0, 3.0))
def test_the_mixed_rate_lies_between_the_types_and_rises_with_either(b4, b6, r4, r6, up):
    """Between the slowest and the fastest type's rate, and never lower when one type's rate goes up."""
    m = _mixed(b4, b6)
    rate = m.expert_rate(lambda f: {"Q4_K": r4, "Q6_K": r6}[f.name])
    assert min(r4, r6) * (1 - 1e-12) <= rate <= max(r4, r6) * (1 + 1e-12)
    assert m.expert_rate(lambda f: {"Q4_K": r4 * up, "Q6_K": r6}[f.name]) >= rate * (1 - 1e-12)
