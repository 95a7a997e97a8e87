"""Statistics of routing samples [tokens, layers, k] that published routing facts are stated in:
per-layer LRU hit rates, how much of a held-out stretch a static hot list covers, and how many
distinct experts consecutive tokens touch against uniform routing."""
from __future__ import annotations

import numpy as np

from .routing import distinct_per_layer


def lru_hit_rate(picks: np.ndarray, n_experts: int, slots: int, skip: int = 50) -> float:
    """Share of picks found in a per-layer LRU cache of `slots` experts (misses enter at once);
    the first `skip` tokens fill the cache and are not counted."""
    T, L, _ = picks.shape
    last = np.full((L, n_experts), -(1 << 40), dtype=np.int64)  # token of each expert's last use
    rows = np.arange(L)[:, None]
    hits = total = 0
    for t in range(T):
        newest = -np.partition(-last, slots - 1, axis=1)[:, slots - 1]  # the slots-th most recent use
        p = picks[t]
        if t >= skip:
            hits += int((last[rows, p] >= newest[:, None]).sum())
            total += p.size
        last[rows, p] = t
    return hits / total


def static_coverage(picks: np.ndarray, n_experts: int, top: int, learn_frac: float = 0.5) -> float:
    """Share of the picks after the first `learn_frac` of the tokens that hit the `top` experts per
    layer most picked before it (a static hot list learned on one half, served the other)."""
    T, L, _ = picks.shape
    h = int(T * learn_frac)
    counts = np.zeros((L, n_experts))
    for layer in range(L):
        counts[layer] = np.bincount(picks[:h, layer].ravel(), minlength=n_experts)
    hot = np.zeros((L, n_experts), dtype=bool)
    hot[np.arange(L)[:, None], np.argsort(-counts, axis=1, kind="stable")[:, :top]] = True
    return float(hot[np.arange(L)[None, :, None], picks[h:]].mean())


def union_ratio(picks: np.ndarray, n_experts: int, tokens: int) -> float:
    """Distinct experts per layer that `tokens` consecutive tokens touch, over the uniform
    expectation E(1-(1-k/E)^T) (one published measurement: 0.87)."""
    T, L, k = picks.shape
    groups = picks[: T // tokens * tokens].reshape(T // tokens, tokens * 1, L, k).transpose(0, 2, 1, 3)
    flat = np.sort(groups.reshape(groups.shape[0], L, -1), axis=2)
    distinct = 1 + (np.diff(flat, axis=2) != 0).sum(axis=2)
    return float(distinct.mean() / distinct_per_layer(tokens, n_experts, k))
