"""A GGUF whose page-cache pages lie in short physical runs (Plan.cpu_file_page_breaks): llama.cpp's rows read in
place through its mmap run slower by the profile's file_page_excess; what it repacks into its own buffers and what it
reads into buffers at load (--no-mmap) do not; the executor's plans run slower by its kernel's own excess. Profile:
the Zen 4 VM's (zen4-2026-12-05) with page-run rates set here: Q8_0 rows 20% slower from a file in 64 KiB runs, 50%
from one in 4 KiB runs; the executor's Q8_0 kernel 5% and 20%."""
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from simulator.resources import cpu_gbs, in_place_page_excess
from simulator.run import simulate
from specs.figure import Figure
from specs.formats import parse_format
from specs.loaders import load_hardware, load_model
from specs.plan import Plan

DATA = Path(__file__).resolve().parents[1] / "calibration" / "data" / "zen4-2026-12-05"
HW0 = load_hardware(str(DATA / "host-calibrated.yaml"))
Q8, Q4K = parse_format("Q8_0"), parse_format("Q4_K")


def _hw():
    """HW0 with Q8_0's rows 1.2x / 1.5x the time from files in 64 / 4 KiB runs, at both thread counts."""
    hw = HW0.model_copy(deep=True)
    runs = {}
    for name, slow in (("64KiB", 1.2), ("4KiB", 1.5)):
        runs[name] = {k: Figure(float(v) / slow, "measured", "test") for k, v in hw.cpu.rowwise_gbs.items()
                      if k.split("@")[0] == "Q8_0"}
    hw.cpu.file_runs_gbs = runs
    hw.cpu.kernel_file_runs_gbs = {name: {k: Figure(float(v) / slow, "measured", "test") for k, v in
                                          hw.cpu.expert_gbs.items() if k.split("@")[0] == "Q8_0"}
                                   for name, slow in (("64KiB", 1.05), ("4KiB", 1.2))}
    return hw


HW = _hw()


def _ll(breaks: float, **upd) -> Plan:
    return Plan(engine="llamacpp", cpu_repack=True, cpu_file_page_breaks=breaks, **upd)


def test_in_place_rows_run_slower_by_the_excess_of_the_files_breaks():
    """Q8_0 (not repacked) from a file with 1/16 of its boundaries breaks: 1/1.2 the contiguous rate, on 1 and 2 threads."""
    for t in (1, 2):
        assert cpu_gbs(HW, Q8, t, _ll(1 / 16)) == pytest.approx(cpu_gbs(HW, Q8, t, _ll(0.0)) / 1.2)


def test_repacked_buffers_and_no_mmap_are_not_slowed():
    """Q4_K, which llama.cpp repacks on AVX2 into anonymous buffers; every weight with --no-mmap: the breaks change
    nothing."""
    assert cpu_gbs(HW, Q4K, 2, _ll(0.5)) == cpu_gbs(HW, Q4K, 2, _ll(0.0))
    assert in_place_page_excess(HW, Q8, 2, _ll(0.5, cpu_mmap=False)) == 0.0


def test_the_executor_pays_its_own_kernels_excess_whatever_cpu_mmap_says():
    """The executor reads its experts in place from its mmap always: from a file in 4 KiB runs its Q8_0 kernel at
    1/1.2 the contiguous rate (its own table, not llama.cpp's 1.5), on 1 and 2 threads, its whole-expert jobs too;
    the plan's cpu_mmap (a llama.cpp flag) changes nothing; the other engines' templates pay none (not calibrated)."""
    for t in (1, 2):
        for whole in (False, True):
            own = cpu_gbs(HW, Q8, t, Plan(cpu_file_page_breaks=1.0), whole)
            assert own == pytest.approx(cpu_gbs(HW, Q8, t, Plan(), whole) / 1.2)
    assert in_place_page_excess(HW, Q8, 2, Plan(cpu_file_page_breaks=1.0, cpu_mmap=False)) == pytest.approx(0.2)
    assert in_place_page_excess(HW, Q8, 2, Plan(engine="tiered-cache", cpu_file_page_breaks=1.0)) == 0.0


def test_an_all_cpu_decode_of_a_q8_0_file_in_short_runs_is_slower():
    """`small` (Q8_0 experts and head, F16 attention) all-CPU on one thread: its pages in 4 KiB runs (every boundary a
    break) decode slower than contiguous ones, by less than the rows' 1.5x (F16 and the rest of a token are not)."""
    model = load_model(str(DATA.parent / "xeon-2026-12-05" / "small.yaml"))
    run = lambda b: simulate(model, HW, _ll(b, cpu_threads=1), gen_tokens=4, routing="uniform",  # noqa: E731
                             warm_steps=0).decode_tok_s
    fast, slow = run(0.0), run(1.0)
    assert 1.2 < fast / slow < 1.5


@settings(max_examples=20, deadline=None)
@given(st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_more_breaks_are_never_faster(a, b):
    """The excess never falls as the share of breaks grows."""
    lo, hi = sorted((a, b))
    assert cpu_gbs(HW, Q8, 2, _ll(hi)) <= cpu_gbs(HW, Q8, 2, _ll(lo)) * (1 + 1e-12)
