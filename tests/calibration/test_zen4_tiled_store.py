"""ggml's tiled K-quant GEMM rebuilt (calibration.ggml_tiled) with its window stored as ggml stores it, 16 rows a token
at a time: on the Zen 4 VM (AMD EPYC family 25 model 17, 2 cores, AVX-512 with VNNI, a 32 MiB L3) the rebuild's down
products (2048 rows x 768) ran at 112 GFLOP/s a core where ggml's run at 196 (Q4_K, one thread, `small` at pp512's 128
tokens an expert; test-backend-ops with the case added: benchmarks/bench_ggml_tiled.py --case small-down), each write
of its row-by-row store landing 8 KiB from the last. calibrate's job now also converts gate's and up's activations
once a token, as ggml's MUL_MAT_ID does (it converted each expert's copy).

Data: llama-bench pp512 of make-model's seven `small` files (-r 2, 2 threads, repacked and in place) in five sittings
of 2026-12-06 (07:01-07:06 and 07:23-07:26, ../zen4-2026-12-06b), predicted on the `calibrate --quick` profiles
written between them: three before the change (07:03-07:08) and two after (07:22, 07:25); the two in slow spells
(07:00, 07:28: Q4_0's repacked rate ~40 where the others have ~74) are stored beside them. No constant is fitted on
llama.cpp."""
from __future__ import annotations

import statistics
from pathlib import Path

from stored_runs import prefill_rows, stored_profile, stored_rows

DATA = Path("tests/calibration/data/zen4-2026-12-06b")
SITTINGS = ("0701", "0704", "0706", "0723", "0726")
BEFORE = ("0703", "0705", "0708")
AFTER = ("0722", "0725")
TILED = (" Q4_K:", " Q2_K:", " Q3_K:", " IQ4_XS:")  # the files whose experts take the tiled GEMM in place


def _errors(profiles, in_place_tiled: bool | None = None) -> list[float]:
    return [r["error"] for s in SITTINGS for p in profiles for r in prefill_rows(stored_rows(DATA, s, p))
            if in_place_tiled is None
            or in_place_tiled == (any(t in r["case"] for t in TILED) and "--no-repack" in r["case"])]


def test_the_tiled_rates_rise_with_ggmls_store():
    """calibrate's tiled rates (2 threads, 64 tokens an expert), when recorded: Q4_K 150-154 GFLOP/s a core before,
    178-187 after; IQ4_XS 163-169 before, 194-202 after; Q6_K 122-129 before, 140-142 after."""
    def rate(p, key):
        return float(stored_profile(DATA, p)["cpu"]["ggml_prefill_gflops"][key]["value"])
    for key, rise in (("Q4_K:tiled", 1.1), ("IQ4_XS:tiled", 1.1), ("Q6_K:tiled", 1.05)):
        assert min(rate(p, key) for p in AFTER) > rise * max(rate(p, key) for p in BEFORE), key


def test_the_in_place_k_quant_prefills_come_up_to_the_others():
    """The 60 / 40 in-place K-quant pp512 predictions (Q2_K, Q3_K, Q4_K, IQ4_XS): mean error -19.8% before, -10.2%
    after, against -8.7% / -7.8% for the other files' 150 / 100, when recorded."""
    gap_before = statistics.mean(_errors(BEFORE, True)) - statistics.mean(_errors(BEFORE, False))
    gap_after = statistics.mean(_errors(AFTER, True)) - statistics.mean(_errors(AFTER, False))
    assert gap_before < -0.08
    assert abs(gap_after) < 0.06
    assert statistics.mean(_errors(AFTER, True)) > statistics.mean(_errors(BEFORE, True)) + 0.05


def test_prefill_over_every_sitting_and_steady_profile():
    """All pp512 predictions: mean error -11.9%, median |error| 12.0%, max 32.7% before (210); -8.5%, 8.5%, 24.8%
    after (140), when recorded."""
    before, after = _errors(BEFORE), _errors(AFTER)
    assert len(before) == 210 and len(after) == 140
    assert statistics.median(abs(e) for e in after) < statistics.median(abs(e) for e in before)
    assert -0.15 < statistics.mean(after) < 0.0
    assert statistics.median(abs(e) for e in after) < 0.12
