"""The simulator against the executor's all-CPU decode of `small` in five weight types on this Zen 4 VM
(tests/calibration/data/zen4-2026-12-05b: three runs of `python benchmarks/bench_quant_fidelity.py --rounds 3`,
07:16, 07:23 and 07:30 UTC, each the medians of three rounds with their traces and the `calibrate --quick` profile
just before it, with its whole-expert rates). The executor runs a decode token's top-8 as whole experts per
thread (simulator.policies); the profile's rows-split rates (cpu.expert_gbs) are 15-40% below what those jobs read
on the K-quant and IQ4 types, so the simulator charges such jobs at the whole-expert rates (cpu.whole_gbs). The
07:16 run, the quietest (rounds 4-20% apart; 6-34% and 6-30% in the others), is the one checked figure by figure;
all three are in the README. Rerun: `python benchmarks/bench_quant_fidelity.py --reuse --base
DATA/host-calibrated-0716.yaml --store DATA/results-quants-0716.csv`."""
import statistics
from pathlib import Path

import pytest

from calibration import store
from calibration.regress import run_model
from calibration.trace_fit import read_trace
from calibration.trace_profile import calibrate_from_traces
from simulator.ceilings import tier_roofs_gbs
from simulator.run import simulate
from specs.loaders import load_hardware
from specs.plan import Plan

DATA = Path("tests/calibration/data/zen4-2026-12-05b")  # the store's paths are relative to the repo root
RUNS = ("0716", "0723", "0730")
PROFILE = load_hardware(str(DATA / "host-calibrated-0716.yaml"))
ROWS = {r["case"].removeprefix("all-cpu-"): r for r in store.read_rows(DATA / "results-quants-0716.csv")}
COMPUTE_BOUND = ("small-q3k", "small-q2k", "small-iq4xs")  # Q3_K_M, Q2_K, IQ4_XS: bound by their arithmetic


def _rows_only(hw):
    """The profile without whole-expert rates: every CPU job at the rows-split rate, as before."""
    return hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"whole_gbs": {}})})


def _predict(row, hw) -> float:
    plan = Plan.model_validate_json(row["plan"])
    return simulate(run_model(row["model"], plan), hw, plan, prompt_tokens=int(float(row["n_prompt"])),
                    gen_tokens=int(float(row["n_gen"])), routing=row["routing"], warm_steps=0).decode_tok_s


def _errors(hw) -> dict[str, float]:
    return {name: _predict(r, hw) / float(r["value"]) - 1 for name, r in ROWS.items()}


@pytest.fixture(scope="module")
def q8_fit():
    """The profile with the host costs fitted on the Q8_0 run's trace alone (calibrate --from-trace): the other
    four files are out of sample."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        calibrate_from_traces(store.traces_of([ROWS["small"]]), ROWS["small"]["model"], PROFILE,
                              out=f"{d}/fit.yaml", log=None)
        return load_hardware(f"{d}/fit.yaml")


def _token_gbs(row) -> list[float]:
    """Each decode step's CPU expert bytes over their time in the run's trace, GB/s."""
    steps: dict[int, list[float]] = {}
    for r in read_trace(row["routing"]):
        if r["phase"] == "decode" and r["t_cpu_ms"]:
            s = steps.setdefault(r["step"], [0.0, 0.0])
            s[0], s[1] = s[0] + r["bytes_cpu"], s[1] + r["t_cpu_ms"]
    return [b / (t * 1e6) for b, t in steps.values()]


@pytest.mark.parametrize("run", RUNS)
def test_the_cpu_roof_bounds_every_token_of_the_kquant_and_iq4_files(run):
    """The roof `execute --hw` prints for the CPU tier (whole experts, each type at its rate, capped by DDR) lies
    above every decode token's expert GB/s in each run's K-quant and IQ4 files (07:16: small-q3k's fastest token
    reaches it, 23.9 of 23.9). The rows-split roof did not: in the 07:16 run the executor read more than it in most
    tokens of all four. (Q8_0 follows the bus's spells: at 07:30 its tokens read up to 50 GB/s, the profile 37.2.)"""
    hw = load_hardware(str(DATA / f"host-calibrated-{run}.yaml"))
    for r in store.read_rows(DATA / f"results-quants-{run}.csv"):
        if r["case"] == "all-cpu-small":
            continue
        plan = Plan.model_validate_json(r["plan"])
        model = run_model(r["model"], plan)
        g = _token_gbs(r)
        assert max(g) <= tier_roofs_gbs(model, hw, plan)["cpu"] * 1.01, r["case"]
        if run == "0716":
            assert statistics.median(g) > tier_roofs_gbs(model, _rows_only(hw), plan)["cpu"], r["case"]


def test_fitted_on_q8_0_the_compute_bound_types_are_predicted_within_6_percent(q8_fit):
    """Host costs fitted on the Q8_0 run only: Q3_K_M, Q2_K and IQ4_XS decode within 6% (+5.2%, +1.8%, +1.3%) with
    the whole-expert rates; at the rows-split rates 7-9% low (-7.1%, -9.0%, -7.1%)."""
    whole, rows = _errors(q8_fit), _errors(_rows_only(q8_fit))
    for name in COMPUTE_BOUND:
        assert abs(whole[name]) <= 0.06, (name, whole[name])
        assert -0.10 <= rows[name] <= -0.06, (name, rows[name])


@pytest.mark.xfail(strict=True, reason="Q4_K_M runs 12% below its whole-expert burst rate in the decode loop "
                   "(tokens 26.9 GB/s median, 29.8 at best, against 34.8): predicted +20% (README)")
def test_fitted_on_q8_0_q4_k_m_is_predicted_within_10_percent(q8_fit):
    """The memory-side K-quant: Q4_K_M's Q4_K and Q6_K read near the bus's rate."""
    assert abs(_errors(q8_fit)["small-q4k"]) <= 0.10


def test_the_measured_profile_alone_over_predicts_every_type():
    """Nothing fitted on these runs: the profile, timed in a fast spell (Q8_0 38.2 GB/s where the runs' loop read
    30.6 a token at the median), predicts every run fast: +5% (IQ4_XS) to +25% (Q4_K_M), median +10%. The rows-split
    rates landed closer (-1% to -4%, and +20% on Q8_0) only by running the K-quants too slow against that fast
    profile."""
    errs = _errors(PROFILE)
    assert all(0.0 < e <= 0.26 for e in errs.values()), errs
    assert 0.05 <= statistics.median(errs.values()) <= 0.15


@pytest.mark.parametrize("run", ("0859", "0901"))
def test_the_typical_state_profile_predicts_the_runs_mean_closer(run):
    """`calibrate --typical-out` (each CPU kernel and the layer loop from their median rounds: profile.typical_state)
    against the same run's fast profile, both with the whole-expert rates, on the all-CPU runs just after it
    (08:59, 09:01 UTC): median |error| over the five files 36.3% -> 20.5% and 13.1% -> 8.6%. The runs are means
    over every token, and this VM spends much of its time below its fastest rounds."""
    rows = store.read_rows(DATA / f"results-quants-{run}.csv")
    fast, typical = (load_hardware(str(DATA / f"host-{kind}-{run}.yaml")) for kind in ("calibrated", "typical"))
    med = {name: statistics.median(abs(_predict(r, hw) / float(r["value"]) - 1) for r in rows)
           for name, hw in (("fast", fast), ("typical", typical))}
    assert med["typical"] < med["fast"] - 0.03, med
