"""The C heap's policy for the kernels' scratch arrays: freed blocks stay mapped for the next job.

numba's arrays come from malloc. glibc hands a block over its mmap threshold (128 KB at first, rising to the largest
block freed, up to 32 MB) back to the kernel at free(), and trims the top of the heap past 128 KB free, so each
prefill job's token panels, activations and int16 rows (MBs, on every thread) were fresh pages: a fault and a zeroed
4 KB page each, and on two threads the faults contend for the process's address-space lock. Raised thresholds
(mallopt) keep them mapped: a `small-q4k` 64-token expert layer job on 2 threads 25.4 -> 22.8 ms, on 1 thread 47.6
-> 44.5 ms, and pp64 end to end 272-274 -> 282-303 tok/s (session 32, MALLOC_*_ set in the environment instead; the
kernel share of the job's profile was 7%). The process keeps up to TRIM_THRESHOLD_BYTES of freed heap: scratch, next
to the model's GBs. The user's own settings win (glibc's MALLOC_* variables or GLIBC_TUNABLES); other C libraries
are left alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # malloc.h
MMAP_THRESHOLD_BYTES = 256 << 20  # blocks up to this come from the heap (a 512-token `small` job's largest: 32 MB)
TRIM_THRESHOLD_BYTES = 512 << 20  # free heap top kept before returning it to the kernel


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds (mallopt) unless the environment sets the heap's policy -> applied."""
    if any(k.startswith("MALLOC_") for k in os.environ) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): its own policy
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
