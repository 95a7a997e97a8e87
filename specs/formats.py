"""Weight formats: bits per weight and block geometry, GGUF types taken from the `gguf` tables."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import gguf


@dataclass(frozen=True)
class WeightFormat:
    """A storage format: `block_weights` weights stored in `block_bytes` bytes.

    GGUF types come from `gguf.GGML_QUANT_SIZES`; codebook formats with no fixed block (EXL3) and
    per-file averages (a GSQ-RCO mix) are given by bits per weight with block_weights == 0.
    """

    name: str
    block_weights: int  # 0: no fixed block, bytes = weights * bits / 8
    block_bytes: int
    bits: float  # bits per weight, including block scales
    gguf_type: int | None = None
    codebook: bool = False  # arithmetic-heavy decode (trellis/codebook/i-quant lattice)

    @property
    def bits_per_weight(self) -> float:
        """Bits per weight including scales."""
        return self.bits

    def bytes_for(self, n_weights: int) -> float:
        """Bytes needed to store `n_weights` weights (whole blocks for block formats)."""
        if self.block_weights:
            return math.ceil(n_weights / self.block_weights) * self.block_bytes
        return n_weights * self.bits / 8.0


def gguf_format(name: str) -> WeightFormat:
    """The GGUF type `name` (e.g. 'Q4_0', 'IQ4_NL'), geometry from the gguf package."""
    try:
        qt = gguf.GGMLQuantizationType[name.upper()]
    except KeyError:
        raise ValueError(f"unknown GGUF type {name!r}") from None
    return gguf_format_from_type(int(qt))


def gguf_format_from_type(type_id: int) -> WeightFormat:
    """The GGUF type with numeric id `type_id`."""
    qt = gguf.GGMLQuantizationType(type_id)
    block, size = gguf.GGML_QUANT_SIZES[qt]
    return WeightFormat(name=qt.name, block_weights=block, block_bytes=size, bits=size * 8 / block,
                        gguf_type=int(qt), codebook=qt.name.startswith("IQ") and qt.name not in NIBBLE_TABLE_TYPES)


# i-quants whose nibbles index one 16-entry table: one byte shuffle decodes 32 of them, so they compute like the
# plain block formats (llama.cpp's ggml_vec_dot_iq4_xs_q8_K is Q4_K's loop with a vpshufb; the executor's
# iquants.py, one core in L2: 12-16 G weights/s against Q4_K's 17-19). IQ1 .. IQ3 index lattice grids of 256-2048
# entries, with sign masks: codebooks.
NIBBLE_TABLE_TYPES = ("IQ4_NL", "IQ4_XS")


_BPW = re.compile(r"^(?P<kind>EXL3|BPW|IQMIX|MIX)[:@-]?(?P<bits>\d+(\.\d+)?)$", re.IGNORECASE)


def parse_format(name: str) -> WeightFormat:
    """'Q8_0' / 'IQ3_S' (GGUF), 'EXL3:3.02' (codebook at 3.02 bpw), 'BPW:4.25' or 'MIX:3.5' (average);
    'IQMIX:1.94' is an average over GGUF i-quants (lattice codebooks, decoded like EXL3: arithmetic-bound)."""
    m = _BPW.match(name.strip())
    if m:
        kind, bits = m["kind"].upper(), float(m["bits"])
        if not 0 < bits <= 32:
            raise ValueError(f"bits per weight {bits} out of range (0, 32]")
        return WeightFormat(name=f"{kind}:{m['bits']}", block_weights=0, block_bytes=0, bits=bits,
                            codebook=kind in ("EXL3", "IQMIX"))
    return gguf_format(name)


# llama.cpp's CPU backend copies weights of these types at load into blocks of 8 (ARM: 4) rows
# interleaved (its CPU_REPACK buffer: anonymous memory, not the mmap) when the CPU has one of the
# listed instruction sets (ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type; llama.cpp
# 0.3.36's vendored ggml; ARM: dotprod, cpuinfo flag `asimddp`). `--no-repack` turns it off.
LLAMACPP_REPACK_ISA: dict[str, tuple[str, ...]] = {
    "Q4_0": ("avx2", "asimddp"), "Q4_K": ("avx2", "asimddp"), "IQ4_NL": ("avx2", "asimddp"),
    "MXFP4": ("avx2", "asimddp"), "Q2_K": ("avx512f",), "Q5_K": ("asimddp",), "Q6_K": ("asimddp",),
    "Q8_0": ("asimddp",),
}


def llamacpp_repacks(fmt: WeightFormat, isa: list[str]) -> bool:
    """Whether llama.cpp copies CPU weights of `fmt` at load into its interleaved CPU_REPACK layout on a
    CPU with instruction sets `isa` (cpuinfo flag names), unless run with --no-repack."""
    return any(f in isa for f in LLAMACPP_REPACK_ISA.get(fmt.name, ()))


# ggml's MUL_MAT_ID on a batch of tokens (llama.cpp 0.3.36's vendored ggml-cpu): weights in the CPU_REPACK layout
# run a gemv per token over each thread's share of rows (repack.cpp forward_mul_mat_id); K-quants and i-quants in
# place, from 8 tokens an expert, a tiled GEMM on an x86 CPU with AVX (tiled/tiled.cpp ggml_tiled_supported,
# ggml_tiled_min_batch); everything else one dot product per (row, token) pair in 16 x 16 blocks (ggml-cpu.c
# ggml_compute_forward_mul_mat_id_one_chunk).
LLAMACPP_TILED_TYPES = ("Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                        "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
LLAMACPP_TILED_MIN_TOKENS = 8
# up to 16 tokens an expert (TILED_MICRO) the tiled GEMM takes its narrow path: slabs as long in K as keep 16 rows
# of codes in L1, the rows unpacked 16 at a time for at most 16 tokens (tiled.cpp tiled_mmid_gemm_window)
LLAMACPP_TILED_NARROW_MAX_TOKENS = 16
LLAMACPP_TILED_ISA = ("avx512_vnni", "avx2", "avx")
# the tiled GEMM takes an expert's tokens in windows of up to 256 (TILED_TILE_ROWS), unpacking each 64-row group's
# weights once a window (tiled.cpp tiled_mmid_gemm_window): the unpacking's cost is shared by a window's tokens
LLAMACPP_TILED_WINDOW_TOKENS = 256


def llamacpp_prefill_path(fmt: WeightFormat, repacked: bool, tokens_per_expert: float, isa: list[str]) -> str:
    """The path ggml's MUL_MAT_ID takes for CPU experts in `fmt` on a batch with that many tokens an expert:
    'repacked' (weights repacked at load), 'tiled' / 'tiled-narrow' (a K-quant's tiled GEMM, over 16 tokens an
    expert / 8 to 16) or 'vecdot' (a dot per pair)."""
    if repacked:
        return "repacked"
    if (fmt.name in LLAMACPP_TILED_TYPES and tokens_per_expert >= LLAMACPP_TILED_MIN_TOKENS
            and any(f in isa for f in LLAMACPP_TILED_ISA)):
        return "tiled-narrow" if tokens_per_expert <= LLAMACPP_TILED_NARROW_MAX_TOKENS else "tiled"
    return "vecdot"


def llamacpp_prefill_key(fmt_name: str, path: str) -> str:
    """A profile's key for a format's prefill rate on a ggml path: 'Q8_0', 'Q4_0:repacked', 'Q4_K:tiled'."""
    return fmt_name if path == "vecdot" else f"{fmt_name}:{path}"


# ggml's MUL_MAT of F16 weights on a batch hands the whole product to llamafile's tinyBLAS (ggml-cpu.c
# ggml_compute_forward_mul_mat under GGML_USE_LLAMAFILE; llamafile/sgemm.cpp llamafile_sgemm): on x86 with AVX-512 F,
# or AVX2 and F16C, the F32 activations converted to F16 first; the dense path of every make-model file
LLAMACPP_SGEMM_ISA: dict[str, tuple[tuple[str, ...], ...]] = {"F16": (("avx512f",), ("avx2", "f16c"))}


def llamacpp_dense_prefill_key(fmt_name: str, isa: list[str]) -> str | None:
    """A profile's key for llama.cpp's prefill products of dense weights in `fmt_name` on a CPU with `isa`:
    'F16:sgemm' where llamafile's tinyBLAS takes them, else None (the profile's one prefill rate)."""
    if any(all(f in isa for f in need) for need in LLAMACPP_SGEMM_ISA.get(fmt_name, ())):
        return f"{fmt_name}:sgemm"
    return None


# build_moe_ffn's multiply of the expert outputs by their router weights (ggml_mul, [n_embd, k, n] x [1, k, n]) on the
# CPU, a scalar multiply a value (calibration.ggml_binary): its rate, giga-values a second a core, under this key
LLAMACPP_WEIGHTING_KEY = "F32:weighting"


# repack.cpp's MUL_MAT_ID runs every format it repacks the same way, a gemv per token over 8 interleaved rows of
# int8-activation products (q4_0_8x8, q4_K_8x8, iq4_nl_8x8: one template, tensor_traits::forward_mul_mat_id); the
# profile times those rebuilt (Q4_0's, Q4_K's and Q2_K's, calibration.bench_ggml_prefill), Q4_0's standing in for the
# others (IQ4_NL, MXFP4)
LLAMACPP_REPACKED_STAND_IN = "Q4_0"


def llamacpp_prefill_keys(fmt_name: str, path: str) -> tuple[str, ...]:
    """The profile keys that rate a format's prefill on a ggml path, best first: its own, then on the repacked path
    the rebuilt format's (LLAMACPP_REPACKED_STAND_IN), on the tiled GEMM's narrow path its standard one's (a profile
    of before session 41 has only that)."""
    own = llamacpp_prefill_key(fmt_name, path)
    if path == "repacked" and fmt_name != LLAMACPP_REPACKED_STAND_IN:
        return own, llamacpp_prefill_key(LLAMACPP_REPACKED_STAND_IN, path)
    if path == "tiled-narrow":
        return own, llamacpp_prefill_key(fmt_name, "tiled")
    return (own,)


# The executor's integer GEMM (executor.qgemm.q_matmul) packs an expert's tokens in 16-token blocks of panels, each
# token EXECUTOR_PANEL_FLOATS floats a 32 values (int16 pairs and scales; int8 activations: 8 + 4), reads them in
# slices of up to 4,096 columns, and takes them in groups whose slice fits EXECUTOR_GROUP_L2_SHARE of a core's L2,
# an even number of blocks, at least two: each group decodes the weights again (its m0 is paid per group)
EXECUTOR_PANEL_FLOATS = {"int16": 20, "int8": 12}
EXECUTOR_BLOCK_TOKENS, EXECUTOR_SLICE_COLS = 16, 4096
EXECUTOR_GROUP_L2_SHARE = 5 / 8
# the CPU features the integer GEMM takes (qgemm.HAVE_VNNI256: vpdpwssd on ymm, 32 registers); without them prefill's
# products run the float GEMM (gemm.deq_matmul), whose 256-column slices keep every token in L2: one group
EXECUTOR_QGEMM_ISA = ("avx512_vnni", "avx512vl")


def executor_group_bytes(l2_bytes: int) -> int:
    """Bytes of panel slice a group of the executor's integer GEMM takes on a core with l2_bytes of L2."""
    return int(l2_bytes * EXECUTOR_GROUP_L2_SHARE)


def executor_prefill_group_bytes(l2_bytes: int | None, isa: list[str]) -> int | None:
    """executor_group_bytes where the executor's prefill products take the integer GEMM (EXECUTOR_QGEMM_ISA) on a
    core whose L2 is known; None (one group) elsewhere."""
    if not l2_bytes or not all(f in isa for f in EXECUTOR_QGEMM_ISA):
        return None
    return executor_group_bytes(l2_bytes)


def executor_group_tokens(cols: int, group_bytes: int, activations: str = "int16") -> int:
    """Tokens an expert's product over rows of `cols` values takes in one group of the executor's integer GEMM
    (group_bytes of panel slice: executor_group_bytes)."""
    block = min(cols, EXECUTOR_SLICE_COLS) * EXECUTOR_PANEL_FLOATS[activations] // 32 * EXECUTOR_BLOCK_TOKENS * 4
    return EXECUTOR_BLOCK_TOKENS * max(2, group_bytes // block // 2 * 2)


def executor_expert_groups(hidden: int, expert_ffn: int, tokens_per_expert: float, group_bytes: int | None,
                           activations: str | None = None) -> float:
    """Groups an expert's products of that many tokens take in the executor's integer GEMM on `activations`' panels
    (None: int16), the mean over its gate and up (rows of `hidden` values) and down (rows of `expert_ffn`): each
    pays the decode's fixed part once. 1 where group_bytes is None or 0 (one group)."""
    if not group_bytes:
        return 1.0
    m, acts = max(tokens_per_expert, 1.0), activations or "int16"
    return (2 * math.ceil(m / executor_group_tokens(hidden, group_bytes, acts))
            + math.ceil(m / executor_group_tokens(expert_ffn, group_bytes, acts))) / 3
