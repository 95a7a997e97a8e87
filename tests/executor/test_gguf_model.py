"""GGUFModel's mapping: populated at load when every expert lives in RAM, page by page otherwise."""
from __future__ import annotations

import os
import sys

import pytest

from executor.gguf_model import GGUFModel
from executor.runner import Runner
from specs.plan import Placement, Plan

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def mapped_kb(m: GGUFModel) -> int:
    """kB of m's own file mapping that this process has page-table entries for (its Rss in smaps)."""
    start = m.reader.data.ctypes.data
    found = False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5:
            found = int(head[0].split("-")[0], 16) == start
        elif found and head[0] == "Rss:":
            return int(head[1])
    raise AssertionError("mapping not found in /proc/self/smaps")


def test_populate_maps_every_page_of_the_file(tiny):
    """After populate() the mapping's resident set is the whole file (its pages are in the page cache:
    tiny was just written), where a fresh mapping has touched only the header's pages."""
    m = GGUFModel(tiny)
    before = mapped_kb(m)
    if not m.populate():
        pytest.skip("MADV_POPULATE_READ not supported by this kernel")
    size_kb = os.path.getsize(tiny) // 4096 * 4
    assert before < size_kb // 2
    assert mapped_kb(m) >= size_kb


def test_runner_populates_only_when_every_expert_lives_in_ram(tiny):
    """An all-RAM plan maps the file at load; a plan whose experts beyond a RAM budget come from NVMe
    leaves them to be read as the steps route to them (populating would read the whole file)."""
    if not GGUFModel(tiny).populate():
        pytest.skip("MADV_POPULATE_READ not supported by this kernel")
    size_kb = os.path.getsize(tiny) // 4096 * 4
    for placement, whole in ((Placement(engram="none"), True),
                             (Placement(engram="none", expert_ram_bytes=1 << 20), False)):
        r = Runner(Plan(placement=placement), tiny, 8)
        try:
            assert (mapped_kb(r.m) >= size_kb) == whole
        finally:
            r.experts.close()
