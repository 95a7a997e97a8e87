"""Fit at most three simulator constants on the in-sample cases (D030, D107), then predict every
other case out of sample. `python -m calibration.fit` prints both tables.

Fitted: zc_efficiency (zero-copy attains this fraction of pcie.zero_copy_gbs; D030 pins it) and
handover_ms (GPU->CPU->GPU sync per layer with CPU work; D107 pins it given zc_efficiency).
"""
from __future__ import annotations

import math
import sys

from scipy.optimize import least_squares

from simulator.resources import Constants
from simulator.run import simulate
from specs.figure import Figure
from specs.loaders import load_hardware, load_model
from specs.memory import size_cache

from .cases import Case, all_cases

FITTED = ("zc_efficiency", "handover_ms")
BOUNDS = {"zc_efficiency": (0.1, 1.0), "handover_ms": (0.0, 2.0), "step_overhead_ms": (0.0, 20.0)}
START = {"zc_efficiency": 0.6, "handover_ms": 0.2, "step_overhead_ms": 1.0}


def predict(case: Case, constants: dict | None = None, seed: int = 0) -> float:
    """The simulated value of the case's metric (constants override the profile's)."""
    model, hw = load_model(case.model), load_hardware(case.hardware)
    plan = size_cache(model, hw, case.plan) if case.sized else case.plan
    consts = Constants.from_hw(hw, **(constants or {}))
    r = simulate(model, hw, plan, prompt_tokens=case.prompt_tokens, gen_tokens=case.gen_tokens,
                 streams=case.streams, seed=seed, routing=case.routing, warm_steps=case.warm_steps,
                 history=case.history, engram_text=case.engram_text, constants=consts)
    return float(getattr(r, case.metric))


def fit(names=FITTED, cases: list[Case] | None = None) -> dict[str, float]:
    """Least squares on log(predicted/measured) over the fit cases; returns {name: value}."""
    if len(names) > 3:
        raise ValueError("at most three constants may be fitted")
    cases = [c for c in (cases or all_cases()) if c.role == "fit"]

    def resid(x):
        consts = dict(zip(names, x))
        return [math.log(predict(c, consts) / c.measured) for c in cases]

    lo = [BOUNDS[n][0] for n in names]
    hi = [BOUNDS[n][1] for n in names]
    sol = least_squares(resid, [START[n] for n in names], bounds=(lo, hi), diff_step=0.02,
                        xtol=1e-4, ftol=1e-4)
    return dict(zip(names, map(float, sol.x)))


def fitted_constants(hw_name: str, values: dict[str, float]) -> dict[str, Figure]:
    """The fitted values as profile constants with their provenance."""
    fit_cases = ", ".join(c.name for c in all_cases() if c.role == "fit")
    return {k: Figure(v, "derived", f"calibration/fit.py on {fit_cases} ({hw_name})") for k, v in values.items()}


def calibrated_hardware(hw, values: dict[str, float]):
    """`hw` with the fitted constants merged into `hw.constants` (write it with dump_hardware)."""
    return hw.model_copy(update={"constants": {**hw.constants, **fitted_constants(hw.name, values)}})


def evaluate(constants: dict[str, float]) -> list[dict]:
    """Every case's prediction, error and verdict under `constants`."""
    rows, cases = [], all_cases()
    fit_hosts = {c.hardware.split("+", 1)[0] for c in cases if c.role == "fit"}  # the constants belong to these hosts
    for c in cases:
        host = c.hardware.split("+", 1)[0]  # "host+card" (specs.loaders): a second card, the same host
        hw_consts = constants if host in fit_hosts else {}
        p = predict(c, hw_consts)
        rows.append({"case": c.name, "role": "in-sample" if c.role == "fit" else "out-of-sample",
                     "metric": c.metric, "measured": c.measured, "predicted": p,
                     "error": p / c.measured - 1, "tolerance": c.tolerance, "band": c.band,
                     "ok": c.within(p)})
    return rows


def table(rows: list[dict]) -> str:
    """A plain-text table of `evaluate` rows, in-sample first."""
    lines = [f"{'case':28s} {'role':14s} {'metric':14s} {'measured':>9s} {'predicted':>9s} {'error':>7s}  ok"]
    for r in sorted(rows, key=lambda r: r["role"] != "in-sample"):
        lines.append(f"{r['case']:28s} {r['role']:14s} {r['metric']:14s} {r['measured']:9.2f} "
                     f"{r['predicted']:9.2f} {100 * r['error']:+6.1f}%  {'yes' if r['ok'] else 'NO'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    values = fit()
    fit_cases = [c for c in all_cases() if c.role == "fit"]
    print(f"fitted on {', '.join(c.name for c in fit_cases)} ({', '.join(sorted({c.hardware for c in fit_cases}))}):",
          ", ".join(f"{k} = {v:.4g}" for k, v in values.items()))
    rows = evaluate(values)
    print(table(rows))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
