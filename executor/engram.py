"""Engram: n-gram rows hashed from the last token ids, read from an mmap'd GGUF table (MADV_RANDOM).

Row numbers depend only on token ids, so they are known before the forward pass. At each configured
layer the mean of the token's rows is added to the residual. Pages touched are counted (4 KiB); rows
not in the page cache are read from storage inside the lookup (major faults, ~0.3 ms each here).
Hashes, page counts and the Q8_0 mean run in numba loops; only the gathered rows are dequantised.
"""
from __future__ import annotations

import mmap
import os
import resource
from pathlib import Path

import gguf
import numpy as np
from numba import njit

from specs.errors import SpecError

PAGE = mmap.PAGESIZE
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_WHO = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)


def major_faults() -> int:
    """Major page faults of this thread so far (pages read from storage; ~0.7 us a call)."""
    return resource.getrusage(_WHO).ru_majflt


def _mix(h: int) -> int:
    """splitmix64 finaliser."""
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _M64
    h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _M64
    return h ^ (h >> 31)


@njit(cache=True, nogil=True)
def _hash_rows(seeds, orders, toks, lens, rows, out):
    """out[t, o * heads + hd] = row of token t's last min(orders[o], lens[t]) ids (toks [T, W] uint64,
    right-aligned) folded into seeds[o, hd] with splitmix64, mod rows (all uint64: wrapping)."""
    T, W = toks.shape
    O, Hd = seeds.shape
    for t in range(T):
        for o in range(O):
            n = min(orders[o], lens[t])
            for hd in range(Hd):
                h = seeds[o, hd]
                for p in range(W - n, W):
                    h = h ^ (toks[t, p] + np.uint64(_GOLDEN))
                    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
                    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
                    h = h ^ (h >> np.uint64(31))
                out[t, o * Hd + hd] = h % rows


@njit(cache=True, nogil=True)
def _count_pages(rows, offset, row_bytes, page, span):
    """Sum over t of the distinct pages the byte ranges of rows[t] (rows [T, R]) touch."""
    T, R = rows.shape
    buf = np.empty(R * span, dtype=np.int64)
    total = 0
    for t in range(T):
        m = 0
        for r in range(R):
            a = offset + rows[t, r] * row_bytes
            for pg in range(a // page, (a + row_bytes - 1) // page + 1):
                buf[m] = pg
                m += 1
        s = np.sort(buf[:m])
        for i in range(m):
            if i == 0 or s[i] != s[i - 1]:
                total += 1
    return total


@njit(cache=True, nogil=True)
def _mean_q8(q, d, out):
    """out[t] = mean of dequantised Q8_0 rows t R .. t R + R - 1 (q [T R, nb, 32] int8, d [T R, nb, 1] f32
    scales, out [T, nb 32] f32), in numpy's order: f32 products, summed row by row, then / R."""
    T, nb = out.shape[0], q.shape[1]
    R = q.shape[0] // T
    for t in range(T):
        for b in range(nb):
            for j in range(32):
                out[t, b * 32 + j] = np.float32(q[t * R, b, j]) * d[t * R, b, 0]
        for i in range(t * R + 1, t * R + R):
            for b in range(nb):
                for j in range(32):
                    out[t, b * 32 + j] += np.float32(q[i, b, j]) * d[i, b, 0]
        for h in range(nb * 32):
            out[t, h] /= np.float32(R)


class Engram:
    """An Engram table: `rows` rows of `hidden` values, read in place."""

    def __init__(self, path: str | Path, hidden: int):
        self.path = Path(path)
        try:
            r = gguf.GGUFReader(self.path, "r")
        except Exception as e:
            raise SpecError(str(self.path), None, f"not a readable Engram GGUF ({e})") from None
        t = {x.name: x for x in r.tensors}.get("per_layer_token_embd.weight")
        if t is None:
            raise SpecError(str(self.path), "per_layer_token_embd.weight", "missing tensor")
        if t.data_offset + t.n_bytes > os.path.getsize(self.path):
            raise SpecError(str(self.path), t.name, "file truncated")
        cols, self.rows = int(t.shape[0]), int(t.shape[1])
        if cols != hidden:
            raise SpecError(str(self.path), "engram.embedding_length", f"row width {cols} != model hidden {hidden}")
        get = lambda k, d: r.fields[k].contents() if k in r.fields else d  # noqa: E731
        self.layers = [int(v) for v in get("engram.layers", [1])]
        self.orders = [int(v) for v in get("engram.orders", [2, 3, 4])]
        self.heads = int(get("engram.heads", 8))
        self.qtype, self.data = t.tensor_type, np.asarray(t.data)  # [rows, row_bytes or cols]
        self.row_bytes = t.n_bytes // self.rows
        self.offset = t.data_offset
        mm = getattr(r.data, "_mmap", None)
        if mm is not None and hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_RANDOM)  # no read-ahead: rows are scattered
        self._reader = r
        self._orders = np.array(self.orders, dtype=np.int64)
        self._seeds: dict[int, np.ndarray] = {}
        self._span = (self.row_bytes + PAGE - 2) // PAGE + 1  # most pages one row can touch
        self.lookup(self.layers[0] if self.layers else 0, [[0]])  # load the numba kernels now, not in a step

    def _seeds_of(self, layer: int) -> np.ndarray:
        """Per (order, head) starting hashes of `layer` [len(orders), heads] uint64, computed once."""
        s = self._seeds.get(layer)
        if s is None:
            s = self._seeds[layer] = np.array(
                [[_mix((layer * 1_000_003 + n * 7919 + hd * 104_729 + 1) & _M64) for hd in range(self.heads)]
                 for n in self.orders], dtype=np.uint64)
        return s

    def _row_matrix(self, layer: int, hists) -> np.ndarray:
        """Rows [len(hists), len(orders) * heads] int64 of each history (ids, last = current)."""
        W = max(self.orders)
        toks = np.zeros((len(hists), W), dtype=np.uint64)
        lens = np.empty(len(hists), dtype=np.int64)
        for i, h in enumerate(hists):
            tail = h[-W:]
            lens[i] = len(tail)
            toks[i, W - len(tail):] = tail
        out = np.empty((len(hists), len(self.orders) * self.heads), dtype=np.int64)
        _hash_rows(self._seeds_of(layer), self._orders, toks, lens, np.uint64(self.rows), out)
        return out

    def row_ids(self, layer: int, hist) -> np.ndarray:
        """Rows [len(orders) * heads] for the token whose history (ids, last = current) is `hist`."""
        return self._row_matrix(layer, [hist])[0]

    def pages(self, rows: np.ndarray) -> int:
        """Distinct pages the byte ranges of `rows` touch."""
        rows = np.asarray(rows, dtype=np.int64).reshape(1, -1)
        return int(_count_pages(rows, self.offset, self.row_bytes, PAGE, self._span))

    def _mean(self, ids: np.ndarray) -> np.ndarray:
        """Mean dequantised row of each row set ids [T, R] -> [T, hidden] f32 (only these rows are read)."""
        T, R = ids.shape
        raw = self.data[ids.reshape(-1)]
        if self.qtype == gguf.GGMLQuantizationType.Q8_0:
            b = raw.reshape(T * R, -1, 34)  # per block: f16 scale, 32 int8
            d = np.ascontiguousarray(b[..., :2]).view(np.float16).astype(np.float32)
            out = np.empty((T, b.shape[1] * 32), dtype=np.float32)
            _mean_q8(b[..., 2:].view(np.int8), d, out)
            return out
        vals = gguf.dequantize(raw, self.qtype).astype(np.float32, copy=False)
        return vals.reshape(T, R, -1).mean(axis=1)

    @property
    def rows_per_token(self) -> int:
        """Rows gathered per token at one Engram layer: orders x heads."""
        return len(self.orders) * self.heads

    def lookup_step(self, layer: int, streams, n: int) -> tuple[np.ndarray, int]:
        """lookup() for the last n tokens of each stream's history (S lists of ids) -> ([S n, hidden] f32, pages)."""
        W = max(self.orders)
        return self.lookup(layer, [h[max(0, e - W):e] for h in streams for e in range(len(h) - n + 1, len(h) + 1)])

    def lookup(self, layer: int, hists) -> tuple[np.ndarray, int]:
        """Mean row per history in `hists` -> ([len(hists), hidden] f32, pages touched)."""
        ids = self._row_matrix(layer, hists)  # [T, R]
        return self._mean(ids), int(_count_pages(ids, self.offset, self.row_bytes, PAGE, self._span))
