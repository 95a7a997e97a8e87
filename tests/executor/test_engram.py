"""Engram lookups give exactly the row ids, values and page counts of the original pure-Python code
(kept below as the reference), on the Q8_0 table of `tiny`, an F16 table and a page-straddling width;
the trace gives the lookup's time (t_engram_ms, out of t_dense_ms) and rows on both dense paths."""
from __future__ import annotations

import mmap
import time
from dataclasses import replace

import gguf
import numpy as np
import pytest

from executor.engram import Engram
from executor.make_model import PRESETS, engram_path, make_engram
from executor.runner import Runner, default_prompts
from specs.plan import Placement, Plan

# ---- reference: executor/engram.py before vectorising (row_ids, pages, lookup) --------------------

PAGE = mmap.PAGESIZE
_M64 = (1 << 64) - 1


def _mix(h: int) -> int:
    """splitmix64 finaliser."""
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _M64
    h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _M64
    return h ^ (h >> 31)


def ref_row_ids(e, layer: int, hist) -> np.ndarray:
    out = []
    for n in e.orders:
        gram = list(hist[-n:])
        for hd in range(e.heads):
            h = _mix((layer * 1_000_003 + n * 7919 + hd * 104_729 + 1) & _M64)
            for tok in gram:
                h = _mix((h ^ (int(tok) + 0x9E3779B97F4A7C15)) & _M64)
            out.append(h % e.rows)
    return np.array(out, dtype=np.int64)


def ref_pages(e, rows: np.ndarray) -> int:
    start = e.offset + rows * e.row_bytes
    end = start + e.row_bytes - 1
    pages = set()
    for a, b in zip(start // PAGE, end // PAGE):
        pages.update(range(int(a), int(b) + 1))
    return len(pages)


def ref_lookup(e, layer: int, hists) -> tuple[np.ndarray, int]:
    ids = [ref_row_ids(e, layer, h) for h in hists]
    allr = np.concatenate(ids)
    vals = gguf.dequantize(e.data[allr], e.qtype).astype(np.float32).reshape(len(allr), -1)
    out = vals.reshape(len(hists), -1, vals.shape[-1]).mean(axis=1)
    return out, sum(ref_pages(e, r) for r in ids)


# ---- tests ----------------------------------------------------------------------------------------

def _hists(rng, vocab: int, count: int) -> list[list[int]]:
    """Histories of 1..12 tokens (shorter than the longest order too), ids up to vocab - 1."""
    return [rng.integers(0, vocab, int(rng.integers(1, 13))).tolist() for _ in range(count)]


def _tables(tiny, tmp_path_factory):
    d = tmp_path_factory.mktemp("engram")
    f16 = make_engram(replace(PRESETS["tiny"], engram_type="F16", engram_rows=4099), d / "f16.engram.gguf", 3)
    wide = replace(PRESETS["tiny"], hidden=4000, engram_rows=1021, engram_layers=(0, 2), engram_orders=(1, 3, 5),
                   engram_heads=3)  # Q8_0 rows of 4250 bytes: every row straddles 2 or 3 pages
    return [(engram_path(tiny), 256), (f16, 256), (make_engram(wide, d / "wide.engram.gguf", 5), 4000)]


@pytest.fixture(scope="module")
def tables(tiny, tmp_path_factory):
    return [Engram(p, h) for p, h in _tables(tiny, tmp_path_factory)]


def test_row_ids_match_reference(tables):
    rng = np.random.default_rng(1)
    for e in tables:
        for layer in [*e.layers, 3, 17]:
            for h in _hists(rng, 1 << 20, 40) + [[0], [2**31 - 1, 5, 9, 1, 1, 1]]:
                assert np.array_equal(e.row_ids(layer, h), ref_row_ids(e, layer, h)), (e.path, layer, h)
                assert e.row_ids(layer, np.array(h)).dtype == np.int64


def test_pages_match_reference(tables):
    rng = np.random.default_rng(2)
    for e in tables:
        for _ in range(50):
            rows = rng.integers(0, e.rows, int(rng.integers(1, 30)))
            if rng.random() < 0.3:  # repeated rows and neighbours share pages
                rows = np.concatenate([rows, rows[:3], np.minimum(rows[:3] + 1, e.rows - 1)])
            assert e.pages(rows) == ref_pages(e, rows)


@pytest.mark.parametrize("count", [1, 3, 7, 64])
def test_lookup_matches_reference_bitwise(tables, count):
    rng = np.random.default_rng(count)
    for e in tables:
        for layer in e.layers:
            hists = _hists(rng, 512, count)
            got, pages = e.lookup(layer, hists)
            want, want_pages = ref_lookup(e, layer, hists)
            assert got.dtype == np.float32 and got.shape == want.shape
            assert np.array_equal(got, want) and pages == want_pages


def test_lookup_of_prefixes_as_the_runner_passes_them(tables):
    """A prefill step: every prefix of two streams' token ids, as Runner.step builds `hists`."""
    e = tables[0]
    toks = np.random.default_rng(9).integers(0, 512, (2, 20)).tolist()
    hists = [toks[s][: j + 1] for s in range(2) for j in range(20)]
    got, pages = e.lookup(e.layers[0], hists)
    want, want_pages = ref_lookup(e, e.layers[0], hists)
    assert np.array_equal(got, want) and pages == want_pages


def test_lookup_step_is_lookup_of_each_new_token(tables):
    """lookup_step(layer, streams, n) reads the rows of each stream's last n tokens, as lookup of their prefixes."""
    e = tables[2]
    toks = np.random.default_rng(4).integers(0, 512, (3, 9)).tolist()
    for n in (1, 4, 9):
        got, pages = e.lookup_step(e.layers[1], toks, n)
        want, want_pages = ref_lookup(e, e.layers[1], [t[: len(t) - n + j + 1] for t in toks for j in range(n)])
        assert np.array_equal(got, want) and pages == want_pages
    assert e.rows_per_token == 3 * 3


@pytest.mark.parametrize("cpu_path", [True, False], ids=["cpu-step", "torch-step"])
def test_trace_times_engram_apart_from_dense(tiny, monkeypatch, cpu_path):
    """A lookup slowed by 30 ms shows in t_engram_ms of its layer and not in t_dense_ms; rows = tokens x 24."""
    slow = 30.0
    real = Engram.lookup

    def lookup(self, layer, hists):
        t = time.perf_counter()
        while time.perf_counter() - t < slow / 1e3:
            pass
        return real(self, layer, hists)

    monkeypatch.setattr(Engram, "lookup", lookup)
    P, G = 5, 3
    r = Runner(Plan(streams=2, placement=Placement(engram="nvme")), tiny, P + G)
    if not cpu_path:
        r.cpu = None
    try:
        r.generate(default_prompts(2, P, r.c.vocab, seed=3), G)
    finally:
        r.experts.close()
    for x in r.trace:
        on = x["layer"] in r.engram.layers
        assert x["engram_rows"] == (x["tokens"] * 24 if on else 0)
        assert (x["t_engram_ms"] >= slow) if on else x["t_engram_ms"] == 0.0
        assert (x["engram_pages"] > 0) == on and (x["t_dense_ms"] < slow or not on)  # layer 0 warms up
        assert x["engram_major_faults"] >= 0 and (on or x["engram_major_faults"] == 0)
    assert {x["tokens"] for x in r.trace} == {2 * P, 2}
