"""The Plan (JSON): where each tensor group lives and the policies that move experts between tiers.

One Plan object drives both a simulated run (simulator/) and a real one (executor/).
Engine presets (`llamacpp`, `tiered-cache`, `strata`) are Plan templates: `plan_template(name)`.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Engine = Literal["llamacpp", "tiered-cache", "strata", "custom"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Placement(_Strict):
    """Home tier of each tensor group."""

    dense: Literal["gpu", "cpu"] = "gpu"  # attention, norms, routers, shared experts, head
    kv: Literal["gpu", "cpu"] = "gpu"
    experts_home: Literal["ram", "nvme", "gpu"] = "ram"  # the home copy of every routed expert
    # Bytes of RAM the expert home copy may occupy (page cache); None = all experts if they fit.
    # Experts beyond it are read from NVMe through the page cache (Strata on a 64 GB machine).
    expert_ram_bytes: int | None = Field(default=None, ge=0)
    # Layers whose expert tensors live wholly in VRAM (llama.cpp static split: `--n-cpu-moe N`
    # keeps layers [0, N) on the CPU and puts the rest here).
    gpu_expert_layers: list[int] = Field(default_factory=list)
    engram: Literal["nvme", "ram", "gpu", "none"] = "nvme"
    # "prefetch": a step's rows are read before its forward pass (row ids depend only on token ids);
    # "inline": each Engram layer gathers its rows while the stream waits (dsv41-flash-offload's
    # host callback, the executor's lookup)
    engram_gather: Literal["prefetch", "inline"] = "prefetch"
    engram_threads: int | None = Field(default=None, ge=1)  # threads of a big inline gather (None: CPU threads)

    @model_validator(mode="after")
    def _layers_unique(self):
        if len(set(self.gpu_expert_layers)) != len(self.gpu_expert_layers):
            raise ValueError("gpu_expert_layers lists a layer twice")
        if any(layer < 0 for layer in self.gpu_expert_layers):
            raise ValueError("gpu_expert_layers has a negative layer")
        return self


class ExpertCache(_Strict):
    """VRAM cache of routed experts, mirrored from their home copy (a stale entry is only slower)."""

    slots: int = Field(default=0, ge=0)
    policy: Literal["none", "decayed-count", "lru", "static"] = "none"
    decay: float = Field(default=0.95, gt=0, le=1)  # per-step score decay (decayed-count)
    swap_every: int = Field(default=16, ge=1)  # steps between swaps / replans (decayed-count)
    swap_max: int = Field(default=48, ge=0)  # most experts admitted per swap / replan
    rewarm_steps: int = Field(default=4, ge=0)  # decode steps after a prefill before the refill
    release_during_prefill: bool = True
    # decayed-count: "every-step" fills free slots at every step end; "at-replan" is
    # dsv41-flash-offload's schedule: admissions (fills too) only at replans, the kept set
    # restored at once after a release (ct/ct_vllm.py ec_step / ec_rewarm)
    fill: Literal["every-step", "at-replan"] = "every-step"
    warmup_steps: int = Field(default=0, ge=0)  # steps after start before the slot pool exists
    # Where admitted experts are copied: "background" on the copy engine, live once landed;
    # "sync" on the compute stream (decode waits; DSV41_EC_ASYNC=0; copied misses wait there too,
    # as the executor's do); "async" on a side stream, live from the next replan (DSV41_EC_ASYNC=1)
    copies: Literal["background", "sync", "async"] = "background"


class MissPolicy(_Strict):
    """How experts missing from VRAM are served. Constants in ms (0xSero/dsv41-flash-offload)."""

    kind: Literal["auction", "cpu", "zero-copy", "copy"] = "cpu"
    t_hit_ms: float = Field(default=0.03, gt=0)  # per GPU-computed expert
    t_zc_ms: float = Field(default=0.58, gt=0)  # per zero-copy expert over PCIe
    c_a_ms: float = Field(default=0.11, ge=0)  # per CPU job
    c_b_ms: float = Field(default=0.20, gt=0)  # per CPU expert
    # a CPU expert routed by several tokens of a step costs c_b (1 + c_tok (tokens - 1)) in the
    # auction (DSV41_CT_TOK); at most max_cpu misses go to the CPU (DSV41_CT_MAXN)
    c_tok: float = Field(default=0.0, ge=0)
    max_cpu: int | None = Field(default=None, ge=0)
    # how the auction serves the misses it leaves to the device: zero-copy reads of pinned host
    # memory (dsv41-flash-offload) or a copy into a staging slot, then compute (the executor)
    gpu_path: Literal["zero-copy", "copy"] = "zero-copy"


class DeviceTier(_Strict):
    """A second card's expert slots (hardware `expert_device`) as a third engine beside the GPU and the CPU
    (dsv41-flash-offload experimental/b70-tier, cand11). Its worker keeps `slots` experts by LRU over all
    layers and admits every expert it is sent (write-through: a DMA over its own link, a conversion, then the
    product). Per layer the split (ct/ft_tier_cu_v.cu `ft_split_k`) sends it the experts it holds (as the
    server last saw them, once a step) and up to `max_stage` misses to stage, choosing the staged count and
    the CPU's share together to minimise the slowest of the three engines, its own cost estimated as
    job_ms + hit_ms x held + stage_ms x staged (DSV41_BT_A / _HIT / _STAGE / _MAXSTAGE). Steps of more than
    `max_batch_tokens` tokens leave it out. slots = 0: no such tier."""

    slots: int = Field(default=0, ge=0)
    job_ms: float = Field(default=0.15, ge=0)  # per job: the worker's fixed cost (L011: ~0.16 ms a job)
    hit_ms: float = Field(default=0.04, ge=0)  # per held expert (measured 0.031-0.048 ms on the B70)
    stage_ms: float = Field(default=0.50, ge=0)  # per staged expert (13.3 MB at ~27 GB/s, converted)
    max_stage: int = Field(default=8, ge=0)
    max_batch_tokens: int = Field(default=64, ge=1)
    convert_ms: float = Field(default=0.04, ge=0)  # the device's conversion of a staged expert (PLANAR4)


def chunks(prompt_tokens: int, chunk_tokens: int) -> list[int]:
    """Sizes of the prefill chunks (`-b` or stream-all chunk) of a prompt (tokens)."""
    n_full, rest = divmod(int(prompt_tokens), int(chunk_tokens))
    return [chunk_tokens] * n_full + ([rest] if rest else [])


def ubatches(chunk: int, ubatch_tokens: int) -> list[int]:
    """Micro-batch sizes (`-ub`) of one chunk (tokens)."""
    return chunks(chunk, min(ubatch_tokens, chunk))


class Prefill(_Strict):
    """Prefill strategy: llama.cpp op offload, stream-all per chunk, or on the CPU."""

    strategy: Literal["op-offload", "stream-all", "cpu"] = "op-offload"
    chunk_tokens: int = Field(default=2048, ge=1)  # llama.cpp -b; stream-all chunk
    ubatch_tokens: int = Field(default=512, ge=1)  # llama.cpp -ub
    op_offload_min_batch: int = Field(default=32, ge=1)  # batches this large run on the GPU
    # stream-all copies a layer's experts in batches into staging slots, each batch's GEMM
    # reading its slot (dsv41-flash-offload EXL3_HOST_DMA_BATCH / EXL3_HOST_DMA_SLOTS). With
    # `dma_prefetch` the next MoE layer's first batches are copied during its attention
    # (runtime/patch_dma_prefetch.py, D135+); without it (stock path, D061-D119) a layer's
    # first copy starts only when its MoE starts, so the copy engine idles through attention.
    dma_batch_experts: int = Field(default=8, ge=1)
    dma_slots: int = Field(default=2, ge=1)
    dma_prefetch: bool = True

    @model_validator(mode="after")
    def _ubatch_le_chunk(self):
        if self.ubatch_tokens > self.chunk_tokens:
            raise ValueError("ubatch_tokens exceeds chunk_tokens")
        return self

    def passes_with_outputs(self, prompt_tokens: int, streams: int = 1) -> list[tuple[int, bool]]:
        """(tokens, outputs) of each forward pass: each stream's prompt tokens in it, chunks of chunk_tokens (llama.cpp
        -b), each in micro-batches of ubatch_tokens (-ub; stream-all: the whole chunk), as the simulator's prefill
        runs them; `streams` prompts side by side share a pass's ubatch_tokens (at least one token each). outputs:
        whether the pass computes logits, a chunk's last micro-batch (llama_decode outputs its batch's last token)."""
        chunk, ub = max(1, self.chunk_tokens // streams), max(1, self.ubatch_tokens // streams)
        out = []
        for c in chunks(prompt_tokens, chunk):
            us = [c] if self.strategy == "stream-all" else ubatches(c, ub)
            out += [(u, i == len(us) - 1) for i, u in enumerate(us)]
        return out

    def passes(self, prompt_tokens: int, streams: int = 1) -> list[int]:
        """Each stream's prompt tokens per forward pass (tokens): passes_with_outputs' passes."""
        return [n for n, _ in self.passes_with_outputs(prompt_tokens, streams)]


class KVCache(_Strict):
    context: int = Field(default=32768, ge=1)  # tokens reserved
    dtype: Literal["f32", "f16", "bf16", "fp8", "q8_0", "q4_0"] = "f16"


class MTP(_Strict):
    """Multi-token prediction: draft tokens per step and how many are accepted."""

    enabled: bool = False
    tokens_per_step: float = Field(default=1.0, ge=1)  # committed tokens per step (3.29 published)
    acceptance: float = Field(default=0.0, ge=0, le=1)


class Plan(_Strict):
    """A complete placement. JSON on disk; identical for simulate and execute."""

    engine: Engine = "custom"
    placement: Placement = Field(default_factory=Placement)
    expert_cache: ExpertCache = Field(default_factory=ExpertCache)
    miss_policy: MissPolicy = Field(default_factory=MissPolicy)
    device_tier: DeviceTier = Field(default_factory=DeviceTier)  # a second card's slots (slots = 0: none)
    prefill: Prefill = Field(default_factory=Prefill)
    kv: KVCache = Field(default_factory=KVCache)
    streams: int = Field(default=1, ge=1)
    mtp: MTP = Field(default_factory=MTP)
    experts_per_token: int | None = Field(default=None, ge=1)  # run fewer than top-k (Strata Faster)
    cpu_threads: int | None = Field(default=None, ge=1)  # None = all cores of the profile
    # The engine copies CPU-resident weights of the formats it can at load into its own layout in
    # anonymous memory (llama.cpp's CPU_REPACK, on unless --no-repack; specs.formats.llamacpp_repacks):
    # such experts must fit in RAM, since a copy cannot be paged in from the file on NVMe.
    cpu_repack: bool = False
    # CPU weights stay in the mmap'd file (page cache, experts beyond RAM read from NVMe); False: read
    # into anonymous buffers at load (llama.cpp's --no-mmap), so every CPU expert must fit in RAM
    cpu_mmap: bool = True
    # Where the mmap'd file's pages lie in physical memory: the share of its page boundaries that are breaks
    # (calibration.page_layout). 0: contiguous, as a file just written in large writes lies; a file the page cache
    # dropped and read back lies in shorter runs, and CPU weights read in place stream slower from it
    cpu_file_page_breaks: float = Field(default=0.0, ge=0.0, le=1.0)
    # VRAM the engine keeps for CUDA graphs, activations and DMA staging (bytes), beyond weights
    gpu_workspace_bytes: int = Field(default=0, ge=0)
    # Decode batch sizes the engine captured as full CUDA graphs (vLLM --cudagraph-capture-sizes with
    # FULL_DECODE_ONLY): a step of n tokens runs as the smallest such size >= n, its padding rows routed
    # through every MoE layer as tokens are; none listed (or n beyond the largest): no padding
    graph_batch_sizes: list[int] = Field(default_factory=list)
    note: str = ""

    def padded_tokens(self, n: int) -> int:
        """Rows a decode step of n tokens runs as: the smallest captured graph batch size >= n, else n."""
        return min((b for b in self.graph_batch_sizes if b >= n), default=n)

    @model_validator(mode="after")
    def _cache_policy(self):
        if self.expert_cache.slots and self.expert_cache.policy == "none":
            raise ValueError("expert_cache.slots > 0 needs a policy (decayed-count, lru or static)")
        return self


def plan_template(engine: str) -> Plan:
    """The Plan an engine uses by default, before sizing to a machine (cache slots are 0)."""
    if engine == "llamacpp":
        # Static placement at load; experts in RAM (`--cpu-moe`), op offload for prefill.
        return Plan(engine="llamacpp", miss_policy=MissPolicy(kind="cpu"), cpu_repack=True,
                    prefill=Prefill(strategy="op-offload", chunk_tokens=2048, ubatch_tokens=512),
                    gpu_workspace_bytes=2**30)  # compute buffers at -ub 512 (assumed)
    if engine == "tiered-cache":
        # dsv41-flash-offload ("FreeToken"): pinned RAM home, VRAM mirror cache, CPU/PCIe auction.
        # Cache schedule from its ct/ct_vllm.py and docker/entrypoint.sh defaults: a replan every
        # 16 steps admits at most 48, scores decay 0.9 per replan, the pool exists after 64 steps,
        # copies on a side stream (DSV41_EC_ASYNC=1), released for prefill, rewarmed after 4 steps.
        # Prefill (D130 defaults): 8,192-token chunks, 8 staging slots x 8 experts, next-layer prefetch.
        # Engram rows gathered by a host callback on the compute stream (dsv41/engram_disk.cpp),
        # on OMP_NUM_THREADS=16 threads above 256 rows.
        return Plan(engine="tiered-cache", placement=Placement(engram_gather="inline", engram_threads=16),
                    expert_cache=ExpertCache(policy="decayed-count", swap_every=16, swap_max=48,
                                             decay=0.9 ** (1 / 16), fill="at-replan",
                                             warmup_steps=64, copies="async"),
                    miss_policy=MissPolicy(kind="auction", c_tok=0.35, max_cpu=384),
                    prefill=Prefill(strategy="stream-all", chunk_tokens=8192, ubatch_tokens=8192,
                                    dma_batch_experts=8, dma_slots=8, dma_prefetch=True),
                    kv=KVCache(context=262144, dtype="fp8"),
                    gpu_workspace_bytes=5 * 2**30,  # ~5 GiB graphs, activations, staging (README)
                    # vllm serve --compilation-config FULL_DECODE_ONLY --cudagraph-capture-sizes 1 2 4 6 8 12 16 24
                    graph_batch_sizes=[1, 2, 4, 6, 8, 12, 16, 24])
    if engine == "strata":
        # Shipped hot-expert profile (static cache), CPU misses read in place, SSD beyond RAM.
        return Plan(engine="strata", expert_cache=ExpertCache(policy="static"),
                    miss_policy=MissPolicy(kind="cpu"),
                    prefill=Prefill(strategy="op-offload"),
                    gpu_workspace_bytes=3 * 2**29)  # activations and staging, 1.5 GiB (assumed)
    if engine == "custom":
        return Plan()
    raise ValueError(f"unknown engine {engine!r} (llamacpp, tiered-cache, strata, custom)")
