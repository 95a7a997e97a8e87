"""`moe-offload calibrate`: run the microbenchmarks and write a measured hardware profile.

The profile has the schema of the built-in ones; every figure the benchmarks produce is marked
`measured` with the date and the method, merged over `--hw-base` (a datasheet profile) or, without
one, over what `detect_hardware` reads off this machine. Constants for the simulator:

    t_hit_ms        one resident expert's SwiGLU for one token on the torch device (time per hit)
    sync_ms         device sync + hand-off to a CPU worker thread and back (per handover)
    c_a_ms, c_b_ms  CPU expert job: fixed cost per job and cost per expert (default format),
                    and `c_a_ms.<FMT>` / `c_b_ms.<FMT>` for every benchmarked format
    cpu_prefill_gflops_per_core  the same kernel on a prefill batch (64 tokens, default format), at
                    `cpu_prefill_ref_tokens` tokens an expert; `cpu_prefill_fixed_tokens` from the same batch at
                    512 tokens: an expert product's cost beyond its multiply-adds, in tokens' worth of them
    cpu_layer_ms    a CPU-only decode layer (attention block, then the experts) timed in a loop, less
                    its bytes at the kernels' rates and its two job costs; on two layer sizes, split
                    into a fixed part and `cpu_layer_ms_per_mb` (per MB the layer reads). Each round is
                    paired with the kernel benchmark's jobs: alternating itself costs next to nothing, and
                    the per-MB part is mostly the kernels' median rounds beyond their fastest
                    (bench_layer_loop.py)
    dense_gbs       the dense path's matrix-vector bandwidth on the torch device
    pagecache_4k_us a 4 KiB read served from the page cache
    t_miss_ms       (CUDA) copy one expert from pinned RAM and compute it

and, beside `cpu.expert_gbs` (the executor's kernel), `cpu.rowwise_gbs`: the same expert jobs one weight
row per dot product without software prefetch, as llama.cpp's ggml runs them (bench_rowwise.py; ggml's own int8
arithmetic where it is rebuilt: Q8_0, Q4_0, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS), the rates of the simulator's llama.cpp plans; and `cpu.repacked_gbs`:
the formats llama.cpp repacks on this CPU (Q4_0 and Q4_K on AVX2, Q2_K on AVX-512 F) in its layout, 8 rows a pass by
ggml's q4_0 / q4_K / q2_K 8x8 gemv, the rates of llama.cpp plans that repack. With `--ggml-lib` (a llama.cpp
build's libggml-cpu.so) both, and ggml's vecdot and repacked prefill products, time ggml's own kernels instead
(bench_ggml_own.py; on the Zen 4 VM its repacked gemvs streamed 13.7-14.1 / 23.3-23.4 / 20.7-20.8 GB/s on one
thread for Q2_K / Q4_K / Q4_0 where the rebuilds ran 17.2-17.5 / 28.0-28.2 / 21.6-22.0 and perf of llama-bench's
tg64 finds 12.3 / 20.9 / 18.6, session 46);
and `cpu.whole_gbs`: the executor's jobs of experts that split evenly over the threads, each expert start
to end on one thread, as its decode runs a token's top-k (the rates of its own plans' such jobs).

Statistics, chosen on `benchmarks/bench_drift.py` (which estimator reproduces between runs on
this VM): expert-kernel jobs take their fastest clean round; prefill, layer-loop, hit and handover
timings the lower quintile of their repeats (other processes only ever add time); memory
bandwidths the lower quintile of their rounds (the bandwidth jumps ~20% up for tens of seconds at
a time, so the best round says whether a run caught a burst). Medians and bests go to the results
store next to each figure.

Nothing is written until every benchmark has finished: the profile goes out atomically
(`write_atomic`), then the results store gets all rows in one locked append. Ctrl-C at any point
before that leaves the previous profile and the store as they were.
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numba

from simulator.policies import whole_experts_per_thread
from specs.formats import llamacpp_repacks, parse_format
from specs.hardware import HardwareSpec
from specs.loaders import dump_hardware, write_atomic

from . import page_runs as PR

if TYPE_CHECKING:
    from .bench_prefill_formats import FormatShares  # imports the executor's kernels: loaded in the stage
from . import store
from .bench_device import DenseResult, H2DResult, HitResult, bench_dense, bench_h2d, bench_hit, torch_device
from .bench_disk import DiskResult, bench_disk
from .bench_handover import HandoverResult, bench_handover
from .bench_kernel import (KernelBench, KernelFit, PrefillResult, executor_expert_job, executor_kernel_available,
                           kernel_version, toy_expert_job)
from .bench_layer_loop import LayerLoop, LayerLoopBench
from .bench_memory import MemBandwidth, MemoryBench, default_thread_counts
from .settings import FULL, QUICK, TINY, Settings
from .prefill_stage import executor_prefill, ggml_prefill
from .profile import build_profile, noise_of, store_rows, typical_state

# the settings' presets and profile.noise_of are re-exported: callers know them as calibrate's
__all__ = ["Settings", "QUICK", "FULL", "TINY", "Results", "calibrate", "measure_profile", "run_benchmarks",
           "kernel_pool_for", "constants_of", "noise_of"]


@dataclass
class Results:
    """Raw benchmark results of one run, and the store rows they make."""

    settings: Settings
    mem: MemBandwidth | None = None
    kernels: dict[str, KernelFit] = field(default_factory=dict)
    kernels_1t: dict[str, KernelFit] = field(default_factory=dict)  # the same on one thread
    rowwise: dict[str, KernelFit] = field(default_factory=dict)  # ggml's structure (bench_rowwise)
    rowwise_1t: dict[str, KernelFit] = field(default_factory=dict)
    repacked: dict[str, KernelFit] = field(default_factory=dict)  # llama.cpp's repacked layout (bench_rowwise)
    repacked_1t: dict[str, KernelFit] = field(default_factory=dict)
    whole: dict[str, KernelFit] = field(default_factory=dict)  # whole experts per thread (the executor's decode)
    whole_1t: dict[str, KernelFit] = field(default_factory=dict)
    # the rowwise jobs on pools in files in runs of Settings.page_runs_kib, keyed '64KiB Q8_0', '64KiB Q8_0@1t'
    file_runs: dict[str, KernelFit] = field(default_factory=dict)
    kernel_file_runs: dict[str, KernelFit] = field(default_factory=dict)  # the executor's kernel so, keyed the same
    prefill: PrefillResult | None = None
    prefill_long: PrefillResult | None = None  # the same batch at Settings.prefill_long_tokens
    prefill_formats: FormatShares | None = None  # each format's prefill products over the job format's
    dense_prefill: PrefillResult | None = None  # an attention block's products at Settings.dense_prefill_tokens
    attention_prefill: PrefillResult | None = None  # its causal attention, the same prompt
    # ggml's prefill structures (bench_ggml_prefill), keyed 'Q4_K:tiled', 'Q8_0@1t' (specs.formats.llamacpp_prefill_key)
    ggml_prefill: dict[str, PrefillResult] = field(default_factory=dict)
    ggml_prefill_window: dict[str, PrefillResult] = field(default_factory=dict)  # the tiled ones at a full window
    layer_loop: LayerLoop | None = None
    layer_loop_small: LayerLoop | None = None  # the same loop on a layer a quarter as wide: the fixed part
    llc_bytes: int | None = None  # last-level cache of this machine (sysfs), when readable
    l2_bytes: int | None = None  # one core's L2 (sysfs): the executor's prefill GEMM sizes its token groups by it
    gemm_activations: str | None = None  # what the prefill job's GEMM ran on (executor.qgemm.gemm_activations)
    hit: HitResult | None = None
    dense: DenseResult | None = None
    h2d: H2DResult | None = None
    disk: DiskResult | None = None
    handover: HandoverResult | None = None
    handover_cross: HandoverResult | None = None
    wall_s: dict[str, float] = field(default_factory=dict)
    loadavg: tuple[float, float] = (0.0, 0.0)


# ---------------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------------

class _Progress:
    """rich progress bars (one per benchmark) or nothing."""

    def __init__(self, enabled: bool, console=None):
        self.p = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
            console = console or Console(stderr=True)  # stdout stays for the command's own output
            self.p = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=console, transient=False)

    def __enter__(self):
        if self.p:
            self.p.__enter__()
        return self

    def __exit__(self, *exc):
        if self.p:
            self.p.__exit__(*exc)

    def stage(self, name: str, total: int) -> Callable[[], None]:
        if not self.p:
            return lambda: None
        tid = self.p.add_task(name, total=max(1, total))
        return lambda: self.p.advance(tid)


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


class _Budget:
    """Splits the run's total waiting budget: a stage gets its own budget, or less when the
    stages still to come would otherwise overrun `total_s` (each keeps its share)."""

    def __init__(self, s: Settings, n_kernels: int, cuda: bool):
        self.t0 = time.perf_counter()
        self.total = s.total_budget_s
        self.left = {"mem": s.mem_budget_s, "prefill": s.prefill_budget_s, "layers": s.prefill_budget_s,
                     "hit": s.hit_budget_s, "dense": s.dense_budget_s,
                     "handover": 1.5 * s.handover_budget_s, "disk": 3 * s.disk_budget_s}
        for i in range(n_kernels):
            self.left[f"kernel{i}"] = s.kernel_budget_s
            self.left[f"kernel1t{i}"] = s.kernel_budget_s / 3

    def take(self, key: str, own: float) -> float:
        share = self.left.pop(key, own)
        remaining = self.total - (time.perf_counter() - self.t0)
        pending = share + sum(self.left.values())
        return max(0.2, min(own, remaining * share / pending if pending > 0 else own))


def kernel_pool_for(s: Settings, llc: int | None, avail: int | None) -> Settings:
    """`s` with each format's pool of synthetic experts at least kernel_pool_llc_times x the last-level cache `llc`
    (bytes), so that its jobs read DRAM, as a model's experts do: a 2-core Xeon VM (2026-12-05) reports a 300 MiB
    L3 and read a 128 MiB array at 43 GB/s, 192 MiB and more at 23-25, where the quick profile's 128 MiB pools put
    ggml's rebuilt Q8_0 rows at 16.5 GB/s against 13.8-14.8 from a 1 GiB pool. Every format's pool stays alive
    through the run, so together they stay within a third of `avail` (bytes of available memory); so do the pools in
    files of the page-run jobs, which live a format at a time (page_runs.format_pool_bytes: page_runs_pool_bytes'
    first or second each, a pool shared by llama.cpp's rows and the executor's kernel counted once)."""
    if s.kernel_pool_llc_times and llc:
        want = s.kernel_pool_llc_times * llc
        if avail:
            want = min(want, avail // (3 * max(1, len(s.kernel_formats))))
        s = replace(s, kernel_pool_bytes=max(s.kernel_pool_bytes, int(want)))
    if avail and s.page_runs_kib:
        first, other = s.page_runs_pool_bytes
        total = PR.format_pool_bytes(s, s.kernel_formats)
        if total > avail // 3:
            s = replace(s, page_runs_pool_bytes=(first * (avail // 3) // total, other * (avail // 3) // total))
    return s


def _kernel_job(s: Settings, fmt: str, use_exec: bool, whole: bool = False):
    """(run_job, expert bytes, label) of the CPU expert kernel benchmark for `fmt` (whole: whole experts per
    thread, the executor's decode structure)."""
    if use_exec:
        job, eb = executor_expert_job(fmt, s.kernel_hidden, s.kernel_ffn, s.kernel_pool_bytes, max_k=max(s.kernel_ks),
                                      whole=whole)
        return job, eb, _kernel_label(s, fmt, whole)
    job, eb = toy_expert_job(rows=s.kernel_ffn, cols=s.kernel_hidden, pool=2 * max(s.kernel_ks))
    return job, eb, f"toy numba f32 kernel {s.kernel_ffn}x{s.kernel_hidden}"


def _kernel_label(s: Settings, fmt: str, whole: bool = False) -> str:
    """The method line of the executor's expert kernel's rate for `fmt` (whole: whole experts per thread)."""
    import gguf
    from executor.gguf_model import EXPERT_TYPES
    from executor.row_products import rows_activations  # the label says which rows the rate is of
    acts = rows_activations(EXPERT_TYPES[gguf.GGMLQuantizationType[fmt]])
    return (f"executor.cpu_experts.moe_cpu@{kernel_version()} {fmt} SwiGLU {s.kernel_hidden}x{s.kernel_ffn}, 1 token, "
            f"{acts} activations, " + ("whole experts per thread" if whole else "rows split across threads"))


def _decode_jobs(formats, isa: list[str], ggml=None) -> list[tuple]:
    """(kind, fmt, make_job, what) of the decode jobs of llama.cpp's plans: 'rowwise' (in place) for every format with
    a kernel, 'repacked' for those llama.cpp repacks on a CPU with `isa`; on ggml's own kernels where `ggml` has them."""
    from . import bench_rowwise as BR
    from .bench_ggml_own import own_repacked_job, own_rowwise_job
    jobs = []
    for fmt in formats:
        if ggml is not None and fmt in ggml.vec_dot:
            jobs.append(("rowwise", fmt, partial(own_rowwise_job, ggml), "ggml's own rows"))
        elif fmt in BR.FORMATS:
            jobs.append(("rowwise", fmt, BR.rowwise_expert_job, "rows without prefetch"))
    for fmt in formats:
        if not llamacpp_repacks(parse_format(fmt), isa):
            continue
        if ggml is not None and fmt in ggml.gemv and "avx2" in isa:  # its x86 8x8 layouts (ARM's are 4 wide)
            jobs.append(("repacked", fmt, partial(own_repacked_job, ggml), "ggml's own repacked rows"))
        elif fmt in BR.REPACKED_FORMATS:
            jobs.append(("repacked", fmt, BR.repacked_expert_job, "repacked rows"))
    return jobs


def _page_run_jobs(s: Settings, formats, isa: list[str], ggml=None, folder: str | os.PathLike = ".") -> list[tuple]:
    """page_runs.page_run_jobs of `formats` with llama.cpp's in-place rows where _decode_jobs times them here."""
    rowwise = {fmt: make for kind, fmt, make, _ in _decode_jobs(formats, isa, ggml) if kind == "rowwise"}
    return PR.page_run_jobs(s, rowwise, formats, str(folder))


def _time_page_runs(s: Settings, r: Results, jobs: list[tuple], maxt: int, pg, bud: _Budget, ggml=None) -> None:
    """Time one format's page-run jobs (page_runs.by_format) into r.file_runs (llama.cpp's rows, '64KiB Q8_0@1t')
    and r.kernel_file_runs (the executor's kernel, the same keys): each on all the threads and on one, a job's rate
    from its fewest and most experts (its slope is all it gives), the executor's as its decode runs (whole experts
    per thread, cpu.whole_gbs, at the job sizes that split evenly: on one thread, every job). Every job is built first,
    then all are sampled in turn, a window each, twice over: a reference and its short runs see the same spells of
    the VM's speed. The pools, in files, go when this returns, so the next format's take their frames again: on the
    Firecracker VM a frame the guest has not touched for ~20 s costs ~5 s a GiB to touch again, and the pools kept
    to a second pass at the run's end took 14 s of a 72-s quick run (session 52)."""
    n = max(3, s.kernel_repeats // 3)
    benches = []
    for kind, fmt, make_job, what in jobs:
        for one in ((False, True) if maxt > 1 else (False,)):
            t0 = time.perf_counter()
            key = f"{kind} {fmt}" + ("@1t" if one else "")
            threads = 1 if one else min(maxt, numba.config.NUMBA_NUM_THREADS)
            numba.set_num_threads(threads)
            even = [k for k in s.kernel_ks if whole_experts_per_thread([1] * k, threads)]
            kernel = kind.startswith("kernel-")
            whole = kernel and len(even) > 1  # the executor's decode structure, on one thread too (session 53)
            label = _kernel_label(s, fmt, whole) if kernel else _decode_label(ggml, "rowwise", fmt, s.kernel_hidden,
                                                                              s.kernel_ffn)
            tick = pg.stage(f"CPU {what} {fmt}" + (", 1 thread" if one else ""), n)
            job, eb = make_job(fmt, s.kernel_hidden, s.kernel_ffn, s.kernel_pool_bytes, max_k=max(s.kernel_ks),
                               **({"whole": True} if whole else {}))
            ks = (min(even), max(even)) if whole else (min(s.kernel_ks), max(s.kernel_ks))
            kb = KernelBench(job, ks, eb, label=f"{label}, {what}", threads=threads)
            benches.append((key, kb, threads, tick, bud.take(key, s.kernel_budget_s / 3)))
            r.wall_s[key] = time.perf_counter() - t0  # writing its pool (the first job on it) and its warm-up
    for want in ((n + 1) // 2, n // 2):
        for key, kb, threads, tick, budget in benches:
            t0 = time.perf_counter()
            numba.set_num_threads(threads)
            kb.sample(want, budget * want / n, tick)
            r.wall_s[key] += time.perf_counter() - t0
    for key, kb, *_ in benches:
        into = r.kernel_file_runs if key.startswith("kernel-") else r.file_runs
        into[key.removeprefix("kernel-")] = kb.result()
    numba.set_num_threads(min(maxt, numba.config.NUMBA_NUM_THREADS))
    del benches, kb, job
    gc.collect()  # a KernelBench's job refers to the bench itself: only the collector frees it, and its pool, now


def _decode_label(ggml, kind: str, fmt: str, hidden: int, ffn: int) -> str:
    """The method line of a decode job's rate: ggml's own kernel's where `ggml` has it, else the rebuild's."""
    from . import bench_rowwise as BR
    from .bench_ggml_own import own_label
    repacked = kind == "repacked"
    if ggml is not None and fmt in (ggml.gemv if repacked else ggml.vec_dot):
        return own_label(ggml, fmt, hidden, ffn, repacked=repacked)
    return BR.label(fmt, hidden, ffn, repacked=repacked)


def run_benchmarks(s: Settings, progress: bool = True, console=None,
                   disk_dir: str | os.PathLike | None = None, ggml=None) -> Results:
    """Run every benchmark once (numba kernels before torch: torch's OpenMP threads spin after
    each op and would steal the cores the numba kernels measure). `ggml`: a llama.cpp build's kernels
    (ggml_library.GgmlCpu): the decode jobs of llama.cpp's plans run them where it has them, the rebuilds elsewhere."""
    import torch
    from .detect import cache_bytes, llc_bytes, mem_info
    llc = llc_bytes()
    s = kernel_pool_for(s, llc, mem_info().get("MemAvailable"))
    r = Results(settings=s, llc_bytes=llc, l2_bytes=cache_bytes(2))
    l0 = _loadavg()
    threads = list(s.threads or default_thread_counts())
    maxt = max(threads)
    use_exec = not s.toy_kernel and executor_kernel_available()
    formats = s.kernel_formats if use_exec else ("toy-f32",)
    bud = _Budget(s, len(formats), torch.cuda.is_available())
    with _Progress(progress, console) as pg:
        t0 = time.perf_counter()
        first = (s.mem_repeats + 1) // 2
        tick = pg.stage("memory bandwidth", s.mem_repeats)
        membench = MemoryBench(s.mem_bytes, threads)
        mem_budget = bud.take("mem", s.mem_budget_s)
        membench.sample(first, mem_budget * first / s.mem_repeats, tick=tick)
        r.wall_s["memory"] = time.perf_counter() - t0

        # the expert kernels and the layer loop are sampled in two passes, now and at the end of the
        # run (`Passes`): the VM's speed changes for tens of seconds at a time
        kbenches: dict[str, KernelBench] = {}
        ticks: dict[str, Callable[[], None]] = {}
        budgets: dict[str, float] = {}
        loop = small = None
        k_first, l_first = (s.kernel_repeats + 1) // 2, (s.prefill_repeats + 1) // 2
        n1 = max(3, s.kernel_repeats // 3)
        n1_first = (n1 + 1) // 2
        prev = numba.get_num_threads()
        numba.set_num_threads(min(maxt, numba.config.NUMBA_NUM_THREADS))
        try:
            for i, fmt in enumerate(formats):  # first pass; the second runs at the end
                t0 = time.perf_counter()
                ticks[fmt] = pg.stage(f"CPU expert kernel {fmt}", s.kernel_repeats)
                job, eb, label = _kernel_job(s, fmt, use_exec)
                kb = kbenches[fmt] = KernelBench(job, s.kernel_ks, eb, label=label, threads=numba.get_num_threads())
                budgets[fmt] = bud.take(f"kernel{i}", s.kernel_budget_s)
                kb.sample(k_first, budgets[fmt] * k_first / s.kernel_repeats, ticks[fmt])
                r.wall_s[f"kernel {fmt}"] = time.perf_counter() - t0
            if maxt > 1:  # one core: a bus-bound kernel gets more than 1/threads of the all-core rate
                numba.set_num_threads(1)
                for i, fmt in enumerate(formats):
                    t0 = time.perf_counter()
                    key = f"{fmt}@1t"
                    ticks[key] = pg.stage(f"CPU expert kernel {fmt}, 1 thread", n1)
                    job, eb, label = _kernel_job(s, fmt, use_exec)
                    kb = kbenches[key] = KernelBench(job, s.kernel_ks, eb, label=label, threads=1)
                    budgets[key] = bud.take(f"kernel1t{i}", s.kernel_budget_s / 3)
                    kb.sample(n1_first, budgets[key] * n1_first / n1, ticks[key])
                    r.wall_s[f"kernel {fmt} 1 thread"] = time.perf_counter() - t0
                numba.set_num_threads(min(maxt, numba.config.NUMBA_NUM_THREADS))
            if use_exec:  # the same jobs in ggml's structure: the rates of the simulator's llama.cpp plans
                from .detect import cpu_info
                isa = cpu_info()["isa"]  # llama.cpp repacks Q2_K only with AVX-512 F: time what it repacks here
                for kind, fmt, make_job, what in _decode_jobs(formats, isa, ggml):
                    for one in ((False, True) if maxt > 1 else (False,)):
                        t0 = time.perf_counter()
                        key = f"{kind} {fmt}" + ("@1t" if one else "")
                        numba.set_num_threads(1 if one else min(maxt, numba.config.NUMBA_NUM_THREADS))
                        ticks[key] = pg.stage(f"CPU {what} {fmt}" + (", 1 thread" if one else ""), n1)
                        job, eb = make_job(fmt, s.kernel_hidden, s.kernel_ffn, s.kernel_pool_bytes,
                                           max_k=max(s.kernel_ks))
                        kb = kbenches[key] = KernelBench(job, s.kernel_ks, eb, threads=numba.get_num_threads(),
                                                         label=_decode_label(ggml, kind, fmt, s.kernel_hidden,
                                                                             s.kernel_ffn))
                        budgets[key] = bud.take(key, s.kernel_budget_s / 3)
                        kb.sample(n1_first, budgets[key] * n1_first / n1, ticks[key])
                        r.wall_s[key] = time.perf_counter() - t0
                # the executor's decode structure, where a job's experts split evenly over the threads (its jobs of
                # those sizes only): whole experts per thread (cpu.whole_gbs, the executor's plans); on one thread
                # too, where every decode job runs so (its rows split ran Q4_K_M 1.44x slower there, session 53)
                for one in ((False, True) if maxt > 1 else (False,)):
                    nt = 1 if one else min(maxt, numba.config.NUMBA_NUM_THREADS)
                    numba.set_num_threads(nt)
                    ks = [k for k in s.kernel_ks if whole_experts_per_thread([1] * k, nt)]
                    for fmt in formats if len(ks) > 1 else ():
                        t0 = time.perf_counter()
                        key = f"whole {fmt}" + ("@1t" if one else "")
                        ticks[key] = pg.stage(f"CPU whole experts per thread {fmt}" + (", 1 thread" if one else ""),
                                              n1)
                        job, eb, label = _kernel_job(s, fmt, use_exec, whole=True)
                        kb = kbenches[key] = KernelBench(job, ks, eb, label=label, threads=nt)
                        budgets[key] = bud.take(key, s.kernel_budget_s / 3)
                        kb.sample(n1_first, budgets[key] * n1_first / n1, ticks[key])
                        r.wall_s[key] = time.perf_counter() - t0
                numba.set_num_threads(min(maxt, numba.config.NUMBA_NUM_THREADS))
            if use_exec:
                fmt = executor_prefill(s, r, formats, pg, bud)
                ggml_prefill(s, r, formats, maxt, pg, bud, ggml)
                # the pools in files go last before the layer loop, whose experts take their frames again
                for unit in PR.by_format(_page_run_jobs(s, formats, isa, ggml, disk_dir or ".")):
                    _time_page_runs(s, r, unit, maxt, pg, bud, ggml)
                t0 = time.perf_counter()
                lf = "Q8_0" if "Q8_0" in formats else fmt
                ticks["layers"] = pg.stage(f"CPU decode layer loop {lf}", s.prefill_repeats)
                # each token next to jobs of the kernel benchmark's own pool: the kernels' rate at that moment
                job = (kbenches[lf].run_job, kbenches[lf].expert_bytes)
                loop = LayerLoopBench(lf, threads=numba.get_num_threads(), job=job, hidden=s.kernel_hidden,
                                      ffn=s.kernel_ffn, n_experts=s.prefill_experts, top_k=s.prefill_top_k)
                # and on a layer about a twentieth of the bytes: what a layer costs beyond its bytes has a fixed part
                # and a part that grows with them (the kernels run slower between attention blocks)
                small = LayerLoopBench(lf, threads=numba.get_num_threads(), job=job,
                                       hidden=max(32, s.kernel_hidden // 4), ffn=max(32, s.kernel_ffn // 3),
                                       n_experts=s.prefill_experts,
                                       top_k=max(1, s.prefill_top_k // 2))
                budgets["layers"] = bud.take("layers", s.prefill_budget_s)
                loop.sample(l_first, budgets["layers"] * l_first / s.prefill_repeats, ticks["layers"])
                small.sample(l_first, budgets["layers"] * l_first / s.prefill_repeats / 4)
                r.wall_s["layer loop"] = time.perf_counter() - t0
        finally:
            numba.set_num_threads(prev)

        torch_threads = torch.get_num_threads()
        torch.set_num_threads(maxt)
        try:
            t0 = time.perf_counter()
            tick = pg.stage(f"per-hit time ({torch_device().type})", s.hit_repeats)
            r.hit = bench_hit(s.hit_hidden, s.hit_ffn, s.hit_pool_bytes, s.hit_calls, s.hit_repeats, tick=tick,
                              budget_s=bud.take("hit", s.hit_budget_s))
            r.wall_s["hit"] = time.perf_counter() - t0

            t0 = time.perf_counter()
            tick = pg.stage("dense path", s.dense_repeats)
            r.dense = bench_dense(s.dense_bytes, repeats=s.dense_repeats, tick=tick,
                                  budget_s=bud.take("dense", s.dense_budget_s))
            r.wall_s["dense"] = time.perf_counter() - t0

            if torch.cuda.is_available():
                t0 = time.perf_counter()
                tick = pg.stage("H2D pinned/pageable", 2 * s.h2d_repeats + 1)
                r.h2d = bench_h2d(s.h2d_bytes, s.h2d_repeats, s.hit_hidden, s.hit_ffn, tick=tick)
                r.wall_s["h2d"] = time.perf_counter() - t0

            t0 = time.perf_counter()
            tick = pg.stage("device/CPU handover", max(1, s.handover_iters // 50))
            hb = bud.take("handover", 1.5 * s.handover_budget_s)
            r.handover = bench_handover(s.handover_iters, tick=tick, budget_s=hb * 2 / 3)
            r.handover_cross = bench_handover(s.handover_iters, budget_s=hb / 3,
                                              same_core=False)  # results store only: it swings
            r.wall_s["handover"] = time.perf_counter() - t0
        finally:
            torch.set_num_threads(torch_threads)

        t0 = time.perf_counter()
        tick = pg.stage("disk 4 KiB random reads", 5)
        r.disk = bench_disk(s.disk_bytes, s.disk_qd1_reads, s.disk_qd_reads, s.disk_qd,
                            s.disk_cached_reads, directory=disk_dir, seq_passes=s.disk_seq_passes,
                            qd_passes=s.disk_qd_passes, tick=tick,
                            budget_s=bud.take("disk", 3 * s.disk_budget_s) / 3)
        r.wall_s["disk"] = time.perf_counter() - t0

        t0 = time.perf_counter()  # second passes, a run's length after the first
        prev = numba.get_num_threads()
        numba.set_num_threads(min(maxt, numba.config.NUMBA_NUM_THREADS))
        try:
            for key, kb in kbenches.items():
                one, kind = key.endswith("@1t"), key.split(" ")[0] if " " in key else "kernels"
                n, first_n = (n1, n1_first) if one or kind != "kernels" else (s.kernel_repeats, k_first)
                numba.set_num_threads(1 if one else min(maxt, numba.config.NUMBA_NUM_THREADS))
                if n > first_n:
                    kb.sample(n - first_n, budgets[key] * (1 - first_n / n), ticks[key])
                dest = getattr(r, kind + ("_1t" if one else ""))  # kernels, rowwise, repacked or whole
                dest[key.split(" ")[-1].removesuffix("@1t")] = kb.result()
            numba.set_num_threads(min(maxt, numba.config.NUMBA_NUM_THREADS))
            if loop is not None:
                if s.prefill_repeats > l_first:
                    loop.sample(s.prefill_repeats - l_first, budgets["layers"] * (1 - l_first / s.prefill_repeats),
                                ticks["layers"])
                    small.sample(s.prefill_repeats - l_first, budgets["layers"] * (1 - l_first / s.prefill_repeats) / 4)
                r.layer_loop, r.layer_loop_small = loop.result(), small.result()
        finally:
            numba.set_num_threads(prev)
        kbenches.clear()
        r.wall_s["second passes"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if s.mem_repeats > first:
            membench.sample(s.mem_repeats - first, mem_budget * (s.mem_repeats - first) / s.mem_repeats, tick=tick)
        r.mem = membench.result()
        membench.free()
        r.wall_s["memory"] += time.perf_counter() - t0
    r.loadavg = (l0, _loadavg())
    return r


def measure_profile(s: Settings, base: HardwareSpec, progress: bool = True, console=None,
                    disk_dir: str | os.PathLike | None = None, ggml=None) -> tuple[HardwareSpec, Results]:
    """Run the benchmarks and merge them over `base`; writes nothing."""
    r = run_benchmarks(s, progress=progress, console=console, disk_dir=disk_dir, ggml=ggml)
    return build_profile(r, base), r


def _check_writable(path: Path, what: str) -> None:
    """Fail before any benchmark runs when `path`'s folder cannot take a file (SpecError, exit 2)."""
    from specs.errors import SpecError
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.with_name(f".{path.name}.probe{os.getpid()}")
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise SpecError(str(path), None, f"{what}: {e.strerror or e}") from None


def calibrate(quick: bool = True, out: Path | str = "calibrated.yaml", hw_base: HardwareSpec | None = None,
              progress: bool = True, *, settings: Settings | None = None, store_path: Path | str | None = None,
              console=None, disk_dir: str | os.PathLike | None = None,
              typical_out: Path | str | None = None, ggml_lib: str | os.PathLike | None = None) -> HardwareSpec:
    """Measure this machine and write the profile to `out` (atomically); returns it.

    `hw_base`: a profile the measurements are merged over (default: `detect_hardware()`).
    `store_path`: the results store (default `store.default_store_path()`); every measured figure
    is appended there after the profile is written. `settings` overrides QUICK/FULL (tests use
    TINY). `typical_out`: the same run's typical-state profile too (profile.typical_state: each CPU kernel
    from its median clean rounds, where `out` has its fastest). `ggml_lib`: a llama.cpp build's libggml-cpu.so (or
    its folder; 'auto': where ggml_library.find_ggml_cpu finds one) whose own kernels time llama.cpp's decode
    (default None: the rebuilds). Ctrl-C before the end writes nothing."""
    s = settings or (QUICK if quick else FULL)
    _check_writable(Path(out), "cannot write the profile")
    if typical_out is not None:
        _check_writable(Path(typical_out), "cannot write the typical-state profile")
    _check_writable(Path(store_path or store.default_store_path()), "cannot write the results store")
    if disk_dir is not None:
        _check_writable(Path(disk_dir) / ".moe-offload-probe", "cannot create the disk benchmark's file")
    if hw_base is None:
        from .detect import detect_hardware
        hw_base = detect_hardware(measure=False, path=disk_dir or ".")
    ggml = _ggml_cpu(ggml_lib, s, progress, console)
    hw, r = measure_profile(s, hw_base, progress=progress, console=console, disk_dir=disk_dir, ggml=ggml)
    if progress:
        from rich.console import Console
        con = console or Console(stderr=True)
        for name, n in noise_of(r):
            if n.used_all:
                con.print(f"[yellow]note[/]: {name}: {n.describe()} - other processes were busy; "
                          f"re-run on a quiet machine for steadier figures")
    rows = store_rows(r)
    write_atomic(out, dump_hardware(hw))
    if typical_out is not None:
        typ = build_profile(typical_state(r), hw_base)
        typ = typ.model_copy(update={"notes": (typ.notes + "\ntypical state: each CPU kernel's rate from its median "
                                               "clean rounds (calibration.profile.typical_state)").strip()})
        write_atomic(typical_out, dump_hardware(typ))
    store.append_rows(store_path or store.default_store_path(), [{**row, "profile": str(out)} for row in rows])
    return hw


def _ggml_cpu(ggml_lib, s: Settings, progress: bool, console):
    """The llama.cpp build's kernels `ggml_lib` names (None: none), said on the console. A library named outright
    that does not load is an error (SpecError); one found by 'auto' that does not is a note, and the rebuilds run."""
    from specs.errors import SpecError
    from .ggml_library import find_ggml_cpu, load_ggml_cpu
    if ggml_lib is None:
        return None
    try:
        path = find_ggml_cpu(ggml_lib)
        ggml = load_ggml_cpu(path, s.kernel_formats) if path is not None else None
    except SpecError as e:
        if str(ggml_lib) != "auto":
            raise
        ggml, path = None, e
    if progress:
        from rich.console import Console
        con = console or Console(stderr=True)
        con.print(ggml.describe() if ggml is not None else
                  f"no llama.cpp build's kernels ({path}): llama.cpp's decode is timed on the rebuilds" if path
                  else "no llama.cpp build found (--ggml-lib PATH): llama.cpp's decode is timed on the rebuilds")
    return ggml


def constants_of(hw: HardwareSpec) -> dict[str, float]:
    """The measured figures of a calibrated profile, flat (for comparing two runs)."""
    out: dict[str, float] = {}
    for k, v in hw.constants.items():
        out[f"constants.{k}"] = float(v)
    for k, v in hw.cpu.expert_gbs.items():
        if v.source == "measured":
            out[f"cpu.expert_gbs.{k}"] = float(v)
    out["memory.usable_gbs"] = hw.memory.usable_gbs
    for k in ("seq_read_gbs", "rand_4k_iops", "latency_us"):
        out[f"nvme.{k}"] = float(getattr(hw.nvme, k))
    if hw.gpu is not None:
        out["gpu.bw_gbs"] = float(hw.gpu.bw_gbs)
    if hw.pcie is not None:
        out["pcie.h2d_gbs"] = float(hw.pcie.h2d_gbs)
    return out
