"""llama-bench output in all four formats becomes runs with the right placement (issue 7)."""
from pathlib import Path

import pytest

from calibration.ingest import read_llama_bench, read_server_timings
from specs.errors import SpecError
from specs.model import ModelSpec

FIX = Path(__file__).parent.parent / "fixtures" / "llama-bench"
# The fixture's model: qwen3moe, hidden 512, 4 layers, 32 experts of width 256, top-4, Q8_0
TINY = ModelSpec(name="moe-tiny", arch="qwen3moe", n_layers=4, hidden=512, n_experts=32, top_k=4,
                 expert_ffn=256, vocab=1024, attention={"n_heads": 8, "n_kv_heads": 4, "head_dim": 64},
                 expert_format="Q8_0", dense_format="Q8_0")


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "md"])
def test_each_format_gives_four_tests_of_one_command(fmt):
    runs = read_llama_bench(FIX / f"tiny-t12.{fmt}")
    assert [r.test for r in runs] == ["pp64", "tg32", "pp64", "tg32"]
    assert [r.metric for r in runs] == ["prefill_tok_s", "decode_tok_s"] * 2
    assert all(r.backend == "CPU" for r in runs)
    threads = [r.plan(TINY).cpu_threads for r in runs]
    assert threads == [1, 1, 2, 2]


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv", "md"])
def test_cpu_backend_places_everything_on_the_cpu(fmt):
    plan = read_llama_bench(FIX / f"tiny-t12.{fmt}")[1].plan(TINY)
    assert plan.placement.dense == "cpu" and plan.placement.gpu_expert_layers == []
    assert plan.prefill.strategy == "cpu"


def test_json_fields_give_batches_and_the_measured_rate():
    runs = read_llama_bench(FIX / "tiny-t12.json")
    plan = runs[0].plan(TINY)
    assert (plan.prefill.chunk_tokens, plan.prefill.ubatch_tokens) == (2048, 512)
    assert runs[1].tok_s == pytest.approx(690.622637) and runs[1].tok_s_std == pytest.approx(3.233374)


def test_markdown_reads_mean_and_std_from_the_t_s_column():
    runs = read_llama_bench(FIX / "tiny-t12.md")
    assert (runs[3].tok_s, runs[3].tok_s_std) == (944.75, 97.56)


def test_markdown_takes_the_missing_flags_from_the_user():
    runs = read_llama_bench(FIX / "tiny-t12.md", extra_flags=("-ngl", "0", "-ub", "256"))
    assert runs[0].plan(TINY).prefill.ubatch_tokens == 256


def test_server_timing_lines():
    text = ("prompt eval time =     120.50 ms /    64 tokens (    1.88 ms per token,   531.12 tokens per second)\n"
            "       eval time =    1000.00 ms /    50 runs   (   20.00 ms per token,    50.00 tokens per second)\n")
    runs = read_server_timings(text, "server.log", flags=("-t", "2"))
    assert [(r.test, round(r.tok_s, 1)) for r in runs] == [("pp64", 531.1), ("tg50", 50.0)]


def test_a_flag_llamacpp_would_reject_is_named(tmp_path):
    runs = read_llama_bench(FIX / "tiny-t12.md", extra_flags=("--n-cpu-moe", "x"))
    with pytest.raises(SpecError) as e:
        runs[0].plan(TINY)
    assert e.value.field == "--n-cpu-moe"


def test_not_llama_bench_output(tmp_path):
    p = tmp_path / "x.txt"
    p.write_text("hello world\n")
    with pytest.raises(SpecError, match="not llama-bench output"):
        read_llama_bench(p)


def test_ingest_command_appends_measured_cases_to_the_store(tmp_path, capsys):
    import json as _json

    from calibration.store import read_rows
    from moe_offload.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(_json.dumps({"model_type": "qwen3_moe", "hidden_size": 512, "num_hidden_layers": 4,
                                "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
                                "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
                                "vocab_size": 1024}))
    store = tmp_path / "results.csv"
    for fmt in ("json", "csv"):
        assert main(["ingest", str(FIX / f"tiny-t12.{fmt}"), "--model", str(cfg), "--store", str(store)]) == 0
    rows = read_rows(store)
    assert len(rows) == 8  # appended, never overwritten
    assert {r["metric"] for r in rows} == {"decode_tok_s", "prefill_tok_s"}
    plan = _json.loads(rows[1]["plan"])
    assert plan["placement"]["dense"] == "cpu" and plan["cpu_threads"] == 1


def test_ingest_names_the_rejected_flag_with_exit_2(tmp_path, capsys):
    from moe_offload.cli import main

    code = main(["ingest", str(FIX / "tiny-t12.md"), "--model", "qwen3.8-flash-next-iq3_s",
                 "--flags", "-ub abc", "--store", str(tmp_path / "r.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "-ub: expects an integer" in err and not (tmp_path / "r.csv").exists()


def test_llama_bench_repack_column_becomes_no_repack():
    """`--repack 1,0` (small-q4-repack.md, this EPYC): the rpk 0 row ran with experts read in place from
    the mmap, 71.19 tok/s against 86.42 repacked."""
    runs = read_llama_bench(FIX / "small-q4-repack.md")
    assert [r.tok_s for r in runs] == [86.42, 71.19]
    assert "--no-repack" not in runs[0].flags and "--no-repack" in runs[1].flags


@pytest.mark.parametrize("field, value", [("load_mode", "none"), ("load_mode", "dio"), ("use_mmap", False)])
def test_llama_bench_without_mmap_becomes_no_mmap(tmp_path, field, value):
    """llama-bench's -lm none|dio (or -mmp 0 in older builds) read the weights into buffers: --no-mmap."""
    import json
    rec = {**json.loads((FIX / "tiny-t12.json").read_text())[0], field: value}
    p = tmp_path / "run.json"
    p.write_text(json.dumps([rec]))
    assert "--no-mmap" in read_llama_bench(p)[0].flags
    assert "--no-mmap" not in read_llama_bench(FIX / "tiny-t12.json")[0].flags


def test_two_quantisations_of_one_model_are_two_cases():
    """llama-quantize keeps general.name, so small.gguf (Q8_0) and its Q4_K_M are both 'moe-offload synthetic
    small': the case name carries the expert type, or regress would keep only the later of the two runs."""
    from calibration.ingest import run_case_name

    run = read_llama_bench(FIX / "tiny-t12.json")[0]
    q4k = TINY.model_copy(update={"expert_format": "Q4_K"})
    assert run_case_name(TINY, run) != run_case_name(q4k, run)
    assert run_case_name(TINY, run).startswith("llamacpp:moe-tiny Q8_0:")


ZEN4 = Path(__file__).parent / "data" / "zen4-2026-12-06g" / "llama-bench"


def test_a_first_repetition_that_read_the_file_from_disk_is_left_out():
    """`small` tg64 on one thread (Zen 4 VM, 2026-12-06 17:36, after `calibrate --quick`): repetitions at 22.2, 53.5
    and 52.5 tok/s, avg_ts 42.7. The first is under 0.75x the later ones' median, so the run is their mean, 53.0, and
    their sample standard deviation."""
    (run,) = read_llama_bench(ZEN4 / "small-tg-t1-1736.json")
    assert run.cold_reps == 1
    assert run.tok_s == pytest.approx((53.5 + 52.5) / 2, abs=0.1)
    assert run.tok_s_std == pytest.approx(0.71, abs=0.05)


def test_a_first_repetition_within_the_spread_is_kept():
    """The same file at 17:42: 41.5, 51.8, 51.3 tok/s (0.80x): llama-bench's avg_ts, 48.2, as it is; and the fixture's
    two repetitions (too few to tell a cold one) too."""
    (run,) = read_llama_bench(ZEN4 / "small-tg-t1-1742.json")
    assert run.cold_reps == 0 and run.tok_s == pytest.approx(48.2, abs=0.05)
    runs = read_llama_bench(FIX / "tiny-t12.json")
    assert runs[0].tok_s == 1765.730593 and all(r.cold_reps == 0 for r in runs)


def test_ingest_says_which_runs_left_a_cold_repetition_out(tmp_path, capsys):
    from calibration.store import read_rows
    from moe_offload.cli import main

    store = tmp_path / "r.csv"
    files = [str(ZEN4 / f"small-tg-t1{m}-1736.json") for m in ("", "-norepack")]
    assert main(["ingest", *files, "--model", str(ZEN4.parent.parent / "xeon-2026-12-05" / "small.yaml"),
                 "--store", str(store)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "first repetition read from disk, left out" in out[0] and "left out" not in out[1]
    assert [r["cold_reps"] for r in read_rows(store)] == ["1", "0"]


def _config(tmp_path) -> Path:
    import json as _json
    cfg = tmp_path / "config.json"
    cfg.write_text(_json.dumps({"model_type": "qwen3_moe", "hidden_size": 512, "num_hidden_layers": 4,
                                "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
                                "num_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
                                "vocab_size": 1024}))
    return cfg


def test_page_breaks_given_go_into_every_plan_that_reads_the_mmap(tmp_path):
    """--page-breaks 0.09 (the share of the GGUF's page boundaries that were physical breaks while llama-bench read
    it): each run's plan carries it as cpu_file_page_breaks; with none, the plans say 0 (contiguous)."""
    import json as _json

    from calibration.ingest import ingest_runs
    from calibration.store import read_rows
    store = tmp_path / "r.csv"
    ingest_runs([str(FIX / "tiny-t12.json")], str(_config(tmp_path)), "", store, page_breaks="0.09")
    ingest_runs([str(FIX / "tiny-t12.json")], str(_config(tmp_path)), "", store, page_breaks=None)
    plans = [_json.loads(r["plan"]) for r in read_rows(store)]
    assert [p["cpu_file_page_breaks"] for p in plans] == [0.09] * 4 + [0.0] * 4


def test_page_breaks_auto_reads_the_named_files_layout_or_leaves_it_unknown(tmp_path):
    """'auto' reads the layout of the GGUF a record names where it exists (frame numbers need root: else unknown);
    the fixture's records name a file not on this machine: the plans keep 0."""
    import json as _json

    from calibration.ingest import ingest_runs
    from calibration.store import read_rows
    store = tmp_path / "r.csv"
    ingest_runs([str(FIX / "tiny-t12.json")], str(_config(tmp_path)), "", store, page_breaks="auto")
    assert {_json.loads(r["plan"])["cpu_file_page_breaks"] for r in read_rows(store)} == {0.0}


def test_a_bad_page_breaks_value_is_one_line_and_exit_2(tmp_path, capsys):
    from moe_offload.cli import main
    code = main(["ingest", str(FIX / "tiny-t12.json"), "--model", str(_config(tmp_path)), "--page-breaks", "1.5",
                 "--store", str(tmp_path / "r.csv")])
    err = capsys.readouterr().err
    assert code == 2 and "--page-breaks: must be 'auto' or a share in [0, 1]" in err
    assert not (tmp_path / "r.csv").exists()


def test_page_breaks_auto_reads_the_layout_of_the_file_the_records_name(tmp_path):
    """A GGUF whose pages lie in shuffled 4 KiB runs (page_layout.write_in_runs), named by the llama-bench records:
    ingest's default ('auto') reads nearly every boundary a break into each plan (frame numbers need root)."""
    import json as _json

    import numpy as np

    from calibration.ingest import ingest_runs
    from calibration.page_layout import page_layout, write_in_runs
    from calibration.store import read_rows
    gguf = write_in_runs(tmp_path / "model.gguf", np.ones(8 << 20, np.uint8), 4096)
    if page_layout(gguf, resident_only=True) is None:
        pytest.skip("pagemap hides frame numbers from this process (no CAP_SYS_ADMIN)")
    recs = [{**r, "model_filename": str(gguf)} for r in _json.loads((FIX / "tiny-t12.json").read_text())]
    (tmp_path / "r.json").write_text(_json.dumps(recs))
    store = tmp_path / "r.csv"
    ingest_runs([str(tmp_path / "r.json")], str(_config(tmp_path)), "", store)
    assert all(_json.loads(r["plan"])["cpu_file_page_breaks"] > 0.9 for r in read_rows(store))
