"""A GGUF in 4 KiB page runs against the executor on one and on two threads, checked again (session 52): one thread is
priced, two are not.

Data (../zen4-2026-12-07c): two sittings, 07:15 and 07:18 of 2026-12-07, of the executor's all-CPU decode (16-token
prompt, 64 tokens, `calibration.local.measure`: the median of five rounds) of `small` (Q8_0) and `small-q4k` on 1 and 2
threads, each from a copy written in 64 MiB writes (`pm`) and one in shuffled 4 KiB runs (`s4`), fresh that morning;
three `calibrate --quick` profiles of this tree (ad00192: a format's page-run jobs timed together), 07:14, 07:17 and
07:19, before, between and after. No constant is fitted on these runs."""
from __future__ import annotations

import statistics
from functools import lru_cache
from pathlib import Path

import pytest

from specs.loaders import load_hardware
from specs.plan import Plan
from stored_runs import executor_measured, executor_predicted, executor_rows

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("tests/calibration/data/zen4-2026-12-07c")  # the stores' paths are relative to the repo root
PROFILES = ("0714", "0717", "0719")
SITTINGS = ("0715", "0718")
FILES = ("small", "small-q4k")


def _rows(sitting: str) -> tuple[dict, ...]:
    return executor_rows(DATA, sitting)


@lru_cache(maxsize=None)
def _predicted(sitting: str, case: str, profile: str) -> float:
    """decode tok/s of the sitting's run `case` simulated on the profile, on its own routing and page layout."""
    return executor_predicted(DATA, sitting, case, load_hardware(str(ROOT / DATA / f"host-calibrated-{profile}.yaml")))


def _tok_s(case: str, predicted: bool) -> float:
    """Mean decode tok/s of `case` over the sittings (and, predicted, the profiles)."""
    if predicted:
        return statistics.mean(_predicted(s, case, p) for s in SITTINGS for p in PROFILES)
    return statistics.mean(executor_measured(DATA, s, case) for s in SITTINGS)


def _slowdown(f: str, threads: int, predicted: bool) -> float:
    """Time from the copy in 4 KiB runs over time from the copy in 64 MiB writes."""
    return _tok_s(f"pm-{f}-t{threads}", predicted) / _tok_s(f"s4-{f}-t{threads}", predicted)


def test_each_sitting_is_both_files_layouts_and_thread_counts_each_carrying_its_copys_layout():
    """2 files x 2 thread counts x 2 layouts a sitting; each plan's cpu_file_page_breaks as read right after its run:
    the 4 KiB runs' copies 0.999-1.0, the 64 MiB writes' 0.01-0.02 (written 3 minutes before the first sitting)."""
    for s in SITTINGS:
        rows = _rows(s)
        assert len(rows) == 8 and all(float(r["value"]) > 0 for r in rows)
        for r in rows:
            b = Plan.model_validate_json(r["plan"]).cpu_file_page_breaks
            assert (b >= 0.999) if r["case"].startswith("s4") else (0.01 <= b <= 0.02), (s, r["case"], b)


def test_on_two_threads_the_executor_pays_as_much_as_on_one():
    """Measured time from 4 KiB runs over 64 MiB writes: `small` 1.23x on one thread and 1.22x on two, `small-q4k`
    1.20x and 1.23x (session 51's sittings: `small` 1.10x and 1.13x). Its 2-thread decode is not bound by the bus:
    `small` from 64 MiB writes 1.26x its one-thread speed on two threads, `small-q4k` 1.56x."""
    for f, t, want in (("small", 1, 1.229), ("small", 2, 1.216), ("small-q4k", 1, 1.204), ("small-q4k", 2, 1.231)):
        assert _slowdown(f, t, False) == pytest.approx(want, abs=0.005), (f, t)
    for f, want in (("small", 1.256), ("small-q4k", 1.560)):
        assert _tok_s(f"pm-{f}-t2", False) / _tok_s(f"pm-{f}-t1", False) == pytest.approx(want, abs=0.005), f


def test_one_thread_is_priced():
    """Predicted / measured slowdown on one thread: `small` 1.20 / 1.23, `small-q4k` 1.16 / 1.20: within 0.05."""
    for f, want in (("small", 1.196), ("small-q4k", 1.163)):
        assert _slowdown(f, 1, True) == pytest.approx(want, abs=0.005), f
        assert abs(_slowdown(f, 1, True) - _slowdown(f, 1, False)) < 0.05, f


@pytest.mark.xfail(strict=True, reason="not met: the quick profile's 2-thread jobs, bound by the bus, show a fraction "
                                       "of what the executor's 2-thread decode pays (README, session 52)")
def test_two_threads_are_priced():
    """Predicted / measured slowdown on two threads: `small` 1.01 / 1.22, `small-q4k` 1.10 / 1.23. The goal: within
    0.05, as on one thread."""
    for f in FILES:
        assert abs(_slowdown(f, 2, True) - _slowdown(f, 2, False)) < 0.05, f
