"""Disk benchmark on a tiny temporary file: structure, positivity, cleanup (never timing bars)."""
import os

from calibration.bench_disk import bench_disk


def test_disk_uncached_and_cached(tmp_path):
    ticks = []
    d = bench_disk(1 << 20, qd1_reads=20, qd_reads=40, qd=4, cached_reads=50, directory=tmp_path,
                   tick=lambda: ticks.append(1))
    assert len(ticks) == 5
    assert d.bypass in ("O_DIRECT", "posix_fadvise DONTNEED")
    assert d.file_bytes == 1 << 20 and d.reads >= 40 and d.qd == 4
    for v in (d.qd1_latency_us, d.qd1_iops, d.qd_iops, d.seq_gbs, d.cached_us, d.cached_iops):
        assert v > 0
    assert os.listdir(tmp_path) == []  # the temporary file is gone
    assert "QD4" in d.method("qd") and d.bypass in d.method("qd1")


def test_disk_falls_back_to_fadvise(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "O_DIRECT", raising=False)
    d = bench_disk(1 << 20, qd1_reads=10, qd_reads=10, qd=2, cached_reads=10, directory=tmp_path)
    assert d.bypass == "posix_fadvise DONTNEED" and d.qd1_latency_us > 0
