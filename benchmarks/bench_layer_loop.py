"""Benchmark: the CPU decode layer loop's constants over several `calibrate --quick` runs, paired and alone.

Each run measures a quick profile in this process (calibration.calibrate.measure_profile) and prints, for the big
(46.4 MB) and small (2.1 MB) layer, what a layer took beyond its bytes and job costs at the kernels' rate of its own
round (paired: bench_layer_loop.LayerLoop.paired_rest_ms), the same from the loop's lower quintile against the
kernels' fastest rounds (alone: the default profile's), and the kernels' median-over-fastest gap for the layer's bytes;
then `cpu_layer_ms_per_mb` / `cpu_layer_ms` of the default profile, of the typical-state profile (paired), and of the
typical state with the loop's median round against the kernels' median rounds (alone, as before the pairing).

Run: python benchmarks/bench_layer_loop.py [--runs 5]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration import calibrate as cal  # noqa: E402
from calibration.detect import detect_hardware  # noqa: E402
from calibration.profile import build_profile, typical_state  # noqa: E402


def _alone(ll):
    return dataclasses.replace(ll, round_layer_ms=[], round_job_ms=[], job_k=0, job_n=0)


def one_run(base) -> dict:
    """One quick measurement: the layer loops' figures (ms a layer) and the three profiles' constants."""
    _, r = cal.measure_profile(cal.QUICK, base, progress=False)
    f, fd = r.kernels["Q8_0"], r.kernels["F16"]
    out = {"Q8_0 fastest / median GB/s": (round(f.expert_gbs, 1), round(f.expert_gbs_median, 1))}
    for name, ll in (("big", r.layer_loop), ("small", r.layer_loop_small)):
        out[name] = {"paired": ll.paired_rest_ms(f, fd), "alone": ll.rest_ms(f, fd),
                     "gap": ll.bytes_ms(f, fd, median=True) - ll.bytes_ms(f, fd), "q20": ll.t_layer_ms,
                     "rounds": len(ll.round_job_ms)}
    ra = dataclasses.replace(r, layer_loop=_alone(r.layer_loop), layer_loop_small=_alone(r.layer_loop_small))
    for name, res in (("default", r), ("typical, paired", typical_state(r)), ("typical, alone", typical_state(ra))):
        c = build_profile(res, base).constants
        out[name] = (float(c["cpu_layer_ms_per_mb"]), float(c["cpu_layer_ms"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args(argv)
    base = detect_hardware(measure=False, path="/tmp")
    per_mb: dict[str, list[float]] = {}
    for i in range(a.runs):
        o = one_run(base)
        fastest, median = o["Q8_0 fastest / median GB/s"]
        print(time.strftime("%H:%M:%S"), f"Q8_0 {fastest} / {median} GB/s (fastest / median)")
        for name in ("big", "small"):
            x = o[name]
            print(f"  {name:5s} layer: paired {x['paired']:+.4f} ms, alone {x['alone']:+.4f} ms, kernels' median "
                  f"over fastest {x['gap']:.4f} ms, lower quintile {x['q20']:.3f} ms, {x['rounds']} paired rounds")
        for name in ("default", "typical, paired", "typical, alone"):
            per_mb.setdefault(name, []).append(o[name][0])
            print(f"  {name:16s} cpu_layer_ms_per_mb {o[name][0]:.5f}  cpu_layer_ms {o[name][1]:.4f}")
    for name, v in per_mb.items():
        print(f"{name:16s} cpu_layer_ms_per_mb over {len(v)} runs: {min(v):.5f}-{max(v):.5f} ms/MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
