"""A second card as a third expert engine beside the GPU and the CPU: dsv41-flash-offload's experimental Intel
Arc B70 tier (experimental/b70-tier, "cand11"), as its split kernel and worker run it.

- The worker (worker/bt_worker.py) keeps `slots` experts in one LRU over all layers (an OrderedDict) and
  admits every expert a job sends it that it does not hold: write-through, a DMA from the shared host
  store over its own link, a conversion on the card, then the product.
- The server mirrors the worker's residency once an engine step (bt_refresh), so a layer's split sees it
  as of the step before: an expert evicted since is staged again, at the cost of a staged one.
- The split (ct/ft_tier_cu_v.cu `ft_split_k`), per layer: VRAM hits stay on the GPU, experts the card
  holds go to the card, and the misses, ordered by a score nothing in the engine updates (so by expert
  id), go to the CPU from the front, to the card to be staged from the back (at most `max_stage`), and
  the rest zero-copy; the staged count and the CPU's count are the pair that minimise the slowest of
  the three cost estimates, fewest staged then fewest CPU experts on ties (`device_split`).
Steps of more than `max_batch_tokens` tokens leave the card out (the held experts are then misses).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np


def device_split(n_hit: int, n_held: int, tokens, mp, tier) -> tuple[int, int, float]:
    """(k_cpu, z_staged, t_ms): ft_split_k's search over z staged misses (0 .. max_stage) and k CPU misses
    (0 .. max_cpu) for a layer with n_hit VRAM hits, n_held experts on the card and misses routed by
    `tokens` tokens each (in split order). Estimates, ms: GPU t_hit (hits + zero-copy) + t_zc x zero-copy;
    CPU c_a + sum c_b (1 + c_tok (tokens - 1)); card job_ms + hit_ms x held + stage_ms x staged."""
    t = np.asarray(tokens, dtype=float)
    nm = t.size
    cpu = mp.c_a_ms + np.concatenate(([0.0], np.cumsum(mp.c_b_ms * (1 + mp.c_tok * (t - 1)))))  # [nm + 1]
    cpu[0] = 0.0
    maxc = nm if mp.max_cpu is None else min(mp.max_cpu, nm)
    z = np.arange(min(tier.max_stage, nm) + 1)[:, None]  # [Z, 1] staged
    k = np.arange(nm + 1)[None, :]  # [1, K] to the CPU
    zc = nm - z - k  # [Z, K] zero-copy
    card = np.where((n_held + z) > 0, tier.job_ms + tier.hit_ms * n_held + tier.stage_ms * z, 0.0)
    tt = np.maximum(np.maximum(mp.t_hit_ms * (n_hit + zc) + mp.t_zc_ms * zc, cpu[k]), card)
    tt = np.where((k <= maxc) & (zc >= 0), tt, np.inf)
    j = int(np.argmin(tt))  # the first minimum in z-major order: fewest staged, then fewest CPU experts
    return j % (nm + 1), j // (nm + 1), float(tt.flat[j])


class ExpertDeviceTier:
    """The card's residency (the worker's LRU) and what the server last saw of it."""

    def __init__(self, tier, n_layers: int, n_experts: int):
        self.tier = tier
        self.slots = int(min(tier.slots, n_layers * n_experts))
        self.lru: OrderedDict = OrderedDict()  # (layer, expert), least recently used first
        self.res = np.zeros((n_layers, n_experts), dtype=bool)  # the worker's slots now
        self.hint = np.zeros((n_layers, n_experts), dtype=bool)  # as the server saw them at the last step's end
        self._memo: dict = {}

    def route(self, layer: int, n_hit: int, misses: np.ndarray, tokens: np.ndarray | None, mp,
              step_tokens: int) -> tuple[np.ndarray, np.ndarray, int, int, int]:
        """Split a layer's VRAM misses (expert ids; `tokens` routed to each, None = one each):
        (order, tokens_in_order, k_cpu, n_held, n_staged) where order lists the misses that stay
        with the GPU and the CPU (CPU first, k_cpu of them, then zero-copy), and the card runs n_held
        experts it held and n_staged it had to load (the worker's LRU is updated as it runs them)."""
        if step_tokens > self.tier.max_batch_tokens or not self.slots:
            return misses, tokens, -1, 0, 0
        held = self.hint[layer, misses]
        sent, rest = misses[held], misses[~held]
        rest_tok = tokens[~held] if tokens is not None else None
        by_id = np.argsort(rest, kind="stable")  # ft_split's order: a score nothing updates, so expert ids
        rest = rest[by_id]
        rest_tok = rest_tok[by_id] if rest_tok is not None else np.ones(rest.size)
        key = (n_hit, sent.size, rest.size) if tokens is None else None
        if key is not None and key in self._memo:
            k_cpu, z = self._memo[key]
        else:
            k_cpu, z, _ = device_split(n_hit, sent.size, rest_tok, mp, self.tier)
            if key is not None:
                self._memo[key] = (k_cpu, z)
        staged = rest[rest.size - z:] if z else rest[:0]
        n_held, n_staged = self._run(layer, np.concatenate((sent, staged)))
        keep = rest.size - z
        return rest[:keep], rest_tok[:keep], k_cpu, n_held, n_staged

    def _run(self, layer: int, experts: np.ndarray) -> tuple[int, int]:
        """The worker runs a job: (experts it held, experts it had to load); LRU order updated."""
        held = 0
        for e in experts.tolist():
            key = (layer, e)
            if key in self.lru:
                self.lru.move_to_end(key)
                held += 1
                continue
            if len(self.lru) >= self.slots:
                (ol, oe), _ = self.lru.popitem(last=False)
                self.res[ol, oe] = False
            self.lru[key] = None
            self.res[layer, e] = True
        return held, experts.size - held

    def end_step(self) -> None:
        """The server refreshes its view of the card's slots (bt_refresh, once an engine step)."""
        self.hint[:] = self.res
