"""How this machine's bandwidth and kernel speed drift, and which estimator reproduces between runs.

Interleaves, for `--seconds` (default 300): a 2-thread read of a 1 GiB array and one 8-expert job
of the executor's Q8_0 and Q4_0 kernels (best of 5). Prints the 20-s medians (the machine's
states), then for each estimator (best, upper quintile, median, lower quintile of the samples of a
15-s window, about what one `calibrate --quick` spends on a figure) how far apart two windows at
least 60 s apart land: the median and 90th percentile of that spread, and how often it exceeds 10%.
This is the evidence for the statistics `calibrate` uses (README, "Calibrate twice").

    python benchmarks/bench_drift.py [--seconds 300] [--out drift.json]
"""
from __future__ import annotations

import argparse
import json
import time

import numba
import numpy as np

from calibration.bench_kernel import executor_expert_job
from calibration.bench_memory import _k_fill, _k_read
from calibration.sampling import Window

KEYS = ("read", "Q8_0", "Q4_0")
ESTIMATORS = {"best": np.max, "upper quintile": lambda x: np.quantile(x, 0.8), "median": np.median,
              "lower quintile": lambda x: np.quantile(x, 0.2)}


def record(seconds: float, threads: int = 2) -> list[dict]:
    """Samples {t, read, Q8_0, Q4_0 (GB/s), others (outside CPU share)} until `seconds` pass."""
    n = (1 << 30) // 8
    a = np.empty(n)
    _k_fill(a, 1.0)
    _k_read(a[:16])
    numba.set_num_threads(threads)
    jobs = {f: executor_expert_job(f) for f in ("Q8_0", "Q4_0")}
    for job, _ in jobs.values():
        job(8, 0)
    out, i, t_end = [], 0, time.time() + seconds
    while time.time() < t_end:
        w = Window()
        t0 = time.perf_counter()
        _k_read(a)
        row = {"t": time.time(), "read": n * 8 / (time.perf_counter() - t0) / 1e9}
        for f, (job, eb) in jobs.items():
            best = np.inf
            for _ in range(5):
                t0 = time.perf_counter()
                job(8, i)
                best = min(best, time.perf_counter() - t0)
                i += 1
            row[f] = 8 * eb / best / 1e9
        row["others"] = w.others()
        out.append(row)
        time.sleep(0.3)
    return out


def spread_table(rows: list[dict], window_s: float = 15.0, apart_s: float = 60.0, pairs: int = 400,
                 seed: int = 0) -> dict[str, dict[str, tuple[float, float, float]]]:
    """estimator -> figure -> (median spread, p90 spread, share of pairs over 10%)."""
    t = np.array([r["t"] for r in rows])
    t -= t[0]
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for name, est in ESTIMATORS.items():
        out[name] = {}
        for k in KEYS:
            v = np.array([r[k] for r in rows])
            sp = []
            while len(sp) < pairs:
                s1, s2 = rng.uniform(0, t[-1] - window_s, 2)
                if abs(s1 - s2) < apart_s:
                    continue
                a = est(v[(t >= s1) & (t < s1 + window_s)])
                b = est(v[(t >= s2) & (t < s2 + window_s)])
                sp.append(abs(a - b) / ((a + b) / 2))
            sp = np.array(sp)
            out[name][k] = (float(np.median(sp)), float(np.quantile(sp, 0.9)), float(np.mean(sp > 0.1)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = record(a.seconds)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f)
    t = np.array([r["t"] for r in rows]) - rows[0]["t"]
    print(f"{len(rows)} samples over {t[-1]:.0f} s; 20-s medians (GB/s):")
    for b in range(0, int(t[-1]), 20):
        idx = np.flatnonzero((t >= b) & (t < b + 20))
        print(f"  {b:4d} s  " + "  ".join(f"{k} {np.median([rows[i][k] for i in idx]):5.1f}" for k in KEYS)
              + f"  outside CPU {np.mean([rows[i]['others'] for i in idx]):.2f}")
    print("spread between two 15-s windows >= 60 s apart (median / p90 / share over 10%):")
    for name, per in spread_table(rows).items():
        print(f"  {name:15s} " + "  ".join(f"{k} {m:.3f}/{p:.3f}/{s:.2f}" for k, (m, p, s) in per.items()))


if __name__ == "__main__":
    main()
