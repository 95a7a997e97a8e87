"""CPU expert kernel: time per job against experts per job for any kernel (`bench_expert_kernel`),
fitted to t = c_a + c_b * k with scipy least squares; `executor_expert_job` adapts the executor's
numba kernels (executor/cpu_experts.py) to it, per weight format.

`tick` arguments are progress callbacks (one call per unit of work); sizes are arguments so tests
run the same code on tiny inputs.
"""
from __future__ import annotations

import copy
import os
import tempfile
import time
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numba
import numpy as np
from numba import njit, prange

from .page_layout import map_file, write_in_runs
from .sampling import Noise, Passes, Tick, low_quantile, sample_clean


@dataclass
class KernelFit:
    """t(k) = c_a + c_b * k (ms) fitted over experts per job, with the fit's residuals."""

    label: str
    expert_bytes: int
    ks: list[int]
    t_ms: list[float]  # time per job at each k (fastest clean round)
    c_a_ms: float
    c_b_ms: float
    residuals_ms: list[float]
    rms_rel: float  # rms of residual / measured
    threads: int
    repeats: int
    noise: Noise = field(default_factory=Noise)
    # the same fit on each k's median clean round: the machine's typical state, where t_ms is its fast one
    t_ms_median: list[float] = field(default_factory=list)
    c_b_ms_median: float = 0.0

    @property
    def expert_gbs(self) -> float:
        """GB/s of expert weights the kernel sustains (bytes of one expert / c_b), in the fastest rounds."""
        return self._gbs(self.c_b_ms, self.t_ms)

    @property
    def expert_gbs_median(self) -> float:
        """The same from the median rounds, GB/s (0 where they were not kept)."""
        return self._gbs(self.c_b_ms_median, self.t_ms_median) if self.t_ms_median else 0.0

    def _gbs(self, c_b_ms: float, t_ms: list[float]) -> float:
        per = c_b_ms
        if per <= 0:  # degenerate fit (jobs too small to see the per-expert cost): whole job / k
            per = max(t / k for t, k in zip(t_ms, self.ks))
        return self.expert_bytes / (per * 1e-3) / 1e9

    def method(self) -> str:
        typical = f" (median rounds: {self.expert_gbs_median:.2f} GB/s)" if self.t_ms_median else ""
        return (f"{self.label}: job time (fastest of {self.repeats}) at k={self.ks} experts "
                f"({self.expert_bytes / 1e6:.2f} MB each), "
                f"{self.threads} threads, least-squares fit c_a + c_b k{typical}, rms residual "
                f"{100 * self.rms_rel:.1f}%, {self.noise.describe()}")


def fit_job_costs(ks: Sequence[float], t_ms: Sequence[float]) -> tuple[float, float, np.ndarray]:
    """Least-squares c_a, c_b >= 0 for t = c_a + c_b k; returns (c_a, c_b, residuals = fit - t)."""
    from scipy.optimize import least_squares
    k = np.asarray(ks, float)
    t = np.asarray(t_ms, float)
    slope = np.polyfit(k, t, 1)[0] if len(k) > 1 else t[0] / max(k[0], 1)
    x0 = [max(t.min() - max(slope, 0) * k.min(), 1e-6), max(slope, 1e-6)]
    sol = least_squares(lambda p: (p[0] + p[1] * k - t) / np.maximum(t, 1e-9), x0,
                        bounds=([0.0, 0.0], [np.inf, np.inf]))
    c_a, c_b = (float(v) for v in sol.x)
    return c_a, c_b, c_a + c_b * k - t


class KernelBench:
    """Jobs of k experts through `run_job(k, first)` (positions first .. first + k - 1 of the job's pool in its
    shuffled order, modulo its size: token_experts), sampled in one or more passes (`sample`), fitted by `result`.

    `first` walks the pool: each job starts where the job before it ended, so no expert is read again
    before the whole pool (>= 4x the last-level cache in calibrate) has been read in between. Jobs that
    started at i * k instead re-read experts the job of the previous k had just left in the cache
    (k = 6 began inside k = 4's experts, k = 8 inside k = 6's): the larger jobs ran partly from cache and
    the fitted cost per expert fell. Side by side in one process (2 threads, Zen 4, 2026-12-01): the
    rowwise Q8_0 job's fit 42.3 GB/s with a 7.5% rms residual that way, 37.2 GB/s and 0.9% walking; the
    executor's Q8_0 job 43.3 against 35.8; Q4_0, bound by its arithmetic, 23.3 against 23.1.

    A round times every k once (interleaved: a burst of outside load hits every k alike); rounds
    run while other processes used the CPUs are set aside (`sample_clean`). Each k's time is the
    fastest of its clean samples: on this VM the kernels run ~25% slower for tens of seconds at a
    time, and the fastest round reproduces between runs where quantiles say whether a run caught
    such a spell (`benchmarks/bench_drift.py`: Q4_0 p90 spread 2% for the best, 12% for the upper
    quintile of rates). The fit is relative least squares (each point weighted by 1/t) so small
    jobs count as much as big ones."""

    def __init__(self, run_job: Callable[[int, int], object], ks: Sequence[int], expert_bytes: int,
                 label: str = "kernel", threads: int | None = None):
        self.ks = [int(k) for k in ks]
        self.expert_bytes, self.label = int(expert_bytes), label
        self.threads = int(threads or numba.get_num_threads())
        self.run_job = run_job
        self.first = 0  # the next job's first expert

        def job(k: int) -> float:
            """One job of k experts from the cursor (s)."""
            t0 = time.perf_counter()
            run_job(k, self.first)
            self.first += k
            return time.perf_counter() - t0

        for k in self.ks:  # warm-up (and JIT)
            job(k)

        def one_round(i):
            return [(k, job(k)) for k in self.ks]
        self.passes = Passes(one_round, keys=len(self.ks))

    def sample(self, repeats: int, budget_s: float, tick: Tick = None) -> None:
        """`repeats` clean rounds more (one tick each)."""
        self.passes.sample(repeats, budget_s, tick)

    def result(self) -> KernelFit:
        t_ms = [min(self.passes.times[k]) * 1e3 for k in self.ks]
        c_a, c_b, res = fit_job_costs(self.ks, t_ms)
        rel = res / np.asarray(t_ms)
        t_med = [float(np.median(self.passes.times[k])) * 1e3 for k in self.ks]
        return KernelFit(label=self.label, expert_bytes=self.expert_bytes, ks=self.ks, t_ms=t_ms, c_a_ms=c_a,
                         c_b_ms=c_b, residuals_ms=[float(r) for r in res], rms_rel=float(np.sqrt(np.mean(rel ** 2))),
                         threads=self.threads, repeats=self.passes.repeats, noise=self.passes.noise,
                         t_ms_median=t_med, c_b_ms_median=fit_job_costs(self.ks, t_med)[1])


def bench_expert_kernel(run_job: Callable[[int, int], object], ks: Sequence[int], expert_bytes: int,
                        repeats: int = 15, label: str = "kernel", threads: int | None = None,
                        tick: Tick = None, budget_s: float = 10.0) -> KernelFit:
    """`KernelBench` in one pass of `repeats` rounds (within `budget_s`); `repeats` ticks."""
    kb = KernelBench(run_job, ks, expert_bytes, label, threads)
    kb.sample(repeats, budget_s, tick)
    return kb.result()


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _toy_kernel(w, experts, x, out):
    """A tiny expert kernel: out += W_e x for each expert e (f32 rows split across threads)."""
    R = w.shape[1]
    for r in prange(R):
        acc = np.float32(0.0)
        for i in range(experts.shape[0]):
            e = experts[i]
            s = np.float32(0.0)
            for j in range(x.shape[0]):
                s += w[e, r, j] * x[j]
            acc += s
        out[r] += acc


def toy_expert_job(rows: int = 256, cols: int = 256, pool: int = 16):
    """(run_job, expert_bytes) over a small numba f32 kernel: the hook's self-test kernel."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((pool, rows, cols)).astype(np.float32)
    x = rng.standard_normal(cols).astype(np.float32)
    out = np.zeros(rows, np.float32)

    def run_job(k: int, first: int):
        ex = (np.arange(k, dtype=np.int32) + first) % pool
        _toy_kernel(w, ex, x, out)
    return run_job, w[0].nbytes


# executor kernel formats this module can synthesise: name -> (row bytes for `cols` weights)
_ROW_BYTES = {"F16": lambda c: 2 * c, "Q8_0": lambda c: c // 32 * 34, "Q4_0": lambda c: c // 32 * 18,
              "Q2_K": lambda c: c // 256 * 84, "Q3_K": lambda c: c // 256 * 110,
              "Q4_K": lambda c: c // 256 * 144, "Q5_K": lambda c: c // 256 * 176, "Q6_K": lambda c: c // 256 * 210,
              "IQ4_NL": lambda c: c // 32 * 18, "IQ4_XS": lambda c: c // 256 * 136}


def kernel_sources() -> list[Path]:
    """The executor's kernel sources: the expert, dense and attention kernels and every executor module they import,
    directly or through others (executor.nbcache.source_deps); [] when the executor is absent."""
    try:
        from executor import kernels
        from executor.nbcache import source_deps
    except Exception:
        return []
    here = Path(kernels.__file__).resolve().parent
    roots = [here / name for name in ("cpu_experts.py", "dense_kernels.py")]
    return sorted(set(roots) | {f for r in roots for f in source_deps(r) if f.parent == here})


def kernel_version() -> str:
    """Short hash of kernel_sources(), so a calibration names the kernel build it belongs to; '' when absent."""
    import hashlib
    files = kernel_sources()
    if not files:
        return ""
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def executor_kernel_available() -> bool:
    """Whether executor/cpu_experts.py exposes the CPU expert kernel (`moe_cpu`) and its tensor type."""
    try:
        from executor import cpu_experts, gguf_model
    except Exception:
        return False
    return (callable(getattr(cpu_experts, "moe_cpu", None)) and callable(getattr(cpu_experts, "csr", None))
            and hasattr(gguf_model, "EXPERT_TYPES") and hasattr(gguf_model, "ExpertTensor"))


def _synth_tensor(fmt: str, n: int, rows: int, cols: int, rng):
    """A synthetic ExpertTensor [n, rows, row_bytes] in `fmt`: make_model's random weights (std 0.02), whose
    block scales spread over 0.5-1.5x their mean as real ones spread (one scale value for every block, as
    here before session 17, would time a kernel whose speed depends on the values, a table of scales say,
    as if all its lookups hit one cache line)."""
    from gguf import GGMLQuantizationType as QT
    from executor.gguf_model import EXPERT_TYPES, ExpertTensor
    from executor.make_model import _rand_tensor
    qt = QT[fmt]
    rb = _ROW_BYTES[fmt](cols)
    data = _rand_tensor(rng, (n, rows, cols), qt, 0.02).view(np.uint8).reshape(n, rows, rb)
    return ExpertTensor(data=np.ascontiguousarray(data), qtype=qt, code=EXPERT_TYPES[qt], rows=rows, cols=cols)


def _reordered_copies(t, n: int, rng):
    """t (an ExpertTensor) grown to n experts: each further one a drawn expert's rows in another order, their blocks
    too, so that no two 4 KiB pages of the pool hold the same bytes. The pool must be larger than the cache; its
    values need not all be drawn (quantising them is most of its cost: 1.2-5.2 s a format for 600 MiB here)."""
    from gguf import GGML_QUANT_SIZES
    m, rows, rb = t.data.shape
    if m >= n:
        return t
    bs = GGML_QUANT_SIZES[t.qtype][1]
    if bs < 64 and (rb // bs) % (64 // bs) == 0:  # a float format's values moved 64 bytes at a time
        bs *= 64 // bs
    blocks = t.data.reshape(m, rows, rb // bs, bs)
    data = np.empty((n, rows, rb), np.uint8)
    data[:m] = t.data
    for e in range(m, n):
        data[e] = blocks[e % m][rng.permutation(rows)][:, rng.permutation(rb // bs)].reshape(rows, rb)
    return replace(t, data=data)


DRAWN_EXPERTS = 16  # experts a pool quantises from random weights; the rest are _reordered_copies of them


class ExpertPool:
    """Synthetic `fmt` SwiGLU experts (gate / up [E, ffn, hidden], down [E, hidden, ffn]) filling `pool_bytes`,
    at least `max_k` of them, and a token's inputs x [1, hidden], h [1, ffn], all drawn from `seed`: the first
    DRAWN_EXPERTS (at least max_k) quantised from random weights, the rest their blocks reordered."""

    def __init__(self, fmt: str, hidden: int, ffn: int, pool_bytes: int, max_k: int, seed: int):
        if fmt not in _ROW_BYTES:
            raise ValueError(f"no synthetic layout for {fmt} (have {', '.join(_ROW_BYTES)})")
        rng = np.random.default_rng(seed)
        self.expert_bytes = 2 * ffn * _ROW_BYTES[fmt](hidden) + hidden * _ROW_BYTES[fmt](ffn)  # B
        self.n = max(max_k, int(pool_bytes // self.expert_bytes))
        drawn = min(self.n, max(max_k, DRAWN_EXPERTS))
        self.gate, self.up, self.down = (_reordered_copies(_synth_tensor(fmt, drawn, r, c, rng), self.n, rng)
                                         for r, c in ((ffn, hidden), (ffn, hidden), (hidden, ffn)))
        self.x = rng.standard_normal((1, hidden)).astype(np.float32)
        self.h = (rng.standard_normal((1, ffn)) * 0.1).astype(np.float32)


# pools alive somewhere, by their arguments: a calibration run times the same experts in several structures and
# thread counts, and drawing a 256 MB pool costs ~0.7 s a tensor here (25 of a quick run's 63 s, session 22)
_POOLS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def expert_pool(fmt: str, hidden: int = 2048, ffn: int = 768, pool_bytes: int = 256 << 20, max_k: int = 8,
                seed: int = 0, file_runs: int | None = None, folder: str | Path = ".",
                file_bytes: int = 0) -> ExpertPool:
    """The ExpertPool of these arguments: the one a live job already holds, or a new one. file_runs (bytes): the same
    experts, repeated to file_bytes in all, in files in `folder` whose pages lie in physically contiguous runs of
    that length (pool_in_files)."""
    key = (fmt, hidden, ffn, pool_bytes, max_k, seed) + ((file_runs, file_bytes) if file_runs else ())
    pool = _POOLS.get(key)
    if pool is None:
        pool = ExpertPool(*key[:6]) if not file_runs else pool_in_files(expert_pool(*key[:6]), file_runs, folder,
                                                                         file_bytes)
        _POOLS[key] = pool
    return pool


def pool_in_files(p: ExpertPool, run_bytes: int, folder: str | Path = ".", total_bytes: int = 0) -> ExpertPool:
    """A copy of `p` whose tensors' bytes lie in files in `folder` (a disk's, as a GGUF: not a tmpfs), written in
    shuffled runs of run_bytes so that their pages lie in physically contiguous runs of that length, as the pages of a
    file the page cache read back piecemeal do (calibration.page_layout); its experts repeated to at least total_bytes
    in all (whole repetitions: a 124 MiB Q8_0 pool to 248 MiB for 192, to 496 MiB for 384)
    (what such a layout costs grows with the memory the pages span: on the Zen 4 VM ggml's Q8_0 rows from 4 KiB runs
    took 1.09-1.19x the contiguous time in a 128 MiB pool, 1.44x in 192, 1.70-1.73x in 384 and 1024); each mapped back
    privately (frames of the page cache, arrays numba already compiled for) and unlinked (its pages stay while the map
    does)."""
    out = copy.copy(p)
    pool = sum(getattr(p, name).data.nbytes for name in ("gate", "up", "down"))
    reps = max(1, -(-total_bytes // pool))
    for i, name in enumerate(("gate", "up", "down")):
        t = getattr(p, name)
        fd, path = tempfile.mkstemp(prefix=".moe-offload-pool-", dir=folder)
        os.close(fd)
        try:
            write_in_runs(path, t.data, run_bytes, seed=i, repeat=reps)
            data = map_file(path, private=True).reshape((reps * t.data.shape[0],) + t.data.shape[1:])
        finally:
            os.unlink(path)
        setattr(out, name, replace(t, data=data))
    out.n = reps * p.n
    return out


def token_experts(n: int, seed: int = 0):
    """routes(k, first): the k experts (int64, ascending) of a job on a pool of n, as a token routes them: positions
    first .. first + k - 1 (mod n) of the pool's experts in one fixed shuffled order, so that no expert comes back
    before the whole pool has been read (KernelBench's cursor), and a job's experts lie apart in each tensor, in index
    order, as ggml's MUL_MAT_ID and the executor take a token's. Each starts a stream the hardware prefetcher has to
    pick up again: on the Zen 4 VM 8 experts so routed took 2-6% longer than 8 side by side, which calibrate's jobs had
    read before (Q8_0, Q6_K, repacked Q4_K / Q2_K / Q4_0, one thread; benchmarks/bench_expert_scatter.py,
    2026-12-06)."""
    order = np.random.default_rng(seed).permutation(n)
    made: dict[tuple[int, int], np.ndarray] = {}

    def routes(k: int, first: int) -> np.ndarray:
        key = (k, first % n)
        if key not in made:
            made[key] = np.sort(order[(np.arange(k) + first) % n]).astype(np.int64)
        return made[key]
    return routes


def executor_expert_job(fmt: str = "Q4_0", hidden: int = 2048, ffn: int = 768, pool_bytes: int = 256 << 20,
                        max_k: int = 8, seed: int = 0, whole: bool = False, file_runs: int | None = None,
                        folder: str | Path = ".", file_bytes: int = 0):
    """(run_job, expert_bytes): one token's job of k SwiGLU experts through executor.cpu_experts.moe_cpu.

    The experts are synthetic `fmt` tensors (gate/up [E, ffn, hidden], down [E, hidden, ffn]) in a
    pool larger than the last-level cache; a job uses k experts as token_experts routes them. Each
    matrix's rows split across the threads, as llama.cpp's ggml splits them: the engine-neutral rate.
    whole: each expert start to end on one thread where the job's experts split evenly over the threads (its
    even k; the odd ones split rows, as the executor does): the executor's decode structure (cpu.whole_gbs).
    file_runs: the pool, repeated to file_bytes, in files whose pages lie in physically contiguous runs of that many
    bytes (pool_in_files), as the experts of a GGUF the page cache holds so, which the executor reads in place."""
    from executor import cpu_experts
    p = expert_pool(fmt, hidden, ffn, pool_bytes, max_k, seed, file_runs, folder, file_bytes)
    out = np.zeros((1, hidden), np.float32)
    routes: dict[tuple[int, int], tuple] = {}
    experts = token_experts(p.n)

    def run_job(k: int, first: int):
        key = (k, first % p.n)
        r = routes.get(key)
        if r is None:
            ex = experts(k, first).astype(np.int32).reshape(1, k)
            r = routes[key] = cpu_experts.csr(ex, np.full((1, k), 1.0 / k, np.float32))
        out[:] = 0.0
        cpu_experts.moe_cpu(p.gate, p.up, p.down, p.x, *r, out=out, whole=whole)
    return run_job, p.expert_bytes


# ---------------------------------------------------------------------------------------------
# prefill: the same kernel on a batch of tokens (the simulator's cpu_prefill_gflops_per_core)
# ---------------------------------------------------------------------------------------------

@dataclass
class PrefillResult:
    """The CPU expert kernel on a prefill-sized batch: routed GFLOP/s per thread."""

    label: str
    tokens: int
    experts: int
    top_k: int
    t_ms: float  # one batch (lower quintile of the repeats)
    flops: float  # routed expert FLOPs of one batch (2 per weight per token)
    threads: int
    repeats: int
    noise: Noise = field(default_factory=Noise)

    @property
    def gflops_per_core(self) -> float:
        """Routed expert GFLOP/s per thread."""
        return self.flops / (self.t_ms * 1e-3) / 1e9 / self.threads

    @property
    def tokens_per_expert(self) -> float:
        """Tokens each expert's products take (executor_prefill_job routes every token to top_k distinct experts,
        drawn alike: at 64 x 8 of 32 all are touched, bar a chance of 1e-8)."""
        return self.tokens * self.top_k / self.experts

    def method(self) -> str:
        batch = f"{self.tokens} tokens x top-{self.top_k} of {self.experts} experts" if self.experts else f"{self.tokens} tokens"
        return (f"{self.label}: {batch}, "
                f"{self.flops / 1e9:.2f} GFLOP per batch in {self.t_ms:.2f} ms (lower quintile of {self.repeats}), "
                f"{self.threads} threads, {self.noise.describe()}")


def prefill_fixed_tokens(m1: float, gflops1: float, m2: float, gflops2: float, groups1: float = 1.0,
                         groups2: float = 1.0) -> float:
    """m0 such that an expert product of m tokens in g token groups takes the time of m + g m0 tokens' multiply-adds
    (the simulator's cpu_prefill_fixed_tokens; g: specs.formats.executor_expert_groups, 1 for ggml's windows), from
    the rates measured at m1 < m2 tokens an expert in groups1 / groups2 groups: gflops2 / gflops1 = m2 (m1 + g1 m0) /
    (m1 (m2 + g2 m0)). 0 where no m0 >= 0 gives the larger batch's rate (it is no faster); capped at 1,000 tokens."""
    q = gflops2 / gflops1
    num, den = m1 * m2 * (q - 1.0), m2 * groups1 - q * m1 * groups2
    if den > 0:
        return min(1000.0, max(0.0, num / den))
    if den == 0 or num > 0:  # no finite m0 >= 0 (the larger batch too fast for its groups), or any m0 (num = 0)
        return 0.0 if num == 0 else 1000.0
    return min(1000.0, num / den)


def executor_prefill_jobs(fmt: str = "Q4_0", hidden: int = 2048, ffn: int = 768, n_experts: int = 32,
                          top_k: int = 8, sizes: tuple[int, ...] = (64,), seed: int = 0) -> list:
    """[(run, flops)]: a prefill batch of each of `sizes` tokens, each token routed to `top_k` distinct experts of
    the same `n_experts` synthetic `fmt` experts, through executor.cpu_experts.moe_cpu."""
    from executor import cpu_experts
    rng = np.random.default_rng(seed)
    gate = _synth_tensor(fmt, n_experts, ffn, hidden, rng)
    up = _synth_tensor(fmt, n_experts, ffn, hidden, rng)
    down = _synth_tensor(fmt, n_experts, hidden, ffn, rng)

    def job(tokens: int):
        x = rng.standard_normal((tokens, hidden)).astype(np.float32)
        ids = np.argsort(rng.random((tokens, n_experts)), axis=1)[:, :top_k]
        route = cpu_experts.csr(ids, np.full((tokens, top_k), 1.0 / top_k, np.float32))
        out = np.zeros((tokens, hidden), np.float32)

        def run():
            out[:] = 0.0
            cpu_experts.moe_cpu(gate, up, down, x, *route, out=out)
        return run, 6.0 * hidden * ffn * tokens * top_k
    return [job(t) for t in sizes]


def executor_prefill_job(fmt: str = "Q4_0", hidden: int = 2048, ffn: int = 768, n_experts: int = 32,
                         top_k: int = 8, tokens: int = 64, seed: int = 0):
    """(run, flops): executor_prefill_jobs for one batch of `tokens` tokens."""
    return executor_prefill_jobs(fmt, hidden, ffn, n_experts, top_k, (tokens,), seed)[0]


def executor_dense_prefill_jobs(hidden: int = 2048, head_dim: int = 64, n_experts: int = 32, tokens: int = 512,
                                seed: int = 0):
    """((run, flops), (run, flops)): an n-token prefill batch through one synthetic F16 attention block whole, as the
    executor's CPU step runs it (executor.dense_kernels.attention_step: RMSNorm, Q/K/V stacked, Q/K norm and RoPE, the
    K/V caches, causal attention from position 0, the output projection and the residual add; then norm_route: the
    FFN norm and the f32 router of n_experts), with the FLOPs of its dense products (2 per weight and token); and
    through its causal attention alone (executor.attention.attn_cached), with the attention's (4 n_heads head_dim a
    (query, earlier key) pair: simulator.prefill.attention_flops). The block's time less the attention's is the dense
    path's (calibrate): its norms, RoPE and adds, ~0.5-0.8 ms of a `small` layer's 13.7 at 512 tokens, run at the
    products' rate. The heads as executor_layer_loop's: a quarter of the hidden width in query heads, half that in K/V."""
    from executor.attention import attn_cached
    from executor.dense_kernels import attention_step, norm_route
    rng = np.random.default_rng(seed)
    nh = max(1, hidden // (4 * head_dim))
    nkv = max(1, nh // 2)
    Rq, Rk = nh * head_dim, nkv * head_dim

    def f16(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16).view(np.uint8).ravel()
    wq, wk, wv, wo = f16(Rq, hidden), f16(Rk, hidden), f16(Rk, hidden), f16(hidden, Rq)
    router = (rng.standard_normal((n_experts, hidden), dtype=np.float32) * 0.02)
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    h, a = np.empty_like(x), np.empty_like(x)
    ids, wts = np.empty((tokens, 8), np.int64), np.empty((tokens, 8), np.float32)
    ones, ones_hd = np.ones(hidden, np.float32), np.ones(head_dim, np.float32)
    ang = np.arange(tokens)[:, None] * 10000.0 ** (-np.arange(head_dim // 2) / (head_dim // 2))[None]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)  # [T, hd/2]
    kc = np.zeros((1, nkv, tokens, head_dim), np.float32)
    vc = np.zeros_like(kc)

    def block():  # x += the block's output in place: its RMSNorms keep the inputs' scale over the repeats
        attention_step(x, ones, 1e-6, wq, 1, Rq, wk, 1, Rk, wv, 1, Rk, ones_hd, ones_hd, cos, sin, nh, nkv, True,
                       True, kc, vc, 0, tokens, wo, 1, hidden, a, True)
        norm_route(x, ones, 1e-6, router, min(8, n_experts), h, ids, wts)
    q3 = rng.standard_normal((tokens, nh + 2 * nkv, head_dim)).astype(np.float32)
    o = np.empty((tokens, Rq), np.float32)

    def attention():
        attn_cached(q3, kc, vc, 0, tokens, nh, nkv, o)
    dense_flops = 2.0 * tokens * (2 * Rq * hidden + 2 * Rk * hidden + n_experts * hidden)
    attn_flops = 4.0 * nh * head_dim * tokens * (tokens - 1) / 2
    return (block, dense_flops), (attention, attn_flops)


def dense_less_attention(block: PrefillResult, attention: PrefillResult) -> PrefillResult:
    """The dense path's result from an attention block's (executor_dense_prefill_jobs) and its attention's alone:
    the block's time less the attention's, at the block's dense FLOPs (the block's whole time where the difference
    is not positive: an attention timed in a slower spell)."""
    t = block.t_ms - attention.t_ms
    return replace(block, t_ms=t if t > 0 else block.t_ms,
                   label=f"{block.label} (its time less its attention's, {attention.t_ms:.2f} ms, timed alone)")


def bench_prefill(run: Callable[[], object], flops: float, repeats: int = 7, label: str = "kernel",
                  tokens: int = 64, experts: int = 32, top_k: int = 8, threads: int | None = None,
                  tick: Tick = None, budget_s: float = 5.0) -> PrefillResult:
    """Time `run()` (one prefill batch) around outside load (`sample_clean`); lower quintile."""
    threads = int(threads or numba.get_num_threads())
    run()  # warm-up (and JIT)

    def one(i):
        t0 = time.perf_counter()
        run()
        return [("batch", time.perf_counter() - t0)]

    times, noise = sample_clean(one, repeats, budget_s, tick=tick)
    return PrefillResult(label=label, tokens=tokens, experts=experts, top_k=top_k,
                         t_ms=low_quantile(times["batch"]) * 1e3, flops=float(flops), threads=threads,
                         repeats=repeats, noise=noise)
