"""llama.cpp's F16 rows (the synthetic files' attention weights) timed on ggml's vec_dot_f16 rebuilt
(calibration.ggml_vec_dot_f16) instead of the executor's float rows, and both against llama-bench.

Data: llama-bench tg64 (-r 3) on 1 and 2 threads, repacked and in place, of the seven `small` files, every file read
into the page cache before each sitting, in three sittings of 2026-12-06 (22:01, 22:05, 22:08;
../zen4-2026-12-06j), between eight `calibrate --quick` profiles: four of 8ebe829, ggml's vec_dot_f16 (22:00, 22:03,
22:08, 22:10), and four of 61e1a79, the executor's rows (21:56, 22:04, 22:06, 22:11), in alternation. No constant is
fitted on llama.cpp. F16's effect is read on the same profiles with the two sets of F16 rates
(stored_runs.rows_with_rowwise_of)."""
from __future__ import annotations

import statistics
from pathlib import Path

from stored_runs import mean_errors, stored_profile

DATA = Path("tests/calibration/data/zen4-2026-12-06j")
SITTINGS = ("2201", "2205", "2208")
PAIRS = (("2200", "2156"), ("2203", "2204"), ("2208", "2206"), ("2210", "2211"))  # (vec_dot_f16, the executor's rows)
GROUPS = (("t1", "norp"), ("t1", "rp"), ("t2", "norp"), ("t2", "rp"))
F16_KEYS = ("F16", "F16@1t", "BF16", "BF16@1t")


def test_f16_rows_read_faster_on_ggmls_vec_dot():
    """One thread 31.7-33.4 GB/s against the executor's rows' 17.5-24.5; two 37.3-44.6 against 28.2-36.5. perf of
    llama-bench's tg64 put ggml's vec_dot_f16 at 26-30 GB/s on one thread, 34-39 on two, in situ
    (benchmarks/bench_llamacpp_in_situ.py, 22:2x)."""
    for new, old in PAIRS:
        n, o = stored_profile(DATA, new)["cpu"]["rowwise_gbs"], stored_profile(DATA, old)["cpu"]["rowwise_gbs"]
        assert n["F16@1t"]["value"] > 1.25 * o["F16@1t"]["value"] and n["F16"]["value"] > 1.1 * o["F16"]["value"]
        assert "vec_dot_f16" in n["F16"]["ref"] and "float single-row" in o["F16"]["ref"]


def test_on_the_same_profiles_ggmls_f16_rate_raises_every_groups_over_prediction():
    """Mean error a group, the profiles' F16 rates from the executor's rows / their own: +9.9 -> +16.8% (one thread,
    in place), +7.2 -> +15.1% (repacked), +9.8 -> +13.7% and +8.9 -> +13.6% on two. The executor's rows had stood
    below ggml's F16 in situ and so cancelled part of what the simulator leaves out of llama.cpp's token."""
    new, old = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    own, rows = mean_errors(DATA, SITTINGS, new), mean_errors(DATA, SITTINGS, new, old, F16_KEYS)
    for grp, before, after in zip(GROUPS, (0.099, 0.072, 0.098, 0.089), (0.168, 0.151, 0.137, 0.136)):
        assert abs(statistics.mean(v for k, v in rows.items() if k[:2] == grp) - before) < 0.005, grp
        assert abs(statistics.mean(v for k, v in own.items() if k[:2] == grp) - after) < 0.005, grp
    assert len(own) == 28 and min(own.values()) > 0.03  # every case over, by 3.5% at the least
