"""Two tokens per row decode (row_products.rows_pair: a 4-row group's weights decoded once for both tokens)
against the same two tokens one at a time (rows_token); the fused int16 path (row_products.rows_fused: four
tokens a row group, then pairs) against pairs alone at 4 and 8 tokens, and against dequantise-then-multiply
(gemm.deq_dots; gemm.deq_matmul from GEMM_TOKENS) at m tokens an expert: where row_products._FUSED sits (F16 rows,
one token at a time, too).
Expert 0's gate (or --parts) of each model, in cache, the ways interleaved in one process, one thread; with
each line the single-token rate and the rate rows dequantise at (G weights/s):

    python benchmarks/bench_token_pairs.py [--dir /tmp/moe-offload-bench] [--presets tiny small small-q4]
    python benchmarks/bench_token_pairs.py --presets small-q4k --parts gate down   # Q4_K, Q6_K
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.local import ensure_model  # noqa: E402
from executor import kernels as K  # noqa: E402
from executor import row_products as RP  # noqa: E402
from executor.gemm import GEMM_TOKENS, deq_dots, deq_matmul, deq_rows, pack_tokens  # noqa: E402
from executor.gguf_model import GGUFModel  # noqa: E402


@lru_cache(maxsize=None)
def _ways(code: int):
    """The ways timed here for type `code`, compiled with the code a constant in them as the executor's C functions
    are (kernel_table.py; a literal argument ran the dequantised path ~15x slower): (alone, pairs, fused, deq)."""
    @njit(fastmath=True)
    def alone(w, R, rb, X16, DX, res, reps):
        for _ in range(reps):
            for k in range(X16.shape[0]):
                RP.rows_token(code, w, 0, R, rb, X16, DX, k, res, 0)

    @njit(fastmath=True)
    def pairs(w, R, rb, X16, DX, res, reps):
        m = X16.shape[0]
        for _ in range(reps):
            k = 0
            while k + 2 <= m:
                RP.rows_pair(code, w, 0, R, rb, X16, DX, k, res, 0)
                k += 2
            if k < m:
                RP.rows_token(code, w, 0, R, rb, X16, DX, k, res, 0)

    @njit(fastmath=True)
    def fused(w, R, rb, X16, DX, res, reps):
        for _ in range(reps):
            RP.rows_fused(code, w, 0, R, rb, X16, DX, res, 0)

    @njit(fastmath=True)
    def deq(w, R, rb, X, res, reps):
        """The executor's path above _FUSED: gemm.deq_dots, or from GEMM_TOKENS the packed GEMM (packing timed too)."""
        for _ in range(reps):
            if X.shape[0] >= GEMM_TOKENS:
                deq_matmul(code, w, 0, R, rb, pack_tokens(X), X.shape[0], res, 0)
            else:
                deq_dots(code, w, 0, R, rb, X, res, 0)
    return alone, pairs, fused, deq


def _alone(code, *args):
    _ways(int(code))[0](*args)


def _pairs(code, *args):
    _ways(int(code))[1](*args)


def _fused(code, *args):
    _ways(int(code))[2](*args)


def _deq(code, *args):
    _ways(int(code))[3](*args)


@njit(fastmath=True)
def _f16_tokens(w, R, rb, X, DX, res, reps):
    nc = np.int64(X.shape[1] // 16)
    for _ in range(reps):
        for k in range(X.shape[0]):
            r = 0
            while r + 4 <= R:
                RP.rows4_f16(w, np.int64(r * rb), np.int64(rb), X[k], DX[k], nc, res[k], np.int64(r))
                r += 4
            while r < R:
                RP.rows1_f16(w, np.int64(r * rb), np.int64(rb), X[k], DX[k], nc, res[k], np.int64(r))
                r += 1



def _time(fns, rounds: int = 7) -> list[float]:
    """Median seconds of each zero-argument callable, interleaved round by round."""
    ts = [[] for _ in fns]
    for _ in range(rounds):
        for f, t in zip(fns, ts):
            t0 = time.perf_counter()
            f()
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in ts]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default="/tmp/moe-offload-bench")
    ap.add_argument("--presets", nargs="+", default=["tiny", "small", "small-q4"])
    ap.add_argument("--parts", nargs="+", default=["gate"], choices=("gate", "up", "down"))
    a = ap.parse_args()
    K.set_threads(1)
    for preset, part in ((p, q) for p in a.presets for q in a.parts):
        model = GGUFModel(ensure_model(preset, a.dir, engram=False))
        W = model.experts(0, part)
        w, R = K.flat(W)[0], W.rows
        rb = w.shape[0] // R
        line = []
        for m in (2, 4, 6, 8, 12, 16, 24, 32):
            X = np.random.default_rng(m).standard_normal((m, W.cols)).astype(np.float32)
            X16, DX = K._quant_rows(X)
            res = np.empty((m, R), np.float32)
            reps = max(1, int(2e6 // (R * W.cols * m // 1000 + 1)))
            calls = [lambda: _fused(W.code, w, R, rb, X16, DX, res, reps)]
            calls.append((lambda: _alone(W.code, w, R, rb, X16, DX, res, reps)) if m == 2 else
                         (lambda: _deq(W.code, w, R, rb, X, res, reps)))
            if m in (4, 8):
                calls.append(lambda: _pairs(W.code, w, R, rb, X16, DX, res, reps))
            for f in calls:
                f()  # compiled
            t_fused, t_other, *t_pairs = _time(calls)
            if m == 2:  # two tokens alone: the single-token rate
                line.append(f"one token {2 * reps * R * W.cols / t_other / 1e9:.1f} G weights/s")
            line.append(f"m={m}: {'alone' if m == 2 else 'deq'} / fused {t_other / t_fused:.2f}"
                        + (f", pairs / fused {t_pairs[0] / t_fused:.2f}" if t_pairs else ""))
        out = np.empty((R, W.cols), np.float32)  # the whole matrix dequantised (prefill's first half), 1 pass
        t_deq, = _time([lambda: deq_rows(W.code, w.reshape(R, rb), out)])
        line.append(f"rows dequantised {R * W.cols / t_deq / 1e9:.1f} G weights/s")
        print(f"{preset} {part} {R}x{W.cols} ({W.qtype.name}): " + "; ".join(line), flush=True)
        f16 = [g for g in (model.experts(i, "gate") for i in range(model.cfg.n_layers)) if g.code == K.F16]
        if f16:  # F16 rows take float32 activations one token at a time up to _FUSED tokens too
            W = f16[0]
            w, R = K.flat(W)[0], W.rows
            rb = w.shape[0] // R
            line = []
            for m in (8, 12, 16):
                X = np.random.default_rng(m).standard_normal((m, W.cols)).astype(np.float32)
                DX = np.zeros((m, 2 * (W.cols // 32)), np.float32)
                res = np.empty((m, R), np.float32)
                reps = max(1, int(2e6 // (R * W.cols * m // 1000 + 1)))
                calls = [lambda: _f16_tokens(w, R, rb, X, DX, res, reps), lambda: _deq(W.code, w, R, rb, X, res, reps)]
                for f in calls:
                    f()
                t_tok, t_deq = _time(calls)
                line.append(f"m={m}: deq / per token {t_deq / t_tok:.2f}")
            print(f"{preset} F16 gate {R}x{W.cols}: " + "; ".join(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
