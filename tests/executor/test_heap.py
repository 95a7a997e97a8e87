"""The C heap's policy (executor/heap.py): the kernels' freed scratch stays mapped, unless the user set the policy."""
from __future__ import annotations

import os
import resource

import numpy as np
import pytest

import executor  # noqa: F401  (its import applies the policy)
from executor.heap import keep_freed_memory


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(any(k.startswith("MALLOC_") for k in os.environ), reason="the user's MALLOC_ settings apply")
def test_a_freed_8_mb_scratch_array_comes_back_without_page_faults():
    """8 MB freed and allocated again, as each prefill job's panels are: no page faults (glibc's defaults hand the
    block back to the kernel at free, and the next one faults in ~500-2,000 fresh pages)."""
    if not keep_freed_memory():
        pytest.skip("not glibc: its own policy")
    a = np.ones(2 << 20, np.float32)
    del a
    f0 = _minor_faults()
    b = np.ones(2 << 20, np.float32)
    assert _minor_faults() - f0 < 16
    assert b.sum() == 2 << 20


def test_the_users_malloc_settings_win(monkeypatch):
    """With any MALLOC_* variable (or glibc.malloc tunables) in the environment the policy is left as the user set it."""
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert keep_freed_memory() is False
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0")
    assert keep_freed_memory() is False
