"""Routing models: which experts each token picks in each MoE layer.

`sample(n_tokens, rng)` returns int32 [n_tokens, n_layers, k]: k distinct experts per token and
layer. Popularity-weighted picks without replacement follow Plackett-Luce (sequential draws).
"""
from __future__ import annotations

import json
from pathlib import Path

import functools

import numpy as np


def zipf_popularity(n_experts: int, exponent: float) -> np.ndarray:
    """Route share by rank, p_r proportional to r^-exponent (sums to 1)."""
    w = np.arange(1, n_experts + 1, dtype=float) ** -float(exponent)
    return w / w.sum()


def inclusion(p: np.ndarray, k: int) -> np.ndarray:
    """P(expert is among a token's k picks) for popularity p, conditional-Poisson approximation
    pi_i = 1 - exp(-lam p_i) with sum(pi) = k (sums to k; equals k*p for flat p)."""
    from scipy.optimize import brentq  # lazy: scipy.optimize costs ~0.4 s to import
    if k >= len(p):
        return np.ones_like(p)
    lam = brentq(lambda x: np.sum(1 - np.exp(-x * p)) - k, 1e-9, 1e9)
    return 1 - np.exp(-lam * p)


def top_share(p: np.ndarray, k: int, frac_experts: float) -> float:
    """Share of reads served by the most popular `frac_experts` of the experts."""
    pi = np.sort(inclusion(p, k))[::-1]
    n = max(1, int(round(frac_experts * len(p))))
    return float(pi[:n].sum() / pi.sum())


@functools.lru_cache(maxsize=64)  # a pure function, asked for again by every screened plan
def fit_exponent(n_experts: int, k: int, frac_experts: float = 0.046, frac_reads: float = 0.41) -> float:
    """Zipf exponent whose top `frac_experts` serve `frac_reads` of the reads (e.g. 4.6% -> 41%)."""
    if frac_reads <= frac_experts + 1e-9:  # no skew needed
        return 0.0
    from scipy.optimize import brentq  # lazy: scipy.optimize costs ~0.4 s to import

    def gap(s: float) -> float:
        return top_share(zipf_popularity(n_experts, s), k, frac_experts) - frac_reads

    if gap(5.0) < 0:  # few experts: the top share saturates below the target (one of 32 at top-4
        return 5.0    # serves at most 1/4 of reads); take the steepest skew the bracket allows
    return brentq(gap, 0.0, 5.0, xtol=1e-6)


def _pl_sample(pop: np.ndarray, n_tokens: int, k: int, rng) -> np.ndarray:
    """[n_tokens, L, k] picks without replacement, proportional to pop [L, E] (Plackett-Luce:
    pick j is drawn from pop and redrawn while it repeats an earlier pick)."""
    L, E = pop.shape
    cdf = np.cumsum(pop / pop.sum(axis=1, keepdims=True), axis=1)
    cdf[:, -1] = 1.0
    flat = (cdf + np.arange(L)[:, None]).ravel()
    base = (np.arange(L) * E)[None, :]

    def draw(shape_mask_layers):
        u = rng.random(shape_mask_layers.shape) + shape_mask_layers
        return np.minimum(np.searchsorted(flat, u, side="right"), L * E - 1)

    layer_of = np.broadcast_to(np.arange(L)[None, :, None], (n_tokens, L, k))
    out = draw(layer_of.astype(float)) - base[..., None]
    for j in range(1, k):
        dup = (out[:, :, j:j + 1] == out[:, :, :j]).any(axis=2)
        while dup.any():
            t_idx, l_idx = np.nonzero(dup)
            out[t_idx, l_idx, j] = draw(l_idx.astype(float)) - l_idx * E
            dup = np.zeros_like(dup)
            dup[t_idx, l_idx] = (out[t_idx, l_idx, j][:, None] == out[t_idx, l_idx, :j]).any(axis=1)
    return out.astype(np.int32)


class Routing:
    """Base: `popularity` [L, E] (route shares per layer) and `sample`."""

    n_layers: int
    n_experts: int
    k: int

    @property
    def popularity(self) -> np.ndarray:
        return np.full((self.n_layers, self.n_experts), 1.0 / self.n_experts)

    def sample(self, n_tokens: int, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError


class Uniform(Routing):
    """Every expert equally likely; k distinct per token and layer."""

    def __init__(self, n_layers: int, n_experts: int, k: int):
        self.n_layers, self.n_experts, self.k = n_layers, n_experts, k

    def sample(self, n_tokens, rng):
        return _pl_sample(np.ones((self.n_layers, self.n_experts)), n_tokens, self.k, rng)


class Skewed(Routing):
    """Zipf popularity per layer (exponent per layer or one for all), ranks shuffled per layer;
    `locality` = chance a pick repeats one of the previous token's experts in that layer."""

    def __init__(self, n_layers: int, n_experts: int, k: int, exponent=1.0, locality: float = 0.0,
                 seed: int = 0):
        self.n_layers, self.n_experts, self.k = n_layers, n_experts, k
        self.exponent = np.broadcast_to(np.asarray(exponent, dtype=float), (n_layers,)).copy()
        self.locality = float(locality)
        perm_rng = np.random.default_rng(seed + 7919)
        pop = np.empty((n_layers, n_experts))
        for layer in range(n_layers):
            pop[layer, perm_rng.permutation(n_experts)] = zipf_popularity(n_experts, self.exponent[layer])
        self._pop = pop

    @classmethod
    def fitted(cls, n_layers, n_experts, k, frac_experts=0.046, frac_reads=0.41, locality=0.0, seed=0):
        """A skewed model whose top `frac_experts` of experts serve `frac_reads` of reads."""
        return cls(n_layers, n_experts, k, fit_exponent(n_experts, k, frac_experts, frac_reads),
                   locality, seed)

    @property
    def popularity(self):
        return self._pop

    def sample(self, n_tokens, rng):
        fresh = _pl_sample(self._pop, n_tokens, self.k, rng)
        if self.locality <= 0 or n_tokens < 2:
            return fresh
        out = fresh
        reuse = rng.random((n_tokens, self.n_layers)) < self.locality
        for t in range(1, n_tokens):
            rows = np.flatnonzero(reuse[t])
            if rows.size:  # repeat the previous token's set in those layers (then draw the rest)
                out[t, rows] = out[t - 1, rows]
        return out


class Replay(Routing):
    """Replays a recorded trace: a list of [L, k] arrays or an array [T, L, k]; wraps around."""

    def __init__(self, routes, n_experts: int):
        arr = np.asarray([np.asarray(r) for r in routes], dtype=np.int32)
        if arr.ndim != 3:
            raise ValueError("a routing trace is [tokens, layers, k] expert ids")
        self.trace, self.n_experts = arr, n_experts
        self.n_layers, self.k = arr.shape[1], arr.shape[2]
        self._pos = 0

    @classmethod
    def from_jsonl(cls, path: str | Path, n_experts: int, phase: str = "decode") -> "Replay":
        """Read an executor trace: records {step, phase, layer, routed: [tokens][k]} (one per step
        and layer; `phase` selects decode), or one record per token with 'experts' [layers][k]."""
        per_token, steps = [], {}
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if "routed" in rec:
                if rec.get("phase", phase) == phase:
                    steps.setdefault(rec["step"], {})[rec["layer"]] = rec["routed"]
            elif "experts" in rec or "routes" in rec:
                per_token.append(rec.get("experts", rec.get("routes")))
        for step in sorted(steps):
            layers = steps[step]
            order = sorted(layers)
            for t in range(len(layers[order[0]])):
                per_token.append([layers[layer][t] for layer in order])
        return cls(per_token, n_experts)

    @property
    def popularity(self):
        counts = np.zeros((self.n_layers, self.n_experts))
        for layer in range(self.n_layers):
            np.add.at(counts[layer], self.trace[:, layer].ravel(), 1.0)
        return counts / counts.sum(axis=1, keepdims=True)

    def sample(self, n_tokens, rng):
        idx = (self._pos + np.arange(n_tokens)) % len(self.trace)
        self._pos = int((self._pos + n_tokens) % len(self.trace))
        return self.trace[idx]


def make_routing(kind: str, n_layers: int, n_experts: int, k: int, seed: int = 0, **kw) -> Routing:
    """'uniform', 'skewed' (exponent=, locality=) or 'fitted' (frac_experts=, frac_reads=, locality=)."""
    if kind == "uniform":
        return Uniform(n_layers, n_experts, k)
    if kind == "skewed":
        return Skewed(n_layers, n_experts, k, kw.get("exponent", 1.0), kw.get("locality", 0.0), seed)
    if kind == "fitted":
        return Skewed.fitted(n_layers, n_experts, k, kw.get("frac_experts", 0.046),
                             kw.get("frac_reads", 0.41), kw.get("locality", 0.0), seed)
    raise ValueError(f"unknown routing model {kind!r} (uniform, skewed, fitted)")


def distinct_per_layer(tokens: float, n_experts: int, k: int) -> float:
    """Expected distinct experts per layer for `tokens` uniform tokens: E(1-(1-k/E)^T)."""
    return n_experts * (1 - (1 - k / n_experts) ** tokens) if tokens > 0 else 0.0


__all__ = ["Uniform", "Skewed", "Replay", "make_routing", "fit_exponent", "zipf_popularity",
           "inclusion", "top_share", "distinct_per_layer"]
