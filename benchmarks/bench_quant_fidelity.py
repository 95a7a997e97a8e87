"""Simulator vs executor across weight types: all-CPU decode of `small` in each quantisation, on this machine.

    python benchmarks/bench_quant_fidelity.py [--base PROFILE] [--presets small small-q4k ...] [--rounds 3]
                                              [--store runs/results-quants.csv] [--reuse]

Steps: a measured profile (`moe-offload calibrate --quick` unless --base is given); each preset's synthetic GGUF
(made once under runs/models, or --models); its all-CPU decode (16-token prompt, --gen tokens) run round-robin `rounds` times
(medians and traces to the store: calibration.local.measure); then each run predicted from the measured profile
alone, nothing fitted on these runs (`moe-offload regress --local-only`): with the profile's whole-expert rates
(`cpu.whole_gbs`: a decode token's top-k runs each expert start to end on one thread) and with every CPU job at the
rows-split rate instead (`cpu.expert_gbs`), which is how the simulator charged them before. Beside each, the expert
tier's GB/s per token in the run's trace (each decode step's expert bytes over their time: the median, and the
90th percentile, its fast spells) and the roof the simulator runs that tier at (the executor's `--hw` output).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PRESETS = ("small", "small-q4k", "small-q3k", "small-q2k", "small-iq4xs")


def token_gbs(trace: str) -> list[float]:
    """GB/s of each decode step's CPU expert jobs in a trace: the step's expert bytes over their time."""
    from calibration.trace_fit import read_trace
    steps: dict[int, list[float]] = {}
    for r in read_trace(trace):
        if r.get("phase") == "decode" and r.get("t_cpu_ms"):
            s = steps.setdefault(int(r["step"]), [0.0, 0.0])
            s[0] += r["bytes_cpu"]
            s[1] += r["t_cpu_ms"]
    return [b / (t * 1e6) for b, t in steps.values()]


def rows_only(profile: str, out: str) -> str:
    """`profile` without its whole-expert rates, written to `out`: every CPU job at the rows-split rate."""
    from specs.loaders import dump_hardware, load_hardware
    hw = load_hardware(profile)
    Path(out).write_text(dump_hardware(hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"whole_gbs": {}})})))
    return out


def predict(row: dict, hw) -> float:
    """The simulator's decode tok/s of a stored run on profile `hw` (its own routing trace)."""
    from calibration.regress import run_model
    from simulator.run import simulate
    from specs.plan import Plan
    plan = Plan.model_validate_json(row["plan"])
    sim = simulate(run_model(row["model"], plan), hw, plan, prompt_tokens=int(float(row["n_prompt"])),
                   gen_tokens=int(float(row["n_gen"])), routing=row.get("routing") or None, warm_steps=0)
    return sim.decode_tok_s


def fitted_on(row: dict, base):
    """`base` with the host costs fitted on one run's traces (calibrate --from-trace): that run's format then runs
    at the rate its trace shows, the others at the profile's."""
    from calibration import store
    from calibration.trace_profile import calibrate_from_traces
    from specs.loaders import load_hardware
    with tempfile.TemporaryDirectory() as d:
        calibrate_from_traces(store.traces_of([row]), row["model"], base, out=f"{d}/fit.yaml", log=None)
        return load_hardware(f"{d}/fit.yaml")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=None, help="measured profile (made by calibrate --quick when missing)")
    ap.add_argument("--presets", nargs="+", default=list(PRESETS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64, help="decode tokens per run")
    ap.add_argument("--store", default="runs/results-quants.csv")
    ap.add_argument("--models", default=None, help="folder of the presets' GGUFs (default runs/models, made there once)")
    ap.add_argument("--reuse", action="store_true", help="skip measuring: predict the store's latest rows")
    a = ap.parse_args(argv)

    from calibration import local, regress, store
    from calibration.regress import run_model
    from simulator.ceilings import tier_roofs_gbs
    from specs.loaders import load_hardware

    t0 = time.perf_counter()
    base = a.base or "runs/host-calibrated.yaml"
    if not Path(base).exists():
        from calibration.calibrate import calibrate
        calibrate(quick=True, out=base, progress=False, store_path=a.store)
    if a.reuse:
        rows = list({r["case"]: r for r in store.read_rows(a.store) if r.get("engine") == local.ENGINE}.values())
    else:
        cases = [local.LocalCase(f"all-cpu-{p}", local._plan(16), 16, a.gen, "decode_tok_s",
                                 model=local.ensure_model(p, a.models or local.MODELS_DIR, engram=False)) for p in a.presets]
        rows = local.measure(None, cases, a.store, rounds=a.rounds)
    with tempfile.TemporaryDirectory() as d:
        whole = {r["case"]: r for r in regress.local_rows(a.store, base)}
        rows_rate = {r["case"]: r for r in regress.local_rows(a.store, rows_only(base, f"{d}/rows.yaml"))}
    hw = load_hardware(base)
    print(f"\nprofile {base}; store {a.store}")
    print(f"{'case':22s} {'measured':>9s} {'whole':>8s} {'error':>7s} {'rows':>8s} {'error':>7s}  "
          f"{'token GB/s p50 / p90':>20s} {'roof':>6s} {'spread':>7s}")
    for r in rows:
        w, o = whole.get(r["case"]), rows_rate.get(r["case"])
        if w is None or o is None:
            continue
        from specs.plan import Plan
        plan = Plan.model_validate_json(r["plan"])
        roof = tier_roofs_gbs(run_model(r["model"], plan), hw, plan)["cpu"]
        g = token_gbs(r["routing"]) if r.get("routing") else [float("nan")]
        p50, p90 = statistics.median(g), statistics.quantiles(g, n=10)[-1] if len(g) > 1 else g[0]
        print(f"{r['case']:22s} {w['measured']:9.1f} {w['predicted']:8.1f} {100 * w['error']:+6.1f}% "
              f"{o['predicted']:8.1f} {100 * o['error']:+6.1f}%  {p50:9.1f} / {p90:5.1f}   {roof:6.1f} "
              f"{100 * float(r.get('spread') or 0):6.1f}%")
    for name, got in (("whole-expert rates", whole), ("rows-split rates", rows_rate)):
        errs = [abs(x["error"]) for x in got.values()]
        if errs:
            print(f"{name}: median |error| {100 * statistics.median(errs):.1f}%, max {100 * max(errs):.1f}% "
                  f"over {len(errs)} runs")
    ref = [r for r in rows if r["case"] == "all-cpu-small"]
    if ref:  # out of sample across types: host costs and Q8_0's in-loop rate from the Q8_0 run alone
        fit = fitted_on(ref[0], hw)
        bare = fit.model_copy(update={"cpu": fit.cpu.model_copy(update={"whole_gbs": {}})})
        print("\nhost costs fitted on all-cpu-small's trace only (Q8_0), the other files predicted:")
        for name, prof in (("whole-expert rates", fit), ("rows-split rates", bare)):
            errs = {r["case"]: predict(r, prof) / float(r["value"]) - 1 for r in rows}
            print(f"  {name}: " + ", ".join(f"{c.removeprefix('all-cpu-')} {100 * e:+.1f}%" for c, e in errs.items()))
    print(f"({time.perf_counter() - t0:.0f} s; nothing fitted on these runs but where said; spread = (max - min) / "
          f"median of the quiet rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
