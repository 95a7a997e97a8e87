"""The simulator against llama.cpp on this kind of machine (2 cores of an AMD EPYC under KVM), without
llama.cpp here: llama-bench runs of 2026-11-30 (session 13; the CPU build of llama-cpp-python 0.3.36's
vendored llama.cpp, its default pp512 / tg128, 3 repetitions) on make-model's `small` (Q8_0 experts),
`small-q4` (Q4_0), llama-quantize's Q4_K_M of `small` and the llama-bench fixture's shape, at 2 and 1
threads, ingested into data/epyc-2026-11-30/results-llamacpp.csv with the models' GGUF headers as YAML,
predicted on the profile `moe-offload calibrate --quick` wrote beside them. No constant is fitted on
llama.cpp: this is the check README's "Simulator against llama.cpp on this machine" quotes, rerunnable.
Section 2: session 14's runs (data/epyc-2026-11-30b), on profiles that carry llama.cpp's structure
(cpu.rowwise_gbs), against the same profiles without it. Section 3: session 15's runs
(data/epyc-2026-11-30c), on profiles that carry llama.cpp's repacked Q4_0 (cpu.repacked_gbs), against the
same profiles without it. Section 4: session 21's prefill runs (data/zen3-2026-12-02, a busier Zen 3 host), on
profiles that carry ggml's prefill structures (cpu.ggml_prefill_gflops), against the same profiles without them."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from calibration import regress

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("tests/calibration/data/epyc-2026-11-30")  # the store's model paths are relative to the repo root


def _local_rows(store: Path, hw: Path, latest_only: bool = True) -> list[dict]:
    """regress.local_rows from the repository root (the stores' model paths are relative to it); every stored
    run, not only each case's newest, with latest_only false."""
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)
    try:
        return regress.local_rows(store, str(hw), latest_only=latest_only)
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def rows():
    """regress rows (measured against predicted) of the stored llama.cpp runs."""
    return _local_rows(DATA / "results-llamacpp.csv", DATA / "host-calibrated.yaml")


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


# ---------------------------------------------------------------------------------------------
# Session 14: llama.cpp's rates measured in its own structure (calibration.bench_rowwise)
# ---------------------------------------------------------------------------------------------

DATA14 = Path("tests/calibration/data/epyc-2026-11-30b")
PROFILES14 = ("host-calibrated-1854.yaml", "host-calibrated-1858.yaml")  # calibrate --quick at 18:54, 18:58
MAIN14 = ("small", "small-q4", "fixture-shape", "small-q4km")  # the four files of section 1, 2 and 1 threads


def _without(path: Path, out: Path, table: str) -> Path:
    """A copy of profile `path` without the CPU rate table `table` (rowwise_gbs: llama.cpp plans at the
    executor's kernel rates; repacked_gbs: every llama.cpp product at the rowwise rates)."""
    from specs.loaders import dump_hardware, load_hardware
    hw = load_hardware(str(path))
    out.write_text(dump_hardware(hw.model_copy(update={"cpu": hw.cpu.model_copy(update={table: {}})})))
    return out


@pytest.fixture(scope="module", params=PROFILES14)
def rows14(request, tmp_path_factory):
    """(decode |error| by run with the profile's rowwise rates, the same with its executor kernel rates) for
    session 14's 18 llama.cpp decode runs (18:32-18:50 UTC) on one of the two `calibrate --quick` profiles
    taken after them (18:54, 18:58): the four files of section 1, and six variants of the fixture's shape
    (4 or 16 layers, vocab 4,000 or 32,000, hidden 512 or 2048; `fx-*.yaml`, named L4V32k ...)."""
    hw = ROOT / DATA14 / request.param
    plain = _without(hw, tmp_path_factory.mktemp("hw") / "plain.yaml", "rowwise_gbs")
    return tuple(_decode(_local_rows(DATA14 / "results-llamacpp.csv", p)) for p in (hw, plain))


def test_rowwise_profiles_carry_llamacpps_rates():
    """calibrate wrote rowwise rates for the five formats it times, at 2 threads and at 1."""
    from specs.loaders import load_hardware
    for name in PROFILES14:
        rw = load_hardware(str(ROOT / DATA14 / name)).cpu.rowwise_gbs
        assert {f + s for f in ("Q8_0", "Q4_0", "F16", "Q4_K", "Q6_K") for s in ("", "@1t")} <= set(rw)


def test_rowwise_rates_predict_llamacpp_closer(rows14):
    """On both profiles, llama.cpp plans at the rowwise rates come closer to llama.cpp than at the executor's
    kernel rates, on the four files (median |error| 13.4% against 18.4%, 8.0% against 11.3% when recorded)
    and on the six variants of the fixture's shape (27.6% against 38.8%, 20.2% against 39.6%)."""
    new, old = rows14
    assert len(new) == len(old) == 18
    for keep in (lambda k: k.split(" t")[0] in MAIN14, lambda k: k.split(" t")[0] not in MAIN14):
        a = [v for k, v in new.items() if keep(k)]
        b = [v for k, v in old.items() if keep(k)]
        assert statistics.median(a) < statistics.median(b), (a, b)


def test_rowwise_small_q8_within_ten_percent(rows14):
    """`small` (Q8_0 experts, F16 attention) at 2 and 1 threads: within 10% on both profiles (+2% / +5% and
    -6% / -1% when recorded; -20.6% / -8.8% and -7.7% / +9.4% on two profiles before this session's change)."""
    new, _ = rows14
    assert new["small t2"] <= 0.10 and new["small t1"] <= 0.10, new


@pytest.mark.xfail(strict=True, reason="narrow layers: llama.cpp spends ~0.14 ms a layer beyond its dot products "
                   "at hidden 512 (16 layers against 4, the same vocabulary), which no term of the simulator "
                   "models; the fixture's shape at 2 threads +59-62%, 16 layers +35-61%; README")
def test_rowwise_every_run_within_twenty_five_percent(rows14):
    """All 18 decode runs within 25%."""
    assert max(rows14[0].values()) <= 0.25


def test_prefill_of_the_fixture_shape_runs_the_head_once(rows):
    """pp512 of the fixture's shape (its 32,000 x 512 head is 83% of the dense bytes): the head runs for the
    batch's last token only (ModelSpec.prefill_dense_flops), so the prediction is within 30% at 2 and 1
    threads on all three profiles (-1.7% / +1.5%, +24.6% / +2.2%, -3.1% / -20.6% when recorded; -50% to -68%
    with the head charged for every prompt token). Since session 34 each dense tensor's weights come from its
    shape: the F32 routers had been counted at the Q8_0 head's bits (0.26 M weights for 0.07 M), and the
    figures are +0.1% / +3.4%, +26.9% / +4.0%, -1.3% / -19.1%."""
    def fixture_pp(rs):
        return [r["error"] for r in rs if r["metric"] == "prefill_tok_s" and "fixture-shape" in r["case"]]
    errs = fixture_pp(rows)
    for name in PROFILES14:
        errs += fixture_pp(_local_rows(DATA14 / "results-llamacpp.csv", DATA14 / name))
    assert len(errs) == 6 and max(map(abs, errs)) <= 0.30, errs


# ---------------------------------------------------------------------------------------------
# Session 15: llama.cpp's repacked Q4_0 (8 interleaved rows a pass; calibration.bench_rowwise)
# ---------------------------------------------------------------------------------------------

DATA15 = Path("tests/calibration/data/epyc-2026-11-30c")
# calibrate --quick at 21:16 and 21:18 (before and after round 1 of llama-bench, 21:16-21:18), 21:19 and
# 21:21 (around round 2, 21:19-21:21)
PROFILES15 = ("host-calibrated-2116.yaml", "host-calibrated-2118.yaml", "host-calibrated-2119.yaml",
              "host-calibrated-2121.yaml")


def _runs(rows: list[dict]) -> dict[str, float]:
    """Signed decode error of each run by 'time it was stored, model, tN' (a round's runs share their times)."""
    out = {}
    for r in rows:
        c = r["case"]
        name = c.split(":")[1].removeprefix("moe-offload synthetic ") + " t" + c.split("-t ")[1].split()[0]
        out[r["source"].split("(")[1][:19] + " " + name] = r["error"]
    return out


@pytest.fixture(scope="module")
def rows15(tmp_path_factory):
    """{profile: (errors with the repacked rate, errors without it)} for session 15's 16 llama.cpp decode runs
    (two rounds of the four files at 2 and 1 threads, tg64 x 5) on each of the four profiles around them."""
    out = {}
    for name in PROFILES15:
        hw = ROOT / DATA15 / name
        plain = _without(hw, tmp_path_factory.mktemp("hw") / "plain.yaml", "repacked_gbs")
        out[name] = tuple(_runs(_local_rows(DATA15 / "results-llamacpp.csv", p, latest_only=False)) for p in (hw, plain))
    return out


def test_repacked_profiles_carry_the_q4_0_rate():
    """calibrate wrote llama.cpp's repacked Q4_0 rate at 2 threads and at 1 on all four profiles."""
    from specs.loaders import load_hardware
    for name in PROFILES15:
        rp = load_hardware(str(ROOT / DATA15 / name)).cpu.repacked_gbs
        assert {"Q4_0", "Q4_0@1t"} <= set(rp) and all(float(v) > 0 for v in rp.values())


def test_repacked_rate_predicts_llamacpps_q4_0_closer(rows15):
    """`small-q4` (Q4_0 experts, which llama.cpp repacks on AVX2): over 4 profiles x 2 rounds x 2 thread counts
    the median |error| is <= 10% with the repacked rate and lower than with the rowwise rate alone (7.4%
    against 24.2% when recorded); at 1 thread the repacked rate is closer in every one of the 8 pairs
    (-13% to +7% against -22% to -35%)."""
    new = [abs(v) for a, _ in rows15.values() for k, v in a.items() if "small-q4 " in k]
    old = [abs(v) for _, b in rows15.values() for k, v in b.items() if "small-q4 " in k]
    assert len(new) == len(old) == 16
    assert statistics.median(new) <= 0.10 and statistics.median(new) < statistics.median(old), (new, old)
    for a, b in rows15.values():
        for k in (k for k in a if "small-q4 t1" in k):
            assert abs(a[k]) < abs(b[k]), (k, a[k], b[k])


def test_formats_llamacpp_does_not_repack_here_are_unchanged(rows15):
    """`small` (Q8_0: repacked on ARM only) and the fixture's shape predict the same with or without the
    repacked rate."""
    for a, b in rows15.values():
        for k in a:
            if "small-q4 " not in k and "small-q4km " not in k:
                assert a[k] == pytest.approx(b[k], rel=1e-12), k


def test_repacked_q4_k_runs_at_the_q4_0_gemvs_weights_a_second(rows15):
    """The Q4_K_M file's Q4_K experts are repacked on AVX2 too (repack.cpp's one gemv structure); no Q4_K gemv is
    rebuilt, so they take the rebuilt Q4_0 gemv's weights a second (specs.formats.LLAMACPP_REPACKED_STAND_IN). Over
    the 16 runs: median |error| 9.6%, max 33.2%, against 8.3% / 29.7% at Q4_K's rowwise rate (session 32: on
    the Zen 4 VM's tg32 the same change took -35.0% / -18.5% to -16.5% / 0.0% at 1 / 2 threads). Asserted: the
    median within 10%."""
    new = [abs(v) for a, _ in rows15.values() for k, v in a.items() if "small-q4km " in k]
    assert len(new) == 16 and statistics.median(new) <= 0.10, new


# Section 4: session 21 (2026-12-02, a Zen 3 host reading 13-21 GB/s): two sets of llama-bench pp512 / tg128, -r 3,
# on `small` (Q8_0) and `small-q4` (Q4_0: repacked; and --repack 0 at 2 threads), each set beside the
# `calibrate --quick` profile written just before it (13:43: repacked Q4_0 timed on the executor's int16 rows;
# 14:00: on ggml's q4_0 8x8 gemv rebuilt, calibration.ggml_vec_dot.gemv_q4_0x8)
DATA21 = Path("tests/calibration/data/zen3-2026-12-02")
SETS21 = (("results-llamacpp-e1.csv", "host-calibrated-1343.yaml"), ("results-llamacpp-e2.csv", "host-calibrated-1400.yaml"))


def _prefill(rows: list[dict]) -> dict[str, float]:
    """Signed prefill error of each run by model and thread count, ' in place' for --no-repack."""
    out = {}
    for r in rows:
        if r["metric"] == "prefill_tok_s":
            c = r["case"]
            name = c.split(":")[1].removeprefix("moe-offload synthetic ") + " t" + c.split("-t ")[1].split()[0]
            out[name + (" in place" if "--no-repack" in c else "")] = r["error"]
    return out


@pytest.fixture(scope="module")
def rows21(tmp_path_factory):
    """[(prefill errors with ggml's structures, the same with the profile's one prefill rate)] for each set."""
    out = []
    for store, name in SETS21:
        hw = ROOT / DATA21 / name
        plain = _without(hw, tmp_path_factory.mktemp("hw") / "plain.yaml", "ggml_prefill_gflops")
        out.append(tuple(_prefill(_local_rows(DATA21 / store, p)) for p in (hw, plain)))
    return out


def test_ggml_profiles_carry_the_rebuilt_structures():
    """calibrate wrote ggml's prefill rates for Q8_0 and Q4_0 per (row, token) and repacked Q4_0, at 2 threads and 1."""
    from specs.loaders import load_hardware
    for _, name in SETS21:
        g = load_hardware(str(ROOT / DATA21 / name)).cpu.ggml_prefill_gflops
        assert {"Q8_0", "Q4_0", "Q4_0:repacked", "Q8_0@1t", "Q4_0@1t", "Q4_0:repacked@1t"} <= set(g)


def test_ggml_structures_predict_llamacpps_prefill_closer(rows21):
    """The five pp512 runs of each set: median |error| 11.8% / 11.9% with ggml's structures against 24.8% /
    24.5% with one rate, max 25.7% / 27.3% against 50.6% / 31.9% (when recorded). Asserted: lower median and
    max in both sets, and the median within 15%."""
    for new, old in rows21:
        assert len(new) == len(old) == 5
        a, b = [abs(v) for v in new.values()], [abs(v) for v in old.values()]
        assert statistics.median(a) <= 0.15 and statistics.median(a) < statistics.median(b), (new, old)
        assert max(a) < max(b), (new, old)


def test_ggml_gemv_rebuild_predicts_repacked_q4_0_within_fifteen_percent(rows21):
    """With the gemv rebuild (the 14:00 profile) llama.cpp's repacked Q4_0 pp512 is predicted at -9.6% (2
    threads) and -10.9% (1 thread), where the int16 stand-in had -11.8% / -25.7% and one rate -24.5% / -30.1%;
    Q4_0 in place (a dot product per (row, token)) within 15% in both sets (-3.2%, -11.9%; one rate +50.6%,
    +31.9%)."""
    new, old = rows21[1]
    for k in ("small-q4 Q4_0 t2", "small-q4 Q4_0 t1"):
        assert abs(new[k]) <= 0.15 and abs(new[k]) < abs(old[k]), (k, new[k], old[k])
    for new, old in rows21:
        assert abs(new["small-q4 Q4_0 t2 in place"]) <= 0.15 < abs(old["small-q4 Q4_0 t2 in place"])
