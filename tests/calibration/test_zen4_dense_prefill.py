"""The simulator against llama.cpp on a Zen 4 VM (AMD EPYC family 25 model 17, 2 cores, AVX-512 with VNNI, a 32 MiB
L3), with llamafile's tinyBLAS F16 GEMM rebuilt (calibration.ggml_sgemm) for llama.cpp's dense prefill products,
without llama.cpp here: llama-bench pp512 (-r 2, 2 threads, with its load-time repacking and with `--repack 0`) of
make-model's seven `small` files in six sittings of 2026-12-06 (03:22-03:37; three with tg64, -r 3, too;
results-llamacpp-HHMM.csv; the models' headers are session 40's, in ../xeon-2026-12-05), predicted on the three
`calibrate --quick` profiles written between them that rate 'F16:sgemm' (03:32-03:40, host-calibrated-HHMM.yaml;
two earlier ones, 03:20 and 03:24, are stored beside them). No constant is fitted on llama.cpp.

perf of llama-bench's `small-q4k` pp512 in place here: the tiled K-quant GEMM ~65% of the samples, tinyBLAS's
F16 gemm_bloc<4, 6> 12%, the elementwise multiply of the expert outputs by their weights 8.3%, flash attention 2.7%."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from stored_runs import assert_every_run_predicted, prefill_rows, stored_profile, stored_rows

DATA = Path("tests/calibration/data/zen4-2026-12-06")  # the stores' model paths are relative to the repo root
SITTINGS = ("0322", "0325", "0328", "0330", "0334", "0337")
DECODE_SITTINGS = ("0322", "0334", "0337")
PROFILES = ("0332", "0337", "0340")  # those that rate 'F16:sgemm'
SGEMM_PROFILES = PROFILES
TILED = (" Q4_K:", " Q2_K:", " Q3_K:", " IQ4_XS:")  # the files whose experts take the tiled GEMM in place


def _profile(profile: str) -> dict:
    return stored_profile(DATA, profile)


def _rows(sitting: str, profile: str, sgemm: bool = True) -> tuple[dict, ...]:
    """regress's rows of a sitting on a profile; without sgemm, the profile's 'F16:sgemm' rates dropped."""
    return stored_rows(DATA, sitting, profile, None if sgemm else "sgemm")


def _in_place_tiled(r: dict) -> bool:
    return any(t in r["case"] for t in TILED) and "--no-repack" in r["case"]


_prefill = prefill_rows


def test_every_stored_run_is_predicted():
    """14 pp512 runs a sitting (seven files, each repacked and in place), and 14 tg64 in three of them."""
    assert_every_run_predicted(DATA, SITTINGS, DECODE_SITTINGS, PROFILES[0])


def test_the_profiles_rate_llamas_f16_dense_products_at_the_fma_roof():
    """'F16:sgemm' (llamafile's tinyBLAS, an attention block of 2048 at 512 tokens): 91.9, 91.0 and 92.1 GFLOP/s a
    core, when recorded, about Zen 4's two 256-bit FMA pipes (32 FLOP a cycle) at its clock; the executor's integer
    expert GEMM on the same profiles, which stood in for it, 101-105."""
    for p in SGEMM_PROFILES:
        d = _profile(p)
        sgemm = float(d["cpu"]["ggml_prefill_gflops"]["F16:sgemm"]["value"])
        base = float(d["constants"]["cpu_prefill_gflops_per_core"]["value"])
        assert 85 < sgemm < 0.95 * base


def test_the_f16_rate_moves_each_prefill_by_its_dense_share_only(sitting: str = "0337"):
    """Rated at tinyBLAS's 92 rather than the integer GEMM's ~103, each pp512 prediction falls by 0.35% to 1.6% (the
    dense products are ~8.5% of a `small` token's multiply-adds, the head aside; the last sitting with decode runs);
    the decode predictions do not move."""
    for p in SGEMM_PROFILES:
        before = {r["case"]: r for r in _rows(sitting, p, sgemm=False)}
        for r in _rows(sitting, p):
            moved = r["predicted"] / before[r["case"]]["predicted"] - 1
            if r["metric"] == "prefill_tok_s":
                assert -0.025 < moved < -0.002, r["case"]
            else:
                assert moved == pytest.approx(0.0, abs=1e-12)


def test_the_in_place_k_quants_sit_under_the_other_prefills():
    """What is left, stated: on each (sitting, profile) the four in-place K-quant runs' mean error sits 5 to 24
    points under the other ten's (12.7 on average), when recorded. Here the tiled GEMM's rebuild runs at ggml's own
    rate in test-backend-ops' cases (0.93-1.21x at 768 x 2048 and 32 tokens an expert; 0.90-1.25x at 1792 x 2048,
    16 and 64), but ggml's rate rises with the tokens an expert (120 -> 151 -> 195 GFLOP/s for Q4_K at 16, 32, 64)
    where the rebuild's stays near 150 from 64 up, and llama-bench's 128 tokens an expert imply ~220 from perf's
    split."""
    gaps = []
    for s in SITTINGS:
        for p in PROFILES:
            pp = _prefill(_rows(s, p))
            gaps.append(statistics.mean(r["error"] for r in pp if _in_place_tiled(r))
                        - statistics.mean(r["error"] for r in pp if not _in_place_tiled(r)))
    assert all(-0.30 < g < 0.0 for g in gaps)
    assert -0.18 < statistics.mean(gaps) < -0.08


def test_prefill_over_every_sitting_and_profile():
    """The 252 pp512 predictions: mean error -9.5%, median |error| 10.5%, when recorded."""
    errs = [r["error"] for s in SITTINGS for p in PROFILES for r in _prefill(_rows(s, p))]
    assert len(errs) == 252
    assert -0.16 < statistics.mean(errs) < -0.04
    assert statistics.median(abs(e) for e in errs) < 0.16


def test_the_vms_spells_set_the_decode_level():
    """tg64 (42 runs a profile): mean error +30.4%, +17.4%, -2.5% on the three profiles in turn (the two earlier ones
    +16.9%, -1.3%), when recorded; profiles minutes apart differ by ~30 points over the same runs, so the profile's
    spell, not the mechanism, sets the level here."""
    means = [statistics.mean(r["error"] for s in DECODE_SITTINGS for r in _rows(s, p) if r["metric"] != "prefill_tok_s")
             for p in PROFILES]
    assert max(means) - min(means) > 0.2
    assert -0.1 < statistics.mean(means) < 0.25
