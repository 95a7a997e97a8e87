"""calibrate's prefill stages: the executor's prefill job (its expert GEMM at two batch sizes, each kernel format's
products against the job's, the dense block and its attention) and the structures llama.cpp's ggml gives each format
on a prompt's batch, each into calibrate's Results (calibration.profile turns them into the profile's figures)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numba

from .bench_kernel import (bench_prefill, dense_less_attention, executor_dense_prefill_jobs, executor_prefill_jobs,
                           kernel_version)
from .profile import DEFAULT_FORMAT
from .settings import Settings

if TYPE_CHECKING:
    from .calibrate import Results, _Budget as Budget


def executor_prefill(s: Settings, r: Results, formats, pg, bud: Budget) -> str:
    """Time the executor's prefill job in the default format (or the first of `formats`) at prefill_tokens and
    prefill_long_tokens (r.prefill, r.prefill_long: m0 from the two), the other formats' products against it on one
    core (r.prefill_formats), and the dense block whole and its attention alone at dense_prefill_tokens
    (r.dense_prefill: the block less its attention) -> the job's format."""
    from executor.qgemm import gemm_activations  # the label says which GEMM the rate is of
    t0 = time.perf_counter()
    fmt = DEFAULT_FORMAT if DEFAULT_FORMAT in formats else formats[0]
    tick = pg.stage(f"CPU prefill batch {fmt}", s.prefill_repeats)
    long = s.prefill_long_tokens > s.prefill_tokens  # and the same experts at pp512's size: m0
    jobs = executor_prefill_jobs(fmt, s.kernel_hidden, s.kernel_ffn, s.prefill_experts, s.prefill_top_k,
                                 (s.prefill_tokens, s.prefill_long_tokens) if long else (s.prefill_tokens,))
    run, flops = jobs[0]
    r.gemm_activations = gemm_activations()
    r.prefill = bench_prefill(run, flops, s.prefill_repeats,
                              label=f"executor.cpu_experts.moe_cpu@{kernel_version()} {fmt} SwiGLU "
                                    f"{s.kernel_hidden}x{s.kernel_ffn}, {gemm_activations()} activations",
                              tokens=s.prefill_tokens, experts=s.prefill_experts,
                              top_k=s.prefill_top_k, threads=numba.get_num_threads(), tick=tick,
                              budget_s=bud.take("prefill", s.prefill_budget_s))
    del run
    if long:
        tick = pg.stage(f"CPU prefill batch {fmt}, {s.prefill_long_tokens} tokens", s.prefill_repeats)
        run, flops = jobs[1]
        r.prefill_long = bench_prefill(run, flops, s.prefill_repeats, label=r.prefill.label,
                                       tokens=s.prefill_long_tokens, experts=s.prefill_experts,
                                       top_k=s.prefill_top_k, threads=numba.get_num_threads(), tick=tick,
                                       budget_s=bud.take("prefill", s.prefill_budget_s))
        del run
    del jobs
    if s.prefill_format_tokens:  # the job's rate for the other formats: their products' speed over its
        from .bench_prefill_formats import prefill_format_shares
        prev = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            r.prefill_formats = prefill_format_shares(formats, fmt, s.kernel_hidden, s.kernel_ffn,
                                                      s.prefill_format_tokens, s.prefill_format_rounds)
        finally:
            numba.set_num_threads(prev)
    if s.dense_prefill_tokens:  # the block whole, then its attention alone: the dense path the difference
        parts = executor_dense_prefill_jobs(s.kernel_hidden, tokens=s.dense_prefill_tokens,
                                            n_experts=s.prefill_experts)
        res = {}
        for (run, flops), what in zip(parts, ("block", "attention")):
            tick = pg.stage(f"CPU prefill {what}, {s.dense_prefill_tokens} tokens", s.prefill_repeats)
            res[what] = bench_prefill(run, flops, s.prefill_repeats, tokens=s.dense_prefill_tokens,
                                      experts=0, top_k=0, threads=numba.get_num_threads(), tick=tick,
                                      label=f"executor.{'dense_kernels' if what == 'block' else 'attention'}"
                                            f"@{kernel_version()} F16 attention block of {s.kernel_hidden}, "
                                            + ("whole (attention_step, norm_route): Q/K/V, output and "
                                               "router products" if what == "block"
                                               else "causal attention from position 0"),
                                      budget_s=bud.take("prefill", s.prefill_budget_s))
        r.attention_prefill = res["attention"]
        r.dense_prefill = dense_less_attention(res["block"], res["attention"])
        del parts, run
    r.wall_s["prefill"] = time.perf_counter() - t0
    return fmt


def ggml_prefill(s: Settings, r: Results, formats, maxt: int, pg, bud: Budget, ggml=None) -> None:
    """Time the prefill structures ggml gives these formats here (bench_ggml_prefill) into r.ggml_prefill, on all
    the threads and on one, the tiled GEMM's again at a full window (into r.ggml_prefill_window); the threads are
    reset to all after. The vecdot and repacked structures run ggml's own kernels where `ggml` has them
    (bench_ggml_own)."""
    from . import bench_ggml_prefill as BG
    from .detect import cpu_info
    from .ggml_binary import weighting_job
    t0 = time.perf_counter()
    isa = cpu_info()["isa"]
    dense = BG.dense_job(isa) if s.dense_prefill_tokens else None  # F16 on llamafile's tinyBLAS, at a prompt's batch
    weighting = BG.WEIGHTING if s.dense_prefill_tokens else None  # the expert outputs times their weights, any CPU
    own = (({(f, "vecdot") for f in ggml.vec_dot} | {(f, "repacked") for f in ggml.gemv if "avx2" in isa})
           if ggml else frozenset())  # ggml's x86 8x8 gemvs: llama.cpp's ARM layouts are 4 wide
    jobs = BG.profile_jobs(formats, isa, own) + ([dense] if dense else []) + ([weighting] if weighting else [])
    for fmt, path in jobs:
        label = None
        if (fmt, path) == dense:
            tokens, experts = s.dense_prefill_tokens, 0
            run, flops = BG.ggml_dense_prefill_job(s.kernel_hidden, tokens=tokens)
        elif (fmt, path) == weighting:
            tokens, experts = s.dense_prefill_tokens, s.prefill_top_k
            run, flops = weighting_job(s.kernel_hidden, s.prefill_top_k, tokens)
        else:
            tokens = BG.job_tokens(path, s.ggml_prefill_tokens, s.ggml_prefill_experts, s.ggml_prefill_experts)
            experts = s.ggml_prefill_experts
            if (fmt, path) in own:
                from .bench_ggml_own import own_prefill_job, own_prefill_label
                run, flops = own_prefill_job(ggml, fmt, path, s.kernel_hidden, s.kernel_ffn, experts, experts, tokens)
                label = own_prefill_label(ggml, fmt, path, s.kernel_hidden, s.kernel_ffn)
            else:
                run, flops = BG.ggml_prefill_job(fmt, path, s.kernel_hidden, s.kernel_ffn, experts, experts, tokens)
        _time_ggml_job(s, r.ggml_prefill, run, flops, fmt, path, tokens, experts, maxt, pg, bud, len(jobs), label)
        del run
        if path == "tiled" and s.ggml_prefill_window_tokens > tokens:  # again at a full window: its shared part
            tokens = s.ggml_prefill_window_tokens
            run, flops = BG.ggml_prefill_job(fmt, path, s.kernel_hidden, s.kernel_ffn, experts, experts, tokens)
            _time_ggml_job(s, r.ggml_prefill_window, run, flops, fmt, path, tokens, experts, maxt, pg, bud, len(jobs))
            del run
    numba.set_num_threads(min(maxt, numba.config.NUMBA_NUM_THREADS))
    r.wall_s["ggml prefill"] = time.perf_counter() - t0


def _time_ggml_job(s: Settings, into: dict, run, flops: float, fmt: str, path: str, tokens: int, experts: int,
                   maxt: int, pg, bud: Budget, n_jobs: int, label: str | None = None) -> None:
    """Time one ggml prefill structure on all the threads and on one into `into` ('KEY', 'KEY@1t'); `label`: its
    method line (default: the rebuild's, bench_ggml_prefill.label)."""
    from specs.formats import llamacpp_prefill_key
    from . import bench_ggml_prefill as BG
    for one in ((False, True) if maxt > 1 else (False,)):
        numba.set_num_threads(1 if one else min(maxt, numba.config.NUMBA_NUM_THREADS))
        key = llamacpp_prefill_key(fmt, path) + ("@1t" if one else "")
        what = f"CPU prefill, ggml's {path} structure {fmt}, {tokens} tokens" + (", 1 thread" if one else "")
        tick = pg.stage(what, s.ggml_prefill_repeats)
        into[key] = bench_prefill(run, flops, s.ggml_prefill_repeats,
                                  label=label or BG.label(fmt, path, s.kernel_hidden, s.kernel_ffn),
                                  tokens=tokens, experts=experts, top_k=experts, threads=numba.get_num_threads(),
                                  tick=tick, budget_s=bud.take(key, s.prefill_budget_s / n_jobs))
