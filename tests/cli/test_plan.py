"""`moe-offload plan`: the ceiling report and its --json contract (DESIGN.md interface contract)."""
import json
from pathlib import Path
import subprocess
import sys

import pytest

from moe_offload.cli import main
from specs.loaders import load_model, load_plan


def plan_json(capsys, *argv):
    assert main(["plan", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_design_card_example_runs(capsys):
    """`moe-offload plan --hw epyc8ch-3090.yaml`: --model defaults to deepseek-v4.1-flash."""
    assert main(["plan", "--hw", "epyc8ch-3090.yaml"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v4.1-flash on epyc8ch-3090" in out and "Memory map" in out


def test_json_has_the_contract_fields(capsys):
    s = plan_json(capsys, "--hw", "epyc8ch-3090")
    m = load_model("deepseek-v4.1-flash")
    assert s["model"]["routed_experts"] == 15_360
    assert s["model"]["routed_params"] == m.routed_params
    assert s["model"]["expert_bytes"] == m.expert_bytes
    assert s["model"]["routed_bytes_per_token"] == m.routed_bytes_per_token()
    assert s["model"]["dense_bytes_per_token"] == m.dense_bytes_per_token
    assert s["model"]["engram_bytes_per_token"] == m.engram_bytes_per_token(4096)
    assert {"tier", "bandwidth_gbs", "tok_s"} <= set(s["ceilings"][0])
    assert {"decode_tok_s", "ttft_s", "bottleneck"} <= set(s["predicted"])
    assert s["plan"]["expert_cache"]["slots"] > 0 or s["plan"]["placement"]["gpu_expert_layers"]


def test_json_ceilings_on_standard_buses_match_the_physics(capsys):
    s = plan_json(capsys, "--hw", "epyc8ch-3090")
    assert [round(c["tok_s"]) for c in s["standard_ceilings"]] == [16, 26, 32, 64, 8, 294]


def test_predicted_never_beats_the_vram_ceiling(capsys):
    s = plan_json(capsys, "--hw", "epyc8ch-3090")
    vram = next(c for c in s["ceilings"] if c["tier"] == "VRAM")
    assert 0 < s["predicted"]["decode_tok_s"] < vram["tok_s"]


def test_written_plan_loads_back(capsys, tmp_path):
    out = tmp_path / "plan.json"
    s = plan_json(capsys, "--hw", "i5-13600k-ddr5-3090", "--model", "qwen3.8-flash-next-iq3_s", "--out", str(out))
    assert load_plan(out).model_dump(mode="json") == s["plan"]


def test_plan_fits_experts_beyond_ram_on_nvme(capsys):
    """DeepSeek 2.00 bpw (132 GB of experts) on a 64 GB box: the rest stays on the SSD."""
    s = plan_json(capsys, "--hw", "rtx5070-64g", "--model", "deepseek-v4.1-flash-1017-gsq-2.00")
    assert s["memory"]["nvme"]["experts"] > 60e9
    assert s["memory"]["ram"]["experts"] <= 56e9 + 1


def test_plan_path_imports_neither_torch_nor_numba():
    code = ("import sys; from moe_offload.cli import main; main(['plan', '--hw', 'epyc8ch-3090', '--json']);"
            "print('torch' in sys.modules, 'numba' in sys.modules, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.strip() == "False False"


def test_a_model_that_overflows_the_card_runs_with_the_card_unused(capsys):
    """DeepSeek's 7.7 GiB dense path plus a 262k KV cache overflow a 12 GiB card under every GPU
    engine; with the device left unused (dense, KV and experts in the 64 GB of RAM, the experts that
    do not fit read from NVMe) it runs, NVMe-bound."""
    s = plan_json(capsys, "--hw", "rtx5070-64g", "--model", "deepseek-v4.1-flash", "--context", "262144")
    assert (s["plan"]["placement"]["dense"], s["plan"]["placement"]["kv"]) == ("cpu", "cpu")
    assert s["plan"]["placement"]["expert_ram_bytes"] < s["model"]["routed_experts"] * s["model"]["expert_bytes"]
    assert s["predicted"]["bottleneck"] == "nvme"


def test_model_that_fits_nowhere_is_one_line_with_the_accounting(capsys, tmp_path):
    """With 16 GB of RAM the host cannot hold DeepSeek's dense path and a 262k KV cache either: one
    line with the engine default's reason (the card) and its accounting, exit 2."""
    import yaml
    from specs.loaders import load_hardware
    hw = load_hardware("rtx5070-64g").to_yaml_dict()
    hw["memory"]["capacity_bytes"] = {"value": 16e9, "source": "assumed", "ref": "test"}
    (tmp_path / "small-ram.yaml").write_text(yaml.safe_dump(hw))
    code = main(["plan", "--hw", str(tmp_path / "small-ram.yaml"), "--model", "deepseek-v4.1-flash",
                 "--context", "262144"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "with any placement: plan does not fit in VRAM" in err


def test_pareto_objective_lists_the_front(capsys):
    s = plan_json(capsys, "--hw", "i5-13600k-ddr5-3090", "--model", "qwen3.8-flash-next-iq3_s",
                  "--objective", "pareto", "--prompt-tokens", "8192")
    front = s["pareto"]
    assert front and [f["decode_tok_s"] for f in front] == sorted((f["decode_tok_s"] for f in front), reverse=True)
    assert [f["ttft_s"] for f in front] == sorted((f["ttft_s"] for f in front), reverse=True)


def test_unknown_engine_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--hw", "epyc8ch-3090", "--engine", "vllm"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "invalid choice: 'vllm'" in err


def test_simulate_new_engram_text_is_slower_than_seen(capsys):
    """`simulate --engram-text new` (every Engram row cold, gathered inline by the tiered-cache engine)
    decodes slower and reads NVMe; `seen` text is in the page cache and reads none."""
    out = {}
    for text in ("seen", "new"):
        assert main(["simulate", "--hw", "epyc8ch-3090", "--model", "deepseek-v4.1-flash-3.02", "--engine",
                     "tiered-cache", "--prompt-tokens", "0", "--gen-tokens", "32", "--engram-text", text,
                     "--json"]) == 0
        out[text] = json.loads(capsys.readouterr().out)
    assert out["new"]["decode_tok_s"] < out["seen"]["decode_tok_s"]
    assert out["seen"]["bytes_by_tier"]["nvme"] == 0 < out["new"]["bytes_by_tier"]["nvme"]


def test_simulate_page_breaks_slow_llamacpps_in_place_decode(capsys):
    """`simulate --page-breaks 1` (every page boundary of the GGUF a break in the page cache): llama.cpp's all-CPU
    decode of `small` (Q8_0, in place) on the Zen 4 VM's profile of 01:01, 2026-12-07 (page-run rates timed) is slower
    than from a contiguous file (0, the plans' default); the same profile's tree measured 1.67x the time on one thread
    (tests/calibration/test_zen4_page_layout.py)."""
    data = Path(__file__).resolve().parents[1] / "calibration" / "data"
    out = {}
    for b in ("0", "1"):
        assert main(["simulate", "--hw", str(data / "zen4-2026-12-07" / "host-calibrated-0101.yaml"),
                     "--model", str(data / "xeon-2026-12-05" / "small.yaml"),
                     "--engine", "llamacpp", "--prompt-tokens", "0", "--gen-tokens", "16", "--page-breaks", b,
                     "--json"]) == 0
        out[b] = json.loads(capsys.readouterr().out)["decode_tok_s"]
    assert 1.3 < out["0"] / out["1"] < 2.0


def test_simulate_bad_page_breaks_is_one_line_exit_2(capsys):
    assert main(["simulate", "--hw", "epyc8ch-3090", "--engine", "llamacpp", "--page-breaks", "many"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--page-breaks: must be 'auto' or a share in [0, 1] (got 'many')" in err


def test_simulate_page_breaks_auto_without_a_gguf_says_it_takes_contiguous_pages(capsys):
    """`--page-breaks auto` on a preset (no file to read): one line on stderr, and the plan's default (0)."""
    assert main(["simulate", "--hw", "epyc8ch-3090", "--engine", "llamacpp", "--prompt-tokens", "0",
                 "--gen-tokens", "4", "--page-breaks", "auto", "--json"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "taken as contiguous" in err


def test_plan_page_breaks_go_into_the_plan_and_slow_its_prediction(capsys):
    """`plan --page-breaks 1`: the chosen plan (and the closest llama.cpp plan --emit gives) carries
    cpu_file_page_breaks 1, and llama.cpp's in-place decode of `small` on the profile of 01:01, 2026-12-07 is
    predicted slower than at 0; a searched plan carries it too."""
    data = Path(__file__).resolve().parents[1] / "calibration" / "data"
    args = ["plan", "--hw", str(data / "zen4-2026-12-07" / "host-calibrated-0101.yaml"),
            "--model", str(data / "xeon-2026-12-05" / "small.yaml"), "--json"]
    out = {}
    for b in ("0", "1"):
        assert main(args + ["--engine", "llamacpp", "--emit", "llamacpp", "--page-breaks", b]) == 0
        out[b] = json.loads(capsys.readouterr().out)
        assert out[b]["plan"]["cpu_file_page_breaks"] == float(b)
        assert out[b]["llamacpp"]["closest_static_plan"]["cpu_file_page_breaks"] == float(b)
    assert out["1"]["predicted"]["decode_tok_s"] < out["0"]["predicted"]["decode_tok_s"]
    assert main(args + ["--page-breaks", "0.25", "--simulate-top", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["cpu_file_page_breaks"] == 0.25


def test_plan_bad_page_breaks_is_one_line_exit_2(capsys):
    assert main(["plan", "--hw", "epyc8ch-3090", "--page-breaks", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--page-breaks: must be 'auto' or a share in [0, 1] (got '2')" in err
