"""Fit the simulator's host overhead constants from executor traces (JSONL, one record per step and
layer); trace_profile.py writes them into a profile.

Each constant is read off the records that isolate it (no joint fudge):

    cpu_job_ms, cpu_expert_ms  CPU expert jobs run inline (no device work beside them), 1 token:
                               t_cpu = c_a + c_b n_cpu (c_a from the base profile's kernel
                               benchmark when every job has the same n_cpu)
    hit_ms                     layers with device hits and no CPU job, 1 token: t_dev = hit_ms n_h
    layer_overhead_ms          per layer, what is left of t_dense + t_experts after the expert
                               work above and the dense weights read at the measured dense rate
    token_overhead_ms          steps of several tokens (streams): what is left per layer and
                               further token beyond the one-token model plus the further
                               (token, expert) products at the prefill-measured GEMM rates
    prefill_gflops_per_core    prefill CPU expert jobs: routed FLOPs / t_cpu / threads, at
                               prefill_tokens_per_expert: their (token, expert) products / experts run
    host_gemm_gflops           prefill dense path: dense + attention FLOPs / the rest of the layer
    engram_row_us              host us per Engram row gathered inline: median of t_engram_ms 1e3 /
                               engram_rows over decode records whose rows were all in the page
                               cache (no major fault; reads from storage are the NVMe model's). A
                               median, not a line with an intercept: one-stream decode records all
                               gather the same rows (orders x heads), so a fixed part is not
                               separable there and is charged per row, as the simulator charges it

On a discrete GPU (the base profile's `gpu` is a real one, not torch on the host's cores) the
dense weights are read at its VRAM rate, and these are read off the records:

    device_layer_ms            from layers with device hits and no CPU job only
    overlap_layer_ms           layers whose hits run beside a CPU job (on the worker thread): their
                               rest beyond the host's own; overlap_dev_ms and overlap_cpu_ms, each
                               side's time beyond its one-sided model (the dispatching thread and the
                               CPU job share the cores)
    copy_miss_ms               layers of copied misses only: per copy, t_dev beyond its bytes at the
                               base's measured pageable H2D rate (copy_h2d_gbs: the executor copies
                               from its mmap) and a hit

On a host-sharing device (torch on the host's cores) the hits and a CPU job beside them share the
cores, so the simulator runs them one after the other there; read off the layers with both:

    overlap_layer_ms           their rest beyond the host's own (the hand-off's host time), as above
    overlap_dev_ms             t_dev + t_wait beyond the hits at hit_ms and the job at c_a + c_b n:
                               what sharing the cores costs beyond running the two in turn (threads
                               of both runtimes oversubscribing the cores)
    device_layer_ms            then from layers with device hits and no CPU job only

t_dense_ms holds no Engram time (traces before t_engram_ms did: read as 0 rows, 0 ms), so the
per-layer constants do not absorb it.
A step's host time outside its layers (sampling, bookkeeping) is on its last record as t_host_ms
(traces before it: 0); layer_overhead_ms takes it in through the step means, spread over the layers.

Traces of an int8 build (`execute --gemm-int8`) and of the default one are not fitted together (activations):
its prefill GEMM and its Q4_0 / IQ4_NL decode rows run at other rates. Each record names its build
(gemm_activations; traces before session 38 do not, and fit with either).

Errors: per trace, the summed step time the fitted per-layer model gives for the trace's own
hits and misses (and Engram rows) against the measured sum, in sample and leave-one-trace-out.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specs.errors import SpecError
from specs.loaders import read_text

DEVICE_BYTES_PER_PARAM = 4.0  # the executor's device copies of experts on a CPU host are f32


@dataclass
class HostFit:
    """Fitted host constants (ms, GB/s, GFLOP/s) and how many records pinned each."""

    layer_overhead_ms: float
    token_overhead_ms: float
    cpu_job_ms: float
    cpu_expert_ms: float
    hit_ms: float | None
    prefill_gflops_per_core: float | None
    host_gemm_gflops: float | None
    n: dict = field(default_factory=dict)
    device_layer_ms: float = 0.0  # further per-layer host time where the layer has device work
    engram_row_us: float = 0.0  # host us per Engram row gathered inline (page-cache hits)
    prefill_tokens_per_expert: float | None = None  # of the prefill jobs prefill_gflops_per_core comes from
    # a discrete GPU (CUDA host): layers whose device hits overlap a CPU job on the worker thread cost
    # a hand-off (host time beyond the host's own rest) and slow both sides (the dispatching thread
    # and the CPU job share the cores); device_layer_ms then comes from device-only layers
    discrete: bool = False
    # on either kind of device, once layers with hits beside a CPU job were fitted (else 0: the
    # simulator falls back to device_layer_ms for them on a host-sharing device)
    overlap_layer_ms: float = 0.0
    overlap_dev_ms: float = 0.0
    overlap_cpu_ms: float = 0.0
    copy_h2d_gbs: float = 0.0  # the base's pageable H2D rate: the executor copies misses from its mmap
    copy_miss_ms: float = 0.0  # per copied expert beyond its bytes at that rate and a hit


def read_trace(path: str | Path) -> list[dict]:
    """Records of an executor trace; SpecError (file, line) when it is not one."""
    path = Path(path)
    try:
        lines = read_text(path).splitlines()
    except OSError as e:
        raise SpecError(str(path), None, f"cannot read the trace: {e.strerror or e}") from None
    out = []
    need = ("phase", "layer", "tokens", "t_dense_ms", "t_experts_ms", "t_dev_ms", "t_cpu_ms", "hits", "cpu")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecError(str(path), f"line {i}", f"not JSON ({e.msg})") from None
        miss = [k for k in need if k not in rec]
        if miss:
            raise SpecError(str(path), f"line {i}", f"not an executor trace record (no {miss[0]!r})")
        out.append(rec)
    if not out:
        raise SpecError(str(path), None, "empty trace")
    return out


def activations(traces: dict[str, list[dict]]) -> str | None:
    """The activations the executor's kernels ran on in `traces` (the records' gemm_activations: int8, int16 or
    float), None where no record says (traces before session 38); SpecError when two traces say different ones: an
    int8 build's prefill GEMM and Q4_0 / IQ4_NL decode rows run at other rates, so a fit over both is neither's."""
    seen = {}
    for name, recs in traces.items():
        for r in recs:
            a = r.get("gemm_activations")
            if a is not None:
                seen.setdefault(a, name)
    if len(seen) > 1:
        (a, fa), (b, fb) = list(seen.items())[:2]
        raise SpecError(fb, "gemm_activations", f"{b} activations, where {Path(fa).name} ran on {a}: fit each "
                        "build's traces apart")
    return next(iter(seen), None)


def check_trace(recs: list[dict], model, path: str) -> None:
    """SpecError when the trace's layers or expert ids do not fit `model` (a trace of another model)."""
    layers = {r["layer"] for r in recs}
    if max(layers) >= model.n_layers or len(layers) != model.n_layers:
        raise SpecError(str(path), "layer", f"trace has {len(layers)} layers (max id {max(layers)}), "
                        f"model {model.name} has {model.n_layers}: a trace of another model")
    top = max((e for r in recs for e in r["hits"] + r.get("misses", r["cpu"])), default=-1)
    if top >= model.n_experts:
        raise SpecError(str(path), "routed", f"expert id {top} but model {model.name} has {model.n_experts} "
                        "experts per layer: a trace of another model")
    k = max((len(t) for r in recs for t in r.get("routed", [])), default=0)
    if k > model.top_k:
        raise SpecError(str(path), "routed", f"{k} experts per token but model {model.name} routes "
                        f"top-{model.top_k}: a trace of another model")


def _inline(r) -> bool:
    return bool(r["cpu"]) and not r["hits"] and not r.get("pcie")


def _decode1(recs):
    return [r for r in recs if r["phase"] == "decode" and r["tokens"] == 1]


def _engram_row_us(recs) -> tuple[float, int, int]:
    """(median host us per Engram row, records used, records left out for major faults) over decode records."""
    eng = [r for r in recs if r["phase"] == "decode" and r.get("engram_rows", 0) > 0]
    warm = [r["t_engram_ms"] * 1e3 / r["engram_rows"] for r in eng if not r.get("engram_major_faults", 0)]
    return (statistics.median(warm) if warm else 0.0), len(warm), len(eng) - len(warm)


def _attention_flops(model, r) -> float:
    """A prefill record's attention FLOPs: each of its streams' tokens against that stream's context (kv_start tokens
    before the pass; traces before kv_start was recorded: 0, one pass)."""
    from simulator.prefill import attention_flops
    s = r.get("streams", 1)
    return s * attention_flops(model, r.get("kv_start", 0), r["tokens"] // s)


def _pairs(r, experts) -> int:
    """(token, expert) products of record r among `experts`."""
    s = set(experts)
    return sum(1 for tok in r.get("routed", []) for e in tok if e in s)


def _further_ms(r, f: HostFit, model, threads: int) -> tuple[float, float, float]:
    """(dense, device, CPU) ms of a step's tokens beyond one per expert and layer, at the rates
    prefill measures (host GEMM, CPU expert GEMM); zeros for one-token steps."""
    if r["tokens"] <= 1 or not f.host_gemm_gflops or not f.prefill_gflops_per_core:
        return 0.0, 0.0, 0.0
    gemm = f.host_gemm_gflops * 1e6  # FLOP per ms
    cpu = f.prefill_gflops_per_core * threads * 1e6
    dense = (r["tokens"] - 1) * model.dense_flops_per_token / model.n_layers / gemm
    dev = (_pairs(r, r["hits"]) - len(r["hits"])) * model.expert_flops / gemm
    return dense, dev, (_pairs(r, r["cpu"]) - len(r["cpu"])) * model.expert_flops / cpu


def _expert_part(r, f: HostFit, ddr_gbs: float, eb: float, dev_eb: float, ho_ms: float,
                 further: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> float:
    """Modelled expert time of one decode layer record (ms): device hits and the CPU job, which
    overlap and share DDR when both are present (the fluid bound)."""
    n_h, n_c = len(r["hits"]), len(r["cpu"])
    t_dev = n_h * (f.hit_ms or 0.0) + further[1]
    t_cpu = (f.cpu_job_ms + f.cpu_expert_ms * n_c + further[2]) if n_c else 0.0
    if f.discrete and r.get("pcie"):  # copied from the mmap at the pageable rate, then computed
        t_dev += len(r["pcie"]) * (eb / (f.copy_h2d_gbs * 1e6) + (f.hit_ms or 0.0) + f.copy_miss_ms) \
            if f.copy_h2d_gbs else 0.0
    if n_h and n_c and f.discrete:  # VRAM and DDR apart; both sides slowed while they overlap
        return ho_ms + max(t_dev + f.overlap_dev_ms, t_cpu + f.overlap_cpu_ms)
    if _shared_both(f, r):  # the same cores: the hits, then the job (its hand-off behind them)
        return max(t_dev + f.overlap_dev_ms, ho_ms) + t_cpu
    if n_h and n_c:
        shared = (n_h * dev_eb + n_c * eb) / (ddr_gbs * 1e6)  # ms at the DDR's rate
        return ho_ms + max(t_dev, t_cpu, shared)
    return t_dev + t_cpu


_DDR_UNUSED = 1e9  # GB/s: no DDR bound when reading the one-token model off a step's records


def _step_means(recs, model, value) -> list[tuple[float, int]]:
    """(mean of value(record) over a step's layers, tokens) for each complete step of one trace."""
    steps: dict = {}
    for r in recs:
        steps.setdefault((r["step"], r["tokens"]), []).append(value(r))
    return [(sum(v) / len(v), key[1]) for key, v in steps.items() if len(v) == model.n_layers]


def fit(traces: dict[str, list[dict]], model, dense_gbs: float, threads: int,
        c_a_hint: float = 0.0, discrete: bool = False, copy_gbs: float = 0.0) -> HostFit:
    """Fit the host constants on `traces` {name: records} of `model` (dense weights at dense_gbs;
    discrete: the device is a real GPU, not torch on the host's cores)."""
    dec = [r for recs in traces.values() for r in _decode1(recs)]
    if not dec:
        raise SpecError(", ".join(traces), "phase", "no single-token decode records to fit")
    inl = [r for r in dec if _inline(r)]
    ns = np.array([len(r["cpu"]) for r in inl], dtype=float)
    ts = np.array([r["t_cpu_ms"] for r in inl], dtype=float)
    if len(set(ns)) >= 2:
        A = np.stack([np.ones_like(ns), ns], 1)
        c_a, c_b = np.linalg.lstsq(A, ts, rcond=None)[0]
        c_a, c_b = max(0.0, float(c_a)), float(c_b)
    elif len(ns):
        c_a = c_a_hint
        c_b = float(np.median((ts - c_a) / ns))
    else:
        raise SpecError(", ".join(traces), "cpu", "no inline CPU expert jobs (run an all-CPU plan)")
    hit = [r for r in dec if r["hits"] and not r["cpu"] and not r.get("pcie")]  # t_dev: hits alone
    hit_ms = statistics.median(r["t_dev_ms"] / len(r["hits"]) for r in hit) if hit else None
    f = HostFit(0.0, 0.0, c_a, c_b, hit_ms, None, None,
                n={"decode_records": len(dec), "inline_cpu": len(inl), "hit_only": len(hit)})
    f.engram_row_us, f.n["engram_records"], f.n["engram_cold"] = \
        _engram_row_us([r for recs in traces.values() for r in recs])
    dense_ms = model.dense_bytes_per_token / model.n_layers / (dense_gbs * 1e6)
    def rest(r):  # a layer's time beyond its measured expert work
        return r["t_dense_ms"] + r.get("t_host_ms", 0.0) + r["t_experts_ms"] - r["t_dev_ms"] \
            - r.get("t_wait_ms", 0.0) - (r["t_cpu_ms"] if _inline(r) else 0.0)
    # steps without device work pin the host's own per-layer rest; layers with device work cost more
    # (the device tier's dispatch), fitted apart so that a plan without it is not charged for it
    dev = lambda r: bool(r["hits"] or r.get("pcie"))  # noqa: E731
    per_trace = [_decode1(recs) for recs in traces.values()]
    host_only = [recs for recs in per_trace if recs and not any(dev(r) for r in recs)]
    per_step = [v for recs in (host_only or per_trace) for v, _ in _step_means(recs, model, rest)]
    f.layer_overhead_ms = max(0.0, statistics.median(per_step) - dense_ms)
    dev_rest = [rest(r) for r in dec if dev(r)]
    if host_only and dev_rest:
        f.device_layer_ms = max(0.0, statistics.median(dev_rest) - dense_ms - f.layer_overhead_ms)
        f.n["device_layers"] = len(dev_rest)
    _fit_overlap(f, dec, dev, rest, dense_ms, discrete)
    if discrete:
        f.copy_h2d_gbs = copy_gbs
        copied = [r for r in dec if r.get("pcie") and not r["hits"] and not r["cpu"]]
        if copied and f.hit_ms and copy_gbs:
            per = model.expert_bytes / (copy_gbs * 1e6) + f.hit_ms  # ms per copied expert, modelled
            f.copy_miss_ms = max(0.0, statistics.median(r["t_dev_ms"] / len(r["pcie"]) - per for r in copied))
            f.n["copied_layers"] = len(copied)
    pre = [r for recs in traces.values() for r in recs if r["phase"] == "prefill" and r["tokens"] >= 64]
    if pre:
        flops = sum(_pairs(r, r["cpu"]) * model.expert_flops for r in pre if r["cpu"])
        t = sum(r["t_cpu_ms"] for r in pre if r["cpu"]) * 1e-3
        f.prefill_gflops_per_core = flops / t / 1e9 / threads if t > 0 else None
        jobs = sum(len(r["cpu"]) for r in pre)
        f.prefill_tokens_per_expert = sum(_pairs(r, r["cpu"]) for r in pre) / jobs if jobs else None
        # the head once per stream (its last prompt token's logits); traces before `streams` was recorded: one; each
        # stream's attention against its own context (kv_start tokens before the pass: the plan's -ub passes)
        dflops = sum((model.prefill_dense_flops(r["tokens"], outputs=r.get("streams", 1))
                      + _attention_flops(model, r)) / model.n_layers for r in pre)
        td = sum(r["t_dense_ms"] + r["t_experts_ms"] - r["t_cpu_ms"] - r["t_dev_ms"] for r in pre) * 1e-3
        f.host_gemm_gflops = dflops / td / 1e9 if td > 0 else None
        f.n["prefill_records"] = len(pre)

    def beyond(r):  # what further tokens cost beyond the mechanism (prefill-measured rates)
        fd, fv, fc = _further_ms(r, f, model, threads)
        return (r["t_dense_ms"] + r.get("t_host_ms", 0.0) + r["t_experts_ms"] - dense_ms - f.layer_overhead_ms - fd
                - _expert_part(r, f, _DDR_UNUSED, model.expert_bytes, 0.0, 0.0, (0.0, fv, fc)))
    multi = [x for recs in traces.values()
             for x in _step_means([r for r in recs if r["phase"] == "decode" and r["tokens"] > 1], model, beyond)]
    if multi:
        f.token_overhead_ms = max(0.0, statistics.median(v / (t - 1) for v, t in multi))
        f.n["multi_token_steps"] = len(multi)
    return f


def _fit_overlap(f: HostFit, dec, dev, rest, dense_ms: float, discrete: bool) -> None:
    """Device-only layers (device_layer_ms) and layers with hits beside a CPU job (overlap_layer_ms: their
    rest beyond the host's, the hand-off's host time), medians. On a discrete GPU overlap_dev_ms and
    overlap_cpu_ms are each side's time beyond its one-sided model; on a host-sharing device, where the
    two take turns on the cores, overlap_dev_ms is their window (t_dev + t_wait) beyond the two in turn,
    and without such layers nothing is read here (device_layer_ms stays fitted on every device layer)."""
    f.discrete = discrete
    both = [r for r in dec if r["hits"] and r["cpu"] and not r.get("pcie")]
    fitted = bool(both and f.hit_ms)
    if not (discrete or fitted):
        return
    only = [r for r in dec if dev(r) and not r["cpu"]]
    if only:
        f.device_layer_ms = max(0.0, statistics.median(rest(r) for r in only) - dense_ms - f.layer_overhead_ms)
        f.n["device_layers"] = len(only)
    if not fitted:
        return
    f.overlap_layer_ms = max(0.0, statistics.median(rest(r) for r in both) - dense_ms - f.layer_overhead_ms)
    job = lambda r: f.cpu_job_ms + f.cpu_expert_ms * len(r["cpu"])  # noqa: E731
    if discrete:
        f.overlap_dev_ms = max(0.0, statistics.median(r["t_dev_ms"] - len(r["hits"]) * f.hit_ms for r in both))
        f.overlap_cpu_ms = max(0.0, statistics.median(r["t_cpu_ms"] - job(r) for r in both))
    else:
        f.overlap_dev_ms = max(0.0, statistics.median(
            r["t_dev_ms"] + r.get("t_wait_ms", 0.0) - len(r["hits"]) * f.hit_ms - job(r) for r in both))
    f.n["overlap_layers"] = len(both)


def _shared_both(f: HostFit, r) -> bool:
    """Whether record r is a host-sharing device's layer of hits beside a CPU job, with those fitted."""
    return not f.discrete and bool(f.n.get("overlap_layers")) and bool(r["hits"]) and bool(r["cpu"]) \
        and not r.get("pcie")


def replay_error(recs: list[dict], f: HostFit, model, dense_gbs: float, ddr_gbs: float,
                 handover_ms: float = 0.0, threads: int = 1) -> float | None:
    """Relative error of the fitted per-layer model's summed decode time on `recs`."""
    dec = [r for r in recs if r["phase"] == "decode"]
    if not dec:
        return None
    dense_ms = model.dense_bytes_per_token / model.n_layers / (dense_gbs * 1e6)
    dev_eb = model.params_per_expert * DEVICE_BYTES_PER_PARAM
    pred = 0.0
    for r in dec:
        fu = _further_ms(r, f, model, threads)
        dev = bool(r["hits"] or r.get("pcie"))
        both = (f.discrete and dev and bool(r["cpu"])) or _shared_both(f, r)
        pred += (f.layer_overhead_ms + (r["tokens"] - 1) * f.token_overhead_ms + dense_ms + fu[0]
                 + (f.overlap_layer_ms if both else f.device_layer_ms if dev else 0.0)
                 + _expert_part(r, f, ddr_gbs, model.expert_bytes, dev_eb, handover_ms, fu)
                 + r.get("engram_rows", 0) * f.engram_row_us / 1e3)
    meas = sum(r["t_dense_ms"] + r.get("t_host_ms", 0.0) + r["t_experts_ms"] + r.get("t_engram_ms", 0.0) for r in dec)
    return pred / meas - 1


def errors(traces: dict[str, list[dict]], model, dense_gbs: float, ddr_gbs: float, threads: int,
           handover_ms: float = 0.0, c_a_hint: float = 0.0, discrete: bool = False,
           copy_gbs: float = 0.0) -> list[dict]:
    """Per trace: in-sample error (fit on all) and leave-one-trace-out error (fit on the others)."""
    full = fit(traces, model, dense_gbs, threads, c_a_hint, discrete, copy_gbs)
    rows = []
    for name, recs in traces.items():
        ins = replay_error(recs, full, model, dense_gbs, ddr_gbs, handover_ms, threads)
        others = {k: v for k, v in traces.items() if k != name}
        loo = None
        if others:
            try:
                fo = fit(others, model, dense_gbs, threads, c_a_hint, discrete, copy_gbs)
                for k in ("hit_ms", "prefill_gflops_per_core", "host_gemm_gflops"):
                    if getattr(fo, k) is None:  # no record among the others pins it: nothing to predict from
                        setattr(fo, k, getattr(full, k))
                if not fo.n["engram_records"]:
                    fo.engram_row_us = full.engram_row_us
                loo = replay_error(recs, fo, model, dense_gbs, ddr_gbs, handover_ms, threads)
            except SpecError:
                loo = None
        rows.append({"trace": name, "in_sample": ins, "out_of_sample": loo})
    return rows
