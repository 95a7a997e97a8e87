"""Ingested llama.cpp runs as evidence: leave-one-out error falls once overheads are fitted to them.

The runs come from a known generating model: the simulator's screen on the i5 profile with
"true" constants (a 4 ms step overhead, 0.3 ms per handover, the CPU at 70% of the profile's rate)
that the base profile does not know. Fitting on the other runs must predict each held-out run
better than the base profile does.
"""
import json

import pytest

from calibration.run_fit import Run, fit_runs, leave_one_out, median_abs, predict_run
from moe_offload.cli import main
from planner.llamacpp import parse
from specs.loaders import load_hardware, load_model

MODEL, HW = "qwen3.8-flash-next-iq3_s", "i5-13600k-ddr5-3090"
TRUTH = {"step_overhead_ms": 4.0, "handover_ms": 0.3, "cpu_rate_efficiency": 0.7}
N_CPU_MOE = (48, 44, 40, 36, 32)


def _records():
    model, hw = load_model(MODEL), load_hardware(HW)
    recs = []
    for n in N_CPU_MOE:
        flags = ["-ngl", "99", "--n-cpu-moe", str(n), "-t", "6"]
        plan = parse(flags, model)
        tok_s = predict_run(model, hw, Run(f"n{n}", plan, "decode_tok_s", 1.0), TRUTH)
        recs.append({"build_commit": "test", "backends": "CUDA", "model_filename": "q.gguf", "n_batch": 2048,
                     "n_ubatch": 512, "n_threads": 6, "n_gpu_layers": 99, "n_cpu_moe": n,
                     "tensor_buft_overrides": "none", "no_op_offload": 0, "n_prompt": 0, "n_gen": 64,
                     "avg_ts": tok_s, "stddev_ts": 0.0})
    return recs


def test_fitting_recovers_a_known_generating_model():
    model, hw = load_model(MODEL), load_hardware(HW)
    runs = [Run(f"n{n}", parse(["-ngl", "99", "--n-cpu-moe", str(n), "-t", "6"], model), "decode_tok_s",
                r["avg_ts"]) for n, r in zip(N_CPU_MOE, _records())]
    vals = fit_runs(model, hw, runs)
    for r in runs:
        assert predict_run(model, hw, r, vals) == pytest.approx(r.measured, rel=1e-3)


def test_ingested_runs_lower_the_leave_one_out_error(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(_records()))
    store = tmp_path / "results.csv"
    assert main(["ingest", str(bench), "--model", MODEL, "--store", str(store)]) == 0
    capsys.readouterr()
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", "--from-runs", "--hw-base", HW, "--model", MODEL, "--store", str(store),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "leave-one-out" in printed and out.exists()
    from calibration.run_fit import runs_from_store
    rows = leave_one_out(load_model(MODEL), load_hardware(HW), runs_from_store(store, MODEL))
    assert len(rows) == len(N_CPU_MOE)
    assert median_abs(rows, "loo_error") < median_abs(rows, "unfitted_error")
    assert median_abs(rows, "loo_error") < 0.05


def test_fewer_than_three_runs_is_one_clear_error(tmp_path, capsys):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(_records()[:2]))
    store = tmp_path / "results.csv"
    main(["ingest", str(bench), "--model", MODEL, "--store", str(store)])
    capsys.readouterr()
    code = main(["calibrate", "--from-runs", "--hw-base", HW, "--model", MODEL, "--store", str(store),
                 "--out", str(tmp_path / "x.yaml")])
    assert code == 2 and "needs at least 3 measured runs" in capsys.readouterr().err
