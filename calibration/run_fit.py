"""Fit overhead constants to a user's measured runs (ingested llama.cpp runs in the results store)
and report leave-one-out error per run: each run is predicted by a fit on the others only.

The prediction is the simulator's closed-form screen (the planner's model), so a fit over a handful
of runs takes seconds. At most three constants are fitted (default: per-step overhead, per-layer
handover and the CPU expert-rate efficiency), each within physical bounds.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy.optimize import least_squares

from simulator.resources import Constants
from simulator.screen import screen
from specs.errors import SpecError
from specs.hardware import HardwareSpec
from specs.model import ModelSpec
from specs.plan import Plan

FITTED = ("step_overhead_ms", "handover_ms", "cpu_rate_efficiency")
BOUNDS = {"step_overhead_ms": (0.0, 50.0), "handover_ms": (0.0, 5.0), "cpu_rate_efficiency": (0.05, 1.5)}
START = {"step_overhead_ms": 0.5, "handover_ms": 0.1, "cpu_rate_efficiency": 1.0}


@dataclass(frozen=True)
class Run:
    """One measured run: the placement, its prompt/generation shape and the measured tok/s."""

    case: str
    plan: Plan
    metric: str  # decode_tok_s
    measured: float
    n_prompt: int = 0


def _apply(hw: HardwareSpec, values: dict[str, float]) -> tuple[HardwareSpec, Constants]:
    eff = values.get("cpu_rate_efficiency", 1.0)
    rates = {k: v.with_value(float(v) * eff) for k, v in hw.cpu.expert_gbs.items()}
    hw2 = hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"expert_gbs": rates})})
    consts = Constants.from_hw(hw, **{k: v for k, v in values.items() if k != "cpu_rate_efficiency"})
    return hw2, consts


def predict_run(model: ModelSpec, hw: HardwareSpec, run: Run, values: dict[str, float]) -> float:
    """The screen's decode tok/s for `run` with fitted `values` applied to `hw`."""
    hw2, consts = _apply(hw, values)
    return screen(model, hw2, run.plan, prompt_tokens=run.n_prompt, constants=consts).decode_tok_s


def fit_runs(model: ModelSpec, hw: HardwareSpec, runs: list[Run], names=FITTED) -> dict[str, float]:
    """Least squares on log(predicted / measured) over `runs`; {constant: value}."""
    if len(names) > 3:
        raise ValueError("at most three constants may be fitted")
    names = tuple(names)[: max(1, min(len(names), len(runs)))]

    def resid(x):
        vals = dict(zip(names, x))
        return [math.log(predict_run(model, hw, r, vals) / r.measured) for r in runs]

    sol = least_squares(resid, [START[n] for n in names], bounds=([BOUNDS[n][0] for n in names],
                                                                    [BOUNDS[n][1] for n in names]),
                        diff_step=1e-3, xtol=1e-8, ftol=1e-10)
    return dict(zip(names, map(float, sol.x)))


def leave_one_out(model: ModelSpec, hw: HardwareSpec, runs: list[Run], names=FITTED) -> list[dict]:
    """Per run: error without any fit, and error when fitted on every other run."""
    if len(runs) < 3:
        raise SpecError(None, "runs", f"leave-one-out needs at least 3 measured runs (got {len(runs)})")
    rows = []
    for i, r in enumerate(runs):
        others = runs[:i] + runs[i + 1:]
        vals = fit_runs(model, hw, others, names)
        rows.append({"case": r.case, "measured": r.measured,
                     "unfitted": predict_run(model, hw, r, {}), "loo": predict_run(model, hw, r, vals)})
    for row in rows:
        row["unfitted_error"] = row["unfitted"] / row["measured"] - 1
        row["loo_error"] = row["loo"] / row["measured"] - 1
    return rows


def median_abs(rows: list[dict], key: str) -> float:
    """Median of |rows[key]|."""
    return statistics.median(abs(r[key]) for r in rows)


def runs_from_store(store, model_ref: str) -> list[Run]:
    """The store's decode runs of `model_ref` that carry a plan (ingested or executor runs)."""
    from .store import read_rows

    out = []
    for row in read_rows(store):
        if row.get("model") == model_ref and row.get("plan") and row["metric"] == "decode_tok_s":
            out.append(Run(row["case"], Plan.model_validate_json(row["plan"]), row["metric"], float(row["value"]),
                           int(float(row.get("n_prompt") or 0))))
    latest = {r.case: r for r in out}  # the newest measurement of each case
    return list(latest.values())


def calibrate_from_runs(store, model_ref: str, base: HardwareSpec, model: ModelSpec, out) -> tuple[HardwareSpec, list[dict], dict]:
    """Fit on every stored run of `model_ref`, write the fitted profile to `out` (atomically);
    returns (profile, leave-one-out rows, fitted values)."""
    from specs.figure import Figure
    from specs.loaders import dump_hardware, write_atomic

    runs = runs_from_store(store, model_ref)
    rows = leave_one_out(model, base, runs)
    values = fit_runs(model, base, runs)
    hw, _ = _apply(base, values)
    ref = f"calibration/run_fit.py on {len(runs)} runs of {model_ref}"
    consts = {k: Figure(v, "derived", ref) for k, v in values.items() if k != "cpu_rate_efficiency"}
    hw = hw.model_copy(update={"constants": {**base.constants, **consts}})
    write_atomic(out, dump_hardware(hw))
    return hw, rows, values
