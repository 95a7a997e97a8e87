"""The sizes, repeat counts and waiting budgets of one calibration run (`Settings`), and its presets: QUICK
(`calibrate --quick`, about a minute), FULL and TINY (the tests')."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """Sizes and repeat counts of one calibration run."""

    label: str
    mem_bytes: int
    mem_repeats: int
    threads: tuple[int, ...] | None = None  # None: 1, 2, 4 ... all
    hit_hidden: int = 2048
    hit_ffn: int = 768
    hit_pool_bytes: int = 256 << 20
    hit_calls: int = 100
    hit_repeats: int = 7
    dense_bytes: int = 256 << 20
    dense_repeats: int = 10
    h2d_bytes: int = 256 << 20
    h2d_repeats: int = 5
    disk_bytes: int = 128 << 20
    disk_qd1_reads: int = 2000
    disk_qd_reads: int = 8000
    disk_qd: int = 16
    disk_cached_reads: int = 20000
    disk_seq_passes: int = 5
    disk_qd_passes: int = 5
    handover_iters: int = 2000
    kernel_formats: tuple[str, ...] = ("Q4_0", "Q8_0", "F16", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",  # K-quants: Q2_K .. Q5_K_M
                                       "IQ4_NL", "IQ4_XS")
    kernel_hidden: int = 2048
    kernel_ffn: int = 768
    kernel_pool_bytes: int = 128 << 20
    # a format's pool at least this many times the last-level cache, so the jobs read DRAM (kernel_pool_for); 0: as set.
    # On the Zen 5 VM (32 MiB L3) a 4x pool still hits the L3 in part: the whole-expert Q8_0 job read 64 / 128 / 256 /
    # 512 / 1024 MiB pools at 50-52 / 45-46 / 42.5-43 / 42.5-43.4 / 42.4-43.2 GB/s, F16 55.8 / 48.6 / 47.0 / 47.3 / 45.1
    # (session 54, `python benchmarks/bench_pool_size.py`). 8x lowered the quick profile's rates (whole Q8_0 51.5-56.4
    # -> 44.8-49.4, memory 51-68 -> 48.5-50) and raised its predictions: the page-run jobs, priced against these
    # rates, then read faster than the in-memory reference. Two campaigns (three profiles of each tree, two sittings of
    # executor and llama-bench runs each), mean error 2x -> 8x: llama-bench +9.6% -> +15.3% and -10.0% -> +6.3%, the
    # executor +48.6% -> +54.8% (a spell where its decode read 19-37 GB/s against calibrate's 44-49) and +12.0% ->
    # +25.9%. Left at 2x until the file pools are sized alike and a quiet campaign decides
    kernel_pool_llc_times: int = 2
    kernel_ks: tuple[int, ...] = (1, 2, 4, 6, 8)
    # llama.cpp's in-place decode jobs again on pools in files whose pages lie in physically contiguous runs of these
    # many KiB (calibration.page_layout): the first for every format page_runs_formats names, the others for
    # PAGE_RUNS_FORMAT only; what a file the page cache holds in short runs costs (CPU.file_runs_gbs); empty: not timed
    page_runs_kib: tuple[int, ...] = (64, 4)
    # bytes such a file pool spans (its experts repeated), for the first run length and for the others: what a layout
    # costs grows with the memory its pages span, to ~192 MiB for 64 KiB runs and ~384 MiB for 4 KiB runs on the Zen 4
    # VM (bench_kernel.pool_in_files); a format's together at most a third of the available memory (kernel_pool_for)
    page_runs_pool_bytes: tuple[int, int] = (192 << 20, 384 << 20)
    # the formats timed so (None: every in-place one). quick times those whose rows stream at the bus's pace, where the
    # breaks show: the K-quants' and IQ4's arithmetic hid them to 0-8% from 64 KiB runs on the Zen 4 VM, within one
    # quick timing's noise, and a format not timed pays none (CPU.file_page_excess)
    page_runs_formats: tuple[str, ...] | None = None
    # the same for the executor's kernel (its experts and CPU dense weights are read in place from its mmap too): these
    # formats at the last (shortest) run length, where the cost is largest against a quick timing's noise (None: every
    # kernel format), PAGE_RUNS_FORMAT at the others (CPU.kernel_file_runs_gbs). quick: Q8_0, F16 and Q4_K, whose
    # int16 rows paid 1.2-1.3x from 4 KiB runs on the Zen 4 VM where llama.cpp's K-quant arithmetic hid the breaks
    kernel_page_runs_formats: tuple[str, ...] | None = None
    kernel_repeats: int = 15
    prefill_tokens: int = 64
    prefill_experts: int = 32
    prefill_top_k: int = 8
    prefill_repeats: int = 7
    # the same batch at pp512's size (128 tokens an expert): with the 64-token one, what an expert's product costs
    # beyond its multiply-adds (cpu_prefill_fixed_tokens); 0: not timed
    prefill_long_tokens: int = 512
    # each kernel format's prefill products against the job's format, one core, in cache, at this many tokens an expert
    # (pp512's on a top-8-of-32 model), rounds interleaved (CPU.prefill_format_share); 0: not timed
    prefill_format_tokens: int = 128
    prefill_format_rounds: int = 7
    # an F16 attention block's products and its causal attention on a prompt of this many tokens (the host dense
    # path of all-CPU prefill: cpu_dense_gflops_per_core, cpu_attention_gflops_per_core); 0: not timed
    dense_prefill_tokens: int = 512
    # ggml's prefill structures: a batch of `ggml_prefill_tokens` tokens each routed to every one of
    # `ggml_prefill_experts` experts (as many tokens an expert: pp512 of a top-8-of-32 model has 128)
    ggml_prefill_tokens: int = 64
    ggml_prefill_experts: int = 4
    ggml_prefill_repeats: int = 3
    # the tiled GEMM's rates again at a full window of an expert's tokens (specs.formats.LLAMACPP_TILED_WINDOW_TOKENS):
    # with the rate at ggml_prefill_tokens, the part a window shares (CPU.ggml_prefill_fixed_tokens); 0: not timed
    ggml_prefill_window_tokens: int = 256
    toy_kernel: bool = False  # benchmark bench_kernel.toy_expert_job instead of the executor's kernel
    # time budgets (s) for waiting out other processes' load, per benchmark
    total_budget_s: float = 32.0  # all the waiting together (quick stays within 60 s)
    mem_budget_s: float = 15.0
    kernel_budget_s: float = 5.0
    prefill_budget_s: float = 3.0
    hit_budget_s: float = 3.0
    dense_budget_s: float = 2.0
    handover_budget_s: float = 2.0
    disk_budget_s: float = 4.0


QUICK = Settings(label="quick", mem_bytes=512 << 20, mem_repeats=12, page_runs_formats=("Q8_0", "F16", "Q6_K"),
                 kernel_page_runs_formats=("Q8_0", "F16", "Q4_K"))
FULL = Settings(label="full", mem_bytes=1 << 30, mem_repeats=10, hit_pool_bytes=1 << 30, hit_calls=200,
                hit_repeats=11, dense_bytes=1 << 30, dense_repeats=15, h2d_bytes=1 << 30, h2d_repeats=10,
                disk_bytes=2 << 30, disk_qd1_reads=10000, disk_qd_reads=50000, disk_cached_reads=100000,
                disk_seq_passes=7, disk_qd_passes=7,
                handover_iters=10000, kernel_pool_bytes=512 << 20, kernel_ks=(1, 2, 3, 4, 6, 8, 12, 16),
                kernel_repeats=41, prefill_repeats=15, ggml_prefill_repeats=7, prefill_budget_s=20, total_budget_s=400, mem_budget_s=90, kernel_budget_s=45, hit_budget_s=30,
                dense_budget_s=20, handover_budget_s=20, disk_budget_s=30)
TINY = Settings(label="tiny", mem_bytes=1 << 20, mem_repeats=2, hit_hidden=64, hit_ffn=32,
                hit_pool_bytes=1 << 20, hit_calls=5, hit_repeats=2, dense_bytes=1 << 20, dense_repeats=2,
                h2d_bytes=1 << 20, h2d_repeats=2, disk_bytes=1 << 20, disk_qd1_reads=20, disk_qd_reads=40,
                disk_qd=4, disk_cached_reads=50, disk_seq_passes=1, disk_qd_passes=2, handover_iters=20,
                kernel_formats=("Q4_0",),
                kernel_hidden=64, kernel_ffn=32, kernel_pool_bytes=1 << 20, kernel_pool_llc_times=0, kernel_ks=(1, 2, 4),
                kernel_repeats=3, prefill_tokens=8, prefill_experts=4, prefill_top_k=2, prefill_repeats=2,
                prefill_long_tokens=32, dense_prefill_tokens=16, page_runs_pool_bytes=(2 << 20, 2 << 20),
                ggml_prefill_tokens=8, ggml_prefill_experts=2, ggml_prefill_repeats=1,
                prefill_budget_s=0.2, total_budget_s=3, mem_budget_s=0.2, kernel_budget_s=0.2, hit_budget_s=0.2,
                dense_budget_s=0.2, handover_budget_s=0.2, disk_budget_s=0.2)
