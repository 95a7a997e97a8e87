"""A CPU decode layer loop: what a layer costs beyond its bytes at the kernels' rates when attention blocks and
expert jobs alternate, as a CPU-only engine runs them (the profile's `cpu_layer_ms` and `cpu_layer_ms_per_mb`).

Each round times one token through `layers` synthetic layers and, next to it, jobs of the kernel benchmark's own
pool covering about the same bytes: the kernels' rate at that moment. Paired so, alternating costs next to nothing:
a 46.4 MB layer -0.001-0.096 ms beyond its bytes (of 1.28-1.86 ms a layer; five quick runs, 2026-12-06 16:49-16:59),
and the typical-state profile (`calibrate --typical-out`) takes that figure: its per-MB constant 0.0001-0.0018 ms/MB
in those runs, where the loop's median round against the kernels' median rounds, sampled minutes apart, gave
0-0.0063.

The default profile keeps the loop's lower quintile against the kernels' fastest rounds. On this VM the kernels
spend tens of seconds at a time 2-25% below their fastest rounds (benchmarks/bench_drift.py), so that residual is
mostly the kernels' median-over-fastest gap of the run (0.12-0.29 ms a layer at 46.4 MB in those runs): the state
from which the mean of a run is predicted, and why the per-MB constant swung 0-0.0105 ms/MB over sixteen profiles
of 2026-12-06 (0-0.0091 in those five runs). Replacing it by the paired figure plus that gap, on the profiles and
llama-bench sittings of tests/calibration/data/zen4-2026-12-06f, moved llama.cpp's tg64 errors from -6.2 / -0.3 /
-3.6 / +1.2% to -2.5 / +4.5 / +1.8 / +9.0% (one / two threads, in place / repacked): no better, so it was not
taken, as on 2026-11-30 (README, "Tried and not kept: the layer loop timed paired"). `python
benchmarks/bench_layer_loop.py --runs 5` gives each run's figures.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import numba
import numpy as np

from .bench_kernel import KernelFit, _synth_tensor
from .sampling import Noise, Passes, Tick, low_quantile


def executor_layer_loop(fmt: str = "Q8_0", hidden: int = 2048, ffn: int = 768, n_experts: int = 32, top_k: int = 8,
                        layers: int = 8, head_dim: int = 64, seed: int = 0):
    """(run, dense_bytes, expert_bytes): one decode token through `layers` synthetic layers, each an
    F16 attention block (executor.dense_kernels.attention_step) then top_k of n_experts `fmt`
    experts (executor.cpu_experts.moe_cpu, rows split across threads: the engine-neutral structure the
    profile's kernel rates are measured with), as a CPU-only engine runs them; bytes per layer."""
    from executor import cpu_experts
    from executor.dense_kernels import attention_step
    rng = np.random.default_rng(seed)
    nh = max(1, hidden // (4 * head_dim))  # a quarter of the hidden width in query heads, half that in K/V
    nkv = max(1, nh // 2)

    def f16(rows, cols):
        a = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16).view(np.uint8).ravel()
        a.setflags(write=False)
        return a
    att = [(f16(nh * head_dim, hidden), f16(nkv * head_dim, hidden), f16(nkv * head_dim, hidden),
            f16(hidden, nh * head_dim)) for _ in range(layers)]
    exp = [(_synth_tensor(fmt, n_experts, ffn, hidden, rng), _synth_tensor(fmt, n_experts, ffn, hidden, rng),
            _synth_tensor(fmt, n_experts, hidden, ffn, rng)) for _ in range(layers)]
    ones_h, ones_d = np.ones(hidden, np.float32), np.ones(head_dim, np.float32)
    cos, sin = np.ones((1, head_dim // 2), np.float32), np.zeros((1, head_dim // 2), np.float32)
    kc = np.zeros((1, nkv, 64, head_dim), np.float32)
    vc = np.zeros_like(kc)
    routes = [cpu_experts.csr(np.argsort(rng.random((1, n_experts)), axis=1)[:, :top_k],
                          np.full((1, top_k), 1.0 / top_k, np.float32)) for _ in range(4 * layers)]
    state = {"i": 0}

    x = rng.standard_normal((1, hidden)).astype(np.float32)  # every layer's input (values don't matter to
    a = np.empty_like(x)                                      # the timing; random weights would blow them up)
    y = np.empty_like(x)

    def run():
        for layer in range(layers):
            wq, wk, wv, wo = att[layer]
            attention_step(x, ones_h, 1e-6, wq, 1, nh * head_dim, wk, 1, nkv * head_dim, wv, 1, nkv * head_dim,
                           ones_d, ones_d, cos, sin, nh, nkv, True, True, kc, vc, 32, 1, wo, 1, hidden, a, False)
            state["i"] += 1
            y[:] = 0.0
            cpu_experts.moe_cpu(*exp[layer], a, *routes[state["i"] % len(routes)], out=y, whole=False)
    dense = sum(w.nbytes for w in att[0])
    expert = top_k * sum(t.expert_bytes for t in exp[0])
    return run, dense, expert


@dataclass
class LayerLoop:
    """One decode layer (attention block, then top-k experts) timed in a loop over distinct layers."""

    t_layer_ms: float  # lower quintile
    dense_bytes: int
    expert_bytes: int
    fmt: str
    threads: int
    repeats: int
    noise: Noise = field(default_factory=Noise)
    t_layer_ms_median: float = 0.0  # the median round: the typical state (profile.typical_state)
    # paired rounds: each round's layer (ms) and, timed next to it, `job_n` jobs of `job_k` experts of the kernel
    # benchmark's pool (ms for one job); empty where the loop ran alone
    round_layer_ms: list[float] = field(default_factory=list)
    round_job_ms: list[float] = field(default_factory=list)
    job_k: int = 0
    job_n: int = 0
    typical: bool = False  # t_layer_ms is the median round (profile.typical_state)

    def method(self) -> str:
        return (f"executor kernels, F16 attention ({self.dense_bytes / 1e6:.1f} MB) then {self.fmt} experts "
                f"({self.expert_bytes / 1e6:.1f} MB) per layer, a loop over distinct layers: "
                f"{self.t_layer_ms:.3f} ms a layer (lower quintile of {self.repeats}), {self.threads} threads, "
                + (f"each round next to {self.job_n} jobs of {self.job_k} experts of the {self.fmt} kernel "
                   f"benchmark, " if self.round_job_ms else "") + self.noise.describe())

    def bytes_ms(self, f_exp: KernelFit, f_dense: KernelFit, median: bool = False) -> float:
        """ms a layer's bytes take at the fits' rates (their median rounds where `median` and kept)."""
        def gbs(f):
            return f.expert_gbs_median if median and f.expert_gbs_median else f.expert_gbs
        return self.dense_bytes / (gbs(f_dense) * 1e6) + self.expert_bytes / (gbs(f_exp) * 1e6)

    def paired_rest_ms(self, f_exp: KernelFit, f_dense: KernelFit) -> float | None:
        """ms a layer takes beyond its bytes at the kernels' rate of its own round and its two job costs (c_a of
        each kernel), the median over the paired rounds (None where the loop ran alone): each round's rate is the
        fits' scaled by that round's jobs against `f_exp`'s time for such a job, so the state the machine is in
        cancels. What alternating attention and experts costs; 0.00-0.04 ms at 46.4 MB a layer here."""
        if not (self.round_job_ms and self.job_k and f_exp.c_b_ms > 0):
            return None
        here, c_a = self.bytes_ms(f_exp, f_dense), f_dense.c_a_ms + f_exp.c_a_ms
        per_job = self.job_k * f_exp.c_b_ms  # the fit's job beyond its fixed cost
        return statistics.median(t - here * max(j - f_exp.c_a_ms, 0.0) / per_job - c_a
                                 for t, j in zip(self.round_layer_ms, self.round_job_ms))

    def rest_ms(self, f_exp: KernelFit, f_dense: KernelFit) -> float:
        """ms a layer takes beyond its bytes at the fits' rates and its two job costs: paired where `typical` (the
        fits are the kernels' median rounds, profile.typical_state), else the loop's lower quintile against the fits
        (their fastest rounds). The second carries the kernels' state: on this VM mostly what their median rounds
        take beyond their fastest (module doc), which the profile's predictions of a run's mean need."""
        paired = self.paired_rest_ms(f_exp, f_dense) if self.typical else None
        if paired is not None:
            return paired
        return self.t_layer_ms - self.bytes_ms(f_exp, f_dense) - f_dense.c_a_ms - f_exp.c_a_ms


class LayerLoopBench:
    """`executor_layer_loop` tokens timed around outside load, in one or more passes; with `job` (run_job, expert
    bytes: the kernel benchmark's, bench_kernel.executor_expert_job), each token next to jobs of top_k of its pool's
    experts covering about the token's bytes (at least one), walking the pool."""

    def __init__(self, fmt: str = "Q8_0", threads: int | None = None,
                 job: tuple[Callable[[int, int], object], int] | None = None, **shape):
        self.fmt, self.threads = fmt, int(threads or numba.get_num_threads())
        self.run, self.dense, self.expert = executor_layer_loop(fmt, **shape)
        self.layers = int(shape.get("layers", 8))
        self.job_k = self.job_n = 0
        self.run()  # JIT and page-in
        if job is not None:
            run_job, eb = job
            self.job_k = int(shape.get("top_k", 8))
            self.job_n = max(1, round(self.layers * (self.dense + self.expert) / (self.job_k * eb)))
            cursor = [0]

            def jobs():
                for _ in range(self.job_n):
                    run_job(self.job_k, cursor[0])
                    cursor[0] += self.job_k
            jobs()

        def one(i):
            t0 = time.perf_counter()
            self.run()
            out = [("token", time.perf_counter() - t0)]
            if job is not None:
                t0 = time.perf_counter()
                jobs()
                out.append(("jobs", time.perf_counter() - t0))
            return out
        self.passes = Passes(one, keys=2 if job is not None else 1)

    def sample(self, repeats: int, budget_s: float, tick: Tick = None) -> None:
        self.passes.sample(repeats, budget_s, tick)

    def result(self) -> LayerLoop:
        p = self.passes
        per_layer = [t * 1e3 / self.layers for t in p.times["token"]]
        paired = self.job_n and len(p.times.get("jobs", ())) == len(per_layer)
        return LayerLoop(t_layer_ms=low_quantile(per_layer), dense_bytes=self.dense, expert_bytes=self.expert,
                         fmt=self.fmt, threads=self.threads, repeats=p.repeats, noise=p.noise,
                         t_layer_ms_median=float(np.median(per_layer)),
                         round_layer_ms=per_layer if paired else [],
                         round_job_ms=[t * 1e3 / self.job_n for t in p.times["jobs"]] if paired else [],
                         job_k=self.job_k if paired else 0, job_n=self.job_n if paired else 0)
