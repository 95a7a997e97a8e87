"""ggml's own CPU kernels, where a llama.cpp build is at hand.

A llama.cpp build's libggml-cpu.so exports the kernels its MUL_MAT_ID runs on CPU experts: the vec_dot of every
GGUF type against the token's quantised row (`ggml_vec_dot_q4_K_q8_K`, ...), the gemvs of the layouts it repacks
at load (`ggml_gemv_q2_K_8x8_q8_K`, ...) and the token's quantisers (`quantize_row_q8_0`, `quantize_row_q8_K`).
They are plain C functions: numba calls them through ctypes from compiled code, so calibrate can time them in the
rebuilds' jobs (calibration.bench_ggml_own) and the simulator's llama.cpp plans read the rates of the code
llama.cpp runs on this machine, compiled by its own compiler with its own flags.

Why: the rebuilds are ggml's loops, compiled by LLVM. On the Zen 4 VM (session 46, one thread) ggml's repacked
Q2_K gemv streamed a pool of experts at 11.5-12.0 GB/s by ctypes, where perf of llama-bench's tg64 puts it at 12.3
and the rebuild ran 14.4-16.5; Q4_K's 19.3-19.7 against 20.9 in situ and 24.7-26.3 rebuilt.

A library is used only for the kernels whose products it gets right on a few rows (`verify`): another version of
llama.cpp may lay out its repacked blocks otherwise, and then that kernel is left to the rebuild.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from specs.errors import SpecError

LIB_NAME = "libggml-cpu.so"
ENV = "MOE_OFFLOAD_GGML_LIB"  # a path, or 'none' for the rebuilds
# the llama.cpp programs whose folder (or its ../lib) holds a build's libraries
PROGRAMS = ("llama-bench", "llama-server", "llama-cli")

# a GGUF type's vec_dot type in ggml's CPU backend (ggml-cpu.c type_traits_cpu[...].vec_dot_type), for the types
# calibrate times (calibration.bench_rowwise.FORMATS)
VEC_DOT_TYPE = {"Q8_0": "q8_0", "Q4_0": "q8_0", "IQ4_NL": "q8_0", "Q2_K": "q8_K", "Q3_K": "q8_K", "Q4_K": "q8_K", "Q5_K": "q8_K", "Q6_K": "q8_K", "IQ4_XS": "q8_K",
                "F16": "f16"}
# bytes of a quantised token row of n values: block_q8_0 (fp16 d, 32 int8), block_q8_K (f32 d, 256 int8, 16 int16)
TOKEN_BYTES = {"q8_0": lambda n: n // 32 * 34, "q8_K": lambda n: n // 256 * 292, "f16": lambda n: 2 * n}
# the 8x8 gemvs of llama.cpp's x86 repacked layouts (repack.cpp; block_q4_0x8, block_q4_Kx8, block_q2_Kx8, block_iq4_nlx8)
GEMV = {"Q4_0": "ggml_gemv_q4_0_8x8_q8_0", "Q4_K": "ggml_gemv_q4_K_8x8_q8_K", "Q2_K": "ggml_gemv_q2_K_8x8_q8_K",
        "IQ4_NL": "ggml_gemv_iq4_nl_8x8_q8_0"}

_P, _I, _Z = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
# void vec_dot(int n, float *s, size_t bs, const void *vx, size_t bx, const void *vy, size_t by, int nrc)
VEC_DOT_ARGS = [_I, _P, _Z, _P, _Z, _P, _Z, _I]
# void gemv(int n, float *s, size_t bs, const void *vx, const void *vy, int nr, int nc)
GEMV_ARGS = [_I, _P, _Z, _P, _P, _I, _I]
# void quantize_row_q8_0(const float *x, void *y, int64_t k): the token in a vec_dot type (ggml's from_float)
QUANTIZE_ARGS = [_P, _P, ctypes.c_int64]
QUANTIZER = {"q8_0": "quantize_row_q8_0", "q8_K": "quantize_row_q8_K", "f16": "ggml_cpu_fp32_to_fp16"}


def vec_dot_name(fmt: str) -> str:
    """ggml's vec_dot symbol for a GGUF type: 'ggml_vec_dot_q4_K_q8_K', 'ggml_vec_dot_f16'."""
    t = VEC_DOT_TYPE[fmt]
    return "ggml_vec_dot_f16" if t == "f16" else f"ggml_vec_dot_{fmt.lower().replace('_k', '_K')}_{t}"


def find_ggml_cpu(hint: str | os.PathLike | None = None) -> Path | None:
    """The libggml-cpu.so to time: `hint` (the file or a folder holding it, 'none' for none), else $MOE_OFFLOAD_GGML_LIB,
    else next to a llama.cpp program on PATH (or in its ../lib), else llama-cpp-python's; None when there is none."""
    for given, where in ((hint, None), (os.environ.get(ENV), f"${ENV}")):
        if given is None or str(given) == "auto":
            continue
        if str(given) == "none":
            return None
        p = Path(given)
        for cand in (p, p / LIB_NAME, p / "bin" / LIB_NAME, p / "lib" / LIB_NAME):
            if cand.is_file():
                return cand
        raise SpecError(str(p), where, f"no {LIB_NAME} there (a llama.cpp build's, or 'none')")
    for prog in PROGRAMS:
        exe = shutil.which(prog)
        if exe:
            d = Path(exe).resolve().parent
            for cand in (d / LIB_NAME, d.parent / "lib" / LIB_NAME):
                if cand.is_file():
                    return cand
    spec = importlib.util.find_spec("llama_cpp")  # llama-cpp-python keeps its build in llama_cpp/lib
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            cand = Path(loc) / "lib" / LIB_NAME
            if cand.is_file():
                return cand
    return None


@dataclass
class GgmlCpu:
    """A loaded libggml-cpu.so: its vec_dots and repacked gemvs by GGUF type (ctypes functions numba can call), the
    token's quantisers by vec_dot type, and the kernels `verify` turned away with the reason."""

    path: Path
    vec_dot: dict = field(default_factory=dict)  # 'Q4_K' -> ggml_vec_dot_q4_K_q8_K
    gemv: dict = field(default_factory=dict)  # 'Q2_K' -> ggml_gemv_q2_K_8x8_q8_K
    quantize: dict = field(default_factory=dict)  # 'q8_0' -> quantize_row_q8_0
    rejected: dict = field(default_factory=dict)  # 'vec_dot Q3_K' -> why

    def describe(self) -> str:
        """One line: the library and what of it is used."""
        out = f"ggml's own kernels from {self.path}: vec_dot {' '.join(self.vec_dot) or '-'}, " \
              f"repacked gemv {' '.join(self.gemv) or '-'}"
        return out + "".join(f"; not {k} ({why})" for k, why in self.rejected.items())


def _bind(lib, name: str, args):
    """lib's C function `name` typed for numba (void result), or None where the build lacks it."""
    try:
        fn = getattr(lib, name)
    except AttributeError:
        return None
    fn.argtypes, fn.restype = args, None
    return fn


def load_ggml_cpu(path: str | os.PathLike, formats=tuple(VEC_DOT_TYPE)) -> GgmlCpu:
    """The kernels of the libggml-cpu.so at `path` for these GGUF types, each verified on a few rows (SpecError when
    the file does not load)."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise SpecError(str(path), None, f"cannot load it: {e}") from None
    g = GgmlCpu(path=Path(path))
    init = getattr(lib, "ggml_cpu_init", None)  # fills the fp16 tables some kernels convert scales by
    if init is not None:
        init.argtypes, init.restype = [], None
        init()
    for t, name in QUANTIZER.items():
        fn = _bind(lib, name, QUANTIZE_ARGS)
        if fn is not None:
            g.quantize[t] = fn
    for fmt in formats:
        t = VEC_DOT_TYPE.get(fmt)
        if t is None or t not in g.quantize:
            continue
        fn = _bind(lib, vec_dot_name(fmt), VEC_DOT_ARGS)
        if fn is not None:
            g.vec_dot[fmt] = fn
        if fmt in GEMV:
            fn = _bind(lib, GEMV[fmt], GEMV_ARGS)
            if fn is not None:
                g.gemv[fmt] = fn
    verify(g)
    return g


def _token_values(t: str, q: np.ndarray, n: int) -> np.ndarray:
    """The values a quantised token row holds (float64 [n]): block_q8_0 / block_q8_K / fp16."""
    if t == "f16":
        return q.view(np.float16).astype(np.float64)
    if t == "q8_0":
        b = q.reshape(n // 32, 34)
        return (b[:, :2].copy().view(np.float16).astype(np.float64) * b[:, 2:].view(np.int8)).reshape(-1)
    b = q.reshape(n // 256, 292)
    return (b[:, :4].copy().view(np.float32).astype(np.float64) * b[:, 4:260].view(np.int8)).reshape(-1)


def repack_x8(fmt: str):
    """llama.cpp's x86 repack of `fmt` (a GEMV key): (rows' flat bytes, rows) -> [rows / 8, bytes]."""
    from .bench_ggml_prefill import REPACK_X8
    from .ggml_vec_dot import repack_q4_0_x8
    return {**REPACK_X8, "Q4_0": repack_q4_0_x8, "IQ4_NL": partial(repack_q4_0_x8, xor=0)}[fmt]


def quantise_token(g: GgmlCpu, t: str, x: np.ndarray) -> np.ndarray:
    """x (float32 [n]) as ggml's vec_dot type `t` takes it, by ggml's own from_float: bytes of block_q8_0 /
    block_q8_K rows, or fp16."""
    q = np.zeros(TOKEN_BYTES[t](x.shape[0]), np.uint8)
    g.quantize[t](x.ctypes.data, q.ctypes.data, x.shape[0])
    return q


def verify(g: GgmlCpu, rows: int = 8, n: int = 512, seed: int = 0) -> None:
    """Keep in g only the kernels whose products over `rows` synthetic rows of n weights equal the dequantised
    weights (gguf's dequantize) times the token's quantised values to float rounding; the rest go to g.rejected."""
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize
    from .bench_kernel import _synth_tensor
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    for kind, fns in (("vec_dot", g.vec_dot), ("gemv", g.gemv)):
        for fmt in list(fns):
            t = VEC_DOT_TYPE[fmt]
            w = _synth_tensor(fmt, 1, rows, n, rng).data[0]  # [rows, row bytes]
            ref = dequantize(w.reshape(-1), QT[fmt]).reshape(rows, n).astype(np.float64)
            q = quantise_token(g, t, x)
            tok = _token_values(t, q, n)
            out = np.zeros(rows, np.float32)
            if kind == "vec_dot":
                for r in range(rows):
                    fns[fmt](n, out[r:].ctypes.data, 0, w[r].ctypes.data, 0, q.ctypes.data, 0, 1)
            else:
                packed = np.ascontiguousarray(repack_x8(fmt)(w.reshape(-1), rows)).reshape(-1)
                fns[fmt](n, out.ctypes.data, 0, packed.ctypes.data, q.ctypes.data, 1, rows)
            want, scale = ref @ tok, np.abs(ref) @ np.abs(tok)
            bad = np.abs(out - want) > 1e-4 * scale + 1e-6
            if bad.any():
                del fns[fmt]
                g.rejected[f"{kind} {fmt}"] = f"products off on {int(bad.sum())} of {rows} rows"
