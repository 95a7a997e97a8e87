"""The simulator against llama.cpp on this kind of machine (2 cores of an AMD EPYC under KVM), without
llama.cpp here: llama-bench runs of 2026-11-30 (session 13; the CPU build of llama-cpp-python 0.3.36's
vendored llama.cpp, its default pp512 / tg128, 3 repetitions) on make-model's `small` (Q8_0 experts),
`small-q4` (Q4_0), llama-quantize's Q4_K_M of `small` and the llama-bench fixture's shape, at 2 and 1
threads, ingested into data/epyc-2026-11-30/results-llamacpp.csv with the models' GGUF headers as YAML,
predicted on the profile `moe-offload calibrate --quick` wrote beside them. No constant is fitted on
llama.cpp: this is the check README's "Simulator against llama.cpp on this machine" quotes, rerunnable."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from calibration import regress

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("tests/calibration/data/epyc-2026-11-30")  # the store's model paths are relative to the repo root


@pytest.fixture(scope="module")
def rows():
    """regress rows (measured against predicted) of the stored llama.cpp runs."""
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)
    try:
        yield regress.local_rows(DATA / "results-llamacpp.csv", str(DATA / "host-calibrated.yaml"))
    finally:
        mp.undo()


def test_every_stored_run_is_predicted(rows):
    """All 18 stored runs (4 models x 2 thread counts x pp512 / tg128, and Q4_K_M at 2 threads in place)
    come back with a prediction: no model file or plan is missing from the data."""
    assert len(rows) == 18
    assert all(r["predicted"] > 0 for r in rows)


def _decode(rows) -> dict[str, float]:
    """|error| of each decode case, by a short name: model, thread count, ' in place' for --no-repack."""
    out = {}
    for r in rows:
        if r["metric"] == "decode_tok_s":
            c = r["case"]
            name = c.split(":")[1].removeprefix("moe-offload synthetic ") + " t" + c.split("-t ")[1].split()[0]
            out[name + (" in place" if "--no-repack" in c else "")] = abs(r["error"])
    return out


def test_decode_of_the_small_files_at_two_threads_within_ten_percent(rows):
    """`small` (Q8_0), `small-q4` (Q4_0) and the Q4_K_M file, repacked and in place, at 2 threads: each
    within 10% (-0.9%, -0.9%, +5.4%, +7.1% when recorded)."""
    dec = _decode(rows)
    two = {k: v for k, v in dec.items() if k.startswith("small") and " t2" in k}
    assert len(two) == 4
    assert max(two.values()) <= 0.10, two


def test_decode_median_within_ten_percent(rows):
    """All nine decode runs: median |error| <= 10% (7.1% when recorded)."""
    dec = _decode(rows)
    assert len(dec) == 9
    assert statistics.median(dec.values()) <= 0.10


@pytest.mark.xfail(strict=True, reason="1 thread and the overhead-bound fixture shape over-predicted 24-53%: "
                   "the profile's kernel rates exceed what either engine sustained in decode in that spell "
                   "(the executor's experts 7.2-8.2 GB/s at 1 thread against calibrate's 11.5); README")
def test_decode_max_within_twenty_percent(rows):
    """All nine decode runs: max |error| <= 20% (53.4% when recorded: the fixture shape at 1 thread)."""
    assert max(_decode(rows).values()) <= 0.20
