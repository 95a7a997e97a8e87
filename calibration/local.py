"""This machine's reference cases: the executor on a synthetic model under several plans, each
measurement appended to the results store (model, plan JSON, n_prompt, n_gen, routing trace) so
`regress --hw` can predict it. Cases run round-robin; the store gets the median of the quiet runs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from specs.plan import ExpertCache, MissPolicy, Placement, Plan, Prefill

from . import store
from .page_layout import page_breaks_of

ENGINE = "moe-offload-executor"
MODELS_DIR = Path("runs") / "models"


@dataclass(frozen=True)
class LocalCase:
    """One executor run: a plan, a request shape (tokens) and the metric it measures."""

    name: str
    plan: Plan
    n_prompt: int
    n_gen: int
    metric: str  # decode_tok_s | ttft_s
    model: Path | None = None  # its own GGUF (else the one `measure` is given)


def ensure_model(preset: str = "small", root: str | Path = MODELS_DIR, engram: bool = True) -> Path:
    """The synthetic GGUF of `preset` (with its Engram table unless engram=False), made once under `root`."""
    from executor.make_model import engram_path, make_model
    path = Path(root) / f"{preset}.gguf"
    if not path.exists() or (engram and not engram_path(path).exists()):
        Path(root).mkdir(parents=True, exist_ok=True)
        make_model(preset, path, engram=engram)
    return path


def _plan(n_prompt: int, **upd) -> Plan:
    """A plan as the executor runs it on this host: prefill in one batch on the CPU, no Engram."""
    pre = Prefill(strategy="cpu", chunk_tokens=max(n_prompt, 1), ubatch_tokens=max(n_prompt, 1))
    base = dict(prefill=pre, placement=Placement(engram="none"),
                expert_cache=ExpertCache(release_during_prefill=False))
    base.update(upd)
    return Plan(**base)


def _cache(slots: int) -> ExpertCache:
    # the executor loads an admitted expert on the host thread between steps: copies on the compute stream
    return ExpertCache(slots=slots, policy="decayed-count", release_during_prefill=False, copies="sync")


def local_cases(n_layers: int, n_experts: int, n_gen: int = 64, n_prompt: int = 16,
                ttft_prompts: tuple[int, ...] = (512, 2048), streams: int = 4) -> list[LocalCase]:
    """The issue's plans: all-CPU; cache of 10/30/60% of experts with CPU misses; a static split
    (upper half of the layers on the device); Engram on; `streams` streams; TTFT per prompt length."""
    total = n_layers * n_experts
    c = lambda frac: _cache(max(1, round(frac * total)))  # noqa: E731
    half = list(range(n_layers // 2, n_layers))
    cases = [
        LocalCase("local-all-cpu", _plan(n_prompt), n_prompt, n_gen, "decode_tok_s"),
        LocalCase("local-cache10", _plan(n_prompt, expert_cache=c(0.10)), n_prompt, n_gen, "decode_tok_s"),
        LocalCase("local-cache30", _plan(n_prompt, expert_cache=c(0.30)), n_prompt, n_gen, "decode_tok_s"),
        LocalCase("local-cache60", _plan(n_prompt, expert_cache=c(0.60)), n_prompt, n_gen, "decode_tok_s"),
        LocalCase("local-static-half", _plan(n_prompt, placement=Placement(engram="none", gpu_expert_layers=half)),
                  n_prompt, n_gen, "decode_tok_s"),
        LocalCase("local-engram", _plan(n_prompt, placement=Placement(engram="nvme", engram_gather="inline")),
                  n_prompt, n_gen, "decode_tok_s"),
        LocalCase(f"local-{streams}streams", _plan(n_prompt, streams=streams), n_prompt, max(8, n_gen // 2),
                  "decode_tok_s"),
    ]
    cases += [LocalCase(f"local-ttft-{p}", _plan(p), p, 2, "ttft_s") for p in ttft_prompts]
    return cases


def device_check_plans(n_layers: int, n_experts: int) -> dict[str, Plan]:
    """scripts/device_check.sh's plans, by name: the CPU path, then the CUDA path's tiers (dense on the
    device with CPU experts; a 25% cache with the auction; a 100% cache; every miss copied; a static
    split of layers 1 and 3)."""
    cpu = Placement(dense="cpu", kv="cpu", engram="none")
    gpu = Placement(dense="gpu", engram="none")
    total = n_layers * n_experts
    return {
        "cpu-only": Plan(placement=cpu),
        "gpu-dense+cpu-experts": Plan(placement=gpu),
        "gpu-cache-25%+auction": Plan(placement=gpu, miss_policy=MissPolicy(kind="auction", gpu_path="copy"),
                                      expert_cache=ExpertCache(slots=total // 4, policy="decayed-count", swap_every=4,
                                                               copies="sync")),
        "gpu-cache-100%": Plan(placement=gpu, expert_cache=ExpertCache(slots=total, policy="static", copies="sync",
                                                                       release_during_prefill=False)),
        "gpu-copy-misses": Plan(placement=gpu, miss_policy=MissPolicy(kind="copy"), expert_cache=ExpertCache(copies="sync")),
        "gpu-static-split": Plan(placement=Placement(dense="gpu", engram="none", gpu_expert_layers=[1, 3])),
    }


def warm_page_cache(path: Path, chunk: int = 16 << 20) -> None:
    """Read `path` once so its pages sit in the page cache (the simulator's "seen" Engram text)."""
    buf = bytearray(chunk)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def run_case(case: LocalCase, model_path: Path | None, trace_dir: Path, tag: str = "") -> dict:
    """Execute one case; returns the executor's result dict (trace written under trace_dir), with the model file's
    page layout right after it (model_page_breaks: page_layout.page_breaks_of, None where unreadable). An Engram
    case first reads its table into the page cache: its rows are cached, as predicted."""
    from executor.make_model import engram_path
    from executor.runner import execute
    model_path = case.model or model_path
    if case.plan.placement.engram != "none" and engram_path(model_path).exists():
        warm_page_cache(engram_path(model_path))
    trace = trace_dir / f"{case.name}{tag}.jsonl"
    r = execute(case.plan, model_path, prompt_tokens=case.n_prompt, gen_tokens=case.n_gen, trace_path=trace)
    r["model_page_breaks"] = page_breaks_of("auto", str(model_path))  # the layout it read, right after the run
    return r


QUIET = 0.10  # a run is clean when other processes used at most this share of the CPUs
SLACK = 0.05  # runs within this outside share of the quietest one count towards the median


def _keep(runs: list[tuple[float, float, dict]]) -> list[tuple[float, float, dict]]:
    """The runs (value, outside share, result) measured with the least outside load."""
    low = min(o for _, o, _ in runs)
    return [x for x in runs if x[1] <= max(QUIET, low + SLACK)]


def with_page_breaks(plan: Plan, result: dict) -> str:
    """`plan` as JSON, carrying the page layout of the file the run `result` read (its model_page_breaks, where it
    has one) as cpu_file_page_breaks: what its in-place reads paid (simulator.resources.in_place_page_excess)."""
    b = result.get("model_page_breaks")
    return (plan if b is None else plan.model_copy(update={"cpu_file_page_breaks": float(b)})).model_dump_json()


def measure(model_path: str | Path | None, cases: list[LocalCase], store_path: str | Path | None = None,
            rounds: int = 3, trace_dir: str | Path | None = None, log=print, extra: int | None = None) -> list[dict]:
    """Run every case `rounds` times round-robin on `model_path` (a case's own `model` where it has one), each run
    timed with the CPU share other processes took meanwhile; a case with no clean run gets up to `extra` more
    tries. The store gets the median over the least-contended runs (value: tok/s or s); returns the rows appended."""
    from .sampling import Window
    model_path = Path(model_path) if model_path is not None else None
    trace_dir = Path(trace_dir or Path("runs") / "local-traces" / time.strftime("%Y%m%dT%H%M%S"))
    extra = rounds if extra is None else extra
    got: dict[str, list[tuple[float, float, dict]]] = {c.name: [] for c in cases}

    def one(c, k, of):
        w = Window()
        r = run_case(c, model_path, trace_dir, tag=f"-r{k}")
        got[c.name].append((float(r[c.metric]), w.others(), r))
        if log:
            log(f"  {c.name:20s} run {k + 1}/{of}: {c.metric} = {r[c.metric]:.4g} "
                f"(hit rate {r.get('cache_hit_rate') or 0:.2f}, outside CPU {100 * got[c.name][-1][1]:.0f}%)")
    for k in range(rounds):
        for c in cases:
            one(c, k, rounds)
    for k in range(rounds, rounds + extra):
        busy = [c for c in cases if min(o for _, o, _ in got[c.name]) > QUIET]
        for c in busy:
            one(c, k, rounds + extra)
    rows = []
    for c in cases:
        kept = _keep(got[c.name])
        vals = [v for v, _, _ in kept]
        med = statistics.median(vals)
        _, others, rmed = min(kept, key=lambda x: abs(x[0] - med))
        rows.append(store.make_row(
            c.name, c.metric, med, engine=ENGINE, model=str(c.model or model_path), plan=with_page_breaks(c.plan, rmed),
            n_prompt=c.n_prompt, n_gen=c.n_gen, routing=rmed["trace"],
            warm_steps=0, repeats=len(vals), runs=len(got[c.name]), outside_cpu=others,
            spread=(max(vals) - min(vals)) / med if med else 0.0, cache_hit_rate=rmed.get("cache_hit_rate") or 0.0,
            traces=";".join(r["trace"] for _, _, r in kept)))
    if store_path is not None:
        store.append_rows(store_path, rows)
    return rows


def measure_local(preset: str = "small", store_path: str | Path | None = None, rounds: int = 3,
                  n_gen: int = 64, log=print) -> list[dict]:
    """Make (once) and run the local reference cases on `preset`; rows appended to the store."""
    from specs.loaders import load_model
    path = ensure_model(preset)
    m = load_model(str(path))
    t0 = time.perf_counter()
    rows = measure(path, local_cases(m.n_layers, m.n_experts, n_gen=n_gen),
                   store_path or store.default_store_path(), rounds=rounds, log=log)
    if log:
        log(f"local cases on {preset}: {len(rows)} rows in {time.perf_counter() - t0:.0f} s")
    return rows
