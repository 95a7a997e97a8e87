"""`moe-offload regress`: predict every reference case, compare with what was measured, and fail
when a case drifts out of its tolerance. Published cases come from cases.py; this machine's runs
(executor and ingested llama.cpp) from the results store, predicted on a calibrated profile."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from specs.errors import SpecError

from .cases import all_cases
from .fit import predict as predict_case
from .store import read_rows

LOCAL_TOLERANCE = 0.20  # issue 5: max 20% per local case (median 10% over them)


def published_rows(names: list[str] | None = None) -> list[dict]:
    """Predicted against measured for each published case (profile constants as shipped)."""
    rows = []
    for c in all_cases():
        if names and not any(c.name.startswith(n) for n in names):
            continue
        p = predict_case(c)
        rows.append({"case": c.name, "kind": "published", "role": "in-sample" if c.role == "fit" else "out-of-sample",
                     "metric": c.metric, "measured": c.measured, "predicted": p, "error": p / c.measured - 1,
                     "tolerance": c.tolerance, "band": list(c.band) if c.band else None, "ok": c.within(p),
                     "source": c.source})
    return rows


def local_rows(store: str | Path, hw_path: str, latest_only: bool = True) -> list[dict]:
    """Predicted against measured for the store's runs on this machine (profile `hw_path`)."""
    from simulator.run import simulate
    from specs.loaders import load_hardware, load_model
    from specs.plan import Plan

    hw = load_hardware(hw_path)
    runs = [r for r in read_rows(store) if r.get("plan") and r.get("model")]
    if latest_only:  # the newest measurement of each case
        runs = list({(r["case"], r["metric"]): r for r in runs}.values())
    rows = []
    for r in runs:
        try:
            model = load_model(r["model"])
        except SpecError:
            continue  # the model file of an old run is gone
        plan = Plan.model_validate_json(r["plan"])
        n_prompt, n_gen = int(float(r.get("n_prompt") or 0)), int(float(r.get("n_gen") or 0) or 64)
        sim = simulate(model, hw, plan, prompt_tokens=n_prompt, gen_tokens=n_gen, routing=r.get("routing") or None)
        pred, meas = float(getattr(sim, r["metric"])), float(r["value"])
        err = pred / meas - 1
        rows.append({"case": r["case"], "kind": r.get("engine", "local"), "role": "local", "metric": r["metric"],
                     "measured": meas, "predicted": pred, "error": err, "tolerance": LOCAL_TOLERANCE,
                     "band": None, "ok": abs(err) <= LOCAL_TOLERANCE, "source": f"{store} ({r['time']})"})
    return rows


def summary(rows: list[dict]) -> dict:
    """Median and max absolute error per role, and whether every case passed."""
    out = {"ok": all(r["ok"] for r in rows), "cases": len(rows)}
    for role in sorted({r["role"] for r in rows}):
        errs = [abs(r["error"]) for r in rows if r["role"] == role]
        out[role] = {"n": len(errs), "median_abs_error": statistics.median(errs), "max_abs_error": max(errs),
                     "failed": [r["case"] for r in rows if r["role"] == role and not r["ok"]]}
    return out


def to_json(rows: list[dict]) -> str:
    return json.dumps({"summary": summary(rows), "cases": rows}, indent=2)
