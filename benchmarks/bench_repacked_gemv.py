"""The rebuilt gemvs of llama.cpp's repacked formats (calibration.ggml_vec_dot's q4_0, calibration.ggml_gemv_q4_k,
calibration.ggml_gemv_q2_k) at make-model `small`'s expert shapes: gate / up (768 rows x 2048) and down (2048 x 768),
4 experts x 64 tokens as calibrate's repacked prefill job, each thread its eighth-aligned share of every expert's rows
token by token. Rounds alternate the jobs; medians of GFLOP/s. ggml's own rate in situ comes from perf of llama-bench
(README: the repacked gemv rows), not from here:

    perf record -F 999 -o q2k.perf -- llama-bench -m small-q2k.gguf -p 512 -n 0 -r 3 -t 1 --repack 1
    perf report -i q2k.perf --no-children --sort symbol   (the gemv's share x the samples' seconds / 4 runs)

    python benchmarks/bench_repacked_gemv.py [--threads 1] [--rounds 9] [--formats Q4_0 Q4_K Q2_K]

AVX2 only (the rebuilds')."""
from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np

from calibration.bench_ggml_prefill import REPACK_X8, _repacked_matrix, quantize_q8_0
from calibration.bench_kernel import _synth_tensor
from calibration.ggml_tiled import quantize_q8_k

SHAPES = {"gate": (768, 2048), "down": (2048, 768)}  # rows x K of `small`'s experts


def job(fmt: str, rows: int, k: int, experts: int = 4, tokens: int = 64, seed: int = 0):
    """(run, flops): one repacked product of `experts` experts x `tokens` tokens each."""
    rng = np.random.default_rng(seed)
    w = _synth_tensor(fmt, experts, rows, k, rng)
    x = rng.standard_normal((experts, tokens, k)).astype(np.float32)
    out = np.zeros((experts, tokens, rows), np.float32)
    flops = 2.0 * experts * tokens * rows * k
    if fmt == "Q4_0":  # the synthetic Q4_0 bytes read as block_q4_0x8 (the values don't matter to the timing)
        flat, (x8, dx) = w.data.reshape(experts, -1), quantize_q8_0(x)
        return (lambda: _repacked_matrix(flat, rows, x8, dx, out, numba.get_num_threads())), flops
    flat = np.stack([REPACK_X8[fmt](w.data[e].reshape(-1), rows).reshape(-1) for e in range(experts)])
    x8, dx, bs = quantize_q8_k(x)
    return (lambda: _repacked_matrix(flat, rows, x8, dx, out, numba.get_num_threads(), bs, w.code)), flops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--formats", nargs="+", default=["Q4_0", "Q4_K", "Q2_K"])
    a = ap.parse_args()
    numba.set_num_threads(a.threads)
    jobs = {(f, s): job(f, *SHAPES[s]) for f in a.formats for s in SHAPES}
    for run, _ in jobs.values():
        run()  # compile
    rates: dict = {key: [] for key in jobs}
    for _ in range(a.rounds):
        for key, (run, flops) in jobs.items():
            t0 = time.perf_counter()
            run()
            rates[key].append(flops / (time.perf_counter() - t0) / 1e9)
    print(f"{a.threads} thread(s), {a.rounds} rounds, GFLOP/s a core (median)")
    for (f, s), v in rates.items():
        rows, k = SHAPES[s]
        print(f"{f:5s} {s:5s} {rows:5d} x {k:5d}  {statistics.median(v) / a.threads:7.1f}")


if __name__ == "__main__":
    main()
