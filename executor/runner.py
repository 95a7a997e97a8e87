"""Greedy decode of 1..S streams together on a GGUF MoE model, placed as a Plan says, with a trace.

A step runs each layer once for all streams: attention per stream (lock-step positions), the union
of routed experts once. The trace (JSONL, one record per step and layer) holds routed experts, hits,
misses, the auction's k and the time of each part (the Engram lookup and add in t_engram_ms, apart
from t_dense_ms, with its rows and major page faults); `execute` returns speed and bandwidth per tier.
Three ways through a step: cpu_step.CpuStep when the dense path is read in place on the CPU; on the
torch path, decode steps as device_step's static calls (CUDA graphs on CUDA), prefill op by op here.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from specs.errors import SpecError
from specs.loaders import output_file
from specs.plan import Plan

from . import cpu_experts as CE
from . import kernels as K
from . import qgemm
from . import device_step as DS
from .cpu_step import CpuStep, fits
from .dense import Dense, KVCache, pick_device
from .device_step import DeviceStep
from .engram import Engram, major_faults
from .experts import Experts
from .gguf_model import GGUFModel
from .make_model import engram_path


def check_plan(plan: Plan, model: GGUFModel, prompt_tokens: int, gen_tokens: int) -> None:
    """Raise SpecError when `plan` names layers, slots or sizes `model` does not have."""
    c, f = model.cfg, "plan"
    if plan.device_tier.slots:  # the simulator models a second card's tier (simulator.device_tier); this engine has none
        raise SpecError(f, "device_tier.slots", "the executor runs one device; a second card's expert tier is simulated only")
    bad = [i for i in plan.placement.gpu_expert_layers if i >= c.n_layers]
    if bad:
        raise SpecError(f, "placement.gpu_expert_layers", f"layer {bad[0]} does not exist (model has {c.n_layers})")
    if plan.expert_cache.slots > c.n_layers * c.n_experts:
        raise SpecError(f, "expert_cache.slots", f"{plan.expert_cache.slots} slots exceed the model's "
                        f"{c.n_layers * c.n_experts} routed experts")
    if plan.experts_per_token is not None and plan.experts_per_token > c.top_k:
        raise SpecError(f, "experts_per_token", f"{plan.experts_per_token} exceeds the model's top-{c.top_k}")
    if prompt_tokens < 1 or gen_tokens < 1:
        raise SpecError(f, "prompt_tokens", "prompt and generated tokens must be >= 1")
    need = prompt_tokens + gen_tokens
    if need > plan.kv.context:
        raise SpecError(f, "kv.context", f"{need} tokens do not fit a {plan.kv.context}-token KV cache")
    if need > c.context:
        raise SpecError(f, "kv.context", f"{need} tokens exceed the model's context length {c.context}")


def default_prompts(streams: int, n: int, vocab: int, seed: int = 0) -> np.ndarray:
    """Deterministic prompts [S, n] of ordinary token ids (stream s uses seed + s)."""
    return np.stack([np.random.default_rng(seed + s).integers(0, vocab - 2, n) for s in range(streams)])


class Runner:
    """A model loaded for a plan: dense path, experts, KV cache, optional Engram."""

    def __init__(self, plan: Plan, model_path: str | Path, context: int, dense_inplace: bool | None = None,
                 static_decode: bool | None = None):
        """static_decode: decode steps through device_step's static calls (default: on CUDA, as graphs)."""
        self.plan, self.m = plan, GGUFModel(model_path)
        if plan.placement.experts_home == "ram" and plan.placement.expert_ram_bytes is None:
            self.m.populate()  # every expert's home is RAM: map the file now, not page by page in the first steps
        c = self.c = self.m.cfg
        self.device = pick_device(plan.placement.dense == "gpu")
        K.set_threads(plan.cpu_threads)
        self.dense = Dense(self.m, self.device, inplace=dense_inplace)
        self.experts = Experts(self.m, plan, self.device)
        self.k = min(plan.experts_per_token or c.top_k, c.top_k)
        wqkv = self.dense.layers[0]["wqkv"]  # load the kernels' specialisations now, not in the first steps
        CE.warm_up(*self.experts.W[0], wqkv.parts if self.dense.fast and wqkv.parts and len(wqkv.parts) <= 3 else None)
        self.kv = KVCache(c.n_layers, plan.streams, c.n_kv, context, c.head_dim, self.device, torch.float32)
        ep = engram_path(model_path)
        self.engram = Engram(ep, c.hidden) if plan.placement.engram != "none" and ep.exists() else None
        self.trace: list[dict] = []
        self.hist: list[list[int]] = [[] for _ in range(plan.streams)]
        self.cpu = CpuStep(self) if fits(self) else None  # the dense path in numpy on the CPU
        # the embedding lookup's dequantiser as well: compiled in the first prefill it was the TTFT (cold: 1.1 s)
        (self.dense.embed_np if self.cpu is not None else self.dense.embed)(np.zeros((1, 1), np.int64))
        if static_decode is None:
            static_decode = self.device.type == "cuda"
        self.static = DeviceStep(self, self.device.type == "cuda" and DS.GRAPHS) \
            if static_decode and self.cpu is None else None

    def warm_up(self, prompt_tokens: int) -> float:
        """One throwaway run of the shape to come, as llama-bench's warm-up run: a prompt of prompt_tokens
        a stream (other ids than the default prompts') in the plan's passes and one decode step, then
        reset() -> its TTFT (s), the cold first prompt's.

        A first prompt pays what later ones do not: the allocator's arenas grow and their pages are touched
        the first time (all-CPU `small-q4k` pp512: +92 MB anonymous, ~17,800 minor faults, 45-185 ms of
        ~0.75 s); after it, a prompt of the same shape runs in the memory the first one left."""
        prompts = default_prompts(self.plan.streams, prompt_tokens, self.c.vocab, seed=self.plan.streams)
        _, times, _ = self.generate(prompts, 2)
        self.reset()
        return times["ttft_s"]

    def reset(self) -> None:
        """Forget every token run so far: an empty KV cache, histories and trace, the expert cache as at
        load (a run after it gives the tokens, routing, hits and misses of one on a fresh Runner)."""
        self.kv.len = 0
        self.hist = [[] for _ in range(self.plan.streams)]
        self.trace = []
        if self.cpu is not None:
            self.cpu.pending.clear()
        self.experts.reset()

    def decode_path(self) -> str:
        """How decode steps run: cpu-step (numpy / numba, no torch), cuda-graphs, static (device_step's
        calls, eagerly) or eager (torch op by op)."""
        if self.cpu is not None:
            return "cpu-step"
        if self.static is not None:
            return "cuda-graphs" if self.static.graph else "static"
        return "eager"

    def _run(self, ids: np.ndarray, phase: str, step: int, outputs: bool = True) -> np.ndarray | torch.Tensor | None:
        """step() -> logits [S, V], f32 numpy on the CPU dense path (no torch glue), else a tensor."""
        if self.cpu is not None:
            return self.cpu.step(ids, phase, step, outputs)
        return self.step(ids, phase, step, outputs)

    def step(self, ids: np.ndarray, phase: str, step: int, outputs: bool = True) -> torch.Tensor | None:
        """Run new tokens ids [S, n] through the model -> logits [S, V] at each stream's last token (outputs=False:
        none, the output head not run, as for a prompt's passes before its last: llama.cpp's outputs)."""
        if self.cpu is not None:
            logits = self.cpu.step(ids, phase, step, outputs)
            self.cpu.flush()
            return None if logits is None else torch.from_numpy(logits)
        S, n = ids.shape
        for s in range(S):
            self.hist[s].extend(int(t) for t in ids[s])
        g = self.static if n == 1 else None  # decode: static calls (CUDA graphs), else eager torch
        td = time.perf_counter()
        x = self.dense.embed(ids)  # [S, n, H]
        if g is not None:
            x = g.begin(x, self.kv.len)
        t_embed = (time.perf_counter() - td) * 1e3
        for i in range(self.c.n_layers):
            t0 = time.perf_counter()
            pages, rows, faults, t_eng = 0, 0, 0, 0.0
            if self.engram is not None and i in self.engram.layers:
                f0 = major_faults()
                add, pages = self.engram.lookup_step(i, self.hist, n)
                x.add_(torch.from_numpy(add).to(x.device, x.dtype).view(S, n, -1))  # in place: g reads g.x
                rows, faults = S * n * self.engram.rows_per_token, major_faults() - f0
                t_eng = time.perf_counter() - t0
            if g is None:
                xa = x + self.dense.attention(i, x, self.kv)
                h, eids, w = self.dense.ffn_route(i, xa, self.k)  # [T, H], [T, k] x 2
                resident = h_host = None
            else:
                xa, h, eids, w, h_host = g.layer(i)
                resident = g.E[i]
            t1 = time.perf_counter()
            y, rec = self.experts.forward(i, h, eids, w, resident, h_host)
            t2 = time.perf_counter()
            sh = self.dense.shared(i, h)
            if sh is not None:
                y = y + sh
            x = xa + y.view(S, n, -1) if g is None else torch.add(xa, y.view(S, n, -1), out=g.x)
            t3 = time.perf_counter()
            rec.update(step=step, phase=phase, streams=S, layer=i, tokens=S * n, kv_start=self.kv.len,
                       routed=eids.tolist(),
                       t_dense_ms=((t1 - t0 - t_eng) + (t3 - t2)) * 1e3 + (t_embed if i == 0 else 0.0),
                       t_experts_ms=(t2 - t1) * 1e3, engram_pages=pages, t_engram_ms=t_eng * 1e3, engram_rows=rows,
                       engram_major_faults=faults)
            self.trace.append(rec)
        self.kv.len += n
        if not outputs:
            return None
        t4 = time.perf_counter()
        logits = self.dense.head(x[:, -1])  # [S, V]
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.trace[-1]["t_dense_ms"] += (time.perf_counter() - t4) * 1e3
        return logits

    def generate(self, prompts: np.ndarray, gen_tokens: int, keep_logits: bool = False, progress: bool = False):
        """Prefill `prompts` [S, P], then greedy-decode gen_tokens per stream -> (tokens [S, G], times, logits)."""
        if self.device.type != "cpu":
            return self._generate(prompts, gen_tokens, keep_logits, progress)
        n = torch.get_num_threads()  # on the CPU the heavy products run in numba; torch's remaining ops are
        torch.set_num_threads(1)     # small, and waking its own thread pool costs more than it saves
        try:
            return self._generate(prompts, gen_tokens, keep_logits, progress)
        finally:
            torch.set_num_threads(n)

    def _generate(self, prompts, gen_tokens, keep_logits, progress):
        plan = self.plan
        if plan.expert_cache.release_during_prefill and self.experts.cache.slots:
            self.experts.release()
        t0, n0 = time.perf_counter(), len(self.trace)
        # the plan's -b / -ub, as the simulator's; the head runs on each chunk's last pass only, as llama.cpp's
        passes = plan.prefill.passes_with_outputs(prompts.shape[1], prompts.shape[0])
        a = 0
        for n, outputs in passes:  # the KV cache holds the tokens before a
            logits = self._run(prompts[:, a:a + n], "prefill", 0, outputs)
            a += n
        self.experts.end_step()
        tok = _argmax(logits)  # [S]
        ttft = time.perf_counter() - t0
        out, all_logits, itl = [tok], [_numpy(logits)] if keep_logits else [], []
        for g in range(1, gen_tokens):
            t = time.perf_counter()
            logits = self._run(tok[:, None], "decode", g)
            tok = _argmax(logits)
            itl.append(time.perf_counter() - t)
            self.experts.end_step()
            out.append(tok)
            if keep_logits:
                all_logits.append(_numpy(logits))
            if progress:
                print(f"\rdecode {g + 1}/{gen_tokens}", end="", file=sys.stderr, flush=True)
        if progress:
            print(file=sys.stderr)
        if self.cpu is not None:
            self.cpu.flush()  # the fused steps' records, built after the timed steps
        L = self.c.n_layers  # every pass writes one record a layer: the prefill's passes count as one step
        n1 = n0 + len(passes) * L
        _host_time(self.trace[n0:n1], ttft)
        for s, wall in enumerate(itl):
            _host_time(self.trace[n1 + s * L:n1 + (s + 1) * L], wall)
        return np.stack(out, axis=1), dict(ttft_s=ttft, itl_s=itl), all_logits


def _host_time(step: list[dict], wall_s: float) -> None:
    """Put a step's host time outside its layer records (sampling, the step's own bookkeeping: ~0.02 ms
    a step, 9% of a `tiny` decode step) on its last record as t_host_ms, so that the records of a step
    add up to the time it is measured by (TTFT, ITL); 0 on the others."""
    for r in step:
        r["t_host_ms"] = 0.0
    if step:
        inside = sum(r["t_dense_ms"] + r["t_experts_ms"] + r.get("t_engram_ms", 0.0) for r in step)
        step[-1]["t_host_ms"] = max(0.0, wall_s * 1e3 - inside)


def _argmax(logits) -> np.ndarray:
    """Greedy tokens [S] int64 of logits [S, V] (numpy, or a tensor on any device); first maximum on ties."""
    return logits.argmax(-1) if isinstance(logits, np.ndarray) else logits.argmax(-1).cpu().numpy()


def _numpy(logits) -> np.ndarray:
    """Logits as a numpy array on the host."""
    return logits if isinstance(logits, np.ndarray) else logits.cpu().numpy()


def write_trace(trace: list[dict], path: str | Path) -> Path:
    """Write trace records as JSONL atomically (tmp + os.replace)."""
    path = output_file(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            for r in trace:
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def summarise(trace: list[dict], times: dict, streams: int, gen_tokens: int) -> dict:
    """Speed (tok/s, ms), cache hit rate and achieved bandwidth per tier (GB/s) from a trace."""
    dec = [r for r in trace if r["phase"] == "decode"]
    itl = np.array(times["itl_s"], dtype=float)
    tot = lambda k: float(sum(r[k] for r in dec))  # noqa: E731
    n_hit = sum(len(r["hits"]) for r in dec)
    n_miss = sum(len(r["misses"]) for r in dec)
    bw = lambda b, ms: (b / (ms / 1e3) / 1e9) if ms > 0 else None  # noqa: E731
    return dict(
        decode_tok_s=float(streams * len(itl) / itl.sum()) if len(itl) else None,
        ttft_s=times["ttft_s"],
        itl_p50_ms=float(np.median(itl) * 1e3) if len(itl) else None,
        itl_p95_ms=float(np.percentile(itl, 95) * 1e3) if len(itl) else None,
        cache_hit_rate=(n_hit / (n_hit + n_miss)) if n_hit + n_miss else None,
        time_ms={k: tot(k) for k in ("t_dense_ms", "t_engram_ms", "t_experts_ms", "t_dev_ms", "t_cpu_ms",
                                     "t_wait_ms", "t_host_ms")},
        bytes={"cpu": tot("bytes_cpu"), "pcie": tot("bytes_pcie"), "device": tot("bytes_dev")},
        bandwidth_gbs={"cpu": bw(tot("bytes_cpu"), tot("t_cpu_ms")), "device": bw(tot("bytes_dev"), tot("t_dev_ms"))},
        engram_pages_per_token=tot("engram_pages") / max(1, streams * len(itl)),
    )


def execute(plan: Plan, model_path: str | Path, prompt_tokens: int = 32, gen_tokens: int = 32,
            trace_path: str | Path | None = None, progress: bool = False, prompts: np.ndarray | None = None,
            keep_logits: bool = False, warmup: bool = True) -> dict:
    """Run `plan` on the GGUF at model_path: prefill prompt_tokens, decode gen_tokens per stream.

    Returns decode_tok_s (tok/s, all streams), ttft_s, itl_p50_ms, tokens [S][G], trace (JSONL path),
    bandwidth_gbs per tier, cache_hit_rate, the time split (ms), decode_path (Runner.decode_path) and
    warmup_ttft_s (s: the TTFT of the warm-up run, Runner.warm_up, which the timed run follows as
    llama-bench's does; null with warmup=False, when the timed run is the cold first prompt)."""
    model_path = Path(model_path)
    m = GGUFModel(model_path)
    check_plan(plan, m, prompt_tokens, gen_tokens)
    if prompts is None:
        prompts = default_prompts(plan.streams, prompt_tokens, m.cfg.vocab)
    prompts = np.asarray(prompts, dtype=np.int64).reshape(plan.streams, -1)
    if prompts.shape[1] != prompt_tokens or prompts.min() < 0 or prompts.max() >= m.cfg.vocab:
        raise SpecError("prompts", None, f"need {plan.streams} x {prompt_tokens} token ids in [0, {m.cfg.vocab})")
    del m
    if progress:  # a cold numba cache costs minutes before the first token: say so rather than sit silent
        print("loading the model and its kernels (the first run on a machine compiles them, 1-2 minutes; "
              "later runs load them from numba's cache)", file=sys.stderr, flush=True)
    r = Runner(plan, model_path, prompt_tokens + gen_tokens)
    try:
        warmup_ttft = r.warm_up(prompt_tokens) if warmup else None
        tokens, times, logits = r.generate(prompts, gen_tokens, keep_logits, progress)
    finally:
        r.experts.close()
    if trace_path is None:
        trace_path = Path("runs") / f"trace-{model_path.stem}-{int(time.time())}.jsonl"
    out = summarise(r.trace, times, plan.streams, gen_tokens)
    acts = qgemm.gemm_activations()
    for rec in r.trace:  # which build's kernels timed it: trace_fit fits each build's traces apart
        rec["gemm_activations"] = acts
    out.update(tokens=tokens.tolist(), trace=str(write_trace(r.trace, trace_path)), device=str(r.device),
               decode_path=r.decode_path(), gemm_activations=acts, warmup_ttft_s=warmup_ttft,
               streams=plan.streams, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens,
               dense_bytes_per_token=r.dense.nbytes_per_token())
    if keep_logits:
        out["logits"] = logits
    return out
