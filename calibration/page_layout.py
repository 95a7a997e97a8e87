"""Where a file's pages lie in physical memory, and files written to lie a chosen way.

An engine that reads its weights in place (llama.cpp without repacking, the executor) streams them through its mmap of
the GGUF, that is from the page cache, whose pages were placed in physical memory when the file was written or read in.
How they lie decides how fast the stream runs: on the Zen 4 VM (2026-12-07), llama-bench tg64 on one thread of the
same `small` (Q8_0) file ran 52-53 tok/s from a copy written in 64 MiB writes (2 MiB folios, mapped by PMD), 44.3-44.6
from the file as the page cache then held it (9% of its page boundaries physical breaks, 10% in 2 MiB runs) and 28-31
from a copy whose 4 KiB pages were written in shuffled order (every boundary a break). The hardware prefetcher
streams physical addresses: at a break it has fetched the wrong lines and starts again.

`page_layout(path)` reads a file's layout from /proc/self/pagemap (frame numbers need CAP_SYS_ADMIN: else None);
`layout_of_frames` is the arithmetic; `write_in_runs` writes a file whose physically contiguous runs have a chosen
length and `map_file` maps it back, as calibrate's pools in files and benchmarks/bench_weight_pages.py use.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specs.errors import SpecError

PAGE = 4096  # bytes of a base page (x86-64, ARM64's default)
PMD_PAGES = 512  # base pages in one 2 MiB folio a PMD maps
# a pagemap entry: bits 0-54 the frame number, bit 63 present (Documentation/admin-guide/mm/pagemap.rst)
_PFN_MASK = np.uint64((1 << 55) - 1)
_PRESENT = np.uint64(1 << 63)


@dataclass(frozen=True)
class PageLayout:
    """How a file's resident pages lie: `breaks`, the share of neighbouring page pairs (in file order) whose frames
    are not neighbours; `pmd_share`, the share of its pages in 2 MiB-aligned runs of 512 contiguous frames (the folios a
    PMD can map); `resident_share`, the share of the sampled pages that were present."""

    pages: int
    resident_share: float
    breaks: float
    pmd_share: float

    @property
    def mean_run_kib(self) -> float:
        """KiB of a physically contiguous run on average (4 / breaks; inf with no break)."""
        return PAGE / 1024 / self.breaks if self.breaks else float("inf")


def layout_of_frames(frames: np.ndarray, present: np.ndarray | None = None) -> PageLayout:
    """The layout of pages whose frame numbers are `frames` (int64, file order, one window of consecutive pages per
    row for a 2-D array: pairs across rows are not counted); pages not `present` count in neither ratio."""
    f = np.atleast_2d(np.asarray(frames, np.int64))
    p = np.ones(f.shape, bool) if present is None else np.atleast_2d(np.asarray(present, bool))
    pair = p[:, 1:] & p[:, :-1]
    breaks = float(((np.diff(f, axis=1) != 1) & pair).sum() / max(1, pair.sum()))
    pmd = 0
    for row, ok in zip(f, p):
        # a run of 512 contiguous present frames starting at a 512-aligned frame, wherever it starts in the file
        starts = np.flatnonzero(ok & (row % PMD_PAGES == 0))
        for s in starts:
            end = s + PMD_PAGES
            if end <= row.size and ok[s:end].all() and row[end - 1] - row[s] == PMD_PAGES - 1 \
                    and (np.diff(row[s:end]) == 1).all():
                pmd += PMD_PAGES
    n = int(p.sum())
    return PageLayout(pages=int(f.size), resident_share=n / max(1, f.size), breaks=breaks,
                      pmd_share=pmd / max(1, n))


def _frames(addr: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(frame numbers, present) of the n pages of this process from virtual address addr (page-aligned)."""
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(addr // PAGE * 8)
        e = np.frombuffer(f.read(n * 8), np.uint64)
    return (e & _PFN_MASK).astype(np.int64), (e & _PRESENT) != 0


_LIBC: list = []  # the C library, loaded on first use (mincore)


def _resident(addr: int, n: int) -> np.ndarray:
    """Whether each of the n pages from addr (page-aligned, mapped) is in the page cache (mincore(2))."""
    import ctypes
    if not _LIBC:
        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    vec = (ctypes.c_ubyte * n)()
    if _LIBC[0].mincore(ctypes.c_void_p(addr), ctypes.c_size_t(n * PAGE), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return (np.frombuffer(vec, np.uint8) & 1).astype(bool)


def page_layout(path: str | os.PathLike, windows: int = 64, window_pages: int = 4 * PMD_PAGES,
                resident_only: bool = False) -> PageLayout | None:
    """The layout of `path`'s pages in the page cache: `windows` windows of window_pages pages spread evenly over the
    file, each page touched through a read-only shared map (as llama.cpp maps a GGUF: a page not resident is read in,
    as llama.cpp's loader would; resident_only: only the pages the page cache holds are touched, so nothing is read
    from disk); None where frame numbers read as zero (no CAP_SYS_ADMIN), the file is empty or none is resident."""
    size = os.path.getsize(path)
    n = size // PAGE
    if n == 0:
        return None
    w = min(window_pages, n)
    starts = np.unique(np.linspace(0, n - w, max(1, min(windows, n // w)), dtype=np.int64))
    fd = os.open(path, os.O_RDONLY)
    try:
        m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        return _sampled_layout(m, starts.tolist(), w, resident_only)
    except OSError:  # no pagemap here (a container may hide it), or mincore refused
        return None
    finally:
        try:
            m.close()
        except BufferError:  # a view still held by an exception's frame: the map closes when it is collected
            pass


def _sampled_layout(m: mmap.mmap, starts: list[int], w: int, resident_only: bool) -> PageLayout | None:
    """page_layout's windows of w pages from each of `starts` (pages) of the map m."""
    a = np.frombuffer(m, np.uint8)
    base = a.ctypes.data
    rows, pres = [], []
    for s in starts:
        win = a[s * PAGE:(s + w) * PAGE:PAGE]
        if resident_only:
            int(win[_resident(base + s * PAGE, w)].sum())  # fault in the resident pages only: no disk read
        else:
            int(win.sum())  # fault each page of the window in
        fr, pr = _frames(base + s * PAGE, w)
        rows.append(fr)
        pres.append(pr)
    del a, win  # the map closes only once no view of it is left
    frames, present = np.array(rows), np.array(pres)
    if not frames[present].any():
        return None  # frame numbers hidden: pagemap shows them to CAP_SYS_ADMIN only
    return layout_of_frames(frames, present)


def write_in_runs(path: str | os.PathLike, data: np.ndarray, run_bytes: int | None, seed: int = 0,
                  repeat: int = 1) -> Path:
    """Write `data` (bytes), `repeat` times over, to `path` so that its pages lie in physically contiguous runs of
    about run_bytes: its runs written in a shuffled order (the page cache takes each write's frames from the
    allocator in turn), or the whole in 64 MiB writes with run_bytes None (large folios, PMD-mapped where aligned);
    synced, so that no writeback runs while it is read."""
    b = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    total = b.nbytes * repeat
    step = (64 << 20) if run_bytes is None else max(PAGE, run_bytes // PAGE * PAGE)
    offs = np.arange(0, total, step)
    if run_bytes is not None:
        offs = np.random.default_rng(seed).permutation(offs)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in offs.tolist():
            end = min(off + step, total)
            while off < end:  # a run across a repetition's end in two writes
                i = off % b.nbytes
                n = min(end - off, b.nbytes - i)
                os.pwrite(fd, b[i:i + n], off)
                off += n
        os.fsync(fd)
    finally:
        os.close(fd)
    return Path(path)


def map_file(path: str | os.PathLike, private: bool = False) -> np.ndarray:
    """The bytes of `path` through a read-only shared map with every page faulted in (MAP_POPULATE, as llama.cpp's
    loader maps a GGUF); the array keeps the map open. private: a private writable map instead, each page faulted in
    by a read, so that it maps the page cache's own frame (a write would copy it: never write): numba compiles its
    kernels once for writable arrays, and a read-only one would cost each a second compilation."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if private:
            m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        else:
            m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    a = np.frombuffer(m, np.uint8)
    if private:
        int(a[::PAGE].sum())  # read faults: the page cache's frames, not copies
    return a


def page_breaks_of(value: str | None, model_file: str) -> float | None:
    """The share of a GGUF's page boundaries that are physical breaks, for a plan's cpu_file_page_breaks: `value` a
    number, or 'auto' to read it now from `model_file`, resident pages only (for runs: right after them, the page
    cache moves); None where not given, not readable (frame numbers need root), not a file, or where less than half
    the sampled pages are resident. A bad value raises SpecError naming --page-breaks."""
    if value is None:
        return None
    if value != "auto":
        try:
            b = float(value)
        except ValueError:
            b = -1.0
        if not 0.0 <= b <= 1.0:
            raise SpecError("--page-breaks", None, f"must be 'auto' or a share in [0, 1] (got {value!r})")
        return b
    if not model_file or not Path(model_file).is_file():
        return None
    lay = page_layout(model_file, resident_only=True)
    # most of the file gone from the page cache: the run's layout is not what is left of it
    return lay.breaks if lay is not None and lay.resident_share >= 0.5 else None
