"""The page-run jobs of a calibration: the in-place decode jobs again on pools in files whose pages lie in short
physically contiguous runs, as the page cache may hold a GGUF (calibration.page_layout); what such a layout costs
(CPU.file_runs_gbs for llama.cpp's rows, CPU.kernel_file_runs_gbs for the executor's kernel, CPU.file_page_excess).

Which pools (format, run length, span) and which jobs on them; calibrate times them a format at a time (by_format),
each format's pools freed before the next format's are written (format_pool_bytes: the most alive at once)."""
from __future__ import annotations

from functools import partial
from typing import Callable

from specs.hardware import REFERENCE_RUN_KIB

from .bench_kernel import executor_expert_job
from .settings import Settings

# the format timed at every page run length (the others at one only): the shape of the page layout's cost in the
# breaks (CPU.file_page_excess). Q8_0's rows stream at the bus's pace and so pay the layout most: from 64 KiB runs
# 18-25% on one thread, 4-18% on two, where the K-quants' arithmetic hid it to 0-8% (Zen 4 VM, 2026-12-07)
PAGE_RUNS_FORMAT = "Q8_0"

# the executor's reference run length: its kernel timed from a file of the same span in 2 MiB folios (its runs written
# in 2 MiB pieces), beside each shorter-run file. Its jobs on several threads read 40-60 GB/s from anonymous pools an
# eighth to a third the span, timed a minute apart; the excess against those was noise (Zen 4 VM, 2026-12-07)
REFERENCE_KIB = REFERENCE_RUN_KIB


def page_run_pools(s: Settings, formats, kind: str) -> list[tuple[str, int, int]]:
    """(format, KiB a run, bytes the file spans) of the pools in files the page-run jobs of `kind` read, in the order
    they are timed: 'rowwise' (llama.cpp's in-place rows) the first of s.page_runs_kib for each of `formats` that
    s.page_runs_formats names, then the others for PAGE_RUNS_FORMAT only (else the first such format: the shape of
    the cost in the breaks, CPU.file_page_excess); 'kernel' (the executor's) a format at a time, its reference
    (REFERENCE_KIB) then the last (shortest) run length for each s.kernel_page_runs_formats names (None: all), then
    the others for PAGE_RUNS_FORMAT only. Spans: page_runs_pool_bytes' first for the first length, its second
    otherwise."""
    named = s.page_runs_formats if kind == "rowwise" else s.kernel_page_runs_formats
    names = [f for f in formats if named is None or f in named]
    if not names or not s.page_runs_kib:
        return []
    shape = PAGE_RUNS_FORMAT if PAGE_RUNS_FORMAT in names else names[0]
    first, other = s.page_runs_pool_bytes
    kibs = s.page_runs_kib
    span = lambda kib: first if kib == kibs[0] else other  # noqa: E731
    if kind == "rowwise":
        return [(f, kibs[0], first) for f in names] + [(shape, k, other) for k in kibs[1:]]
    return ([p for f in names for p in ((f, REFERENCE_KIB, other), (f, kibs[-1], other))]
            + [(shape, k, span(k)) for k in kibs[:-1]])


def page_run_jobs(s: Settings, rowwise: dict[str, Callable], formats, folder: str = ".") -> list[tuple]:
    """('64KiB', fmt, make_job, what) of the in-place decode jobs on pools in files whose pages lie in physically
    contiguous runs of each of s.page_runs_kib KiB (page_run_pools' 'rowwise' ones, of the formats `rowwise` has a
    job maker for: llama.cpp's rows), then ('kernel-4KiB', ...) the executor's kernel jobs so (its 'kernel' ones of
    `formats`, a format's reference and short runs back to back). The files go in `folder` (the disk benchmark's: a
    disk's, as a GGUF's, not a tmpfs) and are unlinked once mapped."""
    jobs = []
    for kind, makers in (("", rowwise), ("kernel-", {f: executor_expert_job for f in formats})):
        for fmt, kib, span in page_run_pools(s, list(makers), "rowwise" if not kind else "kernel"):
            jobs.append((f"{kind}{kib}KiB", fmt, partial(makers[fmt], file_runs=kib << 10, folder=str(folder),
                                                         file_bytes=span),
                         f"pool in a file in {kib} KiB runs of pages"))
    return jobs


def by_format(jobs: list[tuple]) -> list[list[tuple]]:
    """page_run_jobs' jobs grouped by format, in the order each format first comes: what calibrate times together
    (a format's reference and its short runs, and llama.cpp's rows and the executor's kernel on a shared pool)."""
    groups: dict[str, list[tuple]] = {}
    for job in jobs:
        groups.setdefault(job[1], []).append(job)
    return list(groups.values())


def format_pool_bytes(s: Settings, formats) -> int:
    """Bytes of the pools in files of the format with the most (s.kernel_formats' rows and kernel together, a pool
    shared by the two counted once): what the page-run jobs hold at once."""
    pools = set(page_run_pools(s, formats, "rowwise")) | set(page_run_pools(s, formats, "kernel"))
    per: dict[str, int] = {}
    for fmt, _, span in pools:
        per[fmt] = per.get(fmt, 0) + span
    return max(per.values(), default=0)
