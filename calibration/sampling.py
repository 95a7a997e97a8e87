"""Noise-aware sampling shared by every microbenchmark of `moe-offload calibrate`.

Timings are taken in windows; `Window` measures how much CPU other processes used over one, and
`sample_clean` keeps the samples of windows free of outside load (falling back to the least
disturbed ones, and saying so in its `Noise`). `low_quantile` reduces timings to the low end that
reproduces on a shared machine.

`tick` arguments are progress callbacks (one call per unit of work).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

Tick = Callable[[], None] | None


def _tick(t: Tick) -> None:
    if t is not None:
        t()


def low_quantile(xs, q: float = 0.2) -> float:
    """The q-quantile of timings: interference from other processes only adds time, so the low
    end is what reproduces between runs on a shared machine."""
    return float(np.quantile(np.asarray(xs, float), q))


def today() -> str:
    """UTC date for a measured figure's ref."""
    return time.strftime("%Y-%m-%d", time.gmtime())


_CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_busy_s() -> float | None:
    """CPU seconds all CPUs spent busy since boot (/proc/stat), or None where unreadable."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    guest = sum(v[8:10]) if len(v) > 9 else 0  # guest time is already counted in user
    return (sum(v) - idle - guest) / _CLK


class Window:
    """How much CPU other processes used over a stretch of wall time: (all busy - ours) / (wall x CPUs)."""

    ncpu = os.cpu_count() or 1

    def __init__(self):
        self.b0, self.c0, self.w0 = _cpu_busy_s(), time.process_time(), time.perf_counter()

    def wall(self) -> float:
        return time.perf_counter() - self.w0

    def others(self) -> float:
        b1 = _cpu_busy_s()
        if b1 is None or self.b0 is None:
            return 0.0
        ours = time.process_time() - self.c0
        return max(0.0, min(1.0, (b1 - self.b0 - ours) / max(1e-9, self.wall() * self.ncpu)))


@dataclass
class Noise:
    """What the sampler saw: windows timed, windows clean of outside load, mean outside CPU share."""

    windows: int = 0
    clean: int = 0
    others: float = 0.0  # mean share of all CPUs other processes used while timing
    used_all: bool = False  # too few clean windows within the budget: the least disturbed were used
    fallback_others: float = 0.0  # then: the outside share of the most disturbed window taken

    def merged(self, other: "Noise") -> "Noise":
        """The noise of two sampling passes together."""
        w = self.windows + other.windows
        return Noise(windows=w, clean=self.clean + other.clean,
                     others=(self.others * self.windows + other.others * other.windows) / max(1, w),
                     used_all=self.used_all or other.used_all,
                     fallback_others=max(self.fallback_others, other.fallback_others))

    def describe(self) -> str:
        s = f"{self.clean}/{self.windows} windows free of outside load (mean outside CPU {100 * self.others:.0f}%)"
        if self.used_all:
            s += f", contended: least disturbed windows used (outside CPU up to {100 * self.fallback_others:.0f}%)"
        return s


def sample_clean(unit: Callable[[int], list[tuple[object, float]]], want: int, budget_s: float,
                 min_window_s: float = 0.15, max_others: float = 0.10, tick: Tick = None,
                 keys: int = 1, window: type = Window,
                 min_units: int | None = None) -> tuple[dict[object, list[float]], Noise]:
    """Run `unit(i)` (returns (key, sample) pairs) in windows of at least `min_window_s`; keep the
    samples of windows where other processes used at most `max_others` of the CPUs.

    Stops once every key has `want` clean samples (samples, not units), or when `budget_s` is spent
    (after at least `min_units` units, default a third of `want`). With fewer than max(2, want // 3)
    clean samples per key it falls back to all samples and says so. One tick per clean unit, up to
    `want`. `window`: what counts as outside load (CPU by default; `DiskWindow` adds a device's I/O)."""
    clean: dict[object, list[float]] = {}
    windows: list[tuple[float, list[tuple[object, float]]]] = []
    noise = Noise()
    shares = []
    t_start = time.perf_counter()
    i = ticked = 0
    min_units = max(1, -(-want // 3)) if min_units is None else min_units
    while True:
        w = window()
        batch: list[tuple[object, float]] = []
        n = 0
        while n == 0 or w.wall() < min_window_s:
            batch += unit(i)
            i += 1
            n += 1
        o = w.others()
        shares.append(o)
        noise.windows += 1
        windows.append((o, batch))
        if o <= max_others:
            noise.clean += 1
            for k, v in batch:
                clean.setdefault(k, []).append(v)
            for _ in range(min(n, want - ticked)):
                _tick(tick)
                ticked += 1
        done = len(clean) >= keys and all(len(v) >= want for v in clean.values())
        spent = time.perf_counter() - t_start > budget_s and i >= min_units
        if done or spent:
            break
    noise.others = float(np.mean(shares)) if shares else 0.0
    for _ in range(want - ticked):
        _tick(tick)
    need = max(2, want // 3)
    keys_seen = {k for _, b in windows for k, _ in b}
    if len(clean) < keys or any(len(clean.get(k, [])) < need for k in keys_seen):
        # too few clean windows: the least disturbed ones, until every key has `need` samples
        noise.used_all = True
        least: dict[object, list[float]] = {}
        for o, b in sorted(windows, key=lambda ob: ob[0]):
            for k, v in b:
                least.setdefault(k, []).append(v)
            noise.fallback_others = o  # the most disturbed window taken
            if all(len(least.get(k, [])) >= need for k in keys_seen):
                break
        return least, noise
    return clean, noise


class Passes:
    """One benchmark's samples gathered in several passes spread over a run, merged by key.

    On this VM the speed two vCPUs get changes for tens of seconds at a time
    (`benchmarks/bench_drift.py`); a benchmark sampled at the start and again at the end of a
    calibration run sees more of the machine's states than one sampled in a single burst."""

    def __init__(self, unit: Callable[[int], list[tuple[object, float]]], keys: int = 1):
        self.unit, self.keys = unit, keys
        self.times: dict[object, list[float]] = {}
        self.noise = Noise()
        self.repeats = 0

    def sample(self, want: int, budget_s: float, tick: Tick = None) -> None:
        """`want` clean samples per key (within `budget_s`), added to those of earlier passes."""
        got, noise = sample_clean(self.unit, want, budget_s, tick=tick, keys=self.keys)
        for k, v in got.items():
            self.times.setdefault(k, []).extend(v)
        self.noise = self.noise.merged(noise) if self.noise.windows else noise
        self.repeats += want
