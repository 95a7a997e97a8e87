"""Device / CPU handover on a few round trips: structure, positivity, CPU affinity restored."""
import os

from calibration.bench_handover import bench_handover


def test_handover():
    aff = os.sched_getaffinity(0)
    h = bench_handover(iters=20, budget_s=0.3, block=10)
    assert h.sync_ms > 0 and h.thread_ms > 0 and h.iters == 20
    assert h.device in h.method() and h.same_core and "one core" in h.method()
    assert os.sched_getaffinity(0) == aff  # pinning undone
    c = bench_handover(iters=20, budget_s=0.3, block=10, same_core=False)
    assert not c.same_core and c.sync_ms > 0 and os.sched_getaffinity(0) == aff  # affinity restored
