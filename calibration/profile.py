"""A calibration run's results as a hardware profile (every figure `measured`, with its date and
method, merged over a base profile) and as rows of the append-only results store."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from specs.figure import Figure
from specs.formats import EXECUTOR_PANEL_FLOATS, executor_expert_groups, executor_prefill_group_bytes
from specs.hardware import HardwareSpec

from . import store
from .bench_kernel import kernel_version, prefill_fixed_tokens
from .sampling import Noise, today

if TYPE_CHECKING:
    from .calibrate import Results

DEFAULT_FORMAT = "Q4_0"  # the format whose kernel figures become the profile's defaults


def noise_of(r: Results) -> list[tuple[str, Noise]]:
    """(benchmark, what its sampler saw) for every benchmark that sampled around outside load."""
    out = ([("memory", r.mem.noise)] if r.mem else []) + [(f"kernel {k}", f.noise) for k, f in r.kernels.items()]
    out += [(f"kernel {k} 1 thread", f.noise) for k, f in r.kernels_1t.items()]
    out += [(f"rows without prefetch {k}{t}", f.noise) for t, fits in (("", r.rowwise), (" 1 thread", r.rowwise_1t))
            for k, f in fits.items()]
    out += [(f"repacked rows {k}{t}", f.noise) for t, fits in (("", r.repacked), (" 1 thread", r.repacked_1t))
            for k, f in fits.items()]
    out += [(f"whole experts {k}{t}", f.noise) for t, fits in (("", r.whole), (" 1 thread", r.whole_1t))
            for k, f in fits.items()]
    out += [(f"rows from a file in {k}", f.noise) for k, f in r.file_runs.items()]
    out += [(f"kernel from a file in {k}", f.noise) for k, f in r.kernel_file_runs.items()]
    out += [(name, res.noise) for name, res in (("prefill", r.prefill), ("prefill long", r.prefill_long),
                                                ("prefill dense", r.dense_prefill),
                                                ("prefill attention", r.attention_prefill)) if res]
    out += [(f"ggml prefill {k}", f.noise) for k, f in r.ggml_prefill.items()]
    out += [(f"ggml prefill {k} window", f.noise) for k, f in r.ggml_prefill_window.items()]
    out += [("layer loop", r.layer_loop.noise)] if r.layer_loop else []
    out += [("small layer loop", r.layer_loop_small.noise)] if r.layer_loop_small else []
    out += [(n, x.noise) for n, x in (("hit", r.hit), ("dense", r.dense), ("handover", r.handover)) if x]
    return out + [(f"disk {k}", n) for k, n in (r.disk.noise.items() if r.disk else ())]


def _m(value: float, method: str, date: str) -> Figure:
    return Figure(float(value), "measured", f"{date}, {method}")


def derived_block_rates(measured: dict[str, float], names: list[str], date: str, suffix: str = "") -> dict[str, Figure]:
    """cpu.expert_gbs for the GGUF block formats `names` that calibrate does not time (Q5_K, BF16, ...):
    each at the weights/s of the timed block format nearest in bits per weight (`measured`: {format:
    GB/s}), a K-quant's among the timed K-quants where there are any (super-blocks with packed
    sub-block scales decode alike, and slower than Q4_0 / Q8_0), times its own bits. Plain block formats
    decode alike (a scale or two per block, then integer products), so weights/s carries over between
    them; bytes/s does not, since bits differ."""
    from specs.formats import parse_format
    timed = {f: (parse_format(f).bits, gbs) for f, gbs in measured.items() if _is_block_key(f)}
    out: dict[str, Figure] = {}
    if not timed:  # the toy kernel: nothing to carry over
        return out
    for name in names:
        fmt = parse_format(name)
        if name in timed or fmt.codebook or not fmt.block_weights:
            continue
        kq = name.endswith("_K")
        src = min(timed, key=lambda f: (f.endswith("_K") != kq, abs(timed[f][0] - fmt.bits), f))
        bits, gbs = timed[src]
        gw = gbs * 8 / bits
        out[name + suffix] = Figure(gw * fmt.bits / 8, "derived",
                                    f"{date}: {src}{suffix}'s measured {gbs:.1f} GB/s = {gw:.1f} G weights/s at "
                                    f"{bits:.3g} bits (the timed block format nearest in bits), at {fmt.bits:.4g} bits")
    return out


def _is_block_key(key: str) -> bool:
    from specs.formats import parse_format
    try:
        return bool(parse_format(key).block_weights)
    except ValueError:
        return False


def _kernel_read_floor(r: Results) -> tuple[float, str] | None:
    """(GB/s, format) of the fastest CPU expert kernel of the run when its pool of experts is at least
    4x the last-level cache (so it read from DRAM): the memory delivers at least that much, whatever
    the memory benchmark's lower quintile says; None when the cache size is unknown or too large."""
    if not r.kernels or not r.llc_bytes or r.settings.kernel_pool_bytes < 4 * r.llc_bytes:
        return None
    fmt, f = max(r.kernels.items(), key=lambda kv: kv[1].expert_gbs)
    return f.expert_gbs, fmt


def typical_state(r: Results) -> Results:
    """`r` with each CPU kernel fit, and the decode layer loop, taken from their median clean rounds instead of their
    fastest (lower quintile): the machine's typical state, from which a run's mean is predicted (this VM's kernels
    spend tens of seconds at a time 2-20% below their fastest rounds, and a run averages over them; session 35)."""
    def med(fits: dict) -> dict:
        return {k: (dataclasses.replace(f, t_ms=f.t_ms_median, c_b_ms=f.c_b_ms_median) if f.t_ms_median else f)
                for k, f in fits.items()}

    def loop(ll):  # the layer loop's median round too: its cost beyond the kernels' rates, both typical
        return dataclasses.replace(ll, t_layer_ms=ll.t_layer_ms_median, typical=True) if ll and ll.t_layer_ms_median \
            else ll
    return dataclasses.replace(r, layer_loop=loop(r.layer_loop), layer_loop_small=loop(r.layer_loop_small),
                               **{name: med(getattr(r, name)) for name in (
                                   "kernels", "kernels_1t", "rowwise", "rowwise_1t", "repacked", "repacked_1t",
                                   "whole", "whole_1t", "file_runs", "kernel_file_runs")})


def build_profile(r: Results, base: HardwareSpec, date: str | None = None) -> HardwareSpec:
    """`base` with every figure the benchmarks measured replaced by its measurement."""
    date = date or today()
    s = r.settings
    data: dict[str, Any] = base.model_dump()  # figures as {value, source, ref}
    mem = data["memory"]
    notes: list[str] = []

    if r.mem:
        t, read = r.mem.figure("read")
        source = r.mem.method("read", t)
        floor = _kernel_read_floor(r)
        if floor and floor[0] > read:  # the kernels read more than that from DRAM in this very run
            source = (f"the {floor[1]} CPU expert kernel of this run, reading a pool of experts "
                      f"{r.settings.kernel_pool_bytes / r.llc_bytes:.0f}x the last-level cache (above the "
                      f"{read:.2f} GB/s of {source})")
            read = floor[0]
            notes.append(f"memory.efficiency raised to the {floor[1]} kernel's {read:.2f} GB/s read from DRAM")
        channels, mts = int(mem["channels"]), float(mem["mts"]["value"])
        peak = channels * mts * 8 / 1000.0
        ratio = read / peak
        known = mem["mts"]["source"] in ("datasheet", "measured", "reported")
        how = "known" if known else f"{mem['mts']['source']} ({mem['mts'].get('ref', '')})"
        if ratio > 1.0:
            new_mts = read * 1000.0 / (8 * channels)
            mem["mts"] = Figure(new_mts, "derived",
                                f"{date}: measured read {read:.1f} GB/s exceeds the base peak {peak:.1f} GB/s "
                                f"({channels} ch x {mts:g} MT/s); MT/s raised so the peak equals the measurement")
            ratio = 1.0
        mts_now = float(mem["mts"]) if isinstance(mem["mts"], Figure) else mts
        mem["efficiency"] = _m(ratio, f"{source}: {read:.2f} GB/s / peak "
                                      f"{channels} ch x {mts_now:g} MT/s = {channels * mts_now * 8 / 1000:.1f} GB/s "
                                      f"(channels/MT/s {how})", date)
        notes.append(f"memory.efficiency = measured read {read:.2f} GB/s ({t} threads; rounds at the start and "
                     f"the end of the run) / peak; "
                     f"channels and MT/s {'known' if known else 'assumed, so the peak is an assumption'}")

    consts: dict[str, Any] = dict(data.get("constants") or {})
    if r.kernels:
        fits = r.kernels
        default = DEFAULT_FORMAT if DEFAULT_FORMAT in fits else next(iter(fits))
        eg = dict(data["cpu"]["expert_gbs"])
        for fmt, f in fits.items():
            eg[fmt] = _m(f.expert_gbs, f.method(), date)
            consts[f"c_a_ms.{fmt}"] = _m(f.c_a_ms, f.method(), date)
            consts[f"c_b_ms.{fmt}"] = _m(f.c_b_ms, f.method(), date)
        d = fits[default]
        eg["default"] = _m(d.expert_gbs, f"as {default}: " + d.method(), date)
        for fmt, f in r.kernels_1t.items():  # read by expert_gbs_for(fmt, threads=1)
            eg[f"{fmt}@1t"] = _m(f.expert_gbs, f.method(), date)
        if default in r.kernels_1t:
            eg["default@1t"] = _m(r.kernels_1t[default].expert_gbs, f"as {default}: " + r.kernels_1t[default].method(), date)
        # the base's other block formats (an assumed table) from this machine's timed ones
        others = [k for k in eg if "@" not in k and _is_block_key(k)]
        eg.update(derived_block_rates({f: k.expert_gbs for f, k in fits.items()}, others, date))
        if r.kernels_1t:
            eg.update(derived_block_rates({f: k.expert_gbs for f, k in r.kernels_1t.items()}, others, date, "@1t"))
        consts["c_a_ms"] = _m(d.c_a_ms, f"as {default}: " + d.method(), date)
        consts["c_b_ms"] = _m(d.c_b_ms, f"as {default}: " + d.method(), date)
        data["cpu"]["expert_gbs"] = eg
        data["cpu"]["threads_used"] = d.threads
        notes.append(f"@ cpu.threads_used: measured: {date}, the threads the CPU expert kernel benchmark ran on")
    if r.rowwise:  # ggml's structure: the rates of llama.cpp plans (specs.hardware.CPU.rowwise_gbs)
        rw: dict[str, Any] = {}
        others = [k for k in data["cpu"]["expert_gbs"] if "@" not in k and _is_block_key(k)]
        for suffix, fits_rw in (("", r.rowwise), ("@1t", r.rowwise_1t)):
            for fmt, f in fits_rw.items():
                rw[fmt + suffix] = _m(f.expert_gbs, f.method(), date)
            if fits_rw:
                src = DEFAULT_FORMAT if DEFAULT_FORMAT in fits_rw else next(iter(fits_rw))
                rw["default" + suffix] = _m(fits_rw[src].expert_gbs, f"as {src}: " + fits_rw[src].method(), date)
                rw.update(derived_block_rates({f: k.expert_gbs for f, k in fits_rw.items()}, others, date, suffix))
        data["cpu"]["rowwise_gbs"] = rw
    # the in-place rows from files in short runs of pages (CPU.file_runs_gbs): '64KiB' -> 'Q8_0@1t'; the executor's
    # kernel so (CPU.kernel_file_runs_gbs)
    for field_, fits in (("file_runs_gbs", r.file_runs), ("kernel_file_runs_gbs", r.kernel_file_runs)):
        fr: dict[str, dict[str, Any]] = {}
        for key, f in fits.items():
            runs, fmt = key.split(" ")
            fr.setdefault(runs, {})[fmt] = _m(f.expert_gbs, f.method(), date)
        if fr:
            data["cpu"][field_] = fr
    if r.whole:  # the executor's decode structure: the rates of its jobs of whole experts (CPU.whole_gbs), '@1t' too
        data["cpu"]["whole_gbs"] = {fmt + suffix: _m(f.expert_gbs, f.method(), date)
                                    for suffix, fits_w in (("", r.whole), ("@1t", r.whole_1t))
                                    for fmt, f in fits_w.items()}
    if r.repacked:  # llama.cpp's repacked layout: the formats it repacks here (specs.hardware.CPU.repacked_gbs)
        data["cpu"]["repacked_gbs"] = {fmt + suffix: _m(f.expert_gbs, f.method(), date)
                                       for suffix, fits_rp in (("", r.repacked), ("@1t", r.repacked_1t))
                                       for fmt, f in fits_rp.items()}
    if r.ggml_prefill:  # ggml's prefill structures: the prefill rates of llama.cpp plans (CPU.ggml_prefill_gflops)
        data["cpu"]["ggml_prefill_gflops"] = {k: _m(f.gflops_per_core, f.method(), date) for k, f in r.ggml_prefill.items()}
    fixed = {k: (r.ggml_prefill[k], w) for k, w in r.ggml_prefill_window.items() if k in r.ggml_prefill}
    if fixed:  # the tiled GEMM at two batch sizes: the part a window of an expert's tokens shares (its unpacking)
        data["cpu"]["ggml_prefill_fixed_tokens"] = {
            k: _m(prefill_fixed_tokens(a.tokens_per_expert, a.gflops_per_core, w.tokens_per_expert, w.gflops_per_core),
                  f"{a.gflops_per_core:.1f} GFLOP/s a core at {a.tokens_per_expert:g} tokens an expert, "
                  f"{w.gflops_per_core:.1f} at {w.tokens_per_expert:g} ({w.method()}): a window's time as m + m0 "
                  f"tokens' multiply-adds", date) for k, (a, w) in fixed.items()}
        a = next(iter(fixed.values()))[0]
        data["cpu"]["ggml_prefill_ref_tokens"] = _m(a.tokens_per_expert, f"tokens an expert of the ggml prefill "
                                                    f"batches: {a.tokens} x top-{a.top_k} of {a.experts}", date)
    if r.l2_bytes and data["cpu"].get("l2_bytes") != r.l2_bytes:  # a base detected here has it, and its note
        data["cpu"]["l2_bytes"] = r.l2_bytes  # the executor's prefill GEMM sizes its token groups by it
        notes.append(f"@ cpu.l2_bytes: measured: {date}, read from sysfs (cpu0's level-2 cache)")
    if r.prefill and r.gemm_activations in EXECUTOR_PANEL_FLOATS:  # the integer GEMM's panels: its groups' tokens
        data["cpu"]["executor_gemm_activations"] = r.gemm_activations
        notes.append(f"@ cpu.executor_gemm_activations: measured: {date}, the build calibrate timed "
                     f"(executor.qgemm.gemm_activations)")
    elif r.prefill:  # the float GEMM: no integer panels, whatever a base said
        data["cpu"].pop("executor_gemm_activations", None)
    if r.prefill:
        pf = r.prefill
        consts["cpu_prefill_gflops_per_core"] = _m(pf.gflops_per_core, pf.method(), date)
        consts["cpu_prefill_ref_tokens"] = _m(pf.tokens_per_expert, f"tokens an expert of that batch: {pf.tokens} x "
                                              f"top-{pf.top_k} of {pf.experts}", date)
        if r.prefill_long:
            lg, st = r.prefill_long, r.settings
            # the job's products in the executor's token groups on this core's L2 (each group pays m0)
            gb = executor_prefill_group_bytes(r.l2_bytes, data["cpu"].get("isa") or [])
            groups = [executor_expert_groups(st.kernel_hidden, st.kernel_ffn, m, gb, data["cpu"].get(
                "executor_gemm_activations")) for m in (pf.tokens_per_expert, lg.tokens_per_expert)]
            m0 = prefill_fixed_tokens(pf.tokens_per_expert, pf.gflops_per_core, lg.tokens_per_expert,
                                      lg.gflops_per_core, *groups)
            consts["cpu_prefill_fixed_tokens"] = _m(m0, f"{pf.gflops_per_core:.1f} GFLOP/s a core at "
                                                    f"{pf.tokens_per_expert:g} tokens an expert, {lg.gflops_per_core:.1f} "
                                                    f"at {lg.tokens_per_expert:g} ({lg.method()}): time per expert "
                                                    f"product as m + g m0 tokens' multiply-adds, g its token groups "
                                                    f"({groups[0]:g} and {groups[1]:g})", date)
    if r.prefill and r.prefill_formats:  # the job's rate for each format: its products' speed over the job format's
        pf = r.prefill_formats
        data["cpu"]["prefill_format_share"] = {k: _m(v, pf.method(), date) for k, v in pf.shares.items()}
    for name, res in (("cpu_dense_gflops_per_core", r.dense_prefill), ("cpu_attention_gflops_per_core",
                                                                       r.attention_prefill)):
        if res:  # the host dense path of all-CPU prefill (simulator.resources.host_dense_s)
            consts[name] = _m(res.gflops_per_core, res.method(), date)
    if r.layer_loop and r.layer_loop.fmt in r.kernels and "F16" in r.kernels:
        f, fd = r.kernels[r.layer_loop.fmt], r.kernels["F16"]

        def rest(ll) -> tuple[float, float]:  # (MB the layer reads, ms beyond its bytes and job costs)
            return (ll.dense_bytes + ll.expert_bytes) / 1e6, ll.rest_ms(f, fd)
        (mb, ms), how = rest(r.layer_loop), r.layer_loop.method()
        paired = r.layer_loop.paired_rest_ms(f, fd)
        if paired is not None:  # what the loop's constant stands for (bench_layer_loop)
            gap = r.layer_loop.bytes_ms(f, fd, median=True) - r.layer_loop.bytes_ms(f, fd)
            how += (f"; at the kernels' rate of each round {paired:.3f} ms a layer beyond its bytes and job costs "
                    f"(median of the paired rounds), and the kernels' median rounds {gap:.3f} ms beyond the rates "
                    f"given here" + (": the paired figure is taken" if r.layer_loop.typical else ""))
        per_mb = 0.0
        if r.layer_loop_small is not None:
            mb0, ms0 = rest(r.layer_loop_small)
            per_mb = max(0.0, (ms - ms0) / (mb - mb0)) if mb > mb0 else 0.0
            how += (f"; and {r.layer_loop_small.method()}: {ms:.3f} ms beyond {mb:.1f} MB and {ms0:.3f} beyond "
                    f"{mb0:.1f} MB, split into a fixed part and one per MB")
            consts["cpu_layer_ms_per_mb"] = _m(per_mb, how, date)
        consts["cpu_layer_ms"] = _m(max(ms - per_mb * mb, 0.0),
                                    f"{how}; less its bytes at the F16 and {r.layer_loop.fmt} kernel rates of this "
                                    f"run plus their job costs", date)
    if r.hit:
        consts["t_hit_ms"] = _m(r.hit.t_hit_ms, r.hit.method(), date)
    if r.dense:
        consts["dense_gbs"] = _m(r.dense.gbs, r.dense.method(), date)
        if r.dense.device == "cuda" and data.get("gpu"):
            data["gpu"]["bw_gbs"] = _m(r.dense.gbs, r.dense.method(), date)
    if r.handover:
        consts["sync_ms"] = _m(r.handover.sync_ms, r.handover.method(), date)
    if r.h2d and data.get("pcie"):
        data["pcie"]["h2d_gbs"] = _m(r.h2d.pinned_gbs, r.h2d.method("pinned"), date)
        consts["pageable_h2d_gbs"] = _m(r.h2d.pageable_gbs, r.h2d.method("pageable"), date)
        consts["t_miss_ms"] = _m(r.h2d.t_miss_ms, f"torch.cuda H2D of one fp16 {s.hit_hidden}x{s.hit_ffn} expert "
                                 f"({r.h2d.expert_bytes / 1e6:.2f} MB) from pinned RAM + SwiGLU, mean", date)
    if r.disk:
        dk = r.disk
        nv = data["nvme"]
        nv["seq_read_gbs"] = _m(dk.seq_gbs, dk.method("seq"), date)
        nv["rand_4k_iops"] = _m(dk.qd_iops, dk.method("qd"), date)
        nv["latency_us"] = _m(dk.qd1_latency_us, dk.method("qd1"), date)
        consts["pagecache_4k_us"] = _m(dk.cached_us, dk.method("cached"), date)
    data["constants"] = consts
    l0, l1 = r.loadavg
    noise = noise_of(r)
    head = (f"calibrated ({s.label}) by moe-offload calibrate on {store.machine_id()} at {store.now_iso()}, "
            f"commit {store.git_commit()}; 1-min load average {l0:.2f} before, {l1:.2f} after; outside load "
            f"while timing (max mean share of the CPUs other processes used) "
            f"{max((x.others for _, x in noise), default=0.0):.2f}")
    notes += [f"noise {n}: {x.describe()}" for n, x in noise]
    stale = ("calibrated (", "noise ", "memory.efficiency = measured", "@ cpu.threads_used: measured",
             "typical state:")
    kept = [ln for ln in (data.get("notes") or "").splitlines() if not ln.startswith(stale)]
    data["notes"] = "\n".join([head, *notes, *kept]).strip()  # a re-calibration replaces the last one's lines
    return HardwareSpec.model_validate(data)


def _noise(add, case: str, n: Noise) -> None:
    add(case, "outside_cpu_share", n.others, windows=n.windows, clean_windows=n.clean,
        method="(busy CPU from /proc/stat - this process) / (wall x CPUs), mean over timing windows")


def store_rows(r: Results) -> list[dict]:
    """One results-store row per measured figure (median and repeat counts as extra columns)."""
    s = r.settings
    rows = []

    def add(case, metric, value, **extra):
        rows.append(store.make_row(f"calibrate:{case}", metric, float(value), mode=s.label, **extra))

    if r.mem:
        for k, per in r.mem.low.items():
            for t, v in per.items():
                add(f"mem_{k}", "gbs", v, threads=t, size_bytes=r.mem.array_bytes, median=r.mem.median[k][t],
                    best=r.mem.best[k][t], method=r.mem.method(k, t))
        _noise(add, "mem", r.mem.noise)
    kv = kernel_version() if r.kernels and "toy-f32" not in r.kernels else "toy"
    for fmt, f in r.kernels.items():
        case = f"cpu_kernel_{fmt}"
        add(case, "c_a_ms", f.c_a_ms, threads=f.threads, kernel=kv, method=f.method())
        add(case, "c_b_ms", f.c_b_ms, threads=f.threads, kernel=kv, method=f.method())
        add(case, "expert_gbs", f.expert_gbs, threads=f.threads, size_bytes=f.expert_bytes, kernel=kv,
            method=f.method())
        if f.t_ms_median:  # the typical state beside the fast one the profile keeps
            add(case, "expert_gbs_median", f.expert_gbs_median, threads=f.threads, size_bytes=f.expert_bytes,
                kernel=kv, method=f.method())
        add(case, "rms_residual_rel", f.rms_rel, threads=f.threads, kernel=kv, method=f.method())
        _noise(add, case, f.noise)
        for k, t, res in zip(f.ks, f.t_ms, f.residuals_ms):
            add(case, "job_ms", t, experts=k, residual_ms=res, threads=f.threads, kernel=kv, method=f.method())
    for fmt, f in r.kernels_1t.items():
        add(f"cpu_kernel_{fmt}_1t", "expert_gbs", f.expert_gbs, threads=1, size_bytes=f.expert_bytes, kernel=kv,
            method=f.method())
    for kind, suffix, fits_rw in (("rowwise", "", r.rowwise), ("rowwise", "_1t", r.rowwise_1t),
                                  ("repacked", "", r.repacked), ("repacked", "_1t", r.repacked_1t),
                                  ("whole", "", r.whole), ("whole", "_1t", r.whole_1t)):
        for fmt, f in fits_rw.items():
            add(f"cpu_{kind}_{fmt}{suffix}", "expert_gbs", f.expert_gbs, threads=f.threads, size_bytes=f.expert_bytes,
                kernel=kv, method=f.method())
            if f.t_ms_median:
                add(f"cpu_{kind}_{fmt}{suffix}", "expert_gbs_median", f.expert_gbs_median, threads=f.threads,
                    size_bytes=f.expert_bytes, kernel=kv, method=f.method())
    for key, f, kind in ([(k, f, "file_runs") for k, f in r.file_runs.items()]
                         + [(k, f, "kernel_file_runs") for k, f in r.kernel_file_runs.items()]):
        case = f"cpu_{kind}_" + key.replace(" ", "_").replace("@", "_")  # '64KiB Q8_0@1t' -> cpu_file_runs_64KiB_Q8_0_1t
        add(case, "expert_gbs", f.expert_gbs, threads=f.threads, size_bytes=f.expert_bytes, kernel=kv,
            method=f.method())
    for case, ll in (("cpu_layer_loop", r.layer_loop), ("cpu_layer_loop_small", r.layer_loop_small)):
        if ll:
            add(case, "t_layer_ms", ll.t_layer_ms, threads=ll.threads, kernel=kv, method=ll.method())
    for case, pf in (("cpu_prefill", r.prefill), ("cpu_prefill_long", r.prefill_long),
                     ("cpu_prefill_dense", r.dense_prefill), ("cpu_prefill_attention", r.attention_prefill)):
        if pf:
            add(case, "gflops_per_core", pf.gflops_per_core, threads=pf.threads, kernel=kv,
                tokens=pf.tokens, method=pf.method())
            _noise(add, case, pf.noise)
    if r.prefill_formats:  # each format's prefill products over the job format's, one core
        pfs = r.prefill_formats
        for fmt, share in pfs.shares.items():
            add(f"cpu_prefill_share_{fmt}", "share", share, threads=1, kernel=kv, tokens=pfs.tokens,
                method=pfs.method())
    for suffix, table in (("", r.ggml_prefill), ("_window", r.ggml_prefill_window)):
        for key, pf in table.items():
            case = "cpu_ggml_prefill_" + key.replace(":", "_").replace("@", "_") + suffix
            add(case, "gflops_per_core", pf.gflops_per_core, threads=pf.threads, kernel=kv, tokens=pf.tokens,
                method=pf.method())
    for name, x in (("t_hit", r.hit), ("dense", r.dense), ("handover", r.handover)):
        if x:
            _noise(add, name, x.noise)
    if r.hit:
        add("t_hit", "ms", r.hit.t_hit_ms, size_bytes=r.hit.expert_bytes, device=r.hit.device, method=r.hit.method())
    if r.dense:
        add("dense", "gbs", r.dense.gbs, size_bytes=r.dense.matrix_bytes, median=r.dense.median_gbs,
            device=r.dense.device, method=r.dense.method())
    if r.h2d:
        add("h2d_pinned", "gbs", r.h2d.pinned_gbs, size_bytes=r.h2d.nbytes, method=r.h2d.method("pinned"))
        add("h2d_pageable", "gbs", r.h2d.pageable_gbs, size_bytes=r.h2d.nbytes, method=r.h2d.method("pageable"))
        add("t_miss", "ms", r.h2d.t_miss_ms, size_bytes=r.h2d.expert_bytes, method="H2D one expert + SwiGLU")
    if r.handover:
        add("handover", "sync_ms", r.handover.sync_ms, device=r.handover.device, method=r.handover.method())
        add("handover", "thread_ms", r.handover.thread_ms, method="queue hand-off to a worker thread and back")
    if r.handover_cross:
        add("handover_cross_core", "sync_ms", r.handover_cross.sync_ms, device=r.handover_cross.device,
            method=r.handover_cross.method())
        add("handover_cross_core", "thread_ms", r.handover_cross.thread_ms, method=r.handover_cross.method())
    if r.disk:
        dk = r.disk
        add("disk_qd1", "latency_us", dk.qd1_latency_us, size_bytes=dk.file_bytes, method=dk.method("qd1"))
        add("disk_qd1", "iops", dk.qd1_iops, size_bytes=dk.file_bytes, method=dk.method("qd1"))
        add(f"disk_qd{dk.qd}", "iops", dk.qd_iops, size_bytes=dk.file_bytes, method=dk.method("qd"))
        add("disk_seq", "gbs", dk.seq_gbs, size_bytes=dk.file_bytes, method=dk.method("seq"))
        add("pagecache_4k", "us", dk.cached_us, size_bytes=dk.file_bytes, method=dk.method("cached"))
        add("pagecache_4k", "iops", dk.cached_iops, size_bytes=dk.file_bytes, method=dk.method("cached"))
    for stage, w in r.wall_s.items():
        add("wall", "s", w, stage=stage)
    add("loadavg", "before", r.loadavg[0])
    add("loadavg", "after", r.loadavg[1])
    return rows


