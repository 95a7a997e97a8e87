"""cpu_layers: the clock run_layers reads, its layer range, and when the fused steps' records are written."""
from __future__ import annotations

import sys
import time

import numpy as np
import pytest
from numba import njit

from executor import cpu_layers as CL
from executor.runner import Runner, default_prompts
from specs.plan import Placement, Plan


@njit
def _now():
    return CL.clock_ns()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="perf_counter is CLOCK_MONOTONIC on Linux")
def test_clock_ns_reads_the_clock_behind_perf_counter():
    """clock_ns inside compiled code falls between two time.perf_counter_ns reads around it."""
    _now()
    for _ in range(100):
        a = time.perf_counter_ns()
        b = _now()
        c = time.perf_counter_ns()
        assert a <= b <= c


def test_run_layers_runs_only_its_range_and_times_each_part(tiny):
    """Layers [1, 3) change x and fill rows 1 and 2 of the output only: the experts run are the routed ones,
    and each layer's clock readings increase (start <= after routing <= after experts) and follow the
    previous layer's; layer_records turns the rows into the per-layer path's records."""
    r = Runner(Plan(placement=Placement(engram="none")), tiny, 8)
    try:
        step, E, k = r.cpu, r.c.n_experts, r.k
        assert step.tables is not None
        r.generate(default_prompts(1, 3, r.c.vocab), 1)
        x = np.random.default_rng(0).standard_normal((1, r.c.hidden)).astype(np.float32)
        x0 = x.copy()
        step._run_layers(0, 0, x, step.cos[3:4], step.sin[3:4], 3, 1)
        assert np.array_equal(x, x0)  # an empty range is a no-op (how CpuStep loads the function)
        out = step._run_layers(1, 3, x, step.cos[3:4], step.sin[3:4], 3, 1)
        assert not np.array_equal(x, x0)
        assert out.shape == (r.c.n_layers, 4 + E + k)
        for i in (1, 2):
            nrun, ids = out[i, 3], out[i, 4 + E:]
            assert sorted(out[i, 4:4 + nrun].tolist()) == sorted(set(ids.tolist())) and len(ids) == k
        t = out[1:3, :3].reshape(-1)
        assert np.all(np.diff(t) >= 0) and t[0] > 0
        recs = CL.layer_records(out, 1, 3, 1, k, step.ebytes, 9, "decode", (0, 0, 0, 0.0))
        assert [x["layer"] for x in recs] == [1, 2] and all(x["step"] == 9 for x in recs)
        assert recs[0]["routed"] == [out[1, 4 + E:].tolist()]
        assert recs[1]["t_dense_ms"] == (out[2, 1] - out[2, 0]) * 1e-6
    finally:
        r.experts.close()


def test_fused_steps_write_their_records_at_flush(tiny):
    """A fused CpuStep.step leaves its records pending (built after the timed steps); flush() appends
    them in step order, one a layer; Runner.step flushes after its step, so its caller sees them."""
    r = Runner(Plan(placement=Placement(engram="none")), tiny, 8)
    try:
        L = r.c.n_layers
        r.cpu.step(default_prompts(1, 2, r.c.vocab), "prefill", 0)
        r.cpu.step(np.array([[5]]), "decode", 1)
        assert r.trace == [] and len(r.cpu.pending) == 2
        r.cpu.flush()
        assert [(x["step"], x["layer"], x["tokens"]) for x in r.trace] == \
            [(0, i, 2) for i in range(L)] + [(1, i, 1) for i in range(L)]
        assert r.cpu.pending == []
        r.step(np.array([[7]]), "decode", 2)
        assert [x["step"] for x in r.trace[-L:]] == [2] * L and len(r.trace) == 3 * L
    finally:
        r.experts.close()
