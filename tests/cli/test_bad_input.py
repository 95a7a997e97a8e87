"""Bad input: one clear line naming the file, the field and the reason; exit code 2; no traceback."""
import json
import subprocess
import sys


from moe_offload.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_unknown_profile(capsys):
    code, _, err = run(capsys, "plan", "--hw", "nosuch-box")
    assert code == 2
    assert one_line(err) .startswith("moe-offload: nosuch-box: no such file or built-in hardware profile")


def test_unknown_preset(capsys):
    code, _, err = run(capsys, "plan", "--hw", "epyc8ch-3090", "--model", "gpt-99")
    assert code == 2 and "gpt-99: no such file or built-in model preset" in one_line(err)


def test_malformed_yaml_names_the_line(capsys, tmp_path):
    p = tmp_path / "hw.yaml"
    p.write_text("name: x\nmemory: [1, 2\ncpu: {}\n")
    code, _, err = run(capsys, "plan", "--hw", str(p))
    assert code == 2 and f"{p}: line 3: malformed YAML" in one_line(err)


def test_malformed_plan_json(capsys, tmp_path):
    p = tmp_path / "plan.json"
    p.write_text('{"engine": "tiered-cache",')
    code, _, err = run(capsys, "fit", "--hw", "epyc8ch-3090", "--plan", str(p))
    assert code == 2 and f"{p}: line 1: malformed JSON" in one_line(err)


def _profile(tmp_path, edit):
    from specs.loaders import load_hardware
    d = load_hardware("epyc8ch-3090").to_yaml_dict()
    edit(d)
    p = tmp_path / "hw.yaml"
    import yaml
    p.write_text(yaml.safe_dump(d))
    return p


def test_missing_field_is_named(capsys, tmp_path):
    p = _profile(tmp_path, lambda d: d["memory"].pop("channels"))
    code, _, err = run(capsys, "plan", "--hw", str(p))
    assert code == 2 and f"{p}: memory.channels: Field required" in one_line(err)


def test_out_of_range_field_is_named(capsys, tmp_path):
    p = _profile(tmp_path, lambda d: d["memory"].update(efficiency={"value": 1.7, "source": "assumed"}))
    code, _, err = run(capsys, "plan", "--hw", str(p))
    assert code == 2 and f"{p}: memory.efficiency:" in one_line(err) and "(0, 1]" in err


def test_figure_without_source_is_rejected(capsys, tmp_path):
    p = _profile(tmp_path, lambda d: d["gpu"].update(bw_gbs=936))
    code, _, err = run(capsys, "plan", "--hw", str(p))
    assert code == 2 and "gpu.bw_gbs" in one_line(err) and "carries its source" in err


def test_plan_field_out_of_range(capsys, tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"streams": 0}))
    code, _, err = run(capsys, "fit", "--hw", "epyc8ch-3090", "--plan", str(p))
    assert code == 2 and f"{p}: streams: Input should be greater than or equal to 1" in one_line(err)


def test_plan_that_does_not_fit_in_vram_gives_the_accounting(capsys, tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"expert_cache": {"slots": 2000, "policy": "lru"}}))
    code, out, err = run(capsys, "fit", "--hw", "epyc8ch-3090", "--plan", str(p))
    line = one_line(err)
    assert code == 2 and f"{p}: vram: plan does not fit in VRAM:" in line and "expert cache 24.72" in line


def test_plan_that_does_not_fit_in_ram(capsys, tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"kv": {"context": 4096}}))
    code, _, err = run(capsys, "fit", "--hw", "rtx5070-64g", "--plan", str(p))
    assert code == 2 and "ram: plan does not fit in RAM: os reserve 7.45 + experts 189.84" in one_line(err)


def test_truncated_gguf_model(capsys, tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x05" * 20)
    code, _, err = run(capsys, "plan", "--hw", "epyc8ch-3090", "--model", str(p))
    assert code == 2 and f"{p}: truncated or corrupt GGUF" in one_line(err)


def test_context_longer_than_the_model(capsys):
    code, _, err = run(capsys, "plan", "--hw", "epyc8ch-3090", "--context", "1000000")
    assert code == 2 and "--context: 1000000 tokens is longer than" in one_line(err)


def test_bad_input_through_the_real_console_script(tmp_path):
    """The installed command prints one line and exits 2 (no traceback from the entry point)."""
    r = subprocess.run([sys.executable, "-m", "moe_offload", "plan", "--hw", "nosuch"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_a_second_cards_slots_without_a_second_card(capsys, tmp_path):
    """A plan with device_tier slots on a machine without an expert_device names the plan's file and the field."""
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"device_tier": {"slots": 2200}}))
    for cmd in ("fit", "simulate"):
        code, _, err = run(capsys, cmd, "--hw", "epyc8ch-3090", "--model", "deepseek-v4.1-flash-3.02", "--plan", str(p))
        assert code == 2 and f"{p}: device_tier.slots: hardware epyc8ch-3090 has no expert_device" in one_line(err)


def test_more_slots_than_the_second_card_holds(capsys, tmp_path):
    """2,500 slots of 13.36 MB on the Arc Pro B70 (32 GiB, 2 GiB reserved): at most 2,411."""
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"device_tier": {"slots": 2500}}))
    code, _, err = run(capsys, "fit", "--hw", "epyc8ch-3090+arc-pro-b70", "--model", "deepseek-v4.1-flash-3.02",
                       "--plan", str(p))
    assert code == 2 and "device_tier.slots: 2500 slots of 13.36 MB need 33.40 GB" in one_line(err) and "2411" in err


def test_unknown_second_card(capsys):
    code, _, err = run(capsys, "plan", "--hw", "epyc8ch-3090+nosuch")
    assert code == 2 and "nosuch: no such file or built-in expert device (built-in: arc-pro-b70)" in one_line(err)


def test_calibrate_with_a_missing_ggml_library_names_it_before_measuring(capsys, tmp_path):
    """`calibrate --ggml-lib` at a place without libggml-cpu.so, or at a file that is no library: one line naming it,
    exit 2, and no profile written (it is checked before any benchmark runs)."""
    out = tmp_path / "p.yaml"
    for lib, why in ((tmp_path / "nowhere", "no libggml-cpu.so there"), (tmp_path / "libggml-cpu.so", "cannot load it")):
        (tmp_path / "libggml-cpu.so").write_bytes(b"not a library")
        code, _, err = run(capsys, "calibrate", "--quick", "--out", str(out), "--store", str(tmp_path / "s.csv"),
                           "--ggml-lib", str(lib))
        assert code == 2 and one_line(err).startswith(f"moe-offload: {lib}: {why}"), err
    assert not out.exists()
