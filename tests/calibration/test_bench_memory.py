"""Memory bandwidth on tiny arrays: structure, positivity and relations (never timing bars)."""
from calibration.bench_memory import MemoryBench, bench_memory, default_thread_counts


def test_thread_counts():
    assert default_thread_counts(1) == [1]
    assert default_thread_counts(2) == [1, 2]
    assert default_thread_counts(6) == [1, 2, 4, 6]
    assert default_thread_counts(8) == [1, 2, 4, 8]


def test_memory_structure():
    ticks = []
    m = bench_memory(1 << 20, threads=[1, 2], repeats=3, tick=lambda: ticks.append(1),
                     budget_s=0.3)
    assert len(ticks) == 3  # one per clean round (filled up when the budget runs out)
    assert set(m.best) == {"read", "copy", "triad"}
    for k in m.best:
        assert set(m.best[k]) == {1, 2}
        for t in (1, 2):
            assert m.best[k][t] >= m.median[k][t] >= m.low[k][t] > 0
    t, v = m.figure("read")
    assert v == max(m.low["read"].values()) and t in (1, 2)
    assert "1 thread" in m.method("read", 1)


def test_memory_bench_merges_sampling_calls():
    m = MemoryBench(1 << 20, threads=[1], kernels=("read",))
    m.sample(2, budget_s=0.3)
    m.sample(2, budget_s=0.3)
    r = m.result()
    assert r.repeats == 4 and len(m.times[("read", 1)]) >= 4 and r.noise.windows >= 2
    assert r.best["read"][1] >= r.median["read"][1] > 0
    m.free()
