"""llama.cpp's CPU expert rates timed on its own kernels (`calibrate --ggml-lib`: a llama.cpp build's
libggml-cpu.so called from numba, calibration.bench_ggml_own) against the rebuilds, and both against llama-bench.

Data: llama-bench tg64 (-r 3) on 1 and 2 threads and pp512 (-r 2) on 2, of the seven `small` files, repacked and in
place, in three sittings of 2026-12-06 (14:40-14:52, ../zen4-2026-12-06f), between eight `calibrate --quick`
profiles: four on the rebuilds (14:38, 14:44, 14:48, 14:54) and four on ggml's own kernels from llama-cpp-python
0.3.36's build (14:39, 14:43, 14:49, 14:53), both with the decode jobs in ggml's chunk order
(bench_rowwise.GGML_SCHEDULE). The layer loop's constants swing between profiles (cpu_layer_ms_per_mb 0.0003-0.009
ms/MB), so the comparison is paired: each own-kernel profile as it is, and with the kernel rates of the rebuild
profile taken next to it (stored_runs.rows_with_kernels_of). No constant is fitted on llama.cpp."""
from __future__ import annotations

import re
import statistics
from pathlib import Path

from stored_runs import rows_on, rows_with_kernels_of, stored_profile, stored_rows

DATA = Path("tests/calibration/data/zen4-2026-12-06f")
SITTINGS = ("1440", "1445", "1450")
PAIRS = (("1439", "1438"), ("1443", "1444"), ("1449", "1448"), ("1453", "1454"))  # (own kernels, rebuilds)
K_QUANT_FILES = ("small-q2k", "small-q3k", "small-q4k", "small-iq4xs")


def _case(r: dict) -> tuple[str, str, str, str]:
    """(metric, threads, 'rp' / 'norp', file) of a row."""
    c = r["case"]
    return (r["metric"][:2], "t" + c.split("-t ")[1].split(" ")[0], "norp" if "--no-repack" in c else "rp",
            c.split("synthetic ")[1].split(" ")[0])


def _errors(kernels: str) -> dict[tuple, float]:
    """Each case's mean error over the sittings and pairs, on the own-kernel profiles with `kernels` 'own' or the
    paired rebuild profile's ('rebuilt')."""
    acc: dict[tuple, list[float]] = {}
    for s in SITTINGS:
        for own, reb in PAIRS:
            rows = stored_rows(DATA, s, own) if kernels == "own" else rows_with_kernels_of(DATA, s, own, reb)
            for r in rows:
                acc.setdefault(_case(r), []).append(r["error"])
    return {k: statistics.mean(v) for k, v in acc.items()}


def _group(errors: dict, metric: str, threads: str, layout: str, files=None) -> list[float]:
    return [e for (m, t, lay, f), e in errors.items() if (m, t, lay) == (metric, threads, layout)
            and (files is None or f in files)]


def _med_abs(v) -> float:
    return statistics.median(abs(e) for e in v)


def test_the_own_profiles_time_ggmls_kernels_slower_repacked_faster_in_place():
    """One thread, each pair: ggml's repacked gemvs stream Q2_K at 13.7-14.1 GB/s against the rebuild's 17.2-17.5,
    Q4_K at 23.3-23.4 against 28.0-28.2 (perf of llama-bench's tg64 in situ: 12.3 and 20.9, README session 45); its
    K-quant vec_dots run faster than the executor's int16 rows that stood in for them (Q4_K 18.6-19.0 against
    14.3-14.5), and Q8_0's own vec_dot slower than its rebuild (26.1-27.2 against 29.6-29.9); each rate names the
    kernel and the library it was timed on."""
    for own, reb in PAIRS:
        o, r = stored_profile(DATA, own)["cpu"], stored_profile(DATA, reb)["cpu"]
        for fmt in ("Q2_K", "Q4_K"):
            assert o["repacked_gbs"][f"{fmt}@1t"]["value"] < 0.86 * r["repacked_gbs"][f"{fmt}@1t"]["value"], (own, fmt)
        for fmt in ("Q2_K", "Q3_K", "Q4_K", "Q6_K", "IQ4_XS"):
            assert o["rowwise_gbs"][f"{fmt}@1t"]["value"] > 1.1 * r["rowwise_gbs"][f"{fmt}@1t"]["value"], (own, fmt)
        assert o["rowwise_gbs"]["Q8_0@1t"]["value"] < r["rowwise_gbs"]["Q8_0@1t"]["value"]
        assert "ggml's own ggml_gemv_q2_K_8x8_q8_K (" in o["repacked_gbs"]["Q2_K"]["ref"]
        assert "ggml's own ggml_vec_dot_q4_K_q8_K" in o["rowwise_gbs"]["Q4_K"]["ref"]
        assert "ggml's own" not in r["rowwise_gbs"]["Q4_K"]["ref"]
        assert "IQ4_NL" in o["repacked_gbs"] and "IQ4_NL" not in r["repacked_gbs"]  # its gemv: own only


def test_in_place_k_quant_decode_on_one_thread_turns_from_under_to_over():
    """tg64 on one thread, `--no-repack`, the four K-quant / IQ4_XS files: the rebuilt rates under-predict them by
    14.6% on average (-21.5 / -13.0 / -12.6 / -10.8%), ggml's own over-predict by 10.4% (+11.3 / +8.0 / +15.4 /
    +6.8%); over all seven files in place, median |error| 12.6% -> 8.0%, when recorded."""
    reb, own = _errors("rebuilt"), _errors("own")
    before, after = _group(reb, "de", "t1", "norp", K_QUANT_FILES), _group(own, "de", "t1", "norp", K_QUANT_FILES)
    assert len(before) == len(after) == 4
    assert max(before) < -0.08 and statistics.mean(before) < -0.12
    assert min(after) > 0.03 and 0.05 < statistics.mean(after) < 0.15
    assert _med_abs(_group(own, "de", "t1", "norp")) < _med_abs(_group(reb, "de", "t1", "norp")) - 0.03


def test_decode_over_predicts_on_ggmls_own_kernels():
    """Every tg64 group on ggml's own kernels over-predicts, on average: one thread +11.4% in place and +10.2%
    repacked, two threads +15.6% and +14.2% (the rebuilt rates: -2.8%, +4.2%, +1.6%, +9.2%; median |error| 12.6 / 4.7 /
    10.1 / 11.2% against 8.0 / 6.5 / 16.3 / 14.2% on ggml's own), when recorded. The kernels are llama.cpp's own, so
    what is left is around them: in situ perf finds them ~10-30% slower than in calibrate's jobs (README, session
    46). IQ4_XS `--repack 1` on two threads is left out: llama.cpp does not repack IQ4_XS, and one of its three runs
    (14:45) measured 31.4 tok/s where the other two and its in-place runs measured 73.9-91.2, a slow spell."""
    own = _errors("own")
    own = {k: e for k, e in own.items() if not (k[3] == "small-iq4xs" and k[1:3] == ("t2", "rp"))}
    for threads in ("t1", "t2"):
        for layout in ("norp", "rp"):
            v = _group(own, "de", threads, layout)
            assert 0.05 < statistics.mean(v) < 0.25, (threads, layout, statistics.mean(v))


def test_on_one_thread_the_f16_dense_rate_holds_most_of_it():
    """The attention weights (F16) are read at the rowwise F16 rate: ggml's own vec_dot_f16 in the expert job ran
    32.6-32.9 GB/s on one thread, the rebuild 20.4-23.6, perf of llama-bench in situ 26. With the rebuild's F16 rate
    and every other kernel ggml's own, one-thread decode's median |error| is 2.7% in place and 1.3% repacked (8.0 and
    6.5% all own), when recorded."""
    acc: dict[tuple, list[float]] = {}
    for own, reb in PAIRS:
        d, src = stored_profile(DATA, own), stored_profile(DATA, reb)["cpu"]
        for k in ("F16", "F16@1t"):
            d["cpu"]["rowwise_gbs"][k] = src["rowwise_gbs"][k]
        for s in SITTINGS:
            for r in rows_on(DATA, s, d, f"{own}-f16-of-{reb}"):
                acc.setdefault(_case(r), []).append(r["error"])
    mixed = {k: statistics.mean(v) for k, v in acc.items()}
    own = _errors("own")
    for layout in ("norp", "rp"):
        assert _med_abs(_group(mixed, "de", "t1", layout)) < 0.05
        assert _med_abs(_group(own, "de", "t1", layout)) > 0.06


def test_repacked_prefill_reads_ggmls_own_gemvs():
    """pp512 on two threads, repacked: ggml's own gemvs in calibrate's prefill job (Q2_K 77-83 GFLOP/s a core against
    the rebuild's 108-109, Q4_K 75-81 against 103-107) move `small-q2k` from +18.4% to -5.4% and `small-q4k` from
    +9.6% to -12.2% (perf in situ, session 45: Q2_K ~97, Q4_K ~80-97 by shape); all seven repacked: mean +4.1% ->
    -4.6%, median |error| 3.2% -> 5.4%. The K-quant files in place (the tiled GEMM, rebuilt either way) do not change,
    when recorded."""
    reb, own = _errors("rebuilt"), _errors("own")
    assert reb[("pr", "t2", "rp", "small-q2k")] > 0.12 and abs(own[("pr", "t2", "rp", "small-q2k")]) < 0.09
    assert reb[("pr", "t2", "rp", "small-q4k")] > own[("pr", "t2", "rp", "small-q4k")] + 0.15
    assert statistics.mean(_group(own, "pr", "t2", "rp")) < statistics.mean(_group(reb, "pr", "t2", "rp"))
    assert _group(reb, "pr", "t2", "norp", K_QUANT_FILES) == _group(own, "pr", "t2", "norp", K_QUANT_FILES)


def _median_round_rows(sitting: str, profile: str) -> tuple[dict, ...]:
    """regress's rows of a sitting on `profile` with each CPU kernel rate (expert, rowwise, repacked) its median
    rounds' figure, which its ref records: what `calibrate --typical-out` takes for the kernels (its layer loop's
    median is not recorded)."""
    d = stored_profile(DATA, profile)
    for table in ("expert_gbs", "rowwise_gbs", "repacked_gbs"):
        for v in d["cpu"][table].values():
            m = re.search(r"median rounds: ([0-9.]+) GB/s", str(v.get("ref", "")).replace("\n", " "))
            if m:
                v["value"] = float(m.group(1))
    return rows_on(DATA, sitting, d, f"{profile}-median-rounds")


def test_on_the_kernels_median_rounds_the_over_prediction_is_even():
    """The own-kernel profiles with each kernel at its median rounds (llama-bench averages over a run's rounds; the
    profile takes each kernel's fastest): every tg64 group over-predicts by 5-8% on average (+7.6 / +7.0% on one
    thread in place / repacked, +7.4 / +5.3% on two), median |error| 5.3 / 4.0 / 8.4 / 5.0%; the rebuild profiles as
    they are: -6.2 / -0.3 / -3.6 / +1.2%, median |error| 15.3 / 1.9 / 11.5 / 3.8%, when recorded. One error the same
    sign and size everywhere points to one mechanism still missing, the kernels' slowdown in situ."""
    acc: dict[tuple, list[float]] = {}
    for s in SITTINGS:
        for own, _ in PAIRS:
            for r in _median_round_rows(s, own):
                acc.setdefault(_case(r), []).append(r["error"])
    typical = {k: statistics.mean(v) for k, v in acc.items()
               if not (k[3] == "small-iq4xs" and k[1:3] == ("t2", "rp"))}
    for threads in ("t1", "t2"):
        for layout in ("norp", "rp"):
            v = _group(typical, "de", threads, layout)
            assert 0.03 < statistics.mean(v) < 0.10 and _med_abs(v) < 0.10, (threads, layout)
