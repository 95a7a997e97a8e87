"""calibrate(): a measured profile in the built-in schema, merged over a base, written atomically;
the results store grows; Ctrl-C (in process and as a real SIGINT) leaves profile and store intact."""
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from calibration import calibrate as cal, page_runs, store
from calibration.bench_device import torch_device
from calibration.bench_kernel import executor_kernel_available
from calibration.bench_memory import MemBandwidth
from calibration.sampling import today
from specs.hardware import HardwareSpec
from specs.loaders import load_hardware

ROOT = Path(__file__).resolve().parents[2]
TINY = cal.TINY
NEEDED = ("t_hit_ms", "sync_ms", "c_a_ms", "c_b_ms", "dense_gbs", "pagecache_4k_us", "cpu_prefill_gflops_per_core")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("cal")
    out, st = d / "hw.yaml", d / "results.csv"
    buf = io.StringIO()
    hw = cal.calibrate(quick=True, out=out, hw_base=None, progress=True, settings=TINY, store_path=st,
                       console=Console(file=buf, width=100), disk_dir=d, typical_out=d / "hw-typical.yaml")
    return hw, out, st, buf.getvalue()


def test_profile_written_and_loadable(run):
    hw, out, _, _ = run
    loaded = load_hardware(str(out))
    assert isinstance(loaded, HardwareSpec)
    assert cal.constants_of(loaded) == pytest.approx(cal.constants_of(hw))
    assert not [f for f in os.listdir(out.parent) if ".tmp" in f]


def test_measured_figures_carry_date_and_method(run):
    hw, _, _, _ = run
    date = today()
    for name in NEEDED:
        f = hw.constants[name]
        assert f.source == "measured" and f.ref.startswith(date) and f >= 0, name
        assert f > 0 or name in ("c_a_ms", "c_b_ms"), name  # a fit may put a cost at its bound 0
    fmt = TINY.kernel_formats[0] if executor_kernel_available() else "toy-f32"
    assert f"c_b_ms.{fmt}" in hw.constants and f"c_a_ms.{fmt}" in hw.constants
    if hw.cpu.threads_used > 1:  # the kernel again on one core (expert_gbs_for(fmt, threads=1) reads it)
        assert hw.cpu.expert_gbs[f"{fmt}@1t"].source == "measured"
    if executor_kernel_available():  # the same jobs in ggml's structure (llama.cpp plans' rates)
        from executor.row_products import ROWS_INT8  # which build's rows the rate is of (Q4_0: int8 in an int8 one)
        assert f"1 token, {'int8' if ROWS_INT8 else 'int16'} activations" in hw.cpu.expert_gbs[fmt].ref
        rw = hw.cpu.rowwise_gbs
        assert rw[fmt].source == "measured" and "no software prefetch" in rw[fmt].ref and rw[fmt] > 0
        assert float(rw["default"]) == float(rw[fmt])
        assert (f"{fmt}@1t" in rw) == (hw.cpu.threads_used > 1)
        from calibration.bench_rowwise import REPACKED_FORMATS  # llama.cpp's repacked layout (Q4_0 on AVX2)
        rp = hw.cpu.repacked_gbs
        for f in (f for f in TINY.kernel_formats if f in REPACKED_FORMATS):
            assert rp[f].source == "measured" and "interleaved rows" in rp[f].ref and rp[f] > 0
            assert (f"{f}@1t" in rp) == (hw.cpu.threads_used > 1)
        wh = hw.cpu.whole_gbs  # the executor's decode structure: whole experts per thread, where a job balances
        assert fmt in wh and (f"{fmt}@1t" in wh) == (hw.cpu.threads_used > 1)  # on one thread too (session 53)
        for k in (fmt, f"{fmt}@1t"):
            if k in wh:
                assert wh[k].source == "measured" and "whole experts per thread" in wh[k].ref and wh[k] > 0
        assert hw.cpu.whole_timed(1)
    for f in (hw.memory.efficiency, hw.nvme.seq_read_gbs, hw.nvme.rand_4k_iops, hw.nvme.latency_us,
              hw.cpu.expert_gbs["default"], hw.cpu.expert_gbs[fmt]):
        assert f.source == "measured" and f.ref.startswith(date) and f > 0
    assert 0 < hw.memory.efficiency <= 1
    assert "least-squares" in hw.cpu.expert_gbs["default"].ref
    assert ("O_DIRECT" in hw.nvme.latency_us.ref) or ("fadvise" in hw.nvme.latency_us.ref)
    # relations: a page-cache hit is cheaper than an uncached read; expert rate = bytes / c_b
    assert hw.constants["pagecache_4k_us"] < hw.nvme.latency_us


def test_in_place_rows_timed_again_from_files_in_short_page_runs(run):
    """page_runs_kib (64, 4): llama.cpp's in-place jobs again on their pool copied into files written in shuffled runs
    of 64 KiB (every format) and of 4 KiB (PAGE_RUNS_FORMAT, else the first format: tiny's only one, Q4_0), keyed as
    rowwise_gbs in cpu.file_runs_gbs (CPU.file_page_excess reads them), each with its store row."""
    hw, _, st, _ = run
    if not executor_kernel_available():
        pytest.skip("no executor kernel: no rowwise jobs")
    fmt, fr = TINY.kernel_formats[0], hw.cpu.file_runs_gbs
    assert set(fr) == {"64KiB", "4KiB"}
    for runs in ("64KiB", "4KiB"):
        f = fr[runs][fmt]
        assert f.source == "measured" and f"pool in a file in {runs[:-3]} KiB runs of pages" in f.ref and f > 0
        assert (f"{fmt}@1t" in fr[runs]) == (hw.cpu.threads_used > 1)
    cases = {r["case"] for r in store.read_rows(st)}
    assert {f"calibrate:cpu_file_runs_64KiB_{fmt}", f"calibrate:cpu_file_runs_4KiB_{fmt}"} <= cases


def test_the_executors_kernel_timed_again_from_files_in_short_page_runs(run):
    """The executor reads its experts and CPU dense weights in place from its mmap too: its kernel's jobs again on
    their pool in files in shuffled 64 KiB runs and 4 KiB runs and in 2 MiB folios (the reference those are priced
    against), keyed as expert_gbs in cpu.kernel_file_runs_gbs
    (CPU.file_page_excess(kernel=True)), its method line the kernel's (its decode jobs' whole experts per thread,
    as whole_gbs, on one thread too), each with its store row."""
    hw, _, st, _ = run
    if not executor_kernel_available():
        pytest.skip("no executor kernel")
    fmt, fr = TINY.kernel_formats[0], hw.cpu.kernel_file_runs_gbs
    assert set(fr) == {"2048KiB", "64KiB", "4KiB"}  # 2 MiB folios: the contiguous reference
    for runs in ("2048KiB", "64KiB", "4KiB"):
        f = fr[runs][fmt]
        assert f.source == "measured" and f > 0
        assert "executor.cpu_experts.moe_cpu" in f.ref and f"pool in a file in {runs[:-3]} KiB runs of pages" in f.ref
        assert "whole experts per thread" in f.ref and fmt in hw.cpu.whole_gbs  # the decode's structure
        assert (f"{fmt}@1t" in fr[runs]) == (hw.cpu.threads_used > 1)
        if f"{fmt}@1t" in fr[runs]:  # on one thread too (session 53)
            assert "whole experts per thread" in fr[runs][f"{fmt}@1t"].ref
    cases = {r["case"] for r in store.read_rows(st)}
    assert {f"calibrate:cpu_kernel_file_runs_{k}KiB_{fmt}" for k in (2048, 64, 4)} <= cases


def test_the_typical_state_profile_takes_each_kernels_median_rounds(run):
    """--typical-out: the same run's profile with each CPU kernel's rate fitted on its median clean rounds (the
    figure the fast profile's ref quotes as "median rounds"), every other figure as measured."""
    import re
    hw, out, _, _ = run
    typ = load_hardware(str(out.parent / "hw-typical.yaml"))
    assert "typical state" in typ.notes
    assert "median rounds" in hw.cpu.expert_gbs[TINY.kernel_formats[0] if executor_kernel_available() else "toy-f32"].ref
    for table in ("expert_gbs", "whole_gbs", "rowwise_gbs"):
        for key, f in getattr(hw.cpu, table).items():
            m = re.search(r"median rounds: ([\d.]+) GB/s", f.ref)
            if m and "as " not in f.ref.split(":")[0]:
                assert float(getattr(typ.cpu, table)[key]) == pytest.approx(float(m.group(1)), abs=0.006), (table, key)
    assert float(typ.nvme.latency_us) == float(hw.nvme.latency_us)


def test_ggml_prefill_structures_timed_for_llamacpp_plans(run):
    """calibrate times the prefill structure ggml's MUL_MAT_ID gives each timed format on this CPU
    (calibration.bench_ggml_prefill): Q4_0 a dot product per (row, token), and where llama.cpp repacks it
    (AVX2) a gemv per token over 8 interleaved rows; on all threads and on one; the store gets a row each."""
    hw, _, st, _ = run
    if not executor_kernel_available():
        pytest.skip("no executor kernels")
    from calibration.bench_ggml_prefill import profile_jobs
    from specs.formats import llamacpp_prefill_key
    g = hw.cpu.ggml_prefill_gflops
    keys = [llamacpp_prefill_key(f, p) for f, p in profile_jobs(TINY.kernel_formats, hw.cpu.isa)]
    assert "Q4_0" in keys and ("Q4_0:repacked" in keys) == ("avx2" in hw.cpu.isa)
    for k in keys:
        assert g[k].source == "measured" and "MUL_MAT_ID" in g[k].ref and g[k] > 0
        assert (f"{k}@1t" in g) == (hw.cpu.threads_used > 1)
    rows = [r for r in store.read_rows(st) if r["case"].startswith("calibrate:cpu_ggml_prefill_")]
    assert len(rows) == len(g)


def test_llamas_f16_dense_products_timed_where_llamafile_takes_them(run):
    """Beside the experts, calibrate times llama.cpp's F16 dense products of a prompt's batch on llamafile's tinyBLAS
    (calibration.ggml_sgemm) where this CPU runs it: 'F16:sgemm' (and on one thread), a store row each."""
    hw, _, st, _ = run
    from calibration.bench_ggml_prefill import dense_job
    g = hw.cpu.ggml_prefill_gflops
    if dense_job(hw.cpu.isa) is None:
        assert "F16:sgemm" not in g
        return
    assert g["F16:sgemm"].source == "measured" and "tinyBLAS" in g["F16:sgemm"].ref and g["F16:sgemm"] > 0
    assert ("F16:sgemm@1t" in g) == (hw.cpu.threads_used > 1)
    assert any(r["case"] == "calibrate:cpu_ggml_prefill_F16_sgemm" for r in store.read_rows(st))


def test_llamas_weighting_of_the_expert_outputs_timed(run):
    """calibrate times llama.cpp's multiply of the expert outputs by their router weights (calibration.ggml_binary)
    on any CPU: 'F32:weighting' in giga-values a second a core (and on one thread), a store row each."""
    hw, _, st, _ = run
    g = hw.cpu.ggml_prefill_gflops
    assert g["F32:weighting"].source == "measured" and "build_moe_ffn" in g["F32:weighting"].ref
    assert g["F32:weighting"] > 0
    assert ("F32:weighting@1t" in g) == (hw.cpu.threads_used > 1)
    assert any(r["case"] == "calibrate:cpu_ggml_prefill_F32_weighting" for r in store.read_rows(st))


def test_prefill_timed_at_two_batch_sizes_gives_the_fixed_tokens(run):
    """calibrate times the executor's prefill batch at prefill_tokens and prefill_long_tokens (TINY: 8 and 32 tokens,
    top-2 of 4 experts: 4 and 16 tokens an expert) and writes the first's rate, its tokens an expert and m0 from the
    two (bench_kernel.prefill_fixed_tokens), each measured."""
    hw, _, _, _ = run
    if not executor_kernel_available():
        pytest.skip("no executor kernels")
    c = hw.constants
    assert float(c["cpu_prefill_ref_tokens"]) == TINY.prefill_tokens * TINY.prefill_top_k / TINY.prefill_experts
    m0 = c["cpu_prefill_fixed_tokens"]
    assert m0.source == "measured" and "tokens an expert" in m0.ref and 0 <= float(m0) <= 1000
    assert c["cpu_prefill_gflops_per_core"].source == "measured"
    from executor.cpu_caches import cache_bytes
    assert hw.cpu.l2_bytes == cache_bytes(2)  # the executor's token groups (specs.formats.executor_group_tokens)
    if cache_bytes(2):
        assert "token groups (1 and 1)" in m0.ref  # TINY's 4 and 16 tokens an expert: one group each


def test_the_profile_names_the_activations_its_prefill_gemm_ran_on(run):
    """calibrate writes the activations of the integer GEMM it timed (executor.qgemm.gemm_activations: int16 in
    the default build, int8 under --gemm-int8) into cpu.executor_gemm_activations, whose panels size the simulator's
    token groups; none where the float GEMM ran."""
    hw, _, _, _ = run
    if not executor_kernel_available():
        pytest.skip("no executor kernels")
    from executor.qgemm import gemm_activations
    acts = gemm_activations()
    assert hw.cpu.executor_gemm_activations == (acts if acts != "float" else None)
    assert acts in hw.constants["cpu_prefill_gflops_per_core"].ref


def test_each_formats_prefill_products_are_timed_against_the_jobs(run):
    """calibrate times each kernel format's prefill products against the prefill job's format
    (calibration.bench_prefill_formats; TINY: Q4_0 alone, its own reference) into cpu.prefill_format_share, each
    figure measured, the job's format at 1, and a store row each."""
    if not executor_kernel_available():
        pytest.skip("no executor kernels")
    hw, _, st, _ = run
    shares = hw.cpu.prefill_format_share
    assert set(shares) == set(TINY.kernel_formats) and float(shares["Q4_0"]) == 1.0
    assert all(v.source == "measured" and "over Q4_0's" in v.ref for v in shares.values())
    rows = [r for r in store.read_rows(st) if r["case"] == "calibrate:cpu_prefill_share_Q4_0"]
    assert len(rows) == 1 and rows[0]["metric"] == "share" and float(rows[0]["value"]) == 1.0


def test_the_host_dense_path_is_timed_for_all_cpu_prefill(run):
    """calibrate times an F16 attention block's products and its causal attention on a TINY.dense_prefill_tokens
    prompt (bench_kernel.executor_dense_prefill_jobs) into cpu_dense_gflops_per_core and
    cpu_attention_gflops_per_core, each measured, with a store row each."""
    hw, _, st, _ = run
    if not executor_kernel_available():
        pytest.skip("no executor kernels")
    for name, case in (("cpu_dense_gflops_per_core", "dense"), ("cpu_attention_gflops_per_core", "attention")):
        f = hw.constants[name]
        assert f.source == "measured" and f"{TINY.dense_prefill_tokens} tokens" in f.ref and f > 0
        assert any(r["case"] == f"calibrate:cpu_prefill_{case}" for r in store.read_rows(st))


def test_describe_calibrated_profile(run):
    from calibration.detect import describe
    hw, _, _, _ = run
    rows = {r[0]: r for r in describe(hw)}
    assert rows["constants.t_hit_ms"][1].endswith(" ms") and rows["constants.t_hit_ms"][2] == "measured"
    assert rows["cpu.threads_used"][2] == "measured"
    assert rows["nvme.rand_4k_iops"][1].endswith("IOPS")


def test_progress_bars_shown(run):
    _, _, _, text = run
    for stage in ("memory bandwidth", "CPU expert kernel", "per-hit time", "disk 4 KiB"):
        assert stage in text


def test_store_rows(run):
    _, out, st, _ = run
    rows = store.read_rows(st)
    cases = {r["case"] for r in rows}
    for c in ("calibrate:mem_read", "calibrate:mem_copy", "calibrate:mem_triad", "calibrate:t_hit",
              "calibrate:handover", "calibrate:handover_cross_core", "calibrate:disk_qd1",
              "calibrate:pagecache_4k", "calibrate:dense"):
        assert c in cases
    assert all(r["time"] and r["commit"] and r["machine"] and r["profile"] == str(out) for r in rows)
    assert all(r["mode"] == "tiny" for r in rows)
    kern = [r for r in rows if r["case"].startswith("calibrate:cpu_kernel_") and r["metric"] == "job_ms"]
    assert len(kern) >= len(TINY.kernel_ks) and all(r["residual_ms"] != "" and r["kernel"] for r in kern)


def test_second_run_appends_and_replaces_profile(run, tmp_path):
    _, out, st, _ = run
    st2, out2 = tmp_path / "r.csv", tmp_path / "hw.yaml"
    st2.write_bytes(st.read_bytes())
    n0 = len(store.read_rows(st2))
    before = st2.read_bytes()
    cal.calibrate(True, out2, None, False, settings=TINY, store_path=st2, disk_dir=tmp_path)
    assert st2.read_bytes().startswith(before)  # nothing rewritten
    assert len(store.read_rows(st2)) > n0
    assert load_hardware(str(out2)).constants["t_hit_ms"].source == "measured"


def test_recalibration_replaces_its_notes(run, tmp_path):
    hw, _, _, _ = run
    again = cal.calibrate(True, tmp_path / "again.yaml", hw, False, settings=TINY, store_path=tmp_path / "r.csv",
                          disk_dir=tmp_path)
    assert again.notes.count("calibrated (tiny)") == 1
    assert again.notes.count("noise memory:") == 1


def test_merge_over_datasheet_base(tmp_path):
    base = load_hardware("epyc8ch-3090")
    hw = cal.calibrate(True, tmp_path / "m.yaml", base, False, settings=TINY, store_path=tmp_path / "r.csv",
                       disk_dir=tmp_path)
    assert hw.name == base.name and hw.memory.channels == 8
    assert hw.memory.mts == base.memory.mts and hw.memory.mts.source == base.memory.mts.source
    assert hw.memory.efficiency.source == "measured"
    if hw.gpu is not None and torch_device().type != "cuda":
        assert hw.gpu.bw_gbs.source == "datasheet"  # nothing here measured it
    assert hw.cpu.expert_gbs["EXL3"] == base.cpu.expert_gbs["EXL3"]  # kept from the base
    assert hw.cpu.expert_gbs["default"].source == "measured"
    assert hw.nvme.capacity_bytes == base.nvme.capacity_bytes


def test_measured_read_above_base_peak_raises_mts():
    base = load_hardware("epyc8ch-3090")
    data = base.model_dump()
    data["memory"]["channels"] = 1
    data["memory"]["mts"] = {"value": 100, "source": "datasheet", "ref": "x"}
    tiny_base = HardwareSpec.model_validate(data)
    r = cal.Results(settings=TINY)
    r.mem = MemBandwidth(array_bytes=1 << 20, repeats=1, low={"read": {1: 8.0}}, best={"read": {1: 9.0}},
                         median={"read": {1: 8.5}})
    hw = cal.build_profile(r, tiny_base)
    assert hw.memory.efficiency == 1.0 and hw.memory.mts.source == "derived"
    assert hw.memory.usable_gbs == pytest.approx(8.0)


def test_ctrl_c_leaves_previous_profile_and_store(tmp_path, monkeypatch):
    out, st = tmp_path / "hw.yaml", tmp_path / "r.csv"
    cal.calibrate(True, out, None, False, settings=TINY, store_path=st, disk_dir=tmp_path)
    prof, rows = out.read_bytes(), st.read_bytes()

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(cal, "bench_disk", interrupted)  # the last benchmark
    with pytest.raises(KeyboardInterrupt):
        cal.calibrate(True, out, None, False, settings=TINY, store_path=st, disk_dir=tmp_path)
    assert out.read_bytes() == prof and st.read_bytes() == rows
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f or f.startswith(".moe-offload-disk")]


def test_real_sigint_mid_run(tmp_path):
    out, st, marker = tmp_path / "hw.yaml", tmp_path / "r.csv", tmp_path / "inside"
    out.write_text("previous profile\n")
    st.write_text("time,commit,machine,case,metric,value\nold,row,m,c,x,1\n")
    prof, rows = out.read_bytes(), st.read_bytes()
    script = textwrap.dedent(f"""
        import faulthandler, signal, time
        from pathlib import Path
        faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack if exit hangs
        # Ctrl-C as a terminal delivers it: a job started in the background of a non-interactive
        # shell inherits SIGINT ignored (POSIX), and the sleep below then never ends
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from calibration import calibrate as cal
        real = cal.bench_handover
        def slow(*a, **k):
            Path({str(marker)!r}).write_text("x")
            time.sleep(60)
            return real(*a, **k)
        cal.bench_handover = slow
        cal.calibrate(True, {str(out)!r}, None, False, settings=cal.TINY, store_path={str(st)!r},
                      disk_dir={str(tmp_path)!r})
    """)
    p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.time()  # the wait ends at the marker; its bound only covers numba compiling on a cold cache (minutes)
    while not marker.exists() and p.poll() is None and time.time() - t0 < 400:
        time.sleep(0.05)
    assert marker.exists(), p.communicate()[1].decode()[-2000:]
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # say where it hangs, then end it
        p.send_signal(signal.SIGUSR1)
        time.sleep(2)
        p.kill()
        _, err = p.communicate()
        raise AssertionError("no exit 90 s after SIGINT; stacks:\n" + err.decode()[-6000:]) from None
    assert p.returncode != 0 and b"KeyboardInterrupt" in err
    assert out.read_bytes() == prof and st.read_bytes() == rows
    assert sorted(os.listdir(tmp_path)) == sorted(["hw.yaml", "r.csv", "inside"])


def test_settings_presets():
    assert cal.FULL.mem_bytes >= 1 << 30 and cal.QUICK.mem_bytes < cal.FULL.mem_bytes
    assert cal.QUICK.label == "quick" and cal.FULL.label == "full"
    assert replace(TINY, toy_kernel=True).toy_kernel


def test_toy_kernel_path(tmp_path):
    hw = cal.calibrate(True, tmp_path / "t.yaml", None, False, settings=replace(TINY, toy_kernel=True),
                       store_path=tmp_path / "r.csv", disk_dir=tmp_path)
    assert "c_b_ms.toy-f32" in hw.constants and hw.cpu.expert_gbs["toy-f32"].source == "measured"


def test_budget_split_keeps_total(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(cal.time, "perf_counter", lambda: clock[0])
    s = replace(cal.QUICK, total_budget_s=10.0)
    b = cal._Budget(s, n_kernels=3, cuda=False)
    assert sum(b.left.values()) > 10  # the stages' own budgets add up to more than the total
    stages = [("mem", s.mem_budget_s)] + [(f"kernel{i}", s.kernel_budget_s) for i in range(3)]
    stages += [("hit", s.hit_budget_s), ("dense", s.dense_budget_s), ("handover", 1.5 * s.handover_budget_s),
               ("disk", 3 * s.disk_budget_s)]
    got = []
    for key, own in stages:
        g = b.take(key, own)
        assert 0.2 <= g <= own
        got.append(g)
        clock[0] += g  # a stage that waits out its whole budget
    assert sum(got) <= 10.0 + 1e-6


def test_quick_fits_its_minute():
    s = cal.QUICK
    worst_wait = s.total_budget_s
    assert worst_wait <= 35  # leaves the work (~12 s here) and a first JIT of the kernels (~13 s) room
    assert cal.FULL.total_budget_s <= 420


def test_unwritable_output_is_a_spec_error_before_benchmarks(tmp_path, monkeypatch):
    from specs.errors import SpecError
    ran = []
    monkeypatch.setattr(cal, "run_benchmarks", lambda *a, **k: ran.append(1))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SpecError) as e:
        cal.calibrate(True, blocker / "hw.yaml", None, False, settings=TINY, store_path=tmp_path / "r.csv")
    assert "hw.yaml" in e.value.line() and "cannot write the profile" in e.value.line()
    with pytest.raises(SpecError) as e:
        cal.calibrate(True, tmp_path / "hw.yaml", None, False, settings=TINY, store_path=blocker / "r.csv")
    assert "results store" in e.value.line()
    assert not ran and not (tmp_path / "hw.yaml").exists()


def test_untimed_block_formats_take_the_nearest_timed_formats_weights_per_second():
    """calibrate times Q4_0, Q8_0 and F16; Q4_K (4.5 bits) gets Q4_0's weights/s, Q6_K (6.5625) Q8_0's
    (1.94 bits away against 2.06), BF16 F16's; each `derived`, with its source format named; codebook
    formats and timed ones are left alone."""
    from calibration.profile import derived_block_rates
    timed = {"Q4_0": 27.0, "Q8_0": 34.0, "F16": 30.0}
    out = derived_block_rates(timed, ["Q4_K", "Q6_K", "BF16", "IQ3_S", "Q4_0"], "2026-11-30")
    assert set(out) == {"Q4_K", "Q6_K", "BF16"}
    assert float(out["Q4_K"]) == pytest.approx(27.0)  # same bits as Q4_0
    assert float(out["Q6_K"]) == pytest.approx(34.0 * 8 / 8.5 * 6.5625 / 8)
    assert float(out["BF16"]) == pytest.approx(30.0)
    assert all(f.source == "derived" for f in out.values()) and "Q8_0" in out["Q6_K"].ref
    assert derived_block_rates({"toy-f32": 5.0}, ["Q4_K"], "2026-11-30") == {}


def test_untimed_k_quants_take_a_timed_k_quants_weights_per_second():
    """With Q4_K and Q6_K timed too (calibrate's default formats), Q5_K (5.5 bits) takes Q4_K's weights/s
    (1.0 bits away; Q4_0 is as near but decodes no packed sub-block scales), Q2_K the same; Q4_0-family
    formats still take the nearest legacy one."""
    from calibration.profile import derived_block_rates
    timed = {"Q4_0": 27.0, "Q8_0": 34.0, "F16": 30.0, "Q4_K": 20.0, "Q6_K": 21.0}
    out = derived_block_rates(timed, ["Q5_K", "Q2_K", "Q5_0"], "2026-11-30")
    assert float(out["Q5_K"]) == pytest.approx(20.0 / 4.5 * 5.5) and "Q4_K" in out["Q5_K"].ref
    assert "Q4_K" in out["Q2_K"].ref and "Q4_0" in out["Q5_0"].ref


def _fit(fmt_gbs: float, expert_bytes: int = 1_000_000, threads: int = 2):
    from calibration.bench_kernel import KernelFit
    c_b = expert_bytes / (fmt_gbs * 1e9) * 1e3
    return KernelFit(label="synthetic", expert_bytes=expert_bytes, ks=[1, 2], t_ms=[c_b, 2 * c_b], c_a_ms=0.0,
                     c_b_ms=c_b, residuals_ms=[0.0, 0.0], rms_rel=0.0, threads=threads, repeats=1)


def _mem(read_gbs: float):
    return MemBandwidth(array_bytes=1 << 30, repeats=1, low={"read": {2: read_gbs}}, best={"read": {2: read_gbs}},
                        median={"read": {2: read_gbs}})


@pytest.mark.parametrize("pool, llc, usable", [(128 << 20, 32 << 20, 30.0), (64 << 20, 32 << 20, 21.0),
                                               (128 << 20, None, 21.0)], ids=["4x-llc", "2x-llc", "llc-unknown"])
def test_memory_is_at_least_what_a_kernel_read_from_dram(pool, llc, usable):
    """The memory benchmark's lower quintile (21 GB/s) below what the Q8_0 kernel read (30 GB/s) from a
    pool of experts >= 4x the last-level cache: the profile's DDR rate is raised to 30 (the simulator caps
    CPU experts by it); a pool that may sit in the cache, or an unknown cache, leaves it."""
    s = replace(cal.QUICK, kernel_pool_bytes=pool)
    r = cal.Results(settings=s, llc_bytes=llc)
    r.mem = _mem(21.0)
    r.kernels = {"Q8_0": _fit(30.0), "Q4_0": _fit(24.0)}
    hw = cal.build_profile(r, load_hardware("epyc8ch-3090"))
    assert hw.memory.usable_gbs == pytest.approx(usable)


def test_layer_cost_splits_into_a_fixed_part_and_one_per_mb():
    """Two layer loops (46.4 MB and 2.1 MB a layer) left 0.412 and 0.025 ms beyond their bytes:
    cpu_layer_ms_per_mb = 0.387 / 44.3 MB, cpu_layer_ms the rest of the big layer's."""
    from calibration.bench_layer_loop import LayerLoop
    r = cal.Results(settings=cal.QUICK)
    r.kernels = {"Q8_0": _fit(30.0), "F16": _fit(30.0)}  # 30 GB/s = 0.0333 ms/MB, no job cost
    mb = lambda ms, dense, expert: ms + (dense + expert) / 30e6  # noqa: E731  (layer time = rest + bytes at 30 GB/s)
    r.layer_loop = LayerLoop(t_layer_ms=mb(0.412, 6_300_000, 40_100_000), dense_bytes=6_300_000,
                             expert_bytes=40_100_000, fmt="Q8_0", threads=2, repeats=7)
    r.layer_loop_small = LayerLoop(t_layer_ms=mb(0.025, 400_000, 1_700_000), dense_bytes=400_000,
                                   expert_bytes=1_700_000, fmt="Q8_0", threads=2, repeats=7)
    c = cal.build_profile(r, load_hardware("epyc8ch-3090")).constants
    per = (0.412 - 0.025) / (46.4 - 2.1)
    assert float(c["cpu_layer_ms_per_mb"]) == pytest.approx(per)
    assert float(c["cpu_layer_ms"]) == pytest.approx(0.412 - per * 46.4)


def test_the_page_run_pools_stay_within_a_third_of_the_available_memory():
    """The pools in files live a format at a time (calibrate._time_page_runs): quick's Q8_0 holds the most, its rows
    from 64 KiB runs (192 MiB, the executor's kernel's there too), from 4 KiB runs (384 MiB, shared by the two) and
    its kernel's 2 MiB folios (384 MiB), 960 MiB where 24 GiB are available; with 1.5 GiB, scaled to a third of it
    (0.5 GiB); without page-run jobs, untouched."""
    assert cal.QUICK.page_runs_formats == ("Q8_0", "F16", "Q6_K")
    assert page_runs.format_pool_bytes(cal.QUICK, cal.QUICK.kernel_formats) == 960 << 20
    assert cal.kernel_pool_for(cal.QUICK, 32 << 20, 24 << 30).page_runs_pool_bytes == (192 << 20, 384 << 20)
    first, other = cal.kernel_pool_for(cal.QUICK, 32 << 20, 3 << 29).page_runs_pool_bytes
    assert other == pytest.approx(2 * first, abs=1) and first + 2 * other == pytest.approx(1 << 29, rel=1e-6)
    none = replace(cal.QUICK, page_runs_kib=())
    assert cal.kernel_pool_for(none, 32 << 20, 1 << 30).page_runs_pool_bytes == none.page_runs_pool_bytes


def test_the_page_run_jobs_are_timed_a_format_at_a_time():
    """page_runs.by_format: quick's page-run jobs in four groups, in the order each format first comes: Q8_0's five
    (its rows' and kernel's pools shared at 64 KiB and 4 KiB, its kernel's reference between), F16's three, Q6_K's
    one, Q4_K's two."""
    jobs = cal._page_run_jobs(cal.QUICK, cal.QUICK.kernel_formats, ["avx2", "avx512f"])
    assert [[k for k, *_ in g] for g in page_runs.by_format(jobs)] == [
        ["64KiB", "4KiB", "kernel-2048KiB", "kernel-4KiB", "kernel-64KiB"],
        ["64KiB", "kernel-2048KiB", "kernel-4KiB"], ["64KiB"], ["kernel-2048KiB", "kernel-4KiB"]]
    assert [g[0][1] for g in page_runs.by_format(jobs)] == ["Q8_0", "F16", "Q6_K", "Q4_K"]


def test_a_formats_pools_in_files_are_gone_once_it_is_timed(tmp_path):
    """_time_page_runs times a format's page-run jobs on all the threads and on one into r.file_runs and
    r.kernel_file_runs, and returns holding none of their pools in files (bench_kernel's live pools): the next
    format's are written into the frames they leave."""
    from calibration import bench_kernel
    if not executor_kernel_available():
        pytest.skip("no executor kernel")
    s = cal.kernel_pool_for(TINY, None, None)
    r = cal.Results(settings=s)
    (unit,) = page_runs.by_format(cal._page_run_jobs(s, s.kernel_formats, ["avx2"], folder=tmp_path))
    with cal._Progress(False) as pg:
        cal._time_page_runs(s, r, unit, 2, pg, cal._Budget(s, 1, False))
    fmt = s.kernel_formats[0]
    assert set(r.kernel_file_runs) == {f"{k}KiB {fmt}{t}" for k in (2048, 4, 64) for t in ("", "@1t")}
    assert set(r.file_runs) == {f"{k}KiB {fmt}{t}" for k in (64, 4) for t in ("", "@1t")}
    assert not [key for key in bench_kernel._POOLS.keys() if len(key) > 6]  # (fmt, ..., seed, file_runs, bytes)
    assert not list(tmp_path.iterdir())  # each file unlinked once mapped


def test_quick_times_the_formats_that_pay_most_from_files():
    """The page-run jobs quick runs: llama.cpp's rows of Q8_0, F16 and Q6_K from 64 KiB runs, Q8_0 again from 4 KiB
    runs (the exponent); the executor's kernel of Q8_0, F16 and Q4_K each from a file in 2 MiB folios (its contiguous
    reference) and then from 4 KiB runs, where its cost is largest, and Q8_0 from 64 KiB runs (its exponent)."""
    jobs = cal._page_run_jobs(cal.QUICK, cal.QUICK.kernel_formats, ["avx2", "avx512f"])
    assert [(k, f) for k, f, _, _ in jobs] == [("64KiB", "Q8_0"), ("64KiB", "F16"), ("64KiB", "Q6_K"), ("4KiB", "Q8_0"),
                                               ("kernel-2048KiB", "Q8_0"), ("kernel-4KiB", "Q8_0"),
                                               ("kernel-2048KiB", "F16"), ("kernel-4KiB", "F16"),
                                               ("kernel-2048KiB", "Q4_K"), ("kernel-4KiB", "Q4_K"),
                                               ("kernel-64KiB", "Q8_0")]
