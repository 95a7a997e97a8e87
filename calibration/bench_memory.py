"""Memory bandwidth: read, copy and triad bandwidth against thread count (numba parallel kernels,
STREAM byte counting: read 8, copy 16, triad 24 bytes per element, no write-allocate traffic counted).

`tick` arguments are progress callbacks (one call per unit of work); sizes are arguments so tests
run the same code on tiny inputs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

import numba
import numpy as np
from numba import njit, prange

from .sampling import Noise, Tick, sample_clean


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _k_read(a):
    s = 0.0
    for i in prange(a.shape[0]):
        s += a[i]
    return s


@njit(parallel=True, nogil=True, cache=True)
def _k_copy(a, b):
    for i in prange(a.shape[0]):
        b[i] = a[i]


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _k_triad(a, b, c, s):
    for i in prange(a.shape[0]):
        a[i] = b[i] + s * c[i]


@njit(parallel=True, nogil=True, cache=True)
def _k_fill(a, v):
    for i in prange(a.shape[0]):
        a[i] = v + (i & 7)


BYTES_PER_ELEMENT = {"read": 8, "copy": 16, "triad": 24}


def default_thread_counts(max_threads: int | None = None) -> list[int]:
    """1, 2, 4, ... up to and including the usable thread count."""
    m = max_threads or numba.config.NUMBA_NUM_THREADS
    out, t = [], 1
    while t < m:
        out.append(t)
        t *= 2
    out.append(m)
    return out


@dataclass
class MemBandwidth:
    """GB/s (1e9 B/s) per kernel per thread count over the clean rounds: `low` (the lower quintile,
    the figure calibrate uses), best and median.

    Why the lower quintile: on this VM the bandwidth two vCPUs get jumps ~20% up for tens of
    seconds at a time (with compute slower, `benchmarks/bench_drift.py`); the best round says
    whether a run caught such a burst, the lower quintile is the state the machine is usually in
    (two 15-s windows a minute apart: p90 spread 14% against 24% for the best)."""

    array_bytes: int
    repeats: int
    low: dict[str, dict[int, float]] = field(default_factory=dict)
    best: dict[str, dict[int, float]] = field(default_factory=dict)
    median: dict[str, dict[int, float]] = field(default_factory=dict)
    noise: Noise = field(default_factory=Noise)

    def figure(self, kernel: str = "read") -> tuple[int, float]:
        """(threads, GB/s): the lower-quintile bandwidth of the thread count where it is highest."""
        t = max(self.low[kernel], key=lambda k: self.low[kernel][k])
        return t, self.low[kernel][t]

    def method(self, kernel: str, threads: int) -> str:
        return (f"numba parallel {kernel} {threads} thread(s), {self.array_bytes / 2**30:.2f} GiB "
                f"arrays, lower quintile of {self.repeats} interleaved rounds, {self.noise.describe()}")


class MemoryBench:
    """Read, copy and triad over three float64 arrays of `array_bytes` each, per thread count.

    `sample()` may be called several times (calibrate samples at the start and at the end of its
    run: on a VM the bandwidth two vCPUs get moves with where the host places them, and a longer
    span sees the machine's best state more reliably); `result()` merges every call's samples."""

    def __init__(self, array_bytes: int = 1 << 30, threads: Sequence[int] | None = None,
                 kernels: Sequence[str] = ("read", "copy", "triad")):
        self.n = max(1024, array_bytes // 8)
        self.threads = list(threads or default_thread_counts())
        self.kernels = list(kernels)
        self.maxt = numba.config.NUMBA_NUM_THREADS
        self.a, self.b, self.c = (np.empty(self.n, np.float64) for _ in range(3))
        self.times: dict[tuple[str, int], list[float]] = {}
        self.noise = Noise()
        self.rounds = 0
        prev = numba.get_num_threads()
        try:
            numba.set_num_threads(self.maxt)
            for arr, v in ((self.a, 1.0), (self.b, 2.0), (self.c, 0.5)):
                _k_fill(arr, v)  # first touch in parallel
            a, b, c = self.a[:16], self.b[:16], self.c[:16]
            _k_read(a), _k_copy(a, b), _k_triad(a, b, c, 3.0)  # compile
        finally:
            numba.set_num_threads(prev)

    def _round(self, _i):
        out = []
        for k in self.kernels:
            for t in self.threads:
                numba.set_num_threads(min(t, self.maxt))
                t0 = time.perf_counter()
                if k == "read":
                    _k_read(self.a)
                elif k == "copy":
                    _k_copy(self.a, self.b)
                else:
                    _k_triad(self.a, self.b, self.c, 3.0)
                out.append(((k, t), time.perf_counter() - t0))
        return out

    def sample(self, repeats: int, budget_s: float, tick: Tick = None) -> None:
        """`repeats` clean rounds (within `budget_s`), added to the samples so far."""
        prev = numba.get_num_threads()
        try:
            got, noise = sample_clean(self._round, repeats, budget_s, tick=tick,
                                      keys=len(self.kernels) * len(self.threads))
        finally:
            numba.set_num_threads(prev)
        for key, v in got.items():
            self.times.setdefault(key, []).extend(v)
        self.noise = self.noise.merged(noise) if self.noise.windows else noise
        self.rounds += repeats

    def result(self) -> MemBandwidth:
        res = MemBandwidth(array_bytes=self.n * 8, repeats=self.rounds, noise=self.noise)
        for k in self.kernels:
            nbytes = self.n * BYTES_PER_ELEMENT[k]
            res.low[k] = {t: nbytes / float(np.quantile(self.times[(k, t)], 0.8)) / 1e9 for t in self.threads}
            res.best[k] = {t: nbytes / min(self.times[(k, t)]) / 1e9 for t in self.threads}
            res.median[k] = {t: nbytes / statistics.median(self.times[(k, t)]) / 1e9 for t in self.threads}
        return res

    def free(self) -> None:
        self.a = self.b = self.c = None


def bench_memory(array_bytes: int = 1 << 30, threads: Sequence[int] | None = None, repeats: int = 5,
                 kernels: Sequence[str] = ("read", "copy", "triad"), tick: Tick = None,
                 budget_s: float = 20.0) -> MemBandwidth:
    """Read, copy and triad bandwidth of three float64 arrays of `array_bytes` each, per thread count.

    A round times every kernel at every thread count once (interleaved, so a burst of outside load
    hits one sample of each configuration); rounds during which other processes used the CPUs are
    set aside (`sample_clean`). The figure is the lower quintile of the clean rounds (`MemBandwidth`).
    One tick per clean round."""
    m = MemoryBench(array_bytes, threads, kernels)
    m.sample(repeats, budget_s, tick)
    return m.result()
