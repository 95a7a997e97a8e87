"""The integer GEMM (executor/qgemm.py) against the float GEMM (gemm.deq_matmul) and the fused int16 rows
(row_products.rows_fused) on one core, a `small`-sized expert matrix in cache, side by side per token count.

    python benchmarks/bench_qgemm.py [--types Q4_K Q6_K ...] [--tokens 4 8 16 32 64 128] [--rounds 7]
    python benchmarks/bench_qgemm.py --decode      # each type's rows decoded to integers (qdecode) against floats
    python benchmarks/bench_qgemm.py --int8        # also the int8 activations' GEMM (q_matmul8, `execute --gemm-int8`)
    python benchmarks/bench_qgemm.py --tiles       # the GEMMs' ymm tiles against their zmm ones: int16, int8, float

Prints GFLOP/s (2 rows x cols x tokens over the median time of `rounds` calls) of each path and the ratios
qgemm / deq_matmul and qgemm / fused; the fused column up to 32 tokens. The token packing (qpack_into) is timed
apart and printed as a share of the integer GEMM's time (it is done once per matrix of tokens, not per row range).
Synthetic rows: calibrate's (calibration.bench_kernel._synth_tensor).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gguf  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from calibration.bench_kernel import _synth_tensor  # noqa: E402
from executor import gemm, qdecode, qgemm  # noqa: E402
from executor import row_products as RP  # noqa: E402
from executor.gemm import KC, _col_bytes, deq_row, pack_tokens  # noqa: E402
from executor.gguf_model import EXPERT_TYPES  # noqa: E402
from executor.kernels import _quant_rows, panels  # noqa: E402

QT = gguf.GGMLQuantizationType
_U = np.uint64


def rows_of(name: str, rows: int, cols: int, rng) -> np.ndarray:
    """rows x cols weights of type `name` as raw row bytes: calibrate's synthetic experts (make_model's random weights,
    block scales spread as real ones)."""
    return _synth_tensor(name, 1, rows, cols, rng).data[0]


def matrix_of(name: str, rng):
    """`small`'s gate / up matrix (768 x 2048) of type `name`, or its down (2048 x 768) for Q6_K, as llama.cpp's
    Q4_K_M files use it -> (rows, cols, type code, flat row bytes, row stride)."""
    rows, cols = (2048, 768) if name == "Q6_K" else (768, 2048)
    raw = rows_of(name, rows, cols, rng)
    return rows, cols, EXPERT_TYPES[QT[name]], raw.reshape(-1), raw.shape[1]


def cases(names, tokens, seed: int = 1):
    """For each type (matrix_of) and token count, the matrix and random tokens with their int16 rows -> (name, rows,
    cols, code, w, rb, m, x, x16, dx)."""
    rng = np.random.default_rng(seed)
    for name in names:
        rows, cols, code, w, rb = matrix_of(name, rng)
        for m in tokens:
            x = rng.standard_normal((m, cols)).astype(np.float32)
            yield (name, rows, cols, code, w, rb, m, x, *_quant_rows(x))


def median_s(f, rounds: int) -> float:
    """Median seconds of `rounds` calls of f (after one warm-up call)."""
    f()
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


@lru_cache(maxsize=None)
def _matmul(code: int, int8: bool, wide: bool):
    """qgemm's GEMM of type `code` on int16 or int8 activations with its ymm or zmm tiles, from Python."""
    mm = qgemm._q_matmul(int8, wide)

    @njit(fastmath=True)
    def run(w, r0, r1, rb, P, m, res, off):
        mm(code, w, r0, r1, rb, P, m, res, off)
    return run


def pack8(x) -> np.ndarray:
    """qgemm.qpack8_into's panels of the float rows x."""
    P = np.empty(((x.shape[0] + 15) // 16, qgemm.panel_width8(x.shape[1]), 16), np.float32)
    qgemm.qpack8_into(P, np.int64(0), x, qgemm.row_range(x.shape[0]))
    return P


def bench_products(names, tokens, rounds: int, int8: bool = False) -> None:
    for name, rows, cols, code, w, rb, m, x, x16, dx in cases(names, tokens):
        res = np.zeros((m, rows), np.float32)
        P, Pf = panels(x, x16, dx, True, True), pack_tokens(x)
        tq = median_s(lambda: RP.py_q_matmul(code, w, 0, rows, rb, P, m, res, 0), rounds)
        tp = median_s(lambda: panels(x, x16, dx, True, True), rounds)
        tg = median_s(lambda: RP.py_deq_matmul(code, w, 0, rows, rb, Pf, m, res, 0), rounds)
        tf = median_s(lambda: RP.py_rows_fused(code, w, 0, rows, rb, x16, dx, res, 0), rounds) if m <= 32 else np.nan
        gf = 2 * rows * cols * m / 1e9
        print(f"{name:6} {m:4d} tokens  qgemm {gf / tq:6.1f} GFLOP/s (packing {100 * tp / tq:4.1f}%)  "
              f"deq_matmul {gf / tg:6.1f}  fused {gf / tf:6.1f}   qgemm/deq_matmul {tg / tq:4.2f}  "
              f"qgemm/fused {tf / tq:4.2f}", flush=True)
        if int8:  # the same products on int8 activations, timed after the int16 ones
            P8 = pack8(x)
            t8 = median_s(lambda: _matmul(code, True, qgemm.WIDE)(w, 0, rows, rb, P8, m, res, 0), rounds)
            print(f"{'':6} {m:4d} tokens  int8 qgemm {gf / t8:6.1f} GFLOP/s   int8/int16 {tq / t8:4.2f}", flush=True)


@lru_cache(maxsize=None)
def _deq_tiled(code: int, wide: bool):
    """gemm's float GEMM of type `code` with or without its 32-token zmm tile, from Python."""
    mm = gemm._deq_matmul(wide)

    @njit(fastmath=True)
    def run(w, r0, r1, rb, P, m, res, off):
        mm(code, w, r0, r1, rb, P, m, res, off)
    return run


def bench_tiles(names, tokens, rounds: int) -> None:
    """The GEMMs with ymm tiles against zmm tiles (qgemm.q_tile / q_tile_wide: int16 and int8 activations;
    gemm.deq_matmul's 32-token tile: float), the two timed in alternating rounds; the products must be the same
    bits. F16 has the float GEMM only."""
    for name, rows, cols, code, w, rb, m, x, x16, dx in cases(names, tokens):
        gf = 2 * rows * cols * m / 1e9
        for acts in ("int16", "int8", "float"):
            if acts != "float" and (name == "F16" or not qgemm.HAVE_VNNI256):
                continue
            P = {"int16": lambda: panels(x, x16, dx, True, True), "int8": lambda: pack8(x),
                 "float": lambda: pack_tokens(x)}[acts]()
            of = (lambda wide: _deq_tiled(code, wide)) if acts == "float" else (
                lambda wide: _matmul(code, acts == "int8", wide))
            out, ts = {}, {False: [], True: []}
            for wide in (False, True):
                out[wide] = np.zeros((m, rows), np.float32)
                of(wide)(w, 0, rows, rb, P, m, out[wide], 0)
            for _ in range(rounds):
                for wide in (False, True):
                    f = of(wide)
                    t = time.perf_counter()
                    f(w, 0, rows, rb, P, m, out[wide], 0)
                    ts[wide].append(time.perf_counter() - t)
            ty, tz = statistics.median(ts[False]), statistics.median(ts[True])
            same = np.array_equal(out[False], out[True])
            print(f"{name:6} {m:4d} tokens {acts:5}  ymm {gf / ty:6.1f}  zmm {gf / tz:6.1f} "
                  f"GFLOP/s  zmm/ymm {ty / tz:4.2f}  same bits: {same}", flush=True)


def bench_decode(names, rounds: int) -> None:
    """G weights/s of each type's rows decoded to integers (qdecode.q_decode: intrinsics, plain loops) and to floats
    (gemm.deq_row, the float GEMM's), 96 rows x 2048 columns a call."""
    rng = np.random.default_rng(2)
    rows, cols = 96, 2048
    for name in names:
        code = EXPERT_TYPES[QT[name]]
        raw = rows_of(name, rows, cols, rng)

        def to_ints(fast):  # the flag a compile-time constant, as q_decode takes it
            @njit(fastmath=True)
            def ints(w, A, S, N):
                for r in range(w.shape[0]):
                    for c0 in range(0, cols, KC):
                        qdecode.q_decode(code, w[r], _U(_col_bytes(code, c0)), A, S, N, KC, fast)
            return ints

        @njit(fastmath=True)
        def floats(w, F):
            for r in range(w.shape[0]):
                for c0 in range(0, cols, KC):
                    deq_row(code, w[r], _U(_col_bytes(code, c0)), F, _U(32))
        A, S, N, F = (np.zeros(KC, np.int16), np.zeros(KC // 16, np.float32), np.zeros(KC // 16, np.float32),
                      np.zeros(KC, np.float32))
        n = rows * cols / 1e9
        fast_f, slow_f = to_ints(True), to_ints(False)
        fast = median_s(lambda: fast_f(raw, A, S, N), rounds)
        slow = median_s(lambda: slow_f(raw, A, S, N), rounds)
        flt = median_s(lambda: floats(raw, F), rounds)
        print(f"{name:6} to integers {n / fast:5.1f} G weights/s (plain loops {n / slow:4.1f}), to floats {n / flt:5.1f}",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", nargs="+", default=["Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_NL",
                                                   "IQ4_XS"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[4, 6, 8, 16, 32, 64, 128])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--decode", action="store_true", help="time the row decoders instead")
    ap.add_argument("--int8", action="store_true", help="also the GEMM on int8 activations (qgemm.q_matmul8)")
    ap.add_argument("--tiles", action="store_true", help="the GEMM's ymm tiles against its zmm ones")
    a = ap.parse_args()
    numba.set_num_threads(1)
    print(f"one core; vpdpwssd: {qgemm.HAVE_VNNI256}, on zmm: {qgemm.HAVE_VNNI512} (the executor's: {qgemm.WIDE}); "
          f"the executor takes the integer GEMM: {qgemm.HAVE_QGEMM}")
    if a.decode:
        bench_decode(a.types, a.rounds)
    elif a.tiles:
        bench_tiles(a.types, a.tokens, a.rounds)
    else:
        bench_products(a.types, a.tokens, a.rounds, a.int8)


if __name__ == "__main__":
    main()
