"""Placement policies shared by the simulator and the executor: miss auction, CPU job structure, expert caches,
prefill.

Pure numpy; the executor imports this module unchanged. Cache slots form one pool over all layers
(decayed-count, static) or an even per-layer split (LRU, as in per-layer LRU-N published results).
`end_step()` reports residency changes as (layer, expert_in, expert_out); -1 marks "none" (a fill
into a free slot has expert_out = -1, an eviction without a fill in that layer has expert_in = -1).
"""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np

Change = tuple[int, int, int]  # (layer, expert_in, expert_out); -1 = none


# ----------------------------------------------------------------------------- miss auction

def auction_cost_ms(k: int, n_hit: int, n_miss: int, t_hit_ms: float, t_zc_ms: float,
                    c_a_ms: float, c_b_ms: float, tokens=None, c_tok: float = 0.0) -> float:
    """Layer time t(k) in ms when k of n_miss misses go to the CPU and the rest are zero-copy.
    `tokens`: tokens routed to each miss, in the order misses go to the CPU; each CPU expert then
    costs c_b (1 + c_tok (tokens - 1)) (dsv41-flash-offload ct/ft_tier_cu_v.cu, `cpu_tok`)."""
    gpu = t_hit_ms * (n_hit + n_miss - k) + t_zc_ms * (n_miss - k)
    if k <= 0:
        return gpu
    extra = c_tok * float(np.sum(np.asarray(tokens[:k]) - 1)) if tokens is not None and c_tok else 0.0
    return max(gpu, c_a_ms + c_b_ms * (k + extra))


def auction_split(n_hit: int, n_miss: int, t_hit_ms: float, t_zc_ms: float, c_a_ms: float,
                  c_b_ms: float, tokens=None, c_tok: float = 0.0, max_cpu: int | None = None) -> tuple[int, float]:
    """(k_cpu, t_ms): misses handed to the CPU minimising t(k) (ties: fewest CPU experts), at most
    `max_cpu`; `tokens` and `c_tok` as in auction_cost_ms."""
    best_k, best_t = 0, math.inf
    top = n_miss if max_cpu is None else min(n_miss, max_cpu)
    for k in range(top + 1):
        t = auction_cost_ms(k, n_hit, n_miss, t_hit_ms, t_zc_ms, c_a_ms, c_b_ms, tokens, c_tok)
        if t < best_t - 1e-12:
            best_k, best_t = k, t
    return best_k, best_t


# ----------------------------------------------------------------------------- CPU job structure

WHOLE_BALANCE = 1.1  # most loaded thread / mean (tokens as the load) up to which experts run whole
WHOLE_TOKENS = 8  # most tokens an expert for whole experts per thread (decode and small batches)


def thread_loads(counts, threads: int) -> list[int]:
    """Tokens per thread when whole experts (tokens routed to each: `counts`) go to `threads` threads, most
    tokens first onto the least loaded (longest processing time first, as executor.cpu_experts._owners)."""
    loads = [0] * max(1, threads)
    for c in sorted((int(c) for c in counts), reverse=True):
        loads[loads.index(min(loads))] += c
    return loads


def whole_experts_per_thread(counts, threads: int) -> bool:
    """True when the executor runs a CPU job of experts routed by `counts` tokens each start to end on one
    thread (one parallel region, no barrier between an expert's up and down products): at most WHOLE_TOKENS
    tokens an expert and the busiest thread within WHOLE_BALANCE of the mean; else each matrix's rows split
    across the threads. A decode token's top-8 on 2 threads runs whole; 3 one-token experts on 2 do not."""
    counts = [int(c) for c in counts]
    if not counts or max(counts) > WHOLE_TOKENS:
        return False
    if max(counts) == 1:  # one token an expert: loads of ceil / floor n / threads
        return -(-len(counts) // threads) * threads <= WHOLE_BALANCE * len(counts)
    load = thread_loads(counts, threads)
    return max(load) * len(load) <= WHOLE_BALANCE * sum(load)


# ----------------------------------------------------------------------------- expert caches

class ExpertCacheBase:
    """Residency of (layer, expert) pairs in a VRAM cache of `slots` experts."""

    def __init__(self, slots: int, n_layers: int, n_experts: int):
        self.slots = int(min(slots, n_layers * n_experts))
        self.n_layers, self.n_experts = n_layers, n_experts
        self.res = np.zeros((n_layers, n_experts), dtype=bool)
        self._changes: list[Change] = []
        self.step = 0
        self.stream_ordered = False  # the last end_step's copies run on the compute stream
        self.replanned = False  # the last end_step was a replan (async copies go live)

    def contains(self, layer: int, expert: int) -> bool:
        """True when (layer, expert) is resident in VRAM."""
        return bool(self.res[layer, expert])

    def resident(self, layer: int) -> np.ndarray:
        """Residency mask [n_experts] of one layer (a copy)."""
        return self.res[layer].copy()

    @property
    def n_resident(self) -> int:
        """Experts resident now."""
        return int(self.res.sum())

    def observe(self, layer: int, experts) -> None:
        """Record that `experts` (ids, repeats count) were routed to in `layer` this step."""

    def end_step(self) -> list[Change]:
        """Close a decode step; return the residency changes it made."""
        self.step += 1
        out, self._changes = self._changes, []
        return out

    def release(self) -> None:
        """Drop every resident (VRAM needed by prefill); the policy decides when to refill."""
        self.res[:] = False
        self._changes = []


class NoCache(ExpertCacheBase):
    """No VRAM cache: nothing is ever resident."""

    def __init__(self, n_layers: int, n_experts: int):
        super().__init__(0, n_layers, n_experts)


class DecayedCountCache(ExpertCacheBase):
    """Count routes, decay scores each step; every `swap_every` steps swap up to `swap_max` coldest
    residents for hotter non-residents (dsv41-flash-offload's VRAM mirror cache).

    fill="every-step": free slots take the hottest experts at the end of every step.
    fill="at-replan": the engine's own schedule (ct/ct_vllm.py `ec_step`): the slot pool exists
    only after `warmup_steps` steps; admissions, fills of free slots included, happen only at
    replans and at most `swap_max` each; after a release the kept residents come back at once,
    `rewarm_steps` decode steps later, in one copy on the compute stream (`stream_ordered`)."""

    def __init__(self, slots, n_layers, n_experts, decay=0.95, swap_every=16, swap_max=48,
                 rewarm_steps=4, fill="every-step", warmup_steps=0):
        super().__init__(slots, n_layers, n_experts)
        self.decay, self.swap_every, self.swap_max = decay, swap_every, swap_max
        self.rewarm_steps = rewarm_steps
        self.score = np.zeros((n_layers, n_experts))
        self.hold = 0  # steps left before free slots may be refilled (after a release)
        self.fill, self.warmup_steps = fill, warmup_steps
        self.pool = fill == "every-step" or warmup_steps == 0  # the VRAM slot pool is allocated
        self.kept: np.ndarray | None = None  # residents at the last release (at-replan)

    def observe(self, layer, experts):
        np.add.at(self.score[layer], np.asarray(experts, dtype=np.int64), 1.0)

    def _fill_free(self) -> None:
        free = self.slots - int(self.res.sum())
        if free <= 0:
            return
        flat = np.where(self.res.ravel(), -1.0, self.score.ravel())
        cand = np.flatnonzero(flat >= 0)  # a free slot is worth any expert; hottest first
        if cand.size > free:
            cand = cand[np.argsort(-flat[cand], kind="stable")[:free]]
        for idx in cand:
            layer, e = divmod(int(idx), self.n_experts)
            self.res[layer, e] = True
            self._changes.append((layer, e, -1))

    def _move(self, cold: int, hot: int) -> None:
        """Evict flat index `cold` (-1: a free slot) and admit flat index `hot`."""
        lh, eh = divmod(int(hot), self.n_experts)
        self.res[lh, eh] = True
        if cold < 0:
            self._changes.append((lh, eh, -1))
            return
        lc, ec = divmod(int(cold), self.n_experts)
        self.res[lc, ec] = False
        if lc == lh:
            self._changes.append((lh, eh, ec))
        else:
            self._changes.append((lc, -1, ec))
            self._changes.append((lh, eh, -1))

    def _swap(self) -> None:
        n_res = int(self.res.sum())
        m = min(self.swap_max, n_res, self.res.size - n_res)
        if m <= 0:
            return
        flat = self.score.ravel()
        resmask = self.res.ravel()
        res_idx = np.flatnonzero(resmask)
        non_idx = np.flatnonzero(~resmask)
        cold = res_idx[np.argsort(flat[res_idx], kind="stable")[:m]]
        hot_part = non_idx[np.argpartition(-flat[non_idx], m - 1)[:m]]
        hot = hot_part[np.argsort(-flat[hot_part], kind="stable")]
        for c, h in zip(cold, hot):
            if flat[h] <= flat[c]:
                break
            self._move(int(c), int(h))

    def _replan(self) -> None:
        """The engine's replan: admit the hottest non-residents of the top-`slots` set, at most
        `swap_max`, into free slots first, then over colder residents outside that set."""
        flat = self.score.ravel()
        n = min(self.slots, flat.size)
        top = np.argpartition(-flat, n - 1)[:n]
        want = top[flat[top] > 0]
        resmask = self.res.ravel()
        adm = want[~resmask[want]]
        adm = adm[np.argsort(-flat[adm], kind="stable")][: self.swap_max]
        if adm.size == 0:
            return
        inwant = np.zeros(flat.size, dtype=bool)
        inwant[want] = True
        victims = np.flatnonzero(resmask & ~inwant)
        victims = list(victims[np.argsort(flat[victims], kind="stable")])
        free = self.slots - int(resmask.sum())
        for h in adm:
            if free > 0:
                free -= 1
                self._move(-1, int(h))
            elif victims and flat[h] > flat[victims[0]]:
                self._move(int(victims.pop(0)), int(h))
            else:
                break

    def _end_step_at_replan(self) -> None:
        s = self.step + 1  # the engine counts the step first, then plans
        if self.kept is not None:  # released: the kept set returns at once after the calm steps
            self.hold -= 1
            if self.hold <= 0:
                self.pool = True
                for idx in self.kept[: self.slots]:
                    self._move(-1, int(idx))
                self.kept = None
                self.stream_ordered = True
            return
        if not self.pool:
            if s < self.warmup_steps:
                return
            self.pool = True
        if s % self.swap_every == 0:
            self._replan()
            self.replanned = True

    def end_step(self):
        self.stream_ordered = self.replanned = False
        if self.fill == "at-replan":
            self._end_step_at_replan()
        elif self.hold > 0:
            self.hold -= 1
        else:
            self._fill_free()
            if (self.step + 1) % self.swap_every == 0:
                self._swap()
        self.score *= self.decay
        return super().end_step()

    def release(self):
        if self.fill == "at-replan":
            if not self.pool:  # no pool (yet, or still released): nothing to hand back
                if self.kept is not None:
                    self.hold = self.rewarm_steps  # a prefill step resets the calm count
                return
            flat = self.score.ravel()
            res_idx = np.flatnonzero(self.res.ravel())
            self.kept = res_idx[np.argsort(-flat[res_idx], kind="stable")]
            self.pool = False
        super().release()
        self.hold = self.rewarm_steps


class LRUCache(ExpertCacheBase):
    """Per-layer least-recently-used cache; slots split evenly over layers; misses enter at once."""

    def __init__(self, slots, n_layers, n_experts, rewarm_steps=0):
        super().__init__(slots, n_layers, n_experts)
        q, r = divmod(self.slots, n_layers)
        self.quota = np.array([q + (1 if i < r else 0) for i in range(n_layers)])
        self.last = np.full((n_layers, n_experts), -1, dtype=np.int64)
        self.rewarm_steps, self.hold = rewarm_steps, 0

    def observe(self, layer, experts):
        ex = np.unique(np.asarray(experts, dtype=np.int64))
        self.last[layer, ex] = self.step
        if self.hold > 0 or self.quota[layer] == 0:
            return
        row = self.res[layer]
        for e in ex[~row[ex]]:
            if row.sum() >= self.quota[layer]:
                cand = np.flatnonzero(row)
                victim = int(cand[np.argmin(self.last[layer, cand])])
                row[victim] = False
                row[e] = True
                self._changes.append((layer, int(e), victim))
            else:
                row[e] = True
                self._changes.append((layer, int(e), -1))

    def end_step(self):
        if self.hold > 0:
            self.hold -= 1
        return super().end_step()

    def release(self):
        super().release()
        self.hold = self.rewarm_steps


class StaticCache(ExpertCacheBase):
    """A fixed hot list (Strata's shipped profile); without one, first come stays until full."""

    def __init__(self, slots, n_layers, n_experts, hot=None):
        super().__init__(slots, n_layers, n_experts)
        self.hot = None
        if hot is not None:
            self.hot = hot_mask(hot, self.slots, n_layers, n_experts)
            self.res[:] = self.hot
            self._changes = [(int(l), int(e), -1) for l, e in zip(*np.nonzero(self.hot))]
        self.rewarm = False

    def observe(self, layer, experts):
        if self.hot is not None or self.rewarm:
            return
        for e in np.unique(np.asarray(experts, dtype=np.int64)):
            if self.res.sum() >= self.slots:
                return
            if not self.res[layer, e]:
                self.res[layer, e] = True
                self._changes.append((layer, int(e), -1))

    def end_step(self):
        if self.rewarm and self.hot is not None:
            self.res[:] = self.hot
            self._changes = [(int(l), int(e), -1) for l, e in zip(*np.nonzero(self.hot))]
        self.rewarm = False
        return super().end_step()

    def release(self):
        super().release()
        self.rewarm = True


def hot_mask(hot, slots: int, n_layers: int, n_experts: int) -> np.ndarray:
    """Bool [L, E] of the `slots` hottest: `hot` is scores [L, E], a bool mask, or (layer, expert) pairs."""
    arr = np.asarray(hot)
    if arr.shape == (n_layers, n_experts) and arr.dtype != bool:
        flat = arr.ravel().astype(float)
        top = np.argsort(-flat, kind="stable")[:slots]
        mask = np.zeros(flat.size, dtype=bool)
        mask[top] = True
        return mask.reshape(n_layers, n_experts)
    if arr.shape == (n_layers, n_experts):
        mask = arr.copy()
    else:
        mask = np.zeros((n_layers, n_experts), dtype=bool)
        for layer, e in arr.reshape(-1, 2)[:slots]:
            mask[int(layer), int(e)] = True
    if mask.sum() > slots:
        keep = np.flatnonzero(mask.ravel())[:slots]
        mask = np.zeros(mask.size, dtype=bool)
        mask[keep] = True
        mask = mask.reshape(n_layers, n_experts)
    return mask


def make_cache(cfg, n_layers: int, n_experts: int, seed: int = 0, hot=None) -> ExpertCacheBase:
    """The cache a `specs.plan.ExpertCache` describes (`hot`: the static policy's profile)."""
    del seed  # the policies are deterministic; kept for a stable signature
    if cfg.policy == "none" or cfg.slots == 0:
        return NoCache(n_layers, n_experts)
    if cfg.policy == "decayed-count":
        return DecayedCountCache(cfg.slots, n_layers, n_experts, cfg.decay, cfg.swap_every,
                                 cfg.swap_max, cfg.rewarm_steps, cfg.fill, cfg.warmup_steps)
    if cfg.policy == "lru":
        return LRUCache(cfg.slots, n_layers, n_experts, cfg.rewarm_steps)
    if cfg.policy == "static":
        return StaticCache(cfg.slots, n_layers, n_experts, hot)
    raise ValueError(f"unknown cache policy {cfg.policy!r}")


# ----------------------------------------------------------------------------- prefill strategies

def expected_touched(tokens: float, n_experts: int, top_k: int, locality: float = 1.0) -> float:
    """Distinct experts of a layer that `tokens` tokens touch: E(1-(1-K/E)^T), times `locality`
    (0.87 was measured for real routing against this uniform form)."""
    return locality * n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def op_offload(batch_tokens: int, min_batch: int = 32) -> bool:
    """llama.cpp op offload: a RAM-resident op runs on the GPU (weights copied) for big batches."""
    return batch_tokens >= min_batch


def mtp_tokens(tokens_per_step: float, acceptance: float) -> int:
    """Tokens verified per MTP step: 1 + the fewest drafts d with sum(a^i, i<=d) >= tokens_per_step."""
    if tokens_per_step <= 1 or acceptance <= 0:
        return 1
    total, d = 1.0, 0
    while total + 0.01 < tokens_per_step and d < 16:  # published figures are rounded
        d += 1
        total += acceptance ** d
    return d + 1


def union_experts(routes: Iterable[np.ndarray]) -> np.ndarray:
    """Distinct expert ids a multi-token step reads in one layer."""
    return np.unique(np.concatenate([np.asarray(r, dtype=np.int64).ravel() for r in routes]))
