"""The executor's prefill products per weight format, against the format calibrate's prefill job times.

calibrate times the executor's whole prefill job (cpu_experts.moe_cpu on a batch of synthetic experts) in one format,
the profile's default (Q4_0): `cpu_prefill_gflops_per_core`. The GEMM's speed differs between formats by what a
sub-block costs it, not by the bytes (at a prompt's tokens an expert the products are compute-bound): on the Zen 5 VM
of session 55, one core, 128 tokens, int16 activations, GFLOP/s in cache: Q4_0 369, IQ4_XS 373, Q8_0 365, Q5_K 359,
Q4_K 338, Q3_K 335, Q2_K 318, Q6_K 277 (benchmarks/bench_qgemm.py --tiles). A Q4_K_M file's Q6_K down products alone
take 1.3x the time Q4_0's would. This times the executor's own products (row_products.rows_matmul through the kernel
table: the integer GEMM, or the float one for F16 and CPUs without VNNI) of each format on one core, an expert's gate
(ffn x hidden) and down (hidden x ffn) matrices in cache at a prompt's tokens an expert, the formats' rounds
interleaved, and gives each format's rate over the reference format's: `cpu.prefill_format_share`, by which the
simulator scales the job's rate for each weight type of a model (simulator.resources.cpu_prefill_gflops).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
from numba import njit

from executor.kernel_table import table_rows_matmul
from executor.nbcache import drop_stale_cache

drop_stale_cache(__file__)


@njit(nogil=True, cache=True)
def _products(code, w, rows, rb, x, x16, dx, P, out):
    """out = x times the rows of w (type `code`): the executor's rows_matmul through the kernel table (none of the
    kernels compiled in here)."""
    table_rows_matmul(code, w, np.int64(0), rows, rb, x, x16, dx, P, out, np.int64(0))


@dataclass
class FormatShares:
    """Each format's prefill rate over the reference format's (share), with how it was measured."""

    shares: dict[str, float]
    gflops: dict[str, float]  # one core, GFLOP/s (the median round)
    ref: str
    tokens: int
    rounds: int

    def method(self) -> str:
        return (f"executor prefill products (row_products.rows_matmul) over {self.ref}'s, one core, an expert's gate "
                f"and down matrices in cache, {self.tokens} tokens, median of {self.rounds} interleaved rounds "
                f"({', '.join(f'{k} {v:.0f}' for k, v in self.gflops.items())} GFLOP/s)")


def _matrix(fmt: str, rows: int, cols: int, tokens: int, rng):
    """A synthetic matrix of `fmt` (calibrate's experts) and the call that multiplies `tokens` random tokens by it."""
    from executor.kernels import _quant_rows, int_panels, panels

    from .bench_kernel import _synth_tensor
    t = _synth_tensor(fmt, 1, rows, cols, rng)
    w = np.ascontiguousarray(t.data[0]).reshape(-1)
    rb, code = t.data.shape[2], np.int64(t.code)
    x = rng.standard_normal((tokens, cols)).astype(np.float32)
    x16, dx = _quant_rows(x)
    P = panels(x, x16, dx, True, int_panels(t.code, t.code, t.code, np.int64(0), np.int64(0)))
    out = np.empty((tokens, rows), np.float32)
    return lambda: _products(code, w, np.int64(rows), np.int64(rb), x, x16, dx, P, out)


def prefill_format_shares(formats, ref: str, hidden: int, ffn: int, tokens: int = 128, rounds: int = 7,
                          seed: int = 0) -> FormatShares:
    """Each of `formats`' prefill rate over `ref`'s (ref included, whether listed or not), on the calling thread
    (rows_matmul is serial)."""
    rng = np.random.default_rng(seed)
    names = [ref] + [f for f in formats if f != ref]
    calls = {f: (_matrix(f, ffn, hidden, tokens, rng), _matrix(f, hidden, ffn, tokens, rng)) for f in names}
    for gate, down in calls.values():  # first calls: the table's entries and the matrices into cache
        gate()
        down()
    times: dict[str, list[float]] = {f: [] for f in names}
    for _ in range(rounds):
        for f, (gate, down) in calls.items():
            t = time.perf_counter()
            gate()
            down()
            times[f].append(time.perf_counter() - t)
    med = {f: statistics.median(v) for f, v in times.items()}
    flops = 2 * 2 * hidden * ffn * tokens
    return FormatShares(shares={f: med[ref] / med[f] for f in names}, gflops={f: flops / med[f] / 1e9 for f in names},
                        ref=ref, tokens=tokens, rounds=rounds)
