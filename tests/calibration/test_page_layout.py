"""Where a file's pages lie in physical memory (calibration.page_layout): the arithmetic on frame numbers, and real
files written in runs of a chosen length, read back through pagemap where this process may see frame numbers."""
from __future__ import annotations

import numpy as np
import pytest

from calibration.page_layout import PMD_PAGES, layout_of_frames, map_file, page_layout, write_in_runs


def test_contiguous_frames_have_no_break_and_a_512_aligned_run_is_pmd_mappable():
    """1024 frames from 1024 on, in order: no break; both 2 MiB halves start at a multiple of 512: all PMD."""
    lay = layout_of_frames(np.arange(1024, 2048))
    assert (lay.breaks, lay.pmd_share, lay.resident_share) == (0.0, 1.0, 1.0)
    assert lay.mean_run_kib == float("inf")


def test_a_run_not_starting_at_an_aligned_frame_is_not_pmd_mappable():
    """512 contiguous frames from 100: no break, but no 2 MiB folio (its first frame is not a multiple of 512)."""
    lay = layout_of_frames(np.arange(100, 100 + PMD_PAGES))
    assert lay.breaks == 0.0 and lay.pmd_share == 0.0


def test_breaks_count_the_page_pairs_whose_frames_are_not_neighbours():
    """Frames 10 11 12 50 51 7: 2 of 5 pairs break (12->50, 51->7); a mean run of 4 KiB / 0.4 = 10 KiB."""
    lay = layout_of_frames(np.array([10, 11, 12, 50, 51, 7]))
    assert lay.breaks == pytest.approx(2 / 5)
    assert lay.mean_run_kib == pytest.approx(10.0)


def test_pages_not_present_and_pairs_across_windows_are_not_counted():
    """Two windows [5 6 7] [9 0 1], the 0 not present: pairs 5-6, 6-7 (no break), 7-9 spans windows (not counted),
    9-0 and 0-1 touch an absent page (not counted): 0 breaks of 2 pairs; 5 of 6 pages resident."""
    lay = layout_of_frames(np.array([[5, 6, 7], [9, 0, 1]]), np.array([[1, 1, 1], [1, 0, 1]], bool))
    assert lay.breaks == 0.0
    assert lay.resident_share == pytest.approx(5 / 6)


def _frames_readable(tmp_path) -> bool:
    p = write_in_runs(tmp_path / "probe", np.zeros(8 * 4096, np.uint8), None)
    return page_layout(p) is not None


@pytest.mark.parametrize("run_bytes, lo, hi", [(4096, 0.9, 1.0), (65536, 0.04, 0.09)])
def test_a_file_written_in_shuffled_runs_lies_in_runs_of_that_length(tmp_path, run_bytes, lo, hi):
    """32 MiB written in shuffled 4 KiB runs: (nearly) every page boundary a physical break; in shuffled 64 KiB runs:
    1 boundary in 16 (0.0625), give or take the allocator's own joins and splits. Needs frame numbers (root)."""
    if not _frames_readable(tmp_path):
        pytest.skip("pagemap hides frame numbers from this process (no CAP_SYS_ADMIN)")
    p = write_in_runs(tmp_path / "pool", np.random.default_rng(0).integers(0, 255, 32 << 20, dtype=np.uint8), run_bytes)
    lay = page_layout(p)
    assert lo <= lay.breaks <= hi
    assert lay.resident_share == 1.0


def test_a_file_written_in_runs_reads_back_its_bytes(tmp_path):
    """The shuffled writes put every run at its own offset: the map reads the data back unchanged."""
    data = np.random.default_rng(1).integers(0, 255, 3 * 65536 + 4096, dtype=np.uint8)
    for run in (4096, 65536, None):
        a = map_file(write_in_runs(tmp_path / f"f{run}", data, run))
        assert np.array_equal(a, data)


def test_resident_only_reads_nothing_from_disk_and_sees_what_the_page_cache_holds(tmp_path):
    """A file dropped from the page cache (POSIX_FADV_DONTNEED after its write was synced): resident_only faults in
    nothing, so no page is resident and there is no layout to give; read back, its pages are all resident again."""
    import os
    if not _frames_readable(tmp_path):
        pytest.skip("pagemap hides frame numbers from this process (no CAP_SYS_ADMIN)")
    p = write_in_runs(tmp_path / "cold", np.ones(4 << 20, np.uint8), None)
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    assert page_layout(p, resident_only=True) is None
    assert page_layout(p).resident_share == 1.0
    assert page_layout(p, resident_only=True).resident_share == 1.0


def test_without_a_readable_pagemap_the_layout_is_unknown(tmp_path, monkeypatch):
    """A container may hide /proc/self/pagemap: page_layout says None (ingest then leaves the plan's breaks at 0), and
    the file's map is closed all the same."""
    import calibration.page_layout as PL

    def hidden(addr, n):
        raise PermissionError("pagemap")
    monkeypatch.setattr(PL, "_frames", hidden)
    p = write_in_runs(tmp_path / "f", np.ones(4 * 4096, np.uint8), None)
    assert page_layout(p) is None and page_layout(p, resident_only=True) is None
