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
    from specs.loaders import load_hardware
    from specs.plan import Plan

    hw = load_hardware(hw_path)
    _check_host_profile(hw, hw_path)
    runs = [r for r in read_rows(store) if r.get("plan") and r.get("model")]
    if latest_only:  # the newest measurement of each case
        runs = list({(r["case"], r["metric"]): r for r in runs}.values())
    rows, models = [], {}  # (model path, reads Engram): ModelSpec, each header read once
    for r in runs:
        plan = Plan.model_validate_json(r["plan"])
        key = (r["model"], plan.placement.engram != "none")
        try:
            if key not in models:
                models[key] = run_model(r["model"], plan)
        except SpecError:
            continue  # the model file of an old run is gone
        model = models[key]
        n_prompt, n_gen = int(float(r.get("n_prompt") or 0)), int(float(r.get("n_gen") or 0) or 64)
        routing = r.get("routing") or None
        if routing and not Path(routing).exists():
            routing = None  # the trace of an old run is gone: the default routing model
        warm = int(float(r["warm_steps"])) if r.get("warm_steps") not in (None, "") else 300
        sim = simulate(model, hw, plan, prompt_tokens=n_prompt, gen_tokens=n_gen, routing=routing,
                       warm_steps=warm)
        pred, meas = float(getattr(sim, r["metric"])), float(r["value"])
        err = pred / meas - 1
        rows.append({"case": r["case"], "kind": r.get("engine", "local"), "role": "local", "metric": r["metric"],
                     "measured": meas, "predicted": pred, "error": err, "tolerance": LOCAL_TOLERANCE,
                     "band": None, "ok": abs(err) <= LOCAL_TOLERANCE, "source": f"{store} ({r['time']})"})
    return rows


HOST_CONSTANTS = ("layer_overhead_ms", "dev_expert_gbs")  # what a host-sharing device needs fitted


def _check_host_profile(hw, path) -> None:
    """SpecError when a host-sharing profile lacks a constant only a trace fit gives."""
    if hw.gpu is not None and hw.gpu.shares_host:
        for k in HOST_CONSTANTS:
            if k not in hw.constants:
                raise SpecError(str(path), f"constants.{k}", "missing: fit it with `moe-offload calibrate "
                                "--from-trace TRACE... --model GGUF --hw-base HW --out HW.yaml`")


def run_model(model_path: str, plan):
    """The ModelSpec a run of `plan` on `model_path` read: its GGUF header, with the Engram sidecar's
    table when the plan reads one."""
    from specs.loaders import load_model
    model = load_model(model_path)
    return with_engram(model, model_path) if plan.placement.engram != "none" else model


def with_engram(model, gguf_path: str):
    """`model` with the Engram table of its sidecar GGUF (`<model>.engram.gguf`), when there is one."""
    side = Path(str(gguf_path) + ".engram.gguf")
    if model.engram is not None or not side.exists():
        return model
    import gguf

    from specs.model import EngramSpec
    r = gguf.GGUFReader(side, "r")
    t = next(x for x in r.tensors if x.name == "per_layer_token_embd.weight")
    get = lambda k, d: r.fields[k].contents() if k in r.fields else d  # noqa: E731
    eng = dict(rows=int(t.shape[1]), row_values=int(t.shape[0]), format=t.tensor_type.name,
               layers=[int(v) for v in get("engram.layers", [1])], orders=len(get("engram.orders", [2, 3, 4])),
               heads=int(get("engram.heads", 8)))
    return model.model_copy(update={"engram": EngramSpec(**eng)})


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


def run_against_model(result: dict, plan, model_path: str, hw) -> dict:
    """One executor run (execute()'s result) beside the simulator: each tier's roof (GB/s) and the
    decode tok/s and TTFT (s) simulated for the same plan, prompt and length, on the run's own routing, the model
    file's page layout as the run left it where the result has it (model_page_breaks)."""
    from simulator.ceilings import tier_roofs_gbs
    from simulator.run import simulate

    if result.get("model_page_breaks") is not None:
        plan = plan.model_copy(update={"cpu_file_page_breaks": float(result["model_page_breaks"])})
    model = run_model(model_path, plan)
    sim = simulate(model, hw, plan, prompt_tokens=int(result["prompt_tokens"]), gen_tokens=int(result["gen_tokens"]),
                   routing=result["trace"], warm_steps=0)
    return {"roof_gbs": tier_roofs_gbs(model, hw, plan),
            "predicted": {"decode_tok_s": sim.decode_tok_s, "ttft_s": sim.ttft_s, "bottleneck": sim.bottleneck,
                          "profile": hw.name}}
