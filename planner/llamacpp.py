"""llama.cpp command lines: emit the llama-server flags of a Plan, and parse flags back into one.

llama.cpp places each tensor once at load (DESIGN.md "Static placement"): `-ngl` puts layers on
the GPU, `--cpu-moe` / `--n-cpu-moe N` keep the experts of all / the first N layers in RAM, and
`-ot REGEX=DEVICE` overrides per tensor. Expert granularity is a whole layer's projection.
CPU weights of the formats its kernels repack are copied at load into anonymous memory unless
`--no-repack` (Plan.cpu_repack), and with `--no-mmap` every CPU weight is read into anonymous
memory (Plan.cpu_mmap): experts that must stream from NVMe need the mmap and no repacking.
It has no expert cache, no miss auction and no stream-all prefill: `closest_static` says what a
plan loses on the way.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from specs.errors import SpecError
from specs.model import ModelSpec
from specs.plan import KVCache, Placement, Plan, Prefill

EXPERT_PROJ = ("gate", "up", "down")
KV_TYPES = {"f32": "f32", "f16": "f16", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0"}


def expert_tensor_names(model: ModelSpec) -> list[str]:
    """GGUF names of every routed-expert tensor (`blk.{i}.ffn_{gate,up,down}_exps.weight`)."""
    return [f"blk.{i}.ffn_{p}_exps.weight" for i in model.layers_moe for p in EXPERT_PROJ]


def _layers_regex(layers: list[int]) -> str:
    return r"blk\.(" + "|".join(str(i) for i in sorted(layers)) + r")\.ffn_(up|down|gate)_exps\.weight=CPU"


@dataclass
class Emitted:
    """A llama-server command line and what of the plan it could not express."""

    argv: list[str]
    lost: list[str] = field(default_factory=list)

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def closest_static(plan: Plan, model: ModelSpec) -> tuple[Plan, list[str]]:
    """The static plan llama.cpp can run that is closest to `plan`, and what was given up."""
    lost = []
    p = plan.placement
    gpu_layers = list(p.gpu_expert_layers)
    if plan.expert_cache.slots and plan.expert_cache.policy != "none":
        # the cache's VRAM becomes whole expert layers, the last ones first (like --n-cpu-moe)
        whole = plan.expert_cache.slots // model.n_experts
        cpu_layers = [i for i in model.layers_moe if i not in gpu_layers]
        gpu_layers += cpu_layers[len(cpu_layers) - whole:] if whole else []
        lost.append(f"a {plan.expert_cache.policy} expert cache of {plan.expert_cache.slots} slots "
                    f"(llama.cpp has no expert cache: {whole} whole layers of experts on the GPU instead)")
    if plan.miss_policy.kind in ("auction", "zero-copy", "copy"):
        lost.append(f"miss policy '{plan.miss_policy.kind}' (llama.cpp computes RAM experts on the CPU)")
    prefill = plan.prefill
    if prefill.strategy == "stream-all":
        lost.append("stream-all prefill (llama.cpp op offload copies RAM experts per micro-batch instead)")
        prefill = Prefill(strategy="op-offload", chunk_tokens=min(prefill.chunk_tokens, 2048),
                          ubatch_tokens=min(prefill.ubatch_tokens, 512))
    if plan.mtp.enabled:
        lost.append("MTP drafting")
    if plan.experts_per_token:
        lost.append(f"running {plan.experts_per_token} experts per token instead of top-k")
    if plan.kv.dtype == "fp8":
        lost.append("fp8 KV cache (q8_0 instead)")
    if p.expert_ram_bytes is not None:
        lost.append("an expert RAM budget (no llama.cpp flag: its mmap's page cache holds about as many experts)")
    # experts read from NVMe through the mmap must not be copied at load (--no-repack)
    repack = plan.cpu_repack if plan.engine == "llamacpp" else p.expert_ram_bytes is None
    static = Plan(engine="llamacpp", cpu_repack=repack, cpu_mmap=plan.cpu_mmap or p.expert_ram_bytes is not None,
                  placement=Placement(dense=p.dense, kv=p.kv, gpu_expert_layers=sorted(gpu_layers),
                                      engram=p.engram, expert_ram_bytes=p.expert_ram_bytes),
                  prefill=prefill, streams=plan.streams, cpu_threads=plan.cpu_threads,
                  cpu_file_page_breaks=plan.cpu_file_page_breaks,
                  kv=KVCache(context=plan.kv.context, dtype="q8_0" if plan.kv.dtype == "fp8" else plan.kv.dtype))
    return static, lost


def emit(plan: Plan, model: ModelSpec, model_path: str = "MODEL.gguf") -> Emitted:
    """The llama-server command line for the static part of `plan`."""
    static, lost = closest_static(plan, model)
    p = static.placement
    argv = ["llama-server", "-m", model_path, "-c", str(static.kv.context)]
    if p.dense == "cpu":
        argv += ["--device", "none", "-ngl", "0"]
    else:
        argv += ["-ngl", "999"]
        cpu_layers = [i for i in model.layers_moe if i not in set(p.gpu_expert_layers)]
        prefix = model.layers_moe[: len(cpu_layers)]
        if not p.gpu_expert_layers:
            argv += ["--cpu-moe"]
        elif cpu_layers == prefix and model.layers_moe == list(range(model.n_moe_layers)):
            if cpu_layers:
                argv += ["--n-cpu-moe", str(len(cpu_layers))]
        elif cpu_layers:
            argv += ["-ot", _layers_regex(cpu_layers)]
        if static.kv.dtype != "f16":
            argv += ["-ctk", static.kv.dtype, "-ctv", static.kv.dtype]
    argv += ["-b", str(static.prefill.chunk_tokens), "-ub", str(static.prefill.ubatch_tokens)]
    if static.prefill.strategy == "cpu" and p.dense == "gpu":
        argv += ["--no-op-offload"]
    if not static.cpu_repack:
        argv += ["--no-repack"]
    if not static.cpu_mmap:
        argv += ["--no-mmap"]
    if static.cpu_threads:
        argv += ["-t", str(static.cpu_threads)]
    if static.streams > 1:
        argv += ["-np", str(static.streams)]
    return Emitted(argv=argv, lost=lost)


_VALUE_FLAGS = {"-m", "--model", "-c", "--ctx-size", "-ngl", "--gpu-layers", "--n-gpu-layers", "--n-cpu-moe",
                "-ncmoe", "-ot", "--override-tensor", "-b", "--batch-size", "-ub", "--ubatch-size", "-t",
                "--threads", "-np", "--parallel", "-ctk", "--cache-type-k", "-ctv", "--cache-type-v",
                "--device", "-dev", "--host", "--port", "-fa", "--flash-attn", "-n", "-p"}
_BOOL_FLAGS = {"--cpu-moe", "-cmoe", "--no-op-offload", "--mlock", "--no-mmap", "--jinja", "-fa", "--no-repack", "-nr"}


def _int(flag: str, v: str, lo: int = 0) -> int:
    try:
        n = int(v)
    except ValueError:
        raise SpecError(None, flag, f"expects an integer (got {v!r})") from None
    if n < lo:
        raise SpecError(None, flag, f"must be >= {lo} (got {n})")
    return n


def parse_overrides(patterns: list[str], model: ModelSpec) -> list[int]:
    """MoE layers whose three expert tensors all match an `-ot REGEX=CPU` pattern."""
    cpu_names = set()
    for pat in patterns:
        for item in pat.split(","):
            if "=" not in item:
                raise SpecError(None, "-ot", f"{item!r} is not REGEX=DEVICE")
            rx, dev = item.rsplit("=", 1)
            try:
                cre = re.compile(rx)
            except re.error as e:
                raise SpecError(None, "-ot", f"bad regex {rx!r}: {e}") from None
            names = {n for n in expert_tensor_names(model) if cre.search(n)}
            if dev.upper() == "CPU":
                cpu_names |= names
            else:
                cpu_names -= names
    layers = []
    for i in model.layers_moe:
        hit = [f"blk.{i}.ffn_{p}_exps.weight" in cpu_names for p in EXPERT_PROJ]
        if any(hit) and not all(hit):
            raise SpecError(None, "-ot", f"splits layer {i}'s expert projections between devices "
                            "(a plan places a layer's experts whole)")
        if all(hit):
            layers.append(i)
    return layers


def parse(argv: list[str] | str, model: ModelSpec, has_gpu: bool = True) -> Plan:
    """The Plan a llama.cpp command line sets up (placement, batches, threads, KV, streams)."""
    args = shlex.split(argv) if isinstance(argv, str) else list(argv)
    if args and not args[0].startswith("-"):
        args = args[1:]  # the program name
    vals: dict[str, str] = {}
    ot: list[str] = []
    flags: set[str] = set()
    i = 0
    while i < len(args):
        a = args[i]
        if a in _VALUE_FLAGS and not (a == "-fa" and (i + 1 >= len(args) or args[i + 1].startswith("-"))):
            if i + 1 >= len(args):
                raise SpecError(None, a, "needs a value")
            if a in ("-ot", "--override-tensor"):
                ot.append(args[i + 1])
            else:
                vals[a] = args[i + 1]
            i += 2
        elif a in _BOOL_FLAGS:
            flags.add(a)
            i += 1
        else:
            raise SpecError(None, a, "unknown llama.cpp flag")

    def get(*names):
        return next((vals[n] for n in names if n in vals), None)

    ngl = get("-ngl", "--gpu-layers", "--n-gpu-layers")
    device = get("--device", "-dev")
    on_gpu = has_gpu and device != "none"
    n_layers_total = model.n_layers + 1  # llama.cpp counts the output layer
    if ngl is not None:
        n = _int("-ngl", ngl, lo=-1)
        if n == 0:
            on_gpu = False
        elif 0 < n < n_layers_total and on_gpu:
            raise SpecError(None, "-ngl", f"{n} of {n_layers_total} layers on the GPU: a partial dense split "
                            "is not a placement moe-offload models yet")
    ncm = get("--n-cpu-moe", "-ncmoe")
    cpu = set(model.layers_moe[: _int("--n-cpu-moe", ncm)]) if ncm is not None else set()
    cpu |= set(parse_overrides(ot, model))  # validated even when nothing goes to a GPU
    if not on_gpu or "--cpu-moe" in flags or "-cmoe" in flags:
        gpu_layers: list[int] = []
    else:
        gpu_layers = [i for i in model.layers_moe if i not in cpu]
    b = _int("-b", get("-b", "--batch-size") or "2048", lo=1)
    ub = _int("-ub", get("-ub", "--ubatch-size") or "512", lo=1)
    ctk = get("-ctk", "--cache-type-k") or "f16"
    if ctk not in KV_TYPES:
        raise SpecError(None, "-ctk", f"unsupported KV type {ctk!r} ({', '.join(KV_TYPES)})")
    threads = get("-t", "--threads")
    return Plan(
        engine="llamacpp",
        placement=Placement(dense="gpu" if on_gpu else "cpu", kv="gpu" if on_gpu else "cpu",
                            gpu_expert_layers=gpu_layers),
        prefill=Prefill(strategy="cpu" if ("--no-op-offload" in flags or not on_gpu) else "op-offload",
                        chunk_tokens=b, ubatch_tokens=min(ub, b)),
        kv=KVCache(context=_int("-c", get("-c", "--ctx-size") or "4096", lo=1), dtype=KV_TYPES[ctk]),
        cpu_threads=_int("-t", threads, lo=1) if threads else None,
        streams=_int("-np", get("-np", "--parallel") or "1", lo=1),
        cpu_repack=not flags & {"--no-repack", "-nr"},
        cpu_mmap="--no-mmap" not in flags,
    )
