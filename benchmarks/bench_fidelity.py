"""Simulator vs executor on `small` on this machine (issue 5, first acceptance bullet).

    python benchmarks/bench_fidelity.py [--base runs/host-calibrated.yaml] [--rounds 3] [--store S]

Steps: a measured base profile (`moe-offload calibrate --quick` unless --base is given), the local
cases run round-robin `rounds` times (medians to the store), the host constants fitted from every
trace of those runs, then each case predicted by the simulator on the fitted profile. Prints the
table, the medians and max errors, and the trace fit's in-sample and leave-one-out errors.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def leave_one_case_out(rows: list[dict], model: str, base, store_path: str) -> dict[str, float | None]:
    """Per case: the simulator's error when the constants come from the other cases' traces only."""
    import tempfile

    from calibration import regress, store
    from calibration.trace_profile import calibrate_from_traces
    from specs.errors import SpecError
    out: dict[str, float | None] = {}
    for r in rows:
        others = store.traces_of([x for x in rows if x["case"] != r["case"]])
        with tempfile.TemporaryDirectory() as d:
            try:
                calibrate_from_traces(others, model, base, out=f"{d}/hw.yaml", log=None)
            except SpecError:
                out[r["case"]] = None
                continue
            got = [x for x in regress.local_rows(store_path, f"{d}/hw.yaml") if x["case"] == r["case"]]
        out[r["case"]] = got[0]["error"] if got else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=None, help="measured base profile (made by calibrate --quick when missing)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=64, help="decode tokens per case")
    ap.add_argument("--store", default="runs/results-fidelity.csv")
    ap.add_argument("--out", default="runs/host-fitted.yaml", help="the fitted profile")
    ap.add_argument("--reuse", action="store_true", help="skip measuring: use the store's latest rows "
                    "(e.g. the H200 host's, tests/calibration/data/h200-2026-11-30/)")
    a = ap.parse_args(argv)

    from calibration import local, regress, store
    from calibration.trace_profile import calibrate_from_traces
    from specs.loaders import load_hardware

    t0 = time.perf_counter()
    base_path = a.base or "runs/host-calibrated.yaml"
    if not Path(base_path).exists():  # measure it now
        from calibration.calibrate import calibrate
        calibrate(quick=True, out=base_path, progress=False, store_path=a.store)
    base = load_hardware(base_path)
    if a.reuse:
        latest = {r["case"]: r for r in store.read_rows(a.store) if r.get("engine") == local.ENGINE}
        rows = list(latest.values())
    else:
        rows = local.measure_local("small", store_path=a.store, rounds=a.rounds, n_gen=a.gen)
    traces = store.traces_of(rows)
    model = rows[0]["model"] if a.reuse else local.ensure_model("small")  # reused: the runs' own model
    print(f"\ntrace fit over {len(traces)} traces (base {base_path}):")
    calibrate_from_traces(traces, str(model), base, out=a.out)
    out = regress.local_rows(a.store, a.out)
    calib = {r["case"]: r["error"] for r in regress.local_rows(a.store, base_path)}  # no trace fit at all
    loo = leave_one_case_out(rows, str(model), base, a.store)
    print(f"\n{'case':20s} {'metric':12s} {'measured':>9s} {'predicted':>9s} {'error':>7s} {'LOCO':>7s} "
          f"{'calib':>7s} {'spread':>7s}")
    spread = {r["case"]: float(r.get("spread") or 0) for r in rows}
    for r in out:
        lo = loo.get(r["case"])
        print(f"{r['case']:20s} {r['metric']:12s} {r['measured']:9.3f} {r['predicted']:9.3f} "
              f"{100 * r['error']:+6.1f}% {'-' if lo is None else f'{100 * lo:+6.1f}%':>7s} "
              f"{100 * calib.get(r['case'], float('nan')):+6.1f}% {100 * spread.get(r['case'], 0):6.1f}%")
    dec = [abs(r["error"]) for r in out if r["metric"] == "decode_tok_s"]
    ttft = [abs(r["error"]) for r in out if r["metric"] == "ttft_s"]
    if dec:
        print(f"\ndecode: median |error| {100 * statistics.median(dec):.1f}% (target 10), "
              f"max {100 * max(dec):.1f}% (target 20) over {len(dec)} plans")
    if ttft:
        print(f"TTFT:   median |error| {100 * statistics.median(ttft):.1f}% (target 15) over {len(ttft)} prompts")
    lo = [abs(v) for k, v in loo.items() if v is not None and "ttft" not in k]
    if lo:
        print(f"decode, leave-one-case-out: median |error| {100 * statistics.median(lo):.1f}%, "
              f"max {100 * max(lo):.1f}%")
    cd = [abs(calib[r["case"]]) for r in out if r["metric"] == "decode_tok_s" and r["case"] in calib]
    if cd:
        print(f"decode, measured profile alone (no trace fit): median |error| {100 * statistics.median(cd):.1f}%, "
              f"max {100 * max(cd):.1f}%")
    print(f"({time.perf_counter() - t0:.0f} s; error: constants fitted on every case's traces; LOCO: fitted "
          f"without the case's own traces; calib: the measured base profile, nothing fitted; spread = (max - min) / median of the quiet rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
