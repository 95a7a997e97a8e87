"""ggml's tiled GEMM unpacks an expert's weights once a window of up to 256 of its tokens, so its rate rises with the
tokens an expert (test-backend-ops, one Zen 4 core, `small`'s gate products: Q3_K 86 / 109 / 143 / 153 GFLOP/s at
32 / 64 / 128 / 256 tokens an expert, Q4_K 152 / 176 / 191 / 200; benchmarks/bench_ggml_tiled.py). calibrate timed
the rebuild at 64 tokens an expert only, where llama-bench's pp512 of `small` puts 128; it now times it at a full
window too and writes what a window shares (cpu.ggml_prefill_fixed_tokens, m0), and the simulator runs each batch at
m / (m + ceil(m / 256) m0) over the same at 64 (simulator.resources.ggml_window_scale).

Data: llama-bench pp512 of make-model's seven `small` files (-r 2, 2 threads, repacked and in place; tg64 -r 3 in two
of them) in four sittings of 2026-12-06 (09:10-09:17, ../zen4-2026-12-06c), predicted on the `calibrate --quick`
profiles written between them, with and without their m0 (the same profile both ways). Three are steady (09:12,
09:16, 09:19); two ran in slow spells (09:09: Q4_0's repacked rate 61 where the steady ones have 76-77; 09:14: 40, and
Q8_0 32 against 57-58) and are stored beside them. No constant is fitted on llama.cpp."""
from __future__ import annotations

import statistics
from pathlib import Path

from stored_runs import prefill_rows, stored_profile, stored_rows

DATA = Path("tests/calibration/data/zen4-2026-12-06c")
SITTINGS = ("0910", "0912", "0915", "0917")
PROFILES = ("0909", "0912", "0914", "0916", "0919")
STEADY = ("0912", "0916", "0919")
TILED = (" Q4_K:", " Q2_K:", " Q3_K:", " IQ4_XS:")  # the files whose experts take the tiled GEMM in place
UNTILED = (" Q4_0:", " Q8_0:", " IQ4_NL:")  # those whose experts never do
FIXED = "ggml_prefill_fixed_tokens"


def _errors(with_m0: bool, keep=lambda case: True) -> list[float]:
    return [r["error"] for s in SITTINGS for p in STEADY
            for r in prefill_rows(stored_rows(DATA, s, p, drop_cpu_field=None if with_m0 else FIXED))
            if keep(r["case"])]


def _in_place_tiled(case: str) -> bool:
    return any(t in case for t in TILED) and "--no-repack" in case


def test_each_profile_gives_each_tiled_type_its_windows_fixed_tokens():
    """Every profile times six types' tiled GEMM at 64 tokens an expert and at 256, on two threads and on one: m0
    between 0 and 40 tokens, read against a reference batch of 64; on the steady profiles Q3_K's and Q6_K's unpacking
    (12-23 tokens) weighs more than Q2_K's (4.5-8), when recorded."""
    for p in PROFILES:
        cpu = stored_profile(DATA, p)["cpu"]
        assert cpu["ggml_prefill_ref_tokens"]["value"] == 64
        m0 = {k: v["value"] for k, v in cpu[FIXED].items()}
        assert set(m0) == {f"{t}:tiled{s}" for t in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS") for s in ("", "@1t")}
        assert all(0 <= v <= 40 for v in m0.values()), p
        if p in STEADY:
            assert min(m0["Q3_K:tiled"], m0["Q6_K:tiled"]) > m0["Q2_K:tiled"], p


def test_the_in_place_tiled_prefills_come_level():
    """The 48 in-place pp512 predictions of the tiled files on the steady profiles: mean error -6.2% without m0,
    -0.5% with it; median |error| 7.8% -> 4.5%; Q3_K's 24 (both modes: it has no repacked layout) -10.8% -> -4.3%,
    when recorded."""
    before, after = _errors(False, _in_place_tiled), _errors(True, _in_place_tiled)
    assert len(before) == len(after) == 48
    assert statistics.mean(before) < -0.04 and abs(statistics.mean(after)) < 0.03
    assert statistics.median(abs(e) for e in after) < statistics.median(abs(e) for e in before)
    q3 = lambda case: " Q3_K:" in case  # noqa: E731
    assert statistics.mean(_errors(True, q3)) > statistics.mean(_errors(False, q3)) + 0.04


def test_prefill_over_every_sitting_and_steady_profile():
    """All 168 pp512 predictions: mean error -5.7%, median |error| 5.4%, max 19.6% without m0; -3.3%, 4.6%, 15.3% with
    it, when recorded."""
    before, after = _errors(False), _errors(True)
    assert len(before) == len(after) == 168
    assert statistics.mean(before) < statistics.mean(after) < 0.0
    assert statistics.median(abs(e) for e in after) < statistics.median(abs(e) for e in before) < 0.07
    assert max(abs(e) for e in after) < max(abs(e) for e in before)


def test_files_that_never_take_the_tiled_gemm_are_predicted_as_before():
    """Q4_0, Q8_0 and IQ4_NL experts (a dot product per pair, or repacked) read no m0: their 72 predictions are the
    same with and without it (mean -3.4%, when recorded)."""
    untiled = lambda case: any(t in case for t in UNTILED)  # noqa: E731
    before, after = _errors(False, untiled), _errors(True, untiled)
    assert len(before) == 72 and before == after
