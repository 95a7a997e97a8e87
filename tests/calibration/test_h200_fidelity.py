"""The simulator against the executor on a CUDA host, without a GPU here: the local cases measured on
an NVIDIA H200 + 16-core Xeon host on 2026-11-30 (`scripts/device_fidelity.sh`: `calibrate --quick`,
each case once, its traces kept in data/h200-2026-11-30/). The host constants are fitted on those
traces (the discrete-GPU form of the fit: dense reads at the VRAM rate, device-only and overlapped
layers apart), then every case is simulated with the trace's own routing and compared to what ran."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from calibration import regress, store
from calibration.trace_profile import calibrate_from_traces
from specs.loaders import load_hardware

ROOT = Path(__file__).resolve().parents[2]
DATA = Path("tests/calibration/data/h200-2026-11-30")  # the store's paths are relative to the repo root


@pytest.fixture(scope="module")
def h200_rows(tmp_path_factory):
    """regress rows (measured against predicted) of the H200 cases, constants fitted on their traces."""
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)
    try:
        rows = store.read_rows(DATA / "results-fidelity.csv")
        traces = store.traces_of(rows)
        out = tmp_path_factory.mktemp("h200") / "fitted.yaml"
        base = load_hardware(str(DATA / "host-calibrated.yaml"))
        calibrate_from_traces(traces, rows[0]["model"], base, out=out, log=None)
        yield regress.local_rows(DATA / "results-fidelity.csv", str(out)), load_hardware(str(out))
    finally:
        mp.undo()


def test_fitted_profile_keeps_the_h200(h200_rows):
    """The fit keeps the measured GPU (no host-sharing pseudo-GPU) and fits the overlap constants."""
    _, hw = h200_rows
    assert hw.gpu.name == "NVIDIA H200" and not hw.gpu.shares_host
    assert all(k in hw.constants for k in ("overlap_layer_ms", "overlap_dev_ms", "overlap_cpu_ms"))


def test_decode_within_the_fidelity_bars_on_the_h200_host(h200_rows):
    """Decode tok/s over the 7 plans: median |error| <= 10%, max <= 20% (issue 5's bars; 6.4% and 13.7%
    when recorded, `python benchmarks/bench_fidelity.py --reuse --base DATA/host-calibrated.yaml
    --store DATA/results-fidelity.csv`)."""
    rows, _ = h200_rows
    dec = [abs(r["error"]) for r in rows if r["metric"] == "decode_tok_s"]
    assert len(dec) == 7
    assert statistics.median(dec) <= 0.10
    assert max(dec) <= 0.20


def test_ttft_within_the_fidelity_bar_on_the_h200_host(h200_rows):
    """TTFT over the 512- and 2048-token prompts: median |error| <= 15% (8.1% when recorded)."""
    rows, _ = h200_rows
    ttft = [abs(r["error"]) for r in rows if r["metric"] == "ttft_s"]
    assert len(ttft) == 2 and statistics.median(ttft) <= 0.15


def test_copied_misses_cost_the_pageable_copy_and_the_fitted_extra():
    """The executor copies a miss from its mmap (pageable memory): with the device check's copy-misses
    trace in the fit, copy_h2d_gbs is calibrate's pageable rate (6.71 GB/s, not the pinned 54.6) and
    copy_miss_ms the rest (0.44 ms per expert); that plan is then predicted within 5% of its median
    step (10.8 tok/s measured; in sample)."""
    from calibration.local import device_check_plans
    from simulator.run import simulate
    from specs.loaders import load_model
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)
    try:
        rows = store.read_rows(DATA / "results-fidelity.csv")
        dc = DATA / "device-check"
        traces = store.traces_of(rows) + [str(dc / "small-gpu-copy-misses.jsonl.gz")]
        base = load_hardware(str(DATA / "host-calibrated.yaml"))
        hw, f, _ = calibrate_from_traces(traces, rows[0]["model"], base, log=None)
        model = load_model(rows[0]["model"])
        plan = device_check_plans(model.n_layers, model.n_experts)["gpu-copy-misses"]
        sim = simulate(model, hw, plan, prompt_tokens=16, gen_tokens=24, routing=str(dc / "small-gpu-copy-misses.jsonl.gz"),
                       warm_steps=0)
        measured = json.loads((dc / "measured.json").read_text())["small/gpu-copy-misses"]
    finally:
        mp.undo()
    assert hw.constant("copy_h2d_gbs", 0) == float(base.constants["pageable_h2d_gbs"])
    assert f.copy_miss_ms > 0
    assert sim.decode_tok_s == pytest.approx(1e3 / measured["itl_p50_ms"], rel=0.05)


def test_the_screen_tracks_the_simulation_on_the_h200_profile(h200_rows):
    """The planner's closed-form screen charges the fitted host costs as the event simulation does
    (dispatch per layer, the per-hit rate, overlapped layers, copies on the compute stream): on the
    device check's six plans it lands within 20% of the simulation (0 to 19% when recorded)."""
    from calibration.local import device_check_plans
    from simulator.run import simulate
    from simulator.screen import screen
    from specs.loaders import load_model
    _, hw = h200_rows
    model = load_model(str(ROOT / DATA / "small.yaml"))
    for name, plan in device_check_plans(model.n_layers, model.n_experts).items():
        routing = str(ROOT / DATA / "device-check" / f"small-{name}.jsonl.gz")
        sim = simulate(model, hw, plan, prompt_tokens=16, gen_tokens=64, routing=routing, warm_steps=0)
        sc = screen(model, hw, plan, prompt_tokens=16, routing=routing, hit_rate=sim.cache_hit_rate)
        assert sc.decode_tok_s == pytest.approx(sim.decode_tok_s, rel=0.20), name


def test_the_planner_leaves_the_h200_unused_for_this_engine(h200_rows):
    """With the executor's host costs (1 ms a layer of eager dispatch), `small` runs fastest on the 16
    host cores alone: measured 114-134 tok/s against 59-69 with the dense path on the GPU (the device
    check's two runs). The search offers that placement on a machine with a GPU, and picks it."""
    from planner.search import search
    from specs.loaders import load_model
    _, hw = h200_rows
    model = load_model(str(ROOT / DATA / "small.yaml"))
    pick, pred, rows, _ = search(model, hw, "decode", context=4096, top=4)
    assert (pick.placement.dense, pick.placement.kv, pick.expert_cache.slots) == ("cpu", "cpu", 0)
    on_gpu = [r["sim"].decode_tok_s for r in rows if r["plan"].placement.dense == "gpu"]
    assert on_gpu and pred.decode_tok_s > max(on_gpu)
