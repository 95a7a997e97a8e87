"""llama.cpp's weight kernels in situ: what each ran at inside a real decode, from a CPU profile of llama-bench.

`perf record -e cpu-clock llama-bench -p 0 -n N ...` samples every thread at a fixed rate. Each of ggml's weight
kernels (its vec_dots and repacked gemvs) is one symbol, so its samples times the period, over the tokens decoded,
are its time a token; a file's tensors give the bytes it reads a token (the routed experts' share, every dense
weight, the head), and the two give the rate it achieved in situ. Set beside the rate the profile gives the same
kernel (calibrate's jobs), that says which kernels the simulator's llama.cpp plans run too fast or too slow, and the
samples outside the weight kernels say how much of a token nothing prices (benchmarks/bench_llamacpp_in_situ.py).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from specs.formats import llamacpp_repacks, parse_format

# ggml's names: ggml_vec_dot_<type>_<vec_dot type> (in place), ggml_gemv_<type>_<r>x<c>_<vec_dot type> (repacked)
_VEC_DOT = re.compile(r"^ggml_vec_dot_(\w+?)(?:_q8_[0K])?$")
_GEMV = re.compile(r"^ggml_gemv_(\w+?)_\d+x\d+_q8_[0K]$")
# Q4_0's and IQ4_NL's repacked gemvs are one template on x86 (repack.cpp gemv_q4_b32_8x8_q8_0_lut_avx, the codebook
# its argument): its samples go to whichever of the two the file repacks
_LUT_GEMV = "gemv_q4_b32_8x8_q8_0_lut_avx"
_PERF_LINE = re.compile(r"^\s*([\d.]+)%\s+(\d+)\s+\[[.k]\]\s+(.+?)\s*$")


def kernel_of_symbol(sym: str, repacked_lut: str | None = None) -> tuple[str, bool] | None:
    """(weight type, repacked) of one of ggml's weight kernels named `sym`, or None for any other symbol;
    repacked_lut: the type the shared Q4_0 / IQ4_NL gemv template stands for in this file."""
    if sym.startswith(_LUT_GEMV):
        return (repacked_lut, True) if repacked_lut else None
    m = _GEMV.match(sym)
    if m:
        return m.group(1).upper(), True  # ggml's q4_K as GGUF's Q4_K
    m = _VEC_DOT.match(sym)
    return (m.group(1).upper(), False) if m else None


def perf_samples(report: str) -> dict[str, int]:
    """{symbol: samples} from `perf report -n --no-children --sort sym --stdio` text."""
    out: dict[str, int] = {}
    for line in report.splitlines():
        m = _PERF_LINE.match(line)
        if m:
            out[m.group(3)] = out.get(m.group(3), 0) + int(m.group(2))
    return out


def bytes_per_token(model, isa: list[str], repack: bool) -> dict[tuple[str, bool], float]:
    """{(weight type, repacked): bytes} one decode token of llama.cpp reads through its weight kernels, all-CPU: each
    expert tensor's routed share (top_k of n_experts), every dense tensor but the norms (F32 vectors ggml multiplies,
    not dots), the head; the embedding row is a copy (GET_ROWS), not a kernel's. `repack`: llama.cpp's default,
    where the types llamacpp_repacks names are read repacked."""
    out: dict[tuple[str, bool], float] = {}
    share = model.top_k / model.n_experts
    for t in model.tensors or ():
        if t.group not in ("experts", "dense") or (len(t.shape) < 2 or t.shape[1] == 1):
            continue
        rp = repack and llamacpp_repacks(parse_format(t.type), isa)
        key = (t.type, rp)
        out[key] = out.get(key, 0.0) + t.bytes * (share if t.group == "experts" else 1.0)
    if model.head_is_embedding:  # a tied head is the table: every row, in place
        emb = next(t for t in model.tensors if t.group == "embedding")
        out[(emb.type, False)] = out.get((emb.type, False), 0.0) + emb.bytes
    return out


@dataclass(frozen=True)
class InSitu:
    """One weight kernel in one llama-bench run: its bytes and time a token, the rate that is (bytes over the time
    its threads spent, divided among them), and the profile's rate for it."""

    fmt: str
    repacked: bool
    mb_per_token: float
    ms_per_token: float  # samples x period / tokens / threads
    gbs: float
    profile_gbs: float | None

    @property
    def profile_over(self) -> float | None:
        """The profile's rate over the in-situ one (1.10: the profile runs this kernel 10% faster than llama.cpp did)."""
        return self.profile_gbs / self.gbs if self.profile_gbs and self.gbs else None


def in_situ_rates(samples: dict[str, int], period_s: float, tokens: int, threads: int,
                  nbytes: dict[tuple[str, bool], float], profile_gbs=None, scale: float = 1.0) -> list[InSitu]:
    """Each weight kernel's InSitu from perf's samples a symbol (one every period_s on each running thread) over
    `tokens` tokens on `threads` threads; profile_gbs(fmt, repacked) -> GB/s or None; scale: the run's token time
    without perf over its time under perf, spread over every kernel (perf's sampling slows the whole run)."""
    lut = next((f for (f, rp) in nbytes if rp and f in ("Q4_0", "IQ4_NL")), None)
    secs: dict[tuple[str, bool], float] = {}
    for sym, n in samples.items():
        k = kernel_of_symbol(sym, lut)
        if k is not None and k in nbytes:
            secs[k] = secs.get(k, 0.0) + n * period_s
    rows = []
    for k, s in sorted(secs.items()):
        ms = s / tokens / threads * 1e3 * scale
        gbs = nbytes[k] / (ms * 1e6) if ms > 0 else math.inf
        rows.append(InSitu(k[0], k[1], nbytes[k] / 1e6, ms, gbs, profile_gbs(*k) if profile_gbs else None))
    return rows
