"""Microbenchmarks: each function makes one real measurement on this machine and returns its figures.

- memory: read, copy and triad bandwidth against thread count (numba parallel kernels, STREAM
  byte counting: read 8, copy 16, triad 24 bytes per element, no write-allocate traffic counted);
- torch device: a resident expert's SwiGLU on one token (the time per hit), the dense path's
  matrix-vector bandwidth; on CUDA, pinned and pageable H2D bandwidth and the miss path (copy one
  expert from pinned RAM, then compute it);
- disk: random 4 KiB reads with the page cache bypassed (O_DIRECT, else posix_fadvise DONTNEED)
  at queue depth 1 and N, sequential 1 MiB reads, and 4 KiB reads served from the page cache, on a
  temporary file created (and removed) here;
- handover: a device sync plus a thread hand-off to a CPU worker and back;
- CPU expert kernel: time per job against experts per job for any kernel (`bench_expert_kernel`),
  fitted to t = c_a + c_b * k with scipy least squares; `executor_expert_job` adapts the
  executor's numba kernels (executor/kernels.py) to it, per weight format.

`tick` arguments are progress callbacks (one call per unit of work); sizes are arguments so tests
run the same code on tiny inputs.
"""
from __future__ import annotations

import mmap
import os
import queue
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numba
import numpy as np
from numba import njit, prange

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


# ---------------------------------------------------------------------------------------------
# sampling around other processes' load
# ---------------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------------
# memory bandwidth
# ---------------------------------------------------------------------------------------------

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
    """GB/s (1e9 B/s) per kernel per thread count: best and median of `repeats`."""

    array_bytes: int
    repeats: int
    best: dict[str, dict[int, float]] = field(default_factory=dict)
    median: dict[str, dict[int, float]] = field(default_factory=dict)
    noise: Noise = field(default_factory=Noise)

    def peak(self, kernel: str = "read") -> tuple[int, float]:
        """(threads, GB/s) of the best thread count for `kernel`."""
        t = max(self.best[kernel], key=lambda k: self.best[kernel][k])
        return t, self.best[kernel][t]

    def method(self, kernel: str, threads: int) -> str:
        return (f"numba parallel {kernel} {threads} thread(s), {self.array_bytes / 2**30:.2f} GiB "
                f"arrays, best of {self.repeats} interleaved rounds, {self.noise.describe()}")


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
        w = self.noise.windows + noise.windows
        self.noise = Noise(windows=w, clean=self.noise.clean + noise.clean,
                           others=(self.noise.others * self.noise.windows + noise.others * noise.windows) / max(1, w),
                           used_all=self.noise.used_all or noise.used_all,
                           fallback_others=max(self.noise.fallback_others, noise.fallback_others))
        self.rounds += repeats

    def result(self) -> MemBandwidth:
        res = MemBandwidth(array_bytes=self.n * 8, repeats=self.rounds, noise=self.noise)
        for k in self.kernels:
            nbytes = self.n * BYTES_PER_ELEMENT[k]
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
    set aside (`sample_clean`). The figure is the best clean round. One tick per clean round."""
    m = MemoryBench(array_bytes, threads, kernels)
    m.sample(repeats, budget_s, tick)
    return m.result()


# ---------------------------------------------------------------------------------------------
# torch device: resident expert (time per hit), dense path, H2D, miss path
# ---------------------------------------------------------------------------------------------

def torch_device():
    """The torch device the executor uses: CUDA when present, else CPU."""
    import torch
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(dev) -> None:
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@dataclass
class HitResult:
    """A resident expert's SwiGLU for one token on the torch device."""

    device: str
    dtype: str
    hidden: int
    ffn: int
    expert_bytes: int
    pool: int
    t_hit_ms: float  # per expert, lower quintile of batch means
    gbs: float  # expert bytes / t_hit
    noise: Noise = field(default_factory=Noise)

    def method(self) -> str:
        return (f"torch {self.device} {self.dtype} SwiGLU expert {self.hidden}x{self.ffn} "
                f"({self.expert_bytes / 1e6:.2f} MB), 1 token, {self.pool} resident experts rotated, "
                f"lower quintile of batch means, {self.noise.describe()}")


def bench_hit(hidden: int = 2048, ffn: int = 768, pool_bytes: int = 256 << 20, calls: int = 200,
              repeats: int = 5, tick: Tick = None, budget_s: float = 5.0) -> HitResult:
    """Median time of one resident expert's SwiGLU (gate, up, down matvecs) for one token.

    A pool of experts larger than the last-level cache is rotated so each call reads its weights
    from device memory. One tick per repeat."""
    import torch
    dev = torch_device()
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    esize = torch.tensor([], dtype=dtype).element_size()
    ebytes = 3 * hidden * ffn * esize
    pool = max(2, int(pool_bytes // ebytes))
    g = torch.randn(pool, ffn, hidden, dtype=dtype, device=dev) * 0.02
    u = torch.randn(pool, ffn, hidden, dtype=dtype, device=dev) * 0.02
    d = torch.randn(pool, hidden, ffn, dtype=dtype, device=dev) * 0.02
    x = torch.randn(hidden, dtype=dtype, device=dev)

    def one(i):
        h = torch.nn.functional.silu(torch.mv(g[i], x)) * torch.mv(u[i], x)
        return torch.mv(d[i], h)

    def batch(_i):
        t0 = time.perf_counter()
        for c in range(calls):
            one(c % pool)
        _sync(dev)
        return [("hit", (time.perf_counter() - t0) / calls)]

    with torch.inference_mode():
        for i in range(min(pool, 4)):
            one(i)
        _sync(dev)
        per, noise = sample_clean(batch, repeats, budget_s, tick=tick)
    t = low_quantile(per["hit"])
    return HitResult(noise=noise, device=dev.type, dtype=str(dtype).replace("torch.", ""), hidden=hidden, ffn=ffn,
                     expert_bytes=ebytes, pool=pool, t_hit_ms=t * 1e3, gbs=ebytes / t / 1e9)


@dataclass
class DenseResult:
    """Dense-path matrix-vector bandwidth on the torch device."""

    device: str
    dtype: str
    matrix_bytes: int
    gbs: float  # best
    median_gbs: float
    repeats: int
    noise: Noise = field(default_factory=Noise)

    def method(self) -> str:
        return (f"torch {self.device} {self.dtype} matrix-vector over {self.matrix_bytes / 2**20:.0f} MiB, "
                f"best of {self.repeats}, {self.noise.describe()}")


def bench_dense(matrix_bytes: int = 1 << 30, hidden: int = 4096, repeats: int = 10,
                tick: Tick = None, budget_s: float = 5.0) -> DenseResult:
    """y = W x with W of `matrix_bytes` on the device (the dense path reads every weight once)."""
    import torch
    dev = torch_device()
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    esize = torch.tensor([], dtype=dtype).element_size()
    rows = max(16, int(matrix_bytes // (hidden * esize)))
    w = torch.randn(rows, hidden, dtype=dtype, device=dev)
    x = torch.randn(hidden, dtype=dtype, device=dev)
    nbytes = rows * hidden * esize
    def one(_i):
        t0 = time.perf_counter()
        torch.mv(w, x)
        _sync(dev)
        return [("mv", time.perf_counter() - t0)]

    with torch.inference_mode():
        torch.mv(w, x)
        _sync(dev)
        got, noise = sample_clean(one, repeats, budget_s, min_window_s=0.1, tick=tick)
    times = got["mv"]
    return DenseResult(noise=noise, device=dev.type, dtype=str(dtype).replace("torch.", ""), matrix_bytes=nbytes,
                       gbs=nbytes / min(times) / 1e9, median_gbs=nbytes / statistics.median(times) / 1e9,
                       repeats=repeats)


@dataclass
class H2DResult:
    """Host-to-device copy bandwidth (CUDA only) and the miss path for one expert."""

    nbytes: int
    pinned_gbs: float
    pageable_gbs: float
    repeats: int
    expert_bytes: int = 0
    t_miss_ms: float = 0.0  # copy one expert from pinned RAM + its SwiGLU on the device

    def method(self, kind: str) -> str:
        return f"torch.cuda {kind} H2D copy of {self.nbytes / 2**20:.0f} MiB, best of {self.repeats}"


def bench_h2d(nbytes: int = 1 << 30, repeats: int = 5, hidden: int = 2048, ffn: int = 768,
              miss_calls: int = 50, tick: Tick = None) -> H2DResult | None:
    """Pinned and pageable H2D GB/s, and the miss path (H2D of one fp16 expert, then compute).

    None without CUDA. One tick per repeat of each kind, plus one for the miss path."""
    import torch
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    out = {}
    for kind in ("pinned", "pageable"):
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=(kind == "pinned"))
        src.fill_(1)
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            _tick(tick)
        out[kind] = nbytes / min(times) / 1e9
        del src
    # miss path: a pinned home copy of several experts, copied over and computed one at a time
    n = 8
    host = torch.randn(n, 3, ffn * hidden, dtype=torch.float16).pin_memory()
    slot = torch.empty(3, ffn * hidden, dtype=torch.float16, device=dev)
    x = torch.randn(hidden, dtype=torch.float16, device=dev)
    with torch.inference_mode():
        def miss(i):
            slot.copy_(host[i % n], non_blocking=True)
            g, u, d = slot[0].view(ffn, hidden), slot[1].view(ffn, hidden), slot[2].view(hidden, ffn)
            return torch.mv(d, torch.nn.functional.silu(torch.mv(g, x)) * torch.mv(u, x))
        miss(0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(miss_calls):
            miss(i)
        torch.cuda.synchronize()
        t_miss = (time.perf_counter() - t0) / miss_calls
    _tick(tick)
    return H2DResult(nbytes=nbytes, pinned_gbs=out["pinned"], pageable_gbs=out["pageable"], repeats=repeats,
                     expert_bytes=3 * ffn * hidden * 2, t_miss_ms=t_miss * 1e3)


# ---------------------------------------------------------------------------------------------
# disk
# ---------------------------------------------------------------------------------------------

@dataclass
class DiskResult:
    """4 KiB random reads from a temporary file: uncached (O_DIRECT or fadvise) and page-cache hits."""

    file_bytes: int
    bypass: str  # 'O_DIRECT' or 'posix_fadvise DONTNEED'
    qd1_latency_us: float  # median uncached 4 KiB read at queue depth 1
    qd1_iops: float
    qd: int
    qd_iops: float  # uncached 4 KiB reads at queue depth `qd` (that many threads)
    seq_gbs: float  # uncached sequential 1 MiB reads
    cached_us: float  # median 4 KiB read served from the page cache
    cached_iops: float
    reads: int
    directory: str
    seq_passes: int = 1
    noise: dict = field(default_factory=dict)  # 'qd1' / 'qd' / 'seq' -> Noise (outside I/O on the device)

    def method(self, what: str) -> str:
        base = f"{self.file_bytes / 2**20:.0f} MiB temp file in {self.directory}"
        n = self.noise.get(what)
        io = f", {n.describe().replace('outside CPU', 'outside CPU or I/O')}" if n else ""
        if what == "qd1":
            return f"4 KiB random pread QD1, {self.bypass}, {base}, median{io}"
        if what == "qd":
            return (f"4 KiB random pread QD{self.qd} ({self.qd} threads), {self.bypass}, {base}, "
                    f"median of passes over fresh pages{io}")
        if what == "seq":
            return f"1 MiB sequential pread QD{SEQ_QD}, {self.bypass}, {base}, median of passes{io}"
        return f"4 KiB random pread from the page cache (file read once), {base}, median"


def _write_file(path: Path, nbytes: int, tick: Tick = None, chunk: int = 16 << 20) -> None:
    rng = np.random.default_rng(12345)
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(chunk, left)
            f.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            left -= n
        f.flush()
        os.fsync(f.fileno())
    _tick(tick)


def _open_direct(path: Path) -> tuple[int, str]:
    """A descriptor that bypasses the page cache: O_DIRECT when the filesystem allows it."""
    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        try:
            fd = os.open(path, os.O_RDONLY | flag)
            buf = mmap.mmap(-1, 4096)
            try:
                os.preadv(fd, [buf], 0)  # some filesystems accept the flag but fail the read
                return fd, "O_DIRECT"
            except OSError:
                os.close(fd)
            finally:
                buf.close()
        except OSError:
            pass
    fd = os.open(path, os.O_RDONLY)
    return fd, "posix_fadvise DONTNEED"


def _drop(fd: int, bypass: str) -> None:
    if bypass != "O_DIRECT" and hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _disk_bytes(dev: tuple[int, int]) -> int | None:
    """Bytes read + written on block device (major, minor) since boot (/proc/diskstats)."""
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                v = line.split()
                if len(v) > 9 and (int(v[0]), int(v[1])) == dev:
                    return (int(v[5]) + int(v[9])) * 512
    except (OSError, ValueError):
        return None
    return None


SEQ_QD = 4  # 1 MiB requests in flight for the sequential figure


class DiskWindow(Window):
    """Outside load over a window: the larger of the share of a device's traffic that was not this
    benchmark's own reads and the share of the CPUs other processes used (Python threads issue the
    reads, so a busy CPU slows them too)."""

    dev: tuple[int, int] = (0, 0)
    ours: list[int] = [0]  # bytes this benchmark read through the device (a running total)

    def __init__(self):
        super().__init__()
        self.d0, self.o0 = _disk_bytes(self.dev), self.ours[0]

    def others(self) -> float:
        cpu = super().others()
        d1 = _disk_bytes(self.dev)
        if d1 is None or self.d0 is None:
            return cpu
        total = d1 - self.d0
        mine = self.ours[0] - self.o0
        return max(cpu, max(0.0, min(1.0, (total - mine) / max(1, total))) if total > 0 else 0.0)


def bench_disk(file_bytes: int = 1 << 30, qd1_reads: int = 2000, qd_reads: int = 8000, qd: int = 16,
               cached_reads: int = 20000, directory: str | os.PathLike | None = None,
               seq_passes: int = 3, qd_passes: int = 3, tick: Tick = None, budget_s: float = 5.0) -> DiskResult:
    """Random 4 KiB reads on a temporary file in `directory` (default: the temp dir).

    Uncached reads go to fresh pages of a random permutation (wrapping round only when a long run
    used them all), so none is served from a cache this process warmed. QD1, QD n and sequential
    reads are sampled in windows; windows in which the device carried other processes' I/O
    (/proc/diskstats) are set aside, within `budget_s` for each. Ticks: write, qd1, qd, seq,
    cached (5)."""
    directory = Path(directory or tempfile.gettempdir())
    pages = max(64, file_bytes // 4096)
    file_bytes = pages * 4096
    fd_tmp, name = tempfile.mkstemp(prefix=".moe-offload-disk-", dir=directory)
    os.close(fd_tmp)
    path = Path(name)
    fds: list[int] = []
    st = os.stat(directory)

    class Win(DiskWindow):
        dev = (os.major(st.st_dev), os.minor(st.st_dev))
        ours = [0]

    try:
        _write_file(path, file_bytes, tick)
        fd, bypass = _open_direct(path)
        fds.append(fd)
        _drop(fd, bypass)
        rng = np.random.default_rng()
        perm = rng.permutation(pages)
        cursor = [0]

        def fresh(n: int) -> np.ndarray:
            """n page offsets not read yet (wraps round, dropping the cache, when all were)."""
            if cursor[0] + n > pages:
                cursor[0] = 0
                _drop(fd, bypass)
            o = perm[cursor[0]:cursor[0] + n] * 4096
            cursor[0] += n
            return o

        # QD1 latency, blocks of 100 reads (aligned buffer from an anonymous mmap satisfies O_DIRECT)
        buf = mmap.mmap(-1, 4096)
        blk = max(1, min(100, qd1_reads))

        def qd1_unit(_i):
            out = []
            for off in fresh(blk):
                t0 = time.perf_counter()
                os.preadv(fd, [buf], int(off))
                out.append(("lat", time.perf_counter() - t0))
            Win.ours[0] += 4096 * blk
            return out

        got, n1 = sample_clean(qd1_unit, qd1_reads, budget_s, window=Win, keys=1,  # want: reads
                               min_units=max(1, qd1_reads // blk // 3))
        lat = np.array(got["lat"])
        buf.close()
        qd1_us = float(np.median(lat)) * 1e6
        qd1_iops = len(lat) / float(lat.sum())
        _tick(tick)

        # QD n: n threads, each its own aligned buffer, reading its share of fresh pages
        def worker(share):
            b = mmap.mmap(-1, 4096)
            try:
                for o in share:
                    os.preadv(fd, [b], int(o))
            finally:
                b.close()

        per_pass = max(qd, min(qd_reads // max(1, qd_passes), pages // 2))
        nqd = [0]
        with ThreadPoolExecutor(qd) as ex:
            def qd_unit(_i):
                offs = fresh(per_pass)
                t0 = time.perf_counter()
                list(ex.map(worker, np.array_split(offs, qd)))
                Win.ours[0] += 4096 * len(offs)
                nqd[0] += len(offs)
                return [("iops", len(offs) / (time.perf_counter() - t0))]

            got, nq = sample_clean(qd_unit, qd_passes, budget_s, min_window_s=0.0, window=Win)
        qd_iops = statistics.median(got["iops"])
        _tick(tick)

        # sequential 1 MiB reads, uncached, whole passes over the file, SEQ_QD requests in flight
        chunks = list(range(0, file_bytes, 1 << 20))

        def seq_worker(part):
            b = mmap.mmap(-1, 1 << 20)
            try:
                return sum(os.preadv(fd, [b], o) for o in part)
            finally:
                b.close()

        with ThreadPoolExecutor(SEQ_QD) as ex:
            def seq_unit(_i):
                _drop(fd, bypass)
                t0 = time.perf_counter()
                done = sum(ex.map(seq_worker, [chunks[j::SEQ_QD] for j in range(SEQ_QD)]))
                Win.ours[0] += done
                return [("gbs", done / (time.perf_counter() - t0) / 1e9)]

            got, ns = sample_clean(seq_unit, seq_passes, budget_s, min_window_s=0.0, window=Win)
        seq_gbs = statistics.median(got["gbs"])
        _tick(tick)

        # page cache: read the file once through the cache, then random 4 KiB reads
        fdc = os.open(path, os.O_RDONLY)
        fds.append(fdc)
        while os.read(fdc, 8 << 20):
            pass
        cperm = rng.integers(0, pages, cached_reads) * 4096
        clat = np.empty(cached_reads)
        for i in range(cached_reads):
            o = int(cperm[i])
            t0 = time.perf_counter()
            os.pread(fdc, 4096, o)
            clat[i] = time.perf_counter() - t0
        cached_us = float(np.median(clat)) * 1e6
        _tick(tick)
        return DiskResult(file_bytes=file_bytes, bypass=bypass, qd1_latency_us=qd1_us, qd1_iops=qd1_iops,
                          qd=qd, qd_iops=qd_iops, seq_gbs=seq_gbs, cached_us=cached_us,
                          cached_iops=cached_reads / float(clat.sum()), reads=len(lat) + nqd[0],
                          directory=str(directory), seq_passes=seq_passes,
                          noise={"qd1": n1, "qd": nq, "seq": ns})
    finally:
        for f in fds:
            try:
                _drop(f, "fadvise")  # give the cache back
            except OSError:
                pass
            os.close(f)
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# device / CPU handover
# ---------------------------------------------------------------------------------------------

@dataclass
class HandoverResult:
    """Round trip: device sync, hand the layer to a CPU worker thread, and back (lower quintile)."""

    device: str
    sync_ms: float  # device op + sync + thread hand-off there and back
    thread_ms: float  # the thread hand-off alone
    iters: int
    noise: Noise = field(default_factory=Noise)
    same_core: bool = False

    def method(self) -> str:
        where = "on one core" if self.same_core else "across cores"
        return (f"torch {self.device} op + sync, queue hand-off to a worker thread and back {where}, "
                f"lower quintile of block medians, {self.iters} round trips, {self.noise.describe()}")


def bench_handover(iters: int = 2000, tick: Tick = None, budget_s: float = 5.0, block: int = 50,
                   same_core: bool = True) -> HandoverResult:
    """The cost of handing a layer from the device to the CPU tier and back.

    `same_core`: run the caller and the worker thread on one core, as a decode loop whose cores
    are awake would see it; across idle cores of a VM the wake-up of a halted vCPU dominates and
    swings 3x with other processes' load (both are in the results store).

    Blocks of `block` round trips, thread-only then with the device op and sync; a block's figure
    is its median, the result the lower quintile of the clean blocks. iters // block ticks."""
    import torch
    dev = torch_device()
    to_w: queue.SimpleQueue = queue.SimpleQueue()
    to_m: queue.SimpleQueue = queue.SimpleQueue()

    pin = None
    if same_core and hasattr(os, "sched_setaffinity"):
        prev_aff = os.sched_getaffinity(0)
        pin = {min(prev_aff)}

    def worker():
        if pin:
            os.sched_setaffinity(0, pin)  # this thread only (Linux: 0 is the calling thread)
        while True:
            item = to_w.get()
            if item is None:
                return
            to_m.put(item)

    if pin:
        os.sched_setaffinity(0, pin)
    th = threading.Thread(target=worker, daemon=True)
    th.start()
    x = torch.ones(16, device=dev)
    lat_t = np.empty(block)
    lat_s = np.empty(block)

    def one(_i):
        for i in range(block):
            t0 = time.perf_counter()
            to_w.put(i)
            to_m.get()
            lat_t[i] = time.perf_counter() - t0
        for i in range(block):
            t0 = time.perf_counter()
            y = x * 2.0
            _sync(dev)
            to_w.put(i)
            to_m.get()
            y.add_(1.0)
            lat_s[i] = time.perf_counter() - t0
        _sync(dev)
        return [("thread", float(np.median(lat_t))), ("sync", float(np.median(lat_s)))]

    try:
        with torch.inference_mode():
            one(0)
            got, noise = sample_clean(one, max(1, iters // block), budget_s, tick=tick, keys=2)
    finally:
        to_w.put(None)
        th.join(5)
        if pin:
            os.sched_setaffinity(0, prev_aff)
    return HandoverResult(device=dev.type, sync_ms=low_quantile(got["sync"]) * 1e3,
                          thread_ms=low_quantile(got["thread"]) * 1e3, iters=iters, noise=noise,
                          same_core=bool(pin))


# ---------------------------------------------------------------------------------------------
# CPU expert kernel: time per job against experts per job, fitted to c_a + c_b * k
# ---------------------------------------------------------------------------------------------

@dataclass
class KernelFit:
    """t(k) = c_a + c_b * k (ms) fitted over experts per job, with the fit's residuals."""

    label: str
    expert_bytes: int
    ks: list[int]
    t_ms: list[float]  # time per job at each k (lower quintile of the repeats)
    c_a_ms: float
    c_b_ms: float
    residuals_ms: list[float]
    rms_rel: float  # rms of residual / measured
    threads: int
    repeats: int
    noise: Noise = field(default_factory=Noise)

    @property
    def expert_gbs(self) -> float:
        """GB/s of expert weights the kernel sustains (bytes of one expert / c_b)."""
        per = self.c_b_ms
        if per <= 0:  # degenerate fit (jobs too small to see the per-expert cost): whole job / k
            per = max(t / k for t, k in zip(self.t_ms, self.ks))
        return self.expert_bytes / (per * 1e-3) / 1e9

    def method(self) -> str:
        return (f"{self.label}: job time (lower quintile of {self.repeats}) at k={self.ks} experts "
                f"({self.expert_bytes / 1e6:.2f} MB each), "
                f"{self.threads} threads, least-squares fit c_a + c_b k, rms residual {100 * self.rms_rel:.1f}%, "
                f"{self.noise.describe()}")


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


def bench_expert_kernel(run_job: Callable[[int, int], object], ks: Sequence[int], expert_bytes: int,
                        repeats: int = 15, label: str = "kernel", threads: int | None = None,
                        tick: Tick = None, budget_s: float = 10.0) -> KernelFit:
    """Time `run_job(k, i)` (one job of k experts; i varies so jobs rotate over their experts).

    The fit is relative least squares (each point weighted by 1/t) so small jobs count as much as
    big ones. A round times every k once; rounds run while other processes used the CPUs are set
    aside (`sample_clean`, within `budget_s`); each k's time is the lower quintile of its clean
    samples. `repeats` ticks in all."""
    ks = [int(k) for k in ks]
    threads = int(threads or numba.get_num_threads())
    for k in ks:  # warm-up (and JIT)
        run_job(k, 0)

    def one_round(i):  # interleaved: a burst of outside load hits every k alike
        out = []
        for k in ks:
            t0 = time.perf_counter()
            run_job(k, i + 1)
            out.append((k, time.perf_counter() - t0))
        return out

    times, noise = sample_clean(one_round, repeats, budget_s, tick=tick, keys=len(ks))
    meds = [low_quantile(times[k]) * 1e3 for k in ks]
    c_a, c_b, res = fit_job_costs(ks, meds)
    rel = res / np.asarray(meds)
    return KernelFit(label=label, expert_bytes=int(expert_bytes), ks=ks, t_ms=meds, c_a_ms=c_a, c_b_ms=c_b,
                     residuals_ms=[float(r) for r in res], rms_rel=float(np.sqrt(np.mean(rel ** 2))),
                     threads=threads, repeats=repeats, noise=noise)


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

    def run_job(k: int, i: int):
        ex = (np.arange(k, dtype=np.int32) + i * k) % pool
        _toy_kernel(w, ex, x, out)
    return run_job, w[0].nbytes


# executor kernel formats this module can synthesise: name -> (row bytes for `cols` weights)
_ROW_BYTES = {"F16": lambda c: 2 * c, "Q8_0": lambda c: c // 32 * 34, "Q4_0": lambda c: c // 32 * 18}


def kernel_version() -> str:
    """Short hash of the executor's kernel sources (kernels.py and the modules beside it that it
    imports), so a calibration names the kernel build it belongs to; '' when absent."""
    import hashlib
    try:
        from executor import kernels
    except Exception:
        return ""
    here = Path(kernels.__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("kernels.py", "simd.py"):
        f = here / name
        if f.is_file():
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


def executor_kernel_available() -> bool:
    """Whether executor/kernels.py exposes the CPU expert kernel (`moe_cpu`) and its tensor type."""
    try:
        from executor import kernels  # noqa: F401
        from executor.gguf_model import EXPERT_TYPES, ExpertTensor  # noqa: F401
    except Exception:
        return False
    return callable(getattr(kernels, "moe_cpu", None)) and callable(getattr(kernels, "csr", None))


def _synth_tensor(fmt: str, n: int, rows: int, cols: int, rng):
    """A synthetic ExpertTensor [n, rows, row_bytes] in `fmt` with sane fp16 scales."""
    from gguf import GGMLQuantizationType as QT
    from executor.gguf_model import EXPERT_TYPES, ExpertTensor
    qt = QT[fmt]
    rb = _ROW_BYTES[fmt](cols)
    if fmt == "F16":
        data = (rng.standard_normal((n, rows, cols), dtype=np.float32) * 0.02).astype(np.float16).view(np.uint8)
    else:
        data = rng.integers(0, 256, (n, rows, rb), dtype=np.uint8)
        blk = 34 if fmt == "Q8_0" else 18
        scale = np.frombuffer(np.float16(0.004).tobytes(), np.uint8)
        v = data.reshape(n, rows, rb // blk, blk)
        v[..., 0], v[..., 1] = scale[0], scale[1]
    return ExpertTensor(data=np.ascontiguousarray(data), qtype=qt, code=EXPERT_TYPES[qt], rows=rows, cols=cols)


def executor_expert_job(fmt: str = "Q4_0", hidden: int = 2048, ffn: int = 768, pool_bytes: int = 256 << 20,
                        max_k: int = 8, seed: int = 0):
    """(run_job, expert_bytes): one token's job of k SwiGLU experts through executor.kernels.moe_cpu.

    The experts are synthetic `fmt` tensors (gate/up [E, ffn, hidden], down [E, hidden, ffn]) in a
    pool larger than the last-level cache; job i uses experts i*k .. i*k+k-1 (mod pool)."""
    from executor import kernels
    if fmt not in _ROW_BYTES:
        raise ValueError(f"no synthetic layout for {fmt} (have {', '.join(_ROW_BYTES)})")
    rng = np.random.default_rng(seed)
    ebytes = 2 * ffn * _ROW_BYTES[fmt](hidden) + hidden * _ROW_BYTES[fmt](ffn)
    pool = max(max_k, int(pool_bytes // ebytes))
    gate = _synth_tensor(fmt, pool, ffn, hidden, rng)
    up = _synth_tensor(fmt, pool, ffn, hidden, rng)
    down = _synth_tensor(fmt, pool, hidden, ffn, rng)
    x = rng.standard_normal((1, hidden)).astype(np.float32)
    out = np.zeros((1, hidden), np.float32)
    routes: dict[tuple[int, int], tuple] = {}

    def run_job(k: int, i: int):
        key = (k, i % pool)
        r = routes.get(key)
        if r is None:
            ex = ((np.arange(k) + i * k) % pool).astype(np.int32).reshape(1, k)
            r = routes[key] = kernels.csr(ex, np.full((1, k), 1.0 / k, np.float32))
        out[:] = 0.0
        kernels.moe_cpu(gate, up, down, x, *r, out=out)
    return run_job, ebytes
