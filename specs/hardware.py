"""HardwareSpec (YAML): GPU, PCIe, system memory, CPU, NVMe. Every figure carries its source."""
from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from .figure import Figure
from .formats import LLAMACPP_REPACKED_STAND_IN, WeightFormat, parse_format


def _positive(f: Figure) -> Figure:
    if not f > 0:
        raise ValueError(f"must be > 0 (got {float(f)})")
    return f


def _non_negative(f: Figure) -> Figure:
    if f < 0:
        raise ValueError(f"must be >= 0 (got {float(f)})")
    return f


def _fraction(f: Figure) -> Figure:
    if not 0 < f <= 1:
        raise ValueError(f"must be in (0, 1] (got {float(f)})")
    return f


Pos = Annotated[Figure, AfterValidator(_positive)]
NonNeg = Annotated[Figure, AfterValidator(_non_negative)]
Frac = Annotated[Figure, AfterValidator(_fraction)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GPU(_Strict):
    name: str
    vram_bytes: Pos
    bw_gbs: Pos  # VRAM bandwidth, GB/s (1e9 bytes/s)
    fp16_tflops: Pos  # dense fp16/bf16 tensor throughput
    reserved_bytes: NonNeg  # CUDA context, graphs, activations, DMA staging: not for weights
    # A pseudo-GPU on a host without one (torch on the CPU): its work runs on the host's cores and
    # reads the host's DDR, so it contends with the CPU expert tier there (simulator/resources.py).
    shares_host: bool = False


class ExpertDevice(_Strict):
    """A further accelerator beside the main GPU that holds routed experts in slots of its own and computes
    them, fed from host RAM over its own link (dsv41-flash-offload's experimental Intel Arc B70 tier)."""

    name: str
    vram_bytes: Pos
    bw_gbs: Pos  # its memory bandwidth, GB/s
    h2d_gbs: Pos  # host-to-device copies over its own link, GB/s
    reserved_bytes: NonNeg  # runtime, staging buffers: not for expert slots

    @property
    def free_bytes(self) -> float:
        """Bytes left for expert slots (VRAM less the reserve)."""
        return float(self.vram_bytes) - float(self.reserved_bytes)


class PCIe(_Strict):
    gen: int = Field(ge=1, le=7)
    lanes: int = Field(ge=1, le=32)
    h2d_gbs: Pos  # host-to-device copies from pinned memory
    zero_copy_gbs: Pos  # the GPU reading mapped host memory directly


class Memory(_Strict):
    channels: int = Field(ge=1, le=24)
    mts: Pos  # DIMM transfer rate, MT/s
    capacity_bytes: Pos
    efficiency: Frac  # achievable fraction of peak for streaming reads
    os_reserve_bytes: NonNeg  # kept by the OS and other programs

    @property
    def peak_gbs(self) -> float:
        """Peak bandwidth in GB/s: channels x MT/s x 8 bytes."""
        return self.channels * self.mts * 8 / 1000.0

    @property
    def usable_gbs(self) -> float:
        """Streaming read bandwidth in GB/s: peak x efficiency."""
        return self.peak_gbs * self.efficiency


# a page-run table of runs this long (KiB) or longer is a contiguous reference (CPU.file_page_excess): a file in 2 MiB
# folios, which PMD mapping and the prefetcher read as contiguous memory
REFERENCE_RUN_KIB = 2048


class CPU(_Strict):
    model: str
    cores: int = Field(ge=1)
    threads_used: int = Field(ge=1)  # cores given to the CPU expert tier
    isa: list[str] = Field(default_factory=list)
    # one core's L2 in bytes (sysfs, calibration.detect): the executor's prefill GEMM takes an expert's tokens in
    # groups sized by it (specs.formats.executor_group_tokens); None: one group, whatever the tokens
    l2_bytes: int | None = Field(default=None, ge=1)
    # the activations the executor's integer prefill GEMM ran on where this profile timed it (calibrate; `--gemm-int8`:
    # int8): int8 panels are 12 floats a 32 values, not 20, so its groups hold 1.5x the tokens
    # (specs.formats.EXECUTOR_PANEL_FLOATS); None: int16, the default build
    executor_gemm_activations: Literal["int16", "int8"] | None = None
    # Expert-kernel throughput (GB/s of expert weights, all threads_used cores) per weight family:
    # keys are format names ('Q4_0', 'EXL3') or families ('codebook', 'block', 'default').
    expert_gbs: dict[str, Pos]
    # The same for an engine computing one weight row per dot product without software prefetch, as
    # llama.cpp's ggml does (calibration.bench_rowwise); its plans read these where the profile has them.
    rowwise_gbs: dict[str, Pos] = Field(default_factory=dict)
    # The same for the formats llama.cpp repacks at load into rows interleaved 8 at a time (its
    # CPU_REPACK layout, computed 8 rows a pass: calibration.bench_rowwise's repacked job), per format.
    repacked_gbs: dict[str, Pos] = Field(default_factory=dict)
    # The same for the executor's decode structure where a job's experts split evenly over the threads: each
    # expert start to end on one thread (executor.cpu_experts: one parallel region, no barrier between its up and
    # down products; simulator.policies.whole_experts_per_thread), per format, with 'FMT@1t' the same job on one
    # thread (where the executor runs every decode job so); its plans read these there (whole_timed)
    whole_gbs: dict[str, Pos] = Field(default_factory=dict)
    # The rowwise rates again on weights in a file whose pages lie in physically contiguous runs of a given length
    # ('64KiB', '4KiB': calibration.page_layout), keyed as rowwise_gbs: what a file the page cache holds in short runs
    # costs the engines that read it in place (file_page_excess); the calibrated run lengths' formats only
    file_runs_gbs: dict[str, dict[str, Pos]] = Field(default_factory=dict)
    # The same for the executor's kernel on such files, keyed as expert_gbs: its decode jobs' structure (whole_gbs's
    # job; profiles before session 53 split rows on one thread), with '2048KiB' the same from a file of the same span
    # in 2 MiB folios (the contiguous reference): its experts and CPU dense weights are read in place through its mmap
    # of the GGUF too (file_page_excess(kernel=True))
    kernel_file_runs_gbs: dict[str, dict[str, Pos]] = Field(default_factory=dict)
    # GFLOP/s per core of the experts' products on a prefill batch in the structure llama.cpp's ggml gives each
    # format (calibration.bench_ggml_prefill), keyed by specs.formats.llamacpp_prefill_key ('Q8_0',
    # 'Q4_0:repacked'), with 'KEY@Nt' for a rate measured on N cores; a path without one prefills at the
    # executor's rate (Calibration's cpu_prefill_gflops_per_core)
    ggml_prefill_gflops: dict[str, Pos] = Field(default_factory=dict)
    # The part of a path's time that a window of an expert's tokens shares (the tiled GEMM unpacks the window's
    # weights once for up to specs.formats.LLAMACPP_TILED_WINDOW_TOKENS tokens), in tokens' worth of its
    # multiply-adds, keyed as ggml_prefill_gflops: the path timed at ggml_prefill_ref_tokens tokens an expert and
    # at a full window (calibration.calibrate). A key without one runs at its rate at any batch.
    ggml_prefill_fixed_tokens: dict[str, NonNeg] = Field(default_factory=dict)
    ggml_prefill_ref_tokens: Pos | None = None  # tokens an expert of the batch the rates with an m0 are timed at
    # The executor's prefill products of each format over those of the format its prefill job is timed in (Calibration's
    # cpu_prefill_gflops_per_core; calibration.bench_prefill_formats): the job's rate for a model's other weight types.
    # A format without one prefills at the job's rate.
    prefill_format_share: dict[str, Pos] = Field(default_factory=dict)

    def expert_gbs_for(self, fmt: WeightFormat, threads: int | None = None, rowwise: bool = False,
                       repacked: bool = False, whole: bool = False) -> float:
        """GB/s at which `threads` cores (default threads_used) compute experts stored in `fmt`:
        a rate measured at that thread count ('Q8_0@1t') when the profile has one, else the
        threads_used rate scaled linearly (arithmetic or bus bound). rowwise (llama.cpp plans), where
        the profile has `rowwise_gbs`: the format's rowwise rate, else its kernel rate times the
        rowwise / kernel ratio of the default format. repacked (llama.cpp plans whose weights of `fmt`
        are repacked): the format's `repacked_gbs` rate where the profile has one, else the same weights a second
        as the rebuilt format's (specs.formats.LLAMACPP_REPACKED_STAND_IN), else as rowwise. whole (the
        executor's jobs of whole experts per thread, where whole_timed): the format's `whole_gbs` rate where
        the profile has one (on one thread, one timed on one), else its kernel rate."""
        family = fmt.name.split(":")[0]
        floats = ("F16",) if fmt.block_weights == 1 else ()  # F32 / BF16 rows read at F16's GB/s, unless timed
        keys = (fmt.name, family, *floats, "codebook" if fmt.codebook else "block", "default")
        rate = self._rate(self.expert_gbs, keys, threads)
        if rate is None:
            raise KeyError(f"cpu.expert_gbs has no entry for {fmt.name} (nor 'default')")
        if repacked and self.repacked_gbs:
            own = self._rate(self.repacked_gbs, (fmt.name,), threads)
            if own is None:  # the rebuilt gemv's weights a second: every repacked format runs its structure
                ref = self._rate(self.repacked_gbs, (LLAMACPP_REPACKED_STAND_IN,), threads)
                own = ref * fmt.bits / parse_format(LLAMACPP_REPACKED_STAND_IN).bits if ref else None
            if own is not None:
                return own
        if whole:
            own = self.whole_rate((fmt.name, family, *floats), threads)
            if own is not None:
                return own
        if rowwise and self.rowwise_gbs:
            own = self._rate(self.rowwise_gbs, (fmt.name, family), threads)
            if own is not None:
                return own
            rd, ed = self._rate(self.rowwise_gbs, ("default",), threads), self._rate(self.expert_gbs, ("default",), threads)
            if rd and ed:
                return rate * rd / ed
        return rate

    def whole_timed(self, threads: int | None) -> bool:
        """Whether whole_gbs prices the executor's jobs of whole experts on `threads` cores (default threads_used):
        on several (rates at threads_used scale to the others), or on one where the profile timed them on one
        ('FMT@1t', or threads_used 1). Scaled down from several, a bus-bound rate would halve on one core."""
        n = threads or self.threads_used
        if not self.whole_gbs:
            return False
        return n > 1 or n == self.threads_used or any(k.endswith(f"@{n}t") for k in self.whole_gbs)

    def whole_rate(self, keys: tuple[str, ...], threads: int | None) -> float | None:
        """GB/s of the executor's jobs of whole experts for the first of `keys` in whole_gbs on `threads` cores, where
        whole_timed: on one thread of several only a rate timed on one ('KEY@1t'); else None."""
        if not self.whole_timed(threads):
            return None
        if (threads or self.threads_used) == 1 < self.threads_used:
            return next((float(self.whole_gbs[f"{k}@1t"]) for k in keys if f"{k}@1t" in self.whole_gbs), None)
        return self._rate(self.whole_gbs, keys, threads)

    def file_page_excess(self, fmt: WeightFormat, threads: int | None, breaks: float, kernel: bool = False) -> float:
        """Extra time (a fraction of the contiguous time) `fmt`'s rowwise rows take on `threads` cores from a file whose
        page boundaries are physical breaks in that share (PageLayout.breaks): a power of the breaks through none at
        contiguous pages, e_R (breaks / b_R)^g, from the format's excess e_R at the calibrated run length R it has
        (runs of R bytes: breaks b_R = 4096 / R; where it has several, the length at which the table times the most
        formats, so that every format stands on the same footing: 64 KiB for llama.cpp's rows, 4 KiB for the
        executor's kernel in calibrate's tables), with the exponent g of the format calibrated at two lengths
        (ln(e_4KiB / e_64KiB) / ln 16 for Q8_0), within [0.25, 1]; g = 1/2 (each break's cost growing as the root of
        the run it ends) where no format has two. Each excess is against the format's rate from a file in runs of 2 MiB
        or more where the table has one (timed beside the short runs, on a file of the same span), the breaks then
        counted beyond that reference's own (1/512: none costs at a file in 2 MiB folios), else against its contiguous
        rate (rowwise_gbs). 0 without such rates or breaks, and for a format not timed so (a quick profile
        times those whose rows pay most: in llama.cpp's rows the others' arithmetic hides the breaks). kernel: the
        executor's kernel instead (kernel_file_runs_gbs; without a reference its jobs' own rates, whole_gbs where it
        has the format on that many threads, else expert_gbs)."""
        base, runs = (self.expert_gbs, self.kernel_file_runs_gbs) if kernel else (self.rowwise_gbs, self.file_runs_gbs)
        if breaks <= 0 or not runs or not base:
            return 0.0
        kib = {k: int(k.removesuffix("KiB")) for k in runs}
        refs = [runs[k] for k in runs if kib[k] >= REFERENCE_RUN_KIB]  # the same pools in 2 MiB folios
        # a reference's own breaks (one at each 2 MiB folio's end) are its zero: breaks counted beyond them
        b_ref = max((4096 / (kib[k] << 10) for k in runs if kib[k] >= REFERENCE_RUN_KIB), default=0.0)
        tables = {4096 / (kib[k] << 10) - b_ref: t for k, t in runs.items() if kib[k] < REFERENCE_RUN_KIB}
        if not tables or breaks <= b_ref:
            return 0.0

        def contiguous(name: str) -> float | None:
            """The format's rate from contiguous pages: its reference, else the job's rate in anonymous memory."""
            for t in refs:
                r = self._rate(t, (name,), threads)
                if r:
                    return r
            whole = self.whole_rate((name,), threads) if kernel else None  # the executor's jobs of whole experts
            return whole or self._rate(base, (name,), threads)

        def points(name: str) -> list[tuple[float, float]]:
            """(breaks, excess) at each calibrated run length, fewest breaks first."""
            r0, out = contiguous(name), []
            for b, table in sorted(tables.items()):
                r = self._rate(table, (name,), threads)
                if r0 and r:
                    out.append((b, max(0.0, r0 / r - 1.0)))
            return out

        names = sorted({k.split("@")[0] for t in tables.values() for k in t})
        ref = max(names, key=lambda n: len(points(n)), default=None)
        ref_pts = points(ref) if ref else []
        g = 0.5
        if len(ref_pts) > 1:
            (b1, e1), (b2, e2) = ref_pts[0], ref_pts[-1]
            g = min(1.0, max(0.25, math.log(e2 / e1) / math.log(b2 / b1))) if e1 > 0 and e2 > 0 else 1.0
        own = points(fmt.name) or points(fmt.name.split(":")[0])
        if not own:
            return 0.0
        common = max(sorted(tables), key=lambda b: len(tables[b]))  # the length timed for the most formats
        b0, e0 = next((p for p in own if p[0] == common), own[0])
        return e0 * ((breaks - b_ref) / b0) ** g

    def ggml_prefill_gflops_for(self, key: str, threads: int | None = None) -> float | None:
        """GFLOP/s per core of ggml's prefill products under `key` on `threads` cores: the rate measured on that
        many cores ('KEY@Nt'), else the threads_used one (per core); None when the profile has neither."""
        if threads is not None and f"{key}@{threads}t" in self.ggml_prefill_gflops:
            return float(self.ggml_prefill_gflops[f"{key}@{threads}t"])
        return float(self.ggml_prefill_gflops[key]) if key in self.ggml_prefill_gflops else None

    def prefill_share_for(self, fmt: WeightFormat) -> float:
        """The executor's prefill products of `fmt` over its prefill job's format (1 where the profile has none)."""
        return float(self.prefill_format_share.get(fmt.name, 1.0))

    def ggml_prefill_fixed_tokens_for(self, key: str, threads: int | None = None) -> float | None:
        """Tokens' worth of multiply-adds a window of an expert's tokens costs ggml's path `key` beyond its tokens' own
        on `threads` cores ('KEY@Nt', else the threads_used figure); None when the profile has neither."""
        table = self.ggml_prefill_fixed_tokens
        if threads is not None and f"{key}@{threads}t" in table:
            return float(table[f"{key}@{threads}t"])
        return float(table[key]) if key in table else None

    def _rate(self, table: dict, keys: tuple[str, ...], threads: int | None) -> float | None:
        """The first of `keys` in `table` at `threads` (a 'KEY@Nt' figure, else scaled linearly), or None."""
        if threads is not None and threads != self.threads_used:
            for key in keys:
                if f"{key}@{threads}t" in table:
                    return float(table[f"{key}@{threads}t"])
        for key in keys:
            if key in table:
                return float(table[key]) * (threads or self.threads_used) / self.threads_used
        return None


class NVMe(_Strict):
    seq_read_gbs: Pos
    rand_4k_iops: Pos
    latency_us: Pos
    capacity_bytes: Pos


class HardwareSpec(_Strict):
    """One machine. `constants` holds fitted simulator overheads (ms), each with its provenance."""

    name: str
    gpu: GPU | None = None
    pcie: PCIe | None = None
    memory: Memory
    cpu: CPU
    nvme: NVMe
    expert_device: ExpertDevice | None = None  # a second card as a further expert tier
    page_bytes: int = Field(default=4096, ge=512)
    constants: dict[str, NonNeg] = Field(default_factory=dict)
    notes: str = ""

    def constant(self, name: str, default: float) -> float:
        """A fitted constant by name, or `default` when the profile has none."""
        return float(self.constants[name]) if name in self.constants else default

    def to_yaml_dict(self) -> dict:
        """A dict that dumps to the YAML profile format (figures as {value, source, ref})."""
        return self.model_dump(mode="json", exclude_none=True)
