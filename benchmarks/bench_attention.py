"""Cached GQA attention on the CPU (executor.attention.attn_cached): microseconds per call on random caches.

    python benchmarks/bench_attention.py [--root CHECKOUT] [--reps 400]

Shapes: head dim 64; `tiny`'s heads (6 query / 2 KV) and `small`'s (8 / 4); one decode token at a 16,
200, 1,000 and 4,000-token context, and a 64, 512 and 2,048-token prompt. --root imports the executor of
another checkout (one from before executor/attention.py existed takes its kernel from
dense_kernels.py), so two versions can be timed in alternating processes. Median of --reps calls.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import numpy as np

CASES = [(16, 1), (200, 1), (1000, 1), (4000, 1), (0, 64), (0, 512), (0, 2048)]  # (cached tokens, new tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument("--reps", type=int, default=400)
    a = ap.parse_args()
    sys.path.insert(0, a.root)
    importlib.import_module("executor")  # first: sets the OpenMP spin before numba loads it
    try:
        from executor.attention import attn_cached
    except ImportError:
        from executor.dense_kernels import attn_cached
    rng = np.random.default_rng(0)
    hd = 64
    for nh, nkv in ((6, 2), (8, 4)):
        kc = rng.standard_normal((1, nkv, 4200, hd), dtype=np.float32)
        vc = kc.copy()
        out = []
        for p0, n in CASES:
            qkv = rng.standard_normal((n, nh + 2 * nkv, hd), dtype=np.float32)
            o = np.empty((n, nh * hd), np.float32)
            attn_cached(qkv, kc, vc, p0, n, nh, nkv, o)
            ts = []
            for _ in range(a.reps if n < 512 else max(1, a.reps // (8 if n == 512 else 40))):
                t = time.perf_counter()
                attn_cached(qkv, kc, vc, p0, n, nh, nkv, o)
                ts.append(time.perf_counter() - t)
            out.append(f"p0={p0} n={n}: {np.median(ts) * 1e6:.1f} us")
        print(f"{nh} query / {nkv} KV heads: " + "; ".join(out))


if __name__ == "__main__":
    main()
