"""Disk: random 4 KiB reads with the page cache bypassed (O_DIRECT, else posix_fadvise DONTNEED)
at queue depth 1 and N, sequential 1 MiB reads, and 4 KiB reads served from the page cache, on a
temporary file created (and removed) here.

`tick` arguments are progress callbacks (one call per unit of work); sizes are arguments so tests
run the same code on tiny inputs.
"""
from __future__ import annotations

import mmap
import os
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .sampling import Tick, Window, _tick, sample_clean


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
