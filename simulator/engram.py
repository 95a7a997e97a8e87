"""Engram rows on the critical path: which of a request's rows the page cache holds, and what an
inline gather of them costs.

dsv41-flash-offload gathers a layer's rows in a host callback on the compute stream
(dsv41/engram_disk.cpp: `cudaLaunchHostFunc`, a memcpy per row from the mmap'd table, OpenMP only
above 256 rows), so a row whose page is not cached costs a page fault, an NVMe read, while the
GPU waits. The executor's lookup is inline on the host too. Row numbers depend only on token ids,
so a server that has read a text before holds its rows in the page cache (up to the RAM left).
"""
from __future__ import annotations

import math

TEXTS = ("seen", "new", "shared")
PARALLEL_MIN_ROWS = 256  # engram_disk.cpp: `#pragma omp parallel for if(j.n>256)`


class EngramText:
    """Page-cache state of a server's Engram rows over its requests.

    "seen": every request's text was read before (a benchmark prompt served again): its rows are
    cached as far as the RAM left holds them. "new": every request's text is new: every row is cold.
    "shared": the requests read one text, each prompt a prefix of the same document and each answer
    the same (a context scan): rows are cold only past what earlier requests read."""

    def __init__(self, mode: str, room_bytes: float, bytes_per_token: float):
        if mode not in TEXTS:
            raise ValueError(f"engram text {mode!r} is not one of {', '.join(TEXTS)}")
        self.mode, self.room, self.bpt = mode, max(0.0, room_bytes), bytes_per_token
        self.prompt_read = self.answer_read = 0

    def _held(self, tokens: float) -> float:
        """Fraction of the rows of `tokens` tokens of text the page cache can hold."""
        need = tokens * self.bpt
        return 1.0 if need <= self.room else self.room / need

    def request(self, prompt_tokens: int, gen_tokens: int) -> tuple[float, float]:
        """Cold fraction of this request's (prompt rows, answer rows); the request is then read."""
        if self.mode == "new" or self.bpt <= 0:
            return (1.0, 1.0) if self.bpt > 0 else (0.0, 0.0)
        if self.mode == "seen":
            cold = 1.0 - self._held(prompt_tokens + gen_tokens)
            return cold, cold
        held = self._held(max(self.prompt_read, prompt_tokens) + max(self.answer_read, gen_tokens))
        cold_p = 1.0 - min(self.prompt_read, prompt_tokens) / prompt_tokens * held if prompt_tokens else 0.0
        cold_a = 1.0 - min(self.answer_read, gen_tokens) / gen_tokens * held if gen_tokens else 0.0
        self.prompt_read = max(self.prompt_read, prompt_tokens)
        self.answer_read = max(self.answer_read, gen_tokens)
        return cold_p, cold_a


def pages_per_row(model, page_bytes: int) -> float:
    """Pages one Engram row touches on average (1.031 for 144-byte rows in 4 KiB pages)."""
    e = model.engram
    return e.bytes_per_token(page_bytes) / e.rows_per_token / page_bytes if e else 0.0


def gather_s(rows: float, cold: float, pages: float, row_us: float, latency_s: float,
             threads: int, iops: float) -> float:
    """Seconds an inline gather of `rows` rows holds the stream: the host cost per row over the
    threads sharing it, plus one page fault per cold page, `threads` outstanding at a time (the
    engine runs one thread for 256 rows or fewer), at most the drive's random IOPS."""
    t = max(1, threads) if rows > PARALLEL_MIN_ROWS else 1
    faults = rows * cold * pages
    rate = min(t / latency_s, iops) if latency_s > 0 else iops
    return rows * row_us * 1e-6 / t + (faults / rate if faults > 0 and rate > 0 else 0.0)


def gathers_inline(model, plan) -> bool:
    """True when the plan gathers the model's Engram rows from NVMe inline, layer by layer."""
    return (model.engram is not None and plan.placement.engram == "nvme"
            and plan.placement.engram_gather == "inline")


def layer_gather_s(model, hw, c, tokens: int, cold: float, threads: int = 1) -> float:
    """Seconds one Engram layer's inline gather of `tokens` tokens' rows holds the stream (gather_s
    with the model's rows and pages, the hardware's drive and the constants' host cost per row)."""
    return gather_s(tokens * model.engram.rows_per_token_per_layer, cold, pages_per_row(model, hw.page_bytes),
                    c.engram_row_us, hw.nvme.latency_us * 1e-6, threads, hw.nvme.rand_4k_iops)


def ram_room(model, hw, plan) -> float:
    """Bytes of RAM the page cache has for Engram rows: capacity less what the plan pins (inf when
    the plan's memory map cannot be drawn, e.g. a host-sharing device)."""
    from specs.errors import SpecError
    from specs.memory import memory_map
    try:
        mm = memory_map(model, hw, plan)
    except SpecError:
        return math.inf
    return mm.ram_capacity - sum(mm.ram.values())
