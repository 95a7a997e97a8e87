"""A GGUF's page layout against llama-bench: where the page cache holds the file's pages decides how fast llama.cpp
reads the weights it does not repack, and the simulator prices it (Plan.cpu_file_page_breaks, CPU.file_page_excess:
calibrate times the in-place rows again from files in 64 KiB and 4 KiB runs of pages).

Data (../zen4-2026-12-07): two paired sittings, 01:02 and 01:06 of 2026-12-07, each on copies of four `small` files
written just before it (calibration.page_layout.write_in_runs): in 64 MiB writes (`pm`: 2 MiB folios, under 1% of
their page boundaries breaks), in shuffled 64 KiB runs (`s6`: 1/16 breaks) and in shuffled 4 KiB runs (`s4`: every
boundary a break), beside the files as the page cache then held them (`ag`: 10-24% breaks). tg64 -r 3 in place
(--repack 0) on 1 and 2 threads, the four copies of a file back to back; each copy's layout read right after the
sitting (resident pages) and ingested with its runs (`ingest --page-breaks`). Three `calibrate --quick` profiles of
this tree (01:01, 01:05, 01:09), before, between and after. No constant is fitted on llama.cpp: "unpriced" is the same
profile without its page-run rates (cpu.file_runs_gbs), as the simulator predicted before."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from calibration.store import read_rows
from stored_runs import stored_profile, stored_rows, tg_case

DATA = Path("tests/calibration/data/zen4-2026-12-07")
PROFILES = ("0101", "0105", "0109")
REPS = ("0102", "0106")
KINDS = {"pm": "64 MiB writes", "ag": "the page cache's own", "s6": "64 KiB runs", "s4": "4 KiB runs"}


def _rows(kind: str, priced: bool = True) -> list[dict]:
    """regress's tg rows of both sittings of that kind on every profile (unpriced: without its page-run rates)."""
    return [r for rep in REPS for p in PROFILES
            for r in stored_rows(DATA, rep + kind, p, drop_cpu_field=None if priced else "file_runs_gbs")]


def _mean_error(kind: str, priced: bool = True) -> float:
    """The mean over (threads, file) cases of each case's mean error."""
    acc: dict[tuple, list[float]] = {}
    for r in _rows(kind, priced):
        acc.setdefault(tg_case(r), []).append(r["error"])
    return statistics.mean(statistics.mean(v) for v in acc.values())


def test_each_sitting_is_eight_runs_each_predicted_and_carrying_its_files_layout():
    """4 files x 1 and 2 threads a sitting, each predicted above 0; every plan carries its copy's page breaks: under
    0.01 for 64 MiB writes, 1/16 give or take 0.02 for 64 KiB runs, over 0.95 for 4 KiB runs, 0.09-0.29 as found."""
    bounds = {"pm": (0.0, 0.01), "s6": (0.045, 0.085), "s4": (0.95, 1.0), "ag": (0.08, 0.3)}
    for kind, (lo, hi) in bounds.items():
        for rep in REPS:
            rows = stored_rows(DATA, rep + kind, PROFILES[0])
            assert len(rows) == 8 and all(r["predicted"] > 0 for r in rows)
            for r in read_rows(DATA / f"results-llamacpp-{rep + kind}.csv"):
                assert lo <= json.loads(r["plan"])["cpu_file_page_breaks"] <= hi, (kind, r["case"])


def test_llama_cpp_reads_a_file_in_4_kib_runs_far_slower():
    """`small` (Q8_0 experts and head, F16 attention) on one thread: 54.1 / 49.7 tok/s from the copy in 2 MiB folios,
    31.7 / 30.5 from the one in 4 KiB runs, in each sitting (1.57-1.71x the time); on two threads 80.0 / 73.8 against
    53.7 / 49.5."""
    for rep in REPS:
        def tok_s(kind, threads):
            return next(r["measured"] for r in stored_rows(DATA, rep + kind, PROFILES[0])
                        if tg_case(r)[::2] == (threads, "small"))
        assert tok_s("pm", "t1") > 1.5 * tok_s("s4", "t1")
        assert tok_s("pm", "t2") > 1.4 * tok_s("s4", "t2")


def test_the_profiles_page_run_rates_rise_in_cost_as_the_runs_shorten():
    """Each profile's Q8_0 rows on one thread: from 4 KiB runs they take longer than from 64 KiB runs, which take
    longer than from contiguous pages (file_runs_gbs against rowwise_gbs)."""
    for p in PROFILES:
        cpu = stored_profile(DATA, p)["cpu"]
        r0, r64, r4 = (t["Q8_0@1t"]["value"] for t in (cpu["rowwise_gbs"], cpu["file_runs_gbs"]["64KiB"],
                                                       cpu["file_runs_gbs"]["4KiB"]))
        assert r0 > r64 > r4, p


def test_pricing_the_page_layout_takes_most_of_the_error_away():
    """Mean error over the 8 cases of each kind, unpriced -> priced: 4 KiB runs +52.3 -> +9.4%, 64 KiB runs +21.9 ->
    +10.6%, the page cache's own +21.7 -> +5.1%, 64 MiB writes +15.3 -> +12.3% (their breaks are few, and what is left
    there is the over-prediction of a contiguous file: README, sessions 46-49)."""
    want = {"s4": (0.523, 0.094), "s6": (0.219, 0.106), "ag": (0.217, 0.051), "pm": (0.153, 0.123)}
    for kind, (before, after) in want.items():
        assert abs(_mean_error(kind, priced=False) - before) < 0.005, kind
        assert abs(_mean_error(kind) - after) < 0.005, kind


def test_the_predicted_slowdown_of_4_kib_runs_follows_the_measured_one():
    """Time from the copy in 4 KiB runs over time from the one in 64 MiB writes, mean over sittings and profiles:
    `small` 1.59 predicted against 1.67 measured on one thread and 1.38 / 1.49 on two, `small-q4` 1.55 / 1.53 and 1.26 /
    1.20, `small-q4k` (in place) 1.25 / 1.30 and 1.34 / 1.27; within 0.12 of each other for every file but IQ4_XS on
    two threads (1.28 predicted, 1.07 measured: its arithmetic hides more of the breaks than Q8_0's exponent says)."""
    def ratio(key: str, threads: str, f: str) -> float:
        m = {k: [r[key] for r in _rows(k) if tg_case(r)[::2] == (threads, f)] for k in ("pm", "s4")}
        return statistics.mean(m["pm"]) / statistics.mean(m["s4"])
    for f in ("small", "small-q4", "small-q4k", "small-iq4xs"):
        for threads in ("t1", "t2"):
            if (f, threads) == ("small-iq4xs", "t2"):
                continue
            assert abs(ratio("predicted", threads, f) - ratio("measured", threads, f)) < 0.12, (f, threads)
