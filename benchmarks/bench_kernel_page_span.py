"""How the executor's cost from a file in short page runs grows with the memory the file spans, on 1 and 2 threads.

For each span, the executor's kernel jobs (calibration.bench_kernel.executor_expert_job; on 2 threads whole experts
per thread, as its decode runs them) on a pool in a file in 2 MiB folios (calibrate's contiguous reference) and on one
in 4 KiB runs, timed as calibrate times them (calibrate._time_page_runs); prints each rate and the excess (reference
over 4 KiB rate, minus one). calibrate times the executor at one span (Settings.page_runs_pool_bytes' second: 384
MiB, 496 in whole repetitions of a 124 MiB Q8_0 pool); a GGUF's experts span more. Session 52 (Zen 4 VM, Q8_0; three
runs of a first version sampling the four jobs in four rounds, then one of this one): at 384 MiB +0.15 / +0.18 /
+0.16 / +0.08 on one thread, +0.03 / +0.05 / +0.08 / +0.03 on two; at 1536 MiB +0.26 / +0.27 / +0.21 / +0.26 on one
and +0.10 / +0.10 / +0.195 / +0.11 on two, the 0.195 with the bus in its fast state (59 GB/s from the reference on
two threads against 36-38): the cost shows on two threads where the bus does not bind them.

    python benchmarks/bench_kernel_page_span.py [--format Q8_0] [--spans-mib 384 1536] [--folder .]
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from calibration import calibrate as cal
from calibration.page_runs import REFERENCE_KIB, by_format
from calibration.settings import QUICK


def excess_at(fmt: str, span: int, folder: str) -> dict[str, float]:
    """{'2048KiB Q8_0@1t': GB/s, ...} of the executor's `fmt` jobs on pools in files spanning `span` bytes, timed as
    calibrate times them (calibrate._time_page_runs: quick's settings, its reference and 4 KiB runs only)."""
    s = replace(QUICK, kernel_formats=(fmt,), page_runs_kib=(4,), page_runs_formats=(), kernel_page_runs_formats=(fmt,),
                page_runs_pool_bytes=(span, span))
    r = cal.Results(settings=s)
    (unit,) = by_format(cal._page_run_jobs(s, s.kernel_formats, [], folder=folder))
    with cal._Progress(False) as pg:
        cal._time_page_runs(s, r, unit, 2, pg, cal._Budget(s, 1, False))
    return {k: f.expert_gbs for k, f in r.kernel_file_runs.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="Q8_0")
    ap.add_argument("--spans-mib", type=int, nargs="+", default=[384, 1536])
    ap.add_argument("--folder", default=".", help="where the files go (a disk's, as a GGUF's; unlinked once mapped)")
    a = ap.parse_args(argv)
    ref = f"{REFERENCE_KIB}KiB {a.format}"
    for mib in a.spans_mib:
        r = excess_at(a.format, mib << 20, a.folder)
        print(f"{a.format} span {mib} MiB: " + " | ".join(
            f"{n} thread(s): reference {r[ref + t]:.1f} GB/s, 4 KiB runs {r['4KiB ' + a.format + t]:.1f}, "
            f"excess {r[ref + t] / r['4KiB ' + a.format + t] - 1:+.3f}" for n, t in ((1, "@1t"), (2, ""))), flush=True)


if __name__ == "__main__":
    main()
