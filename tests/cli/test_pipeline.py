"""The whole pipeline through the CLI on this machine: make-model, plan --hw auto, execute, hw."""
import json
import os
from pathlib import Path

import pytest

from moe_offload.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("pipe")
    assert main(["make-model", "--preset", "tiny", "--out", str(d / "tiny.gguf")]) == 0
    return d


def test_plan_for_a_gguf_on_this_machine_then_execute_it(tiny, capsys):
    plan = tiny / "plan.json"
    assert main(["plan", "--hw", "auto", "--model", str(tiny / "tiny.gguf"), "--out", str(plan), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["plan"]["placement"]["dense"] == "cpu"  # no GPU here
    trace = tiny / "trace.jsonl"
    assert main(["execute", "--plan", str(plan), "--model", str(tiny / "tiny.gguf"), "--gen-tokens", "4",
                 "--prompt-tokens", "4", "--trace", str(trace), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["decode_tok_s"] > 0 and len(r["tokens"][0]) == 4
    records = [json.loads(ln) for ln in trace.read_text().splitlines()]
    assert {rec["layer"] for rec in records} == set(range(4))


def test_execute_names_the_plan_file_for_a_layer_the_model_lacks(tiny, capsys):
    bad = tiny / "bad.json"
    bad.write_text(json.dumps({"placement": {"gpu_expert_layers": [9]}}))
    code = main(["execute", "--plan", str(bad), "--model", str(tiny / "tiny.gguf")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"moe-offload: {bad}: placement.gpu_expert_layers:")


def test_unknown_make_model_preset(tmp_path, capsys):
    assert main(["make-model", "--preset", "huge", "--out", str(tmp_path / "x.gguf")]) == 2
    assert "--preset: unknown preset 'huge'" in capsys.readouterr().err


def test_hw_auto_reports_this_machines_cores_memory_and_no_gpu(capsys):
    assert main(["hw", "--hw", "auto", "--json"]) == 0
    hw = json.loads(capsys.readouterr().out)
    assert hw["cpu"]["cores"] == len(os.sched_getaffinity(0))
    assert "gpu" not in hw  # no CUDA device on this machine
    total = int(open("/proc/meminfo").read().split("MemTotal:")[1].split()[0]) * 1024
    assert hw["memory"]["capacity_bytes"]["value"] == pytest.approx(total, rel=0.01)
    assert hw["memory"]["capacity_bytes"]["source"] == "measured"


def test_execute_reports_each_tier_beside_the_simulators_roof(tiny, capsys):
    """`execute --hw HW`: the bandwidth each expert tier achieved beside the rate the simulator runs it
    at on that profile (the CPU tier: the profile's Q8_0 kernel rate for its threads, capped by DDR),
    and the run simulated on its own routing; the same fields in --json."""
    from specs.loaders import load_hardware, load_model
    plan = tiny / "cpu.json"
    plan.write_text(json.dumps({"placement": {"dense": "cpu", "kv": "cpu", "engram": "none"}, "cpu_threads": 2}))
    args = ["execute", "--plan", str(plan), "--model", str(tiny / "tiny.gguf"), "--gen-tokens", "4",
            "--prompt-tokens", "4", "--trace", str(tiny / "t.jsonl"), "--hw", "epyc8ch-3090"]
    assert main(args + ["--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    hw, model = load_hardware("epyc8ch-3090"), load_model(str(tiny / "tiny.gguf"))
    assert r["roof_gbs"]["cpu"] == pytest.approx(min(hw.cpu.expert_gbs_for(model.fmt_experts, 2), hw.memory.usable_gbs))
    assert r["bandwidth_gbs"]["cpu"] > 0 and r["predicted"]["decode_tok_s"] > 0
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "roof GB/s" in out and "simulated on epyc8ch-3090" in out


def test_execute_says_the_model_files_page_layout_and_simulates_the_run_on_it(tiny, capsys):
    """`execute --json` gives model_page_breaks, the share of the GGUF's page boundaries that are physical breaks in
    the page cache after the run (calibration.page_layout; null where frame numbers are hidden); run_against_model
    prices them: on a profile whose executor kernel runs 1.2x the time from a file in 4 KiB runs as from one in 2 MiB
    folios, a run that read a file with every boundary a break gets the CPU roof 1/1.2 of the contiguous one, and a
    slower prediction."""
    from calibration.regress import run_against_model
    from specs.figure import Figure
    from specs.loaders import load_hardware
    from specs.plan import Plan
    plan = tiny / "cpu-pages.json"
    plan.write_text(json.dumps({"placement": {"dense": "cpu", "kv": "cpu", "engram": "none"}, "cpu_threads": 2}))
    model = str(tiny / "tiny.gguf")
    assert main(["execute", "--plan", str(plan), "--model", model, "--gen-tokens", "4", "--prompt-tokens", "4",
                 "--trace", str(tiny / "pages.jsonl"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert "model_page_breaks" in r and (r["model_page_breaks"] is None or 0.0 <= r["model_page_breaks"] <= 1.0)
    data = Path(__file__).resolve().parents[1] / "calibration" / "data" / "zen4-2026-12-07"
    hw = load_hardware(str(data / "host-calibrated-0101.yaml")).model_copy(deep=True)  # every format's kernel rate
    hw.cpu.kernel_file_runs_gbs = {k: {f: Figure(float(v) / slow, "measured", "test") for f, v in
                                       hw.cpu.expert_gbs.items()} for k, slow in (("2048KiB", 1.0), ("4KiB", 1.2))}
    hw.memory.efficiency = Figure(1.0, "measured", "test")  # the kernel's rate, not DDR, is the CPU roof
    p = Plan.model_validate_json(plan.read_text())
    flat, broken = (run_against_model(dict(r, model_page_breaks=b), p, model, hw) for b in (0.0, 1.0))
    assert broken["roof_gbs"]["cpu"] == pytest.approx(flat["roof_gbs"]["cpu"] / 1.2)
    assert broken["predicted"]["decode_tok_s"] < flat["predicted"]["decode_tok_s"]
