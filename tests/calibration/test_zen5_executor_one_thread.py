"""The executor on one thread runs every decode job's experts whole (executor.cpu_experts._whole: one token an expert
balances on one thread), and calibrate now times that job on one thread too (cpu.whole_gbs 'FMT@1t', and its page-run
jobs so: cpu.kernel_file_runs_gbs, session 53); before, one-thread decode was priced at the rows-split job's one-thread
rate and under-predicted, `small-q4k` by 23%.

Data (../zen5-2026-12-07b): two sittings, 09:37 and 09:39 of 2026-12-07, of the executor's all-CPU decode (16-token
prompt, 64 tokens, `calibration.local.measure`: the median of five rounds) of `small` (Q8_0) and `small-q4k` (Q4_K_M)
on 1 and 2 threads, each from a copy written just before in 64 MiB writes (`pm`: 1-67% breaks, the page cache
fragmented) and one in shuffled 4 KiB runs (`s4`); three `calibrate --quick` profiles of this tree (09:36, 09:38,
09:40), before, between and after. A Zen 5 VM (AMD family 26 model 2, LLVM's `znver5`; the whole-expert Q8_0 job on two
threads read 52-60 GB/s), where a file's 4 KiB runs cost the executor under 5%. No constant is fitted on these runs; "before" is
the same profiles without their one-thread whole-expert rates."""
from __future__ import annotations

import gzip
import json
import statistics
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from specs.loaders import load_hardware
from specs.plan import Plan
from stored_runs import executor_measured, executor_predicted, executor_rows, scratch

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("tests/calibration/data/zen5-2026-12-07b")  # the stores' paths are relative to the repo root
PROFILES = ("0936", "0938", "0940")
SITTINGS = ("0937", "0939")
CASES = tuple(f"{lay}-{f}-t{t}" for f in ("small", "small-q4k") for t in (1, 2) for lay in ("pm", "s4"))


def _rows(sitting: str) -> tuple[dict, ...]:
    return executor_rows(DATA, sitting)


def _profile(p: str) -> dict:
    return yaml.safe_load((ROOT / DATA / f"host-calibrated-{p}.yaml").read_text())


@lru_cache(maxsize=None)
def _hardware(p: str, before: bool):
    """The profile; before: without its one-thread whole-expert rates (as profiles were until session 53)."""
    d = _profile(p)
    if before:
        d["cpu"]["whole_gbs"] = {k: v for k, v in d["cpu"]["whole_gbs"].items() if "@" not in k}
    path = scratch() / f"one-thread-{p}-{before}.yaml"
    path.write_text(yaml.safe_dump(d))
    return load_hardware(str(path))


@lru_cache(maxsize=None)
def _predicted(sitting: str, case: str, profile: str, before: bool) -> float:
    """decode tok/s of the sitting's run `case` simulated on the profile, on its own routing and page layout."""
    return executor_predicted(DATA, sitting, case, _hardware(profile, before))


def _tok_s(case: str, predicted: bool, before: bool = False) -> float:
    """Mean decode tok/s of `case` over the sittings (and, predicted, the profiles)."""
    if predicted:
        return statistics.mean(_predicted(s, case, p, before) for s in SITTINGS for p in PROFILES)
    return statistics.mean(executor_measured(DATA, s, case) for s in SITTINGS)


def _error(case: str, before: bool = False) -> float:
    return _tok_s(case, True, before) / _tok_s(case, False) - 1.0


def test_each_sitting_is_both_files_layouts_and_thread_counts_each_carrying_its_copys_layout():
    """2 files x 2 thread counts x 2 layouts a sitting; each plan's cpu_file_page_breaks as read right after its run:
    the 4 KiB runs' copies 0.999-1.0, the 64 MiB writes' 0.01-0.67 (few free 2 MiB blocks were left)."""
    for s in SITTINGS:
        rows = _rows(s)
        assert sorted(r["case"] for r in rows) == sorted(CASES) and all(float(r["value"]) > 0 for r in rows)
        for r in rows:
            b = Plan.model_validate_json(r["plan"]).cpu_file_page_breaks
            assert (b >= 0.999) if r["case"].startswith("s4") else (0.01 <= b <= 0.67), (s, r["case"], b)


def test_the_profiles_time_whole_experts_on_one_thread_faster_than_rows_split():
    """Each profile's whole-expert job on one thread over its rows-split job there: Q4_K 1.38-1.41x, Q6_K 1.35-1.44x,
    Q8_0 1.13-1.18x, Q4_0 1.09-1.14x; its page-run jobs on one thread are whole-expert jobs too."""
    for p in PROFILES:
        cpu = _profile(p)["cpu"]
        for fmt, lo, hi in (("Q4_K", 1.38, 1.41), ("Q6_K", 1.35, 1.44), ("Q8_0", 1.13, 1.18), ("Q4_0", 1.09, 1.14)):
            ratio = cpu["whole_gbs"][f"{fmt}@1t"]["value"] / cpu["expert_gbs"][f"{fmt}@1t"]["value"]
            assert lo <= ratio <= hi, (p, fmt, ratio)
            assert "whole experts per thread" in cpu["whole_gbs"][f"{fmt}@1t"]["ref"]
        for runs in ("2048KiB", "4KiB"):
            assert "whole experts per thread" in cpu["kernel_file_runs_gbs"][runs]["Q4_K@1t"]["ref"]


def test_the_one_thread_decodes_experts_read_at_the_whole_jobs_rate_not_the_rows():
    """`small-q4k` on one thread, from its traces (the median run's): its experts read 23.9-24.5 GB/s, against the
    profiles' rows-split Q4_K / Q6_K 18.2-18.7 / 19.5-20.1 and whole 25.3-26.3 / 26.7-28.1 on one thread."""
    for s in SITTINGS:
        for r in _rows(s):
            if r["case"].endswith("q4k-t1"):
                with gzip.open(ROOT / r["routing"], "rt") as fh:
                    steps = [json.loads(line) for line in fh]
                dec = [x for x in steps if x.get("phase") == "decode"]
                gbs = sum(x["bytes_cpu"] for x in dec) / sum(x["t_experts_ms"] for x in dec) / 1e6
                assert 23.9 <= gbs <= 24.5, (s, r["case"], gbs)


def test_one_thread_decode_is_priced_at_the_whole_rate():
    """Predicted against measured on one thread, before -> after: `small` -8.8 / -7.6% -> +1.6 / +3.0% (64 MiB writes /
    4 KiB runs), `small-q4k` -23.4 / -23.3% -> -2.0 / -2.0%; mean |error| of the four 15.8% -> 2.2%."""
    want = {"pm-small-t1": (-0.088, 0.016), "s4-small-t1": (-0.076, 0.030),
            "pm-small-q4k-t1": (-0.234, -0.020), "s4-small-q4k-t1": (-0.233, -0.020)}
    for case, (before, after) in want.items():
        assert _error(case, before=True) == pytest.approx(before, abs=0.005), case
        assert _error(case) == pytest.approx(after, abs=0.005), case
    assert statistics.mean(abs(_error(c)) for c in want) < 0.025 < 0.155 < statistics.mean(
        abs(_error(c, before=True)) for c in want)


def test_two_threads_are_unchanged_and_within_13_percent():
    """Two threads read the two-thread whole rates as before: `small` +12.3 / +8.5%, `small-q4k` +4.7 / +4.7% (an
    earlier campaign of the same tree's calibrate at 08:34-08:38: +1.1 / +0.2% and -6.6 / -6.8%)."""
    for case in (c for c in CASES if c.endswith("t2")):
        assert _tok_s(case, True) == pytest.approx(_tok_s(case, True, before=True), rel=1e-12), case
        assert abs(_error(case)) < 0.13, case


def test_here_4_kib_runs_cost_little_and_are_priced_within_0_05_on_both_thread_counts():
    """Time from 4 KiB runs over time from the 64 MiB writes' copy, predicted / measured: `small` 1.02 / 1.03 on one
    thread and 1.01 / 0.97 on two, `small-q4k` 1.02 / 1.02 and 1.01 / 1.01: within 0.05 on both thread counts on this
    host, where the profiles' two-thread jobs from 4 KiB runs pay little too (session 52's, on the Zen 4 VM's slower
    bus, 1.22 / 1.23 measured on two threads, are not priced: test_zen4_executor_two_threads)."""
    for f in ("small", "small-q4k"):
        for t in (1, 2):
            meas = _tok_s(f"pm-{f}-t{t}", False) / _tok_s(f"s4-{f}-t{t}", False)
            pred = _tok_s(f"pm-{f}-t{t}", True) / _tok_s(f"s4-{f}-t{t}", True)
            assert abs(pred - meas) < 0.05, (f, t, pred, meas)
