"""Weights of several types (llama.cpp's Q4_K_M, Q3_K_M and Q2_K files; F16 attention beside a Q8_0 head): each
type's bytes run at that type's rate on the CPU tier, for the executor and for llama.cpp (which repacks some types
and not others), in decode, in the tier roof and in prefill; the dense path alike. The files are session 34's
`small-q2k` / `small-q3k` / `small-q4k` (Zen 4 data)."""
from pathlib import Path

from simulator.ceilings import tier_roofs_gbs
from simulator.resources import (Constants, cpu_dense_gbs, cpu_expert_gbs, cpu_expert_prefill_gflops, cpu_gbs,
                                 cpu_prefill_gflops)
from simulator.run import simulate
from specs.formats import parse_format
from specs.loaders import load_hardware, load_model
from specs.plan import Plan

DATA = Path(__file__).resolve().parents[1] / "calibration" / "data" / "zen4-2026-12-05"
HW = load_hardware(str(DATA / "host-calibrated.yaml"))
Q2K = load_model(str(DATA / "small-q2k.yaml"))  # experts: Q2_K 264.2 MB, Q4_K 113.2, Q3_K 86.5
Q3K = load_model(str(DATA / "small-q3k.yaml"))  # Q3_K 346.0 MB, Q5_K 138.4, Q4_K 113.2
Q4K = load_model(str(DATA / "small-q4k.yaml"))  # dense: F16 attention 50.3 MB, F32 routers 2.2, Q8_0 head 17.8
EXECUTOR = Plan()
LLAMACPP = Plan(engine="llamacpp", cpu_repack=True)


def _with_rate(hw, fmt: str, factor: float):
    """The profile with `fmt`'s expert rate (at every thread count) scaled by `factor`."""
    hw = hw.model_copy(deep=True)
    hw.cpu.expert_gbs = {k: (v.with_value(v * factor) if k.split("@")[0] == fmt else v)
                         for k, v in hw.cpu.expert_gbs.items()}
    return hw


def test_the_cpu_tier_runs_each_type_at_its_own_rate():
    """small-q2k on the executor: 464 MB over (264.2 / r(Q2_K) + 113.2 / r(Q4_K) + 86.5 / r(Q3_K)) ms."""
    types = Q2K.expert_types()
    want = sum(b for b, _ in types.values()) / sum(b / cpu_gbs(HW, parse_format(f), 2, EXECUTOR)
                                                  for f, (b, _) in types.items())
    assert abs(cpu_expert_gbs(HW, Q2K, 2, EXECUTOR) - want) < 1e-9
    assert cpu_gbs(HW, parse_format("Q2_K"), 2, EXECUTOR) < want < cpu_gbs(HW, parse_format("Q4_K"), 2, EXECUTOR)


def test_a_minor_types_rate_moves_the_decode_prediction():
    """Q4_K holds a quarter of small-q2k's expert bytes: a faster Q4_K kernel speeds its predicted decode, where
    before only the type naming the file (Q2_K) counted."""
    base = simulate(Q2K, HW, EXECUTOR, gen_tokens=16, warm_steps=0).decode_tok_s
    faster = simulate(Q2K, _with_rate(HW, "Q4_K", 2.0), EXECUTOR, gen_tokens=16, warm_steps=0).decode_tok_s
    assert faster > base * 1.03


def test_llamacpp_runs_its_repacked_types_repacked_and_the_rest_in_place():
    """small-q3k under llama.cpp on AVX-512: its Q4_K is repacked at load, its Q3_K and Q5_K are not
    (specs.formats.llamacpp_repacks), so --no-repack slows only the Q4_K share."""
    on = cpu_expert_gbs(HW, Q3K, 2, LLAMACPP)
    off = cpu_expert_gbs(HW, Q3K, 2, LLAMACPP.model_copy(update={"cpu_repack": False}))
    types = Q3K.expert_types()
    q4k = types["Q4_K"][0]
    rest = sum(b for f, (b, _) in types.items() if f != "Q4_K")
    t_rest = sum(b / cpu_gbs(HW, parse_format(f), 2, LLAMACPP) for f, (b, _) in types.items() if f != "Q4_K")
    assert abs(on - (q4k + rest) / (q4k / cpu_gbs(HW, parse_format("Q4_K"), 2, LLAMACPP) + t_rest)) < 1e-9
    assert on != off


def test_the_tier_roof_is_the_mixed_rate():
    """execute --hw's roof for the CPU tier: the same per-type rate, capped by the usable DDR rate."""
    roof = tier_roofs_gbs(Q3K, HW, EXECUTOR)["cpu"]
    assert abs(roof - min(cpu_expert_gbs(HW, Q3K, 2, EXECUTOR), HW.memory.usable_gbs)) < 1e-9


def test_prefill_weighs_each_type_by_its_multiply_adds():
    """llama.cpp's prefill rate per type (ggml's structure for it) weighed by the type's weights: at 128 tokens
    an expert its repacked Q4_K runs the gemv, its Q3_K / Q5_K the tiled GEMM."""
    c = Constants.from_hw(HW, "llamacpp")
    types = Q3K.expert_types()
    want = sum(w for _, w in types.values()) / sum(
        w / cpu_prefill_gflops(HW, LLAMACPP, parse_format(f), 128.0, 2, c) for f, (_, w) in types.items())
    assert abs(cpu_expert_prefill_gflops(HW, LLAMACPP, Q3K, 128.0, 2, c) - want) < 1e-9
    assert want < cpu_prefill_gflops(HW, LLAMACPP, parse_format("Q3_K"), 128.0, 2, c)  # the gemv is the slower


def test_the_dense_path_reads_each_type_at_its_own_rate():
    """small-q4k's dense bytes: F16 attention (and F32 routers, at F16's GB/s) beside a Q8_0 head, which this
    profile reads faster: the mixed rate lies between, and a faster Q8_0 kernel speeds the predicted decode
    through the head alone (no expert is Q8_0)."""
    f16, q8 = (cpu_gbs(HW, parse_format(f), 2, EXECUTOR) for f in ("F16", "Q8_0"))
    assert cpu_gbs(HW, parse_format("F32"), 2, EXECUTOR) == f16
    assert min(f16, q8) < cpu_dense_gbs(HW, Q4K, 2, EXECUTOR) < max(f16, q8)
    base = simulate(Q4K, HW, EXECUTOR, gen_tokens=16, warm_steps=0).decode_tok_s
    faster = simulate(Q4K, _with_rate(HW, "Q8_0", 2.0), EXECUTOR, gen_tokens=16, warm_steps=0).decode_tok_s
    assert faster > base * 1.01


def _with_prefill_shares(hw, shares: dict[str, float]):
    """The profile with the executor's prefill products per format over its job format's (cpu.prefill_format_share)."""
    from specs.figure import Figure
    hw = hw.model_copy(deep=True)
    hw.cpu.prefill_format_share = {k: Figure(v, "measured", "test") for k, v in shares.items()}
    return hw


def test_the_executors_prefill_runs_each_type_at_its_share_of_the_job_rate():
    """small-q4k on the executor at 128 tokens an expert, Q4_K at 0.93 and Q6_K at 0.75 of the job format's (Q4_0)
    products (session 55's Zen 5 VM in cache: 338 and 277 against 369 GFLOP/s): the job's rate times the weights'
    mix of the shares, W / (W_Q4_K / 0.93 + W_Q6_K / 0.75); a type without a share (Q8_0) runs at the job's rate."""
    c = Constants.from_hw(HW, "custom")
    hw = _with_prefill_shares(HW, {"Q4_0": 1.0, "Q4_K": 0.93, "Q6_K": 0.75})
    job = cpu_prefill_gflops(HW, EXECUTOR, parse_format("Q4_K"), 128.0, 2, c)
    assert cpu_prefill_gflops(hw, EXECUTOR, parse_format("Q8_0"), 128.0, 2, c) == job
    types = Q4K.expert_types()
    share = {"Q4_K": 0.93, "Q6_K": 0.75}
    want = job * sum(w for _, w in types.values()) / sum(w / share[f] for f, (_, w) in types.items())
    assert abs(cpu_expert_prefill_gflops(hw, EXECUTOR, Q4K, 128.0, 2, c) - want) < 1e-9
    assert cpu_expert_prefill_gflops(HW, EXECUTOR, Q4K, 128.0, 2, c) == job  # no shares: the one rate


def test_slower_prefill_products_lengthen_the_predicted_ttft():
    """The same shares make small-q4k's all-CPU pp512 slower by less than 1 / 0.75 (the dense path is unchanged)."""
    plan = Plan(prefill={"strategy": "cpu"})
    hw = _with_prefill_shares(HW, {"Q4_0": 1.0, "Q4_K": 0.93, "Q6_K": 0.75})
    base = simulate(Q4K, HW, plan, prompt_tokens=512, gen_tokens=2, warm_steps=0).ttft_s
    slower = simulate(Q4K, hw, plan, prompt_tokens=512, gen_tokens=2, warm_steps=0).ttft_s
    assert base * 1.05 < slower < base / 0.75
