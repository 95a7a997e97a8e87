"""Simulator against the executor on a CUDA host's device-check plans, which no constant was fitted on.

    python benchmarks/bench_devcheck_fidelity.py [--data tests/calibration/data/h200-2026-11-30]

The host constants are fitted (calibration.trace_fit) on the local cases' traces of that host's
`scripts/device_fidelity.sh` run, plus, where --with-copy is given, the device check's copy-misses
trace (the only plan whose misses all cross PCIe, so the only one that pins `copy_miss_ms`). Then
each `scripts/device_check.sh` plan on `small` is simulated with its own trace's routing (16-token
prompt, 24 tokens) and its median step compared with the measured one (1000 / itl_p50_ms; 24 tokens
are too few for a mean that one slow step, a step that loads experts, does not move); the means too.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="tests/calibration/data/h200-2026-11-30")
    ap.add_argument("--with-copy", action="store_true", help="fit copy_miss_ms on the copy-misses trace too")
    a = ap.parse_args(argv)

    from calibration import store
    from calibration.local import device_check_plans
    from calibration.trace_profile import calibrate_from_traces
    from simulator.run import simulate
    from specs.loaders import load_hardware, load_model

    data, dc = Path(a.data), Path(a.data) / "device-check"
    rows = store.read_rows(data / "results-fidelity.csv")
    traces = store.traces_of(rows)
    if a.with_copy:
        traces.append(str(dc / "small-gpu-copy-misses.jsonl.gz"))
    model_path = rows[0]["model"]
    with tempfile.TemporaryDirectory() as d:
        hw, f, _ = calibrate_from_traces(traces, model_path, load_hardware(str(data / "host-calibrated.yaml")),
                                         out=f"{d}/hw.yaml", log=None)
    model = load_model(model_path)
    measured = json.loads((dc / "measured.json").read_text())
    print(f"fitted on {len(traces)} traces: copy_h2d_gbs {f.copy_h2d_gbs:.2f}, copy_miss_ms {f.copy_miss_ms:.3f}, "
          f"hit_ms {f.hit_ms:.3f}, layer_overhead_ms {f.layer_overhead_ms:.3f}")
    print(f"\n{'plan':24s} {'median':>8s} {'mean':>8s} {'pred med':>9s} {'pred mean':>9s} {'vs median':>10s} "
          f"{'vs mean':>8s}")
    errs = []
    for name, plan in device_check_plans(model.n_layers, model.n_experts).items():
        m = measured[f"small/{name}"]
        sim = simulate(model, hw, plan, prompt_tokens=16, gen_tokens=24, routing=str(dc / f"small-{name}.jsonl.gz"),
                       warm_steps=0)
        med, mean = 1e3 / m["itl_p50_ms"], m["decode_tok_s"]
        pred_med = 1e3 / sim.itl_p50_ms
        e = pred_med / med - 1
        fitted_on = a.with_copy and name == "gpu-copy-misses"
        if not fitted_on:
            errs.append(abs(e))
        print(f"{name:24s} {med:8.1f} {mean:8.1f} {pred_med:9.1f} {sim.decode_tok_s:9.1f} {100 * e:+9.1f}% "
              f"{100 * (sim.decode_tok_s / mean - 1):+7.1f}%{'  (its trace in the fit)' if fitted_on else ''}")
    print(f"\nout of sample: median |error| {100 * statistics.median(errs):.1f}%, max {100 * max(errs):.1f}% "
          f"over {len(errs)} plans (against the median step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
