"""Engram: n-gram rows hashed from the last token ids, read from an mmap'd GGUF table (MADV_RANDOM).

Row numbers depend only on token ids, so they are known before the forward pass. At each configured
layer the mean of the token's rows is added to the residual. Pages touched are counted (4 KiB).
"""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import gguf
import numpy as np

from specs.errors import SpecError

PAGE = mmap.PAGESIZE
_M64 = (1 << 64) - 1


def _mix(h: int) -> int:
    """splitmix64 finaliser."""
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _M64
    h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _M64
    return h ^ (h >> 31)


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

    def row_ids(self, layer: int, hist) -> np.ndarray:
        """Rows [len(orders) * heads] for the token whose history (ids, last = current) is `hist`."""
        out = []
        for n in self.orders:
            gram = list(hist[-n:])
            for hd in range(self.heads):
                h = _mix((layer * 1_000_003 + n * 7919 + hd * 104_729 + 1) & _M64)
                for tok in gram:
                    h = _mix((h ^ (int(tok) + 0x9E3779B97F4A7C15)) & _M64)
                out.append(h % self.rows)
        return np.array(out, dtype=np.int64)

    def pages(self, rows: np.ndarray) -> int:
        """Distinct pages the byte ranges of `rows` touch."""
        start = self.offset + rows * self.row_bytes
        end = start + self.row_bytes - 1
        pages = set()
        for a, b in zip(start // PAGE, end // PAGE):
            pages.update(range(int(a), int(b) + 1))
        return len(pages)

    def lookup(self, layer: int, hists) -> tuple[np.ndarray, int]:
        """Mean row per history in `hists` -> ([len(hists), hidden] f32, pages touched)."""
        ids = [self.row_ids(layer, h) for h in hists]
        allr = np.concatenate(ids)
        vals = gguf.dequantize(self.data[allr], self.qtype).astype(np.float32).reshape(len(allr), -1)
        out = vals.reshape(len(hists), -1, vals.shape[-1]).mean(axis=1)
        return out, sum(self.pages(r) for r in ids)
