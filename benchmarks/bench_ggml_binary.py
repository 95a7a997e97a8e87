"""ggml's multiply of the expert outputs by their router weights against its rebuild (calibration.ggml_binary), side
by side: MUL of [hidden, 8, n] by [1, 8, n] (build_moe_ffn's `ggml_mul(experts, weights)`, top-8) at hidden 2048
and 7168, n = 1, 32 and 512. test-backend-ops has no such case in its perf list: add, beside its
`test_bin_bcast(ggml_add, GGML_TYPE_F32, {4096, 1, 1, 1}, {1, 1, 1, 1})` in make_test_cases_perf,

    for (int h : {2048, 7168}) { for (int n : {1, 32, 512}) { test_cases.emplace_back(new test_bin_bcast(
        ggml_mul, GGML_TYPE_F32, {1, 8, n, 1}, {h, 1, 1, 1})); } }

and build it. test-backend-ops runs its CPU backend on half the hardware threads; the rebuild runs on as many.
Rounds alternate the two; medians of ns a value (wall) and their ratio.

    python benchmarks/bench_ggml_binary.py --test-backend-ops PATH/test-backend-ops [--rounds 3]

Without --test-backend-ops only the rebuild runs."""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numba

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.ggml_binary import weighting_job  # noqa: E402

CASES = [(h, n) for h in (2048, 7168) for n in (1, 32, 512)]
K = 8


def ggml_ns(tbo: str, hidden: int, n: int) -> float | None:
    """test-backend-ops perf's wall ns a value for MUL of [hidden, 8, n] by [1, 8, n], or None without the case."""
    p = re.escape(f"ne=[1,{K},{n},1],nr=[{hidden},1,1,1]")
    out = subprocess.run([tbo, "perf", "-b", "CPU", "-o", "MUL", "-p", p], capture_output=True, text=True).stdout
    m = re.search(r"([0-9.]+) us/run", out)
    return float(m.group(1)) * 1e3 / (hidden * K * n) if m else None


def rebuild_ns(hidden: int, n: int, min_s: float = 0.3) -> float:
    """The rebuild's median wall ns a value over repeats filling about min_s seconds."""
    run, values = weighting_job(hidden, K, n)
    run()
    t0, times = time.perf_counter(), []
    while time.perf_counter() - t0 < min_s or len(times) < 5:
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e9 / values


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--test-backend-ops", dest="tbo", help="llama.cpp's test-backend-ops binary, with the cases added")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    numba.set_num_threads(max(1, (os.cpu_count() or 2) // 2))  # as test-backend-ops sets its CPU backend
    if args.tbo and ggml_ns(args.tbo, *CASES[0]) is None:
        print(f"{args.tbo}: no MUL case [1,{K},n,1] x [hidden,1,1,1] in its perf list (add it: see this file's "
              "docstring)", file=sys.stderr)
        return 2
    print(f"{numba.get_num_threads()} thread(s); ns a value (wall), medians of {args.rounds} rounds")
    for hidden, n in CASES:
        ours, theirs = [], []
        for _ in range(args.rounds):
            if args.tbo:
                theirs.append(ggml_ns(args.tbo, hidden, n))
            ours.append(rebuild_ns(hidden, n))
        o = statistics.median(ours)
        t = statistics.median(theirs) if theirs else float("nan")
        print(f"MUL [{hidden}, {K}, {n}] x [1, {K}, {n}]: ggml {t:.2f}, rebuild {o:.2f}, ratio (rebuild / ggml) "
              f"{o / t:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
