"""Routing models: which experts each token picks in each MoE layer.

`sample(n_tokens, rng)` returns int32 [n_tokens, n_layers, k]: k distinct experts per token and
layer. Popularity-weighted picks without replacement follow Plackett-Luce (sequential draws; drawn as an
exponential race where draws would often repeat an expert).
"""
from __future__ import annotations

import json
from pathlib import Path

import functools

import numpy as np

from specs.errors import SpecError
from specs.loaders import read_text


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


def _pl_sample(pop: np.ndarray, n_tokens: int, k: int, rng, rows: np.ndarray | None = None) -> np.ndarray:
    """[n_tokens, L, k] picks without replacement, proportional to pop (Plackett-Luce), in pick order. `pop` is
    [L, E], or [R, E] with `rows` [n_tokens, L] naming the popularity row each token and layer draws from. Two exact
    samplers of the one law, by cost: where k independent draws would often repeat an expert (C(k, 2) x sum p^2, the
    expected repeated pairs, at least _RACE_COLLISIONS: `small`'s 8 of 32 uniform, 0.88; heavy heads), the
    exponential race, O(E) a (token, layer); else sequential draws redrawn on a repeat, O(k log E) (8 of 256: 0.11)."""
    p = pop / pop.sum(axis=1, keepdims=True)
    if rows is None:
        rows = np.broadcast_to(np.arange(p.shape[0])[None, :], (n_tokens, p.shape[0]))
    if k * (k - 1) / 2 * float((p * p).sum(axis=1).max()) >= _RACE_COLLISIONS:
        return _pl_race(p, n_tokens, k, rng, rows)
    return _pl_redraw(p, n_tokens, k, rng, rows)


_RACE_COLLISIONS = 0.5


def _pl_race(p: np.ndarray, n_tokens: int, k: int, rng, rows: np.ndarray) -> np.ndarray:
    """_pl_sample as an exponential race: each expert's clock rings after Exp(1) / p_e, and the first k to ring are the
    picks in order, the law of drawing one at a time and renormalising over the rest (the Gumbel-top-k trick in its
    exponential form: Vieira 2014; Kool et al., ICML 2019). Experts of zero popularity never ring before the others."""
    E = p.shape[1]
    with np.errstate(divide="ignore"):
        inv = 1.0 / p  # [R, E]
    L = rows.shape[1]
    out = np.empty((n_tokens, L, k), dtype=np.int32)
    block = max(1, _RACE_BLOCK // max(L * E, 1))  # tokens a block: its clocks stay under ~32 MB
    for t0 in range(0, n_tokens, block):
        r = rows[t0:t0 + block]  # [b, L]
        ring = rng.standard_exponential(r.shape + (E,)) * inv[r]  # [b, L, E]
        first = np.argpartition(ring, k - 1, axis=2)[..., :k] if k < E else np.broadcast_to(np.arange(E), ring.shape)
        order = np.argsort(np.take_along_axis(ring, first, axis=2), axis=2, kind="stable")
        out[t0:t0 + block] = np.take_along_axis(first, order, axis=2)
    return out


_RACE_BLOCK = 1 << 22  # clocks drawn at once


def _pl_redraw(p: np.ndarray, n_tokens: int, k: int, rng, rows: np.ndarray) -> np.ndarray:
    """_pl_sample by sequential draws: pick j drawn from the popularity row and redrawn while it repeats an earlier
    pick; past _REDRAWS rounds, from the experts left (the law redrawing converges to)."""
    R, E = p.shape
    cdf = np.cumsum(p, axis=1)
    cdf[:, -1] = 1.0
    flat = (cdf + np.arange(R)[:, None]).ravel()
    row_of = np.broadcast_to(rows[..., None], rows.shape + (k,)).astype(float)

    def draw(row_float):
        u = rng.random(row_float.shape) + row_float
        return np.minimum(np.searchsorted(flat, u, side="right"), R * E - 1) - row_float.astype(np.int64) * E

    out = draw(row_of)
    for j in range(1, k):
        dup = (out[:, :, j:j + 1] == out[:, :, :j]).any(axis=2)
        tries = 0
        while dup.any():
            t_idx, l_idx = np.nonzero(dup)
            if tries == _REDRAWS:  # a heavy head keeps colliding: draw the rest from what is left
                out[t_idx, l_idx, j] = _draw_left(p, rows[t_idx, l_idx], out[t_idx, l_idx, :j], rng)
                break
            out[t_idx, l_idx, j] = draw(rows[t_idx, l_idx].astype(float))
            dup = np.zeros_like(dup)
            dup[t_idx, l_idx] = (out[t_idx, l_idx, j][:, None] == out[t_idx, l_idx, :j]).any(axis=1)
            tries += 1
    return out.astype(np.int32)


_REDRAWS = 16  # redraw rounds before the exact conditional draw


def _draw_left(p: np.ndarray, rows: np.ndarray, picked: np.ndarray, rng) -> np.ndarray:
    """One pick per row from popularity row `rows` [m] with the experts already `picked` [m, j] removed."""
    w = p[rows].astype(float)  # [m, E]
    np.put_along_axis(w, picked.astype(np.int64), 0.0, axis=1)
    cdf = np.cumsum(w, axis=1)
    u = rng.random(len(rows)) * cdf[:, -1]
    return np.minimum((cdf <= u[:, None]).sum(axis=1), p.shape[1] - 1)


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

    def sample_steps(self, n_steps: int, streams: int, per_stream: int, rng) -> np.ndarray:
        """[n_steps, streams * per_stream, L, k]: each step's tokens (consecutive tokens of a stream
        together, stream after stream). Models without token-to-token state draw them in one go."""
        n = streams * per_stream
        return self.sample(n_steps * n, rng).reshape(n_steps, n, self.n_layers, self.k)

    def new_context(self, rng) -> None:
        """A new request starts (a new prompt): models with a context forget it."""

    def prompt_routes(self, n_tokens: int, rng) -> np.ndarray:
        """Routes [n, L, k] of a prompt's n tokens, the start of the request's context."""
        return self.sample(n_tokens, rng)


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


class Drifting(Routing):
    """Context-dependent routing: an expert's score is a fixed part (what a profile learned offline
    can know) plus a part that drifts from token to token (AR(1), correlation `rho` per token);
    each token picks k experts Plackett-Luce on exp(beta * score). `stable` is the fixed part's share
    of the score variance. The drifting part is what makes adaptive caches (LRU, decayed counts)
    beat a static hot list: published, a static top-32 of 512 learned on half a workload covered
    ~10% of the other half while per-layer LRU-64 hit ~67% (DESIGN.md, "Routing skew").
    Scores advance in blocks of `block` tokens (drift over 4 tokens is small; it keeps 1,000
    simulated tokens cheap); the state carries over between `sample` calls."""

    def __init__(self, n_layers: int, n_experts: int, k: int, beta: float, stable: float, rho: float,
                 seed: int = 0, block: int = 4):
        self.n_layers, self.n_experts, self.k = n_layers, n_experts, k
        self.beta, self.stable, self.rho, self.block = float(beta), float(stable), float(rho), int(block)
        r0 = np.random.default_rng(seed + 7919)
        self.fixed = r0.standard_normal((n_layers, n_experts))
        self.z = r0.standard_normal((n_layers, n_experts))  # the drifting part, stationary N(0, 1)
        self._pos = 0  # tokens into the current block
        self._others: list = []  # (z, pos) of streams 2.. (each its own context)
        self._pop_cache = None

    def _pop(self, z: np.ndarray) -> np.ndarray:
        sc = self.beta * (np.sqrt(self.stable) * self.fixed + np.sqrt(1.0 - self.stable) * z)
        return np.exp(sc - sc.max(axis=-1, keepdims=True))

    @property
    def popularity(self):
        """Long-run route shares per layer (the drifting part averaged out over 256 draws)."""
        if self._pop_cache is None:
            r = np.random.default_rng(1)
            acc = np.zeros((self.n_layers, self.n_experts))
            for _ in range(256):
                pop = self._pop(r.standard_normal((self.n_layers, self.n_experts)))
                acc += pop / pop.sum(axis=1, keepdims=True)
            self._pop_cache = acc / acc.sum(axis=1, keepdims=True)
        return self._pop_cache

    def sample(self, n_tokens, rng):
        L, B = self.n_layers, self.block
        a = self.rho ** B  # block-to-block correlation of the drifting part
        first = B - self._pos  # tokens left in the current block
        n_blocks = 1 + max(0, -(-(n_tokens - first) // B))
        zs = np.empty((n_blocks, L, self.n_experts))
        zs[0] = self.z
        for b in range(1, n_blocks):
            zs[b] = a * zs[b - 1] + np.sqrt(1.0 - a * a) * rng.standard_normal(zs[b].shape)
        pos = self._pos + np.arange(n_tokens)
        blk = pos // B  # [T] block of each token
        rows = blk[:, None] * L + np.arange(L)[None, :]
        out = _pl_sample(self._pop(zs).reshape(n_blocks * L, -1), n_tokens, self.k, rng, rows)
        self.z = zs[blk[-1]] if n_tokens else self.z
        self._pos = int(pos[-1] % B + 1) if n_tokens else self._pos
        if self._pos == B:
            self.z = a * self.z + np.sqrt(1.0 - a * a) * rng.standard_normal(self.z.shape)
            self._pos = 0
        return out

    def sample_steps(self, n_steps, streams, per_stream, rng):
        """Each stream is its own context (its own drifting part); a stream's tokens in a step
        (MTP drafts) are consecutive tokens of that context."""
        L, k = self.n_layers, self.k
        while len(self._others) < streams - 1:  # a further user: an independent context
            self._others.append((rng.standard_normal(self.z.shape), 0))
        outs = [self.sample(n_steps * per_stream, rng).reshape(n_steps, per_stream, L, k)]
        for i in range(streams - 1):
            mine = (self.z, self._pos)
            self.z, self._pos = self._others[i]
            outs.append(self.sample(n_steps * per_stream, rng).reshape(n_steps, per_stream, L, k))
            self._others[i] = (self.z, self._pos)
            self.z, self._pos = mine
        return np.concatenate(outs, axis=1)

    def new_context(self, rng):
        """A new prompt: the drifting part is drawn afresh (a prompt of thousands of tokens
        decorrelates it anyway: rho ** 1000 ~ 0), for every stream."""
        self.z, self._pos = rng.standard_normal(self.z.shape), 0
        self._others = []


class Replay(Routing):
    """Replays a recorded trace: a list of [L, k] arrays or an array [T, L, k]; wraps around."""

    def __init__(self, routes, n_experts: int, prompt=None):
        arr = np.asarray([np.asarray(r) for r in routes], dtype=np.int32)
        if arr.ndim != 3:
            raise ValueError("a routing trace is [tokens, layers, k] expert ids")
        self.trace, self.n_experts = arr, n_experts
        self.n_layers, self.k = arr.shape[1], arr.shape[2]
        self._pos = 0
        # the recorded prompt's routes [P, L, k] (an executor trace's prefill), if any
        self.prompt = (np.asarray(prompt, dtype=np.int32).reshape(-1, self.n_layers, self.k)
                       if prompt is not None and len(prompt) else None)

    @classmethod
    def from_jsonl(cls, path: str | Path, n_experts: int, phase: str = "decode") -> "Replay":
        """Read an executor trace: records {step, phase, layer, routed: [tokens][k]} (one per step
        and layer; `phase` selects decode), or one record per token with 'experts' [layers][k]."""
        per_token, steps, pre = [], {}, {}
        for i, line in enumerate(read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise SpecError(str(path), f"line {i}", f"malformed JSON: {e.msg}") from None
            if not isinstance(rec, dict):
                raise SpecError(str(path), f"line {i}", "a routing trace's lines are JSON objects")
            if "routed" in rec:
                if rec.get("phase", phase) == phase:
                    steps.setdefault(rec["step"], {})[rec["layer"]] = rec["routed"]
                elif rec.get("phase") == "prefill":
                    pre.setdefault(rec["step"], {})[rec["layer"]] = rec["routed"]
            elif "experts" in rec or "routes" in rec:
                per_token.append(rec.get("experts", rec.get("routes")))
        n_layers = max((len(v) for v in steps.values()), default=0)
        pre = {k: v for k, v in pre.items() if len(v) == n_layers}  # whole prefill steps only
        try:
            return cls(_tokens(steps, per_token), n_experts, prompt=_tokens(pre, []))
        except ValueError as e:
            raise SpecError(str(path), None, f"not a routing trace: {e} (an executor trace, or one "
                                             "{\"experts\": [layers][k]} a token)") from None

    def prompt_routes(self, n_tokens, rng):
        """The recorded prompt's routes (at most n tokens; none when the trace holds no prefill): the
        decode routes replay from where they were, untouched."""
        if self.prompt is None:
            return np.zeros((0, self.n_layers, self.k), dtype=np.int32)
        return self.prompt[:n_tokens]

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


def _tokens(steps: dict, per_token: list) -> list:
    """Per-token routes [layers][k] from {step: {layer: [tokens][k]}} records, steps in order (a
    step of several tokens, all the streams' or a prefill's, in the record's token order)."""
    for step in sorted(steps):
        layers = steps[step]
        order = sorted(layers)
        for t in range(len(layers[order[0]])):
            per_token.append([layers[layer][t] for layer in order])
    return per_token


# Drifting's constants, fitted by `python -m calibration.routing_fit` to the published facts for a
# 512-expert top-10 model: per-layer LRU-64 hits ~67%, LRU-128 ~81%, a static top-32 learned on half
# a workload covers ~10% of the other half (DESIGN.md, "Routing skew"; 2 x 2,000 tokens assumed).
DRIFT_BETA, DRIFT_STABLE, DRIFT_RHO = 2.3, 0.06, 0.9875


ROUTING_MODELS = ("uniform", "skewed", "fitted", "drifting")


def make_routing(kind: str, n_layers: int, n_experts: int, k: int, seed: int = 0, **kw) -> Routing:
    """'uniform', 'skewed' (exponent=, locality=), 'fitted' (frac_experts=, frac_reads=, locality=)
    or 'drifting' (beta=, stable=, rho=; defaults fitted to the published 512-expert facts)."""
    if kind == "drifting":
        return Drifting(n_layers, n_experts, k, kw.get("beta", DRIFT_BETA), kw.get("stable", DRIFT_STABLE),
                        kw.get("rho", DRIFT_RHO), seed)
    if kind == "uniform":
        return Uniform(n_layers, n_experts, k)
    if kind == "skewed":
        return Skewed(n_layers, n_experts, k, kw.get("exponent", 1.0), kw.get("locality", 0.0), seed)
    if kind == "fitted":
        return Skewed.fitted(n_layers, n_experts, k, kw.get("frac_experts", 0.046),
                             kw.get("frac_reads", 0.41), kw.get("locality", 0.0), seed)
    raise ValueError(f"unknown routing model {kind!r} ({', '.join(ROUTING_MODELS)})")


def distinct_per_layer(tokens: float, n_experts: int, k: int) -> float:
    """Expected distinct experts per layer for `tokens` uniform tokens: E(1-(1-k/E)^T)."""
    return n_experts * (1 - (1 - k / n_experts) ** tokens) if tokens > 0 else 0.0


__all__ = ["Uniform", "Skewed", "Replay", "make_routing", "fit_exponent", "zipf_popularity",
           "inclusion", "top_share", "distinct_per_layer"]
