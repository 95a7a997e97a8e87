"""calibrate's decode jobs of llama.cpp's plans on a llama.cpp build's own kernels (calibration.bench_ggml_own) beside
the rebuilds (calibration.bench_rowwise), on the same synthetic pools: a token's gate, up and down of k = 8 experts
of make-model `small`'s shapes (2048 x 768), in ggml's chunk order (bench_rowwise.GGML_SCHEDULE). Rounds alternate
the jobs; medians of GB/s over the whole job (fixed costs included, where a profile's rate is the slope over k).
With two threads or more it also times ggml's own in-place job with the experts split between the threads, the
order the jobs had before session 46 (each thread its own experts), beside ggml's:

    python benchmarks/bench_ggml_own.py --ggml-lib /path/to/llama.cpp/build/bin [--threads 1] [--rounds 5]

What perf finds in llama-bench's tg64 for the same kernels (README, sessions 45-46):

    perf record -F 999 -o tg.perf -- llama-bench -m small-q2k.gguf -p 0 -n 64 -r 3 -t 1 --repack 1
    perf report -i tg.perf --no-children --sort symbol   (a kernel's share x the samples' seconds / 193 tokens)"""
from __future__ import annotations

import argparse
import statistics
import time

import numba
from numba import njit, prange

from calibration import bench_rowwise as BR
from calibration.bench_ggml_own import _decode_job, own_repacked_job, own_rowwise_job
from calibration.bench_kernel import expert_pool
from calibration.ggml_library import VEC_DOT_TYPE, find_ggml_cpu, load_ggml_cpu


def split_job(g, fmt: str, hidden: int = 2048, ffn: int = 768):
    """ggml's own in-place job with each thread its own experts (numba's static split of (expert, chunk) pairs)."""
    vec_dot, quantize = g.vec_dot[fmt], g.quantize[VEC_DOT_TYPE[fmt]]

    @njit(parallel=True, nogil=True)
    def matvec(w, es, rows, x, q, out, nthr):
        n = x.shape[1]
        quantize(x.ctypes.data, q.ctypes.data, n)
        rb, wp, qp, op = w.shape[1] // rows, w.ctypes.data, q.ctypes.data, out.ctypes.data
        nc = (rows + BR.CHUNK_ROWS - 1) // BR.CHUNK_ROWS
        for i in prange(es.shape[0] * nc):
            j, c = i // nc, i % nc
            for r in range(c * BR.CHUNK_ROWS, min(rows, (c + 1) * BR.CHUNK_ROWS)):
                vec_dot(n, op + 4 * (j * out.shape[1] + r), 0, wp + es[j] * w.shape[1] + r * rb, 0, qp, 0, 1)
    p = expert_pool(fmt, hidden, ffn, 256 << 20, 8, 0)
    return _decode_job(p, BR._flat(p), matvec, VEC_DOT_TYPE[fmt], hidden, ffn, 8), p.expert_bytes


def gbs(job, eb: float, k: int = 8, tokens: int = 30) -> float:
    """GB/s of `tokens` jobs of k experts each, consecutive experts through the pool."""
    job(k, 0)
    t0 = time.perf_counter()
    for i in range(tokens):
        job(k, k * i)
    return tokens * k * eb / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ggml-lib", default="auto", help="a llama.cpp build's libggml-cpu.so or its folder")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--formats", nargs="+", default=["Q2_K", "Q4_K", "Q4_0", "Q8_0", "Q3_K", "F16"])
    a = ap.parse_args()
    path = find_ggml_cpu(a.ggml_lib)
    if path is None:
        raise SystemExit("no llama.cpp build found: --ggml-lib PATH")
    g = load_ggml_cpu(path, tuple(a.formats))
    numba.set_num_threads(a.threads)
    print(g.describe(), f"\n{a.threads} thread(s), medians of {a.rounds} alternating rounds, GB/s:")
    for fmt in a.formats:
        jobs = {"own rows": own_rowwise_job(g, fmt)}
        if fmt in BR.FORMATS:
            jobs["rebuilt rows"] = BR.rowwise_expert_job(fmt)
        if a.threads > 1:
            jobs["own rows, experts split"] = split_job(g, fmt)
        if fmt in g.gemv:
            jobs["own repacked"] = own_repacked_job(g, fmt)
        if fmt in BR.REPACKED_FORMATS:
            jobs["rebuilt repacked"] = BR.repacked_expert_job(fmt)
        got = {name: [] for name in jobs}
        for _ in range(a.rounds):
            for name, (job, eb) in jobs.items():
                got[name].append(gbs(job, eb))
        print(f"  {fmt:6s} " + "  ".join(f"{name} {statistics.median(v):5.1f}" for name, v in got.items()))


if __name__ == "__main__":
    main()
