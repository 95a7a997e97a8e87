"""Rows per pass of the decode kernels, from DRAM: the executor's int16 row kernels computing 2, 4 or 8
rows at once (Q4_K / Q6_K: 2 or 4), each prefetching its next group, whole experts per thread on 2 threads,
as the executor's decode runs them, on a synthetic expert pool larger than the last-level cache:

    python benchmarks/bench_q8_rows.py [--fmt Q8_0|Q4_0|Q4_K|Q6_K] [--hidden 2048] [--ffn 768] [--rounds 12]
                                       [--layers 24] [--l2 [--threads 2]]

Each round reads 1 GiB first (kernels.read_bandwidth) and runs every variant once on routes of its own,
in rotating order, a token's worth of experts a call (top-k drawn for each of `layers` layers; one layer a
call, before session 16, timed each call's start-up as well, so its percentages of the read were low, its
ratios between variants alike); printed: each variant's median GB/s of expert bytes, its median per-round
ratio to the most rows, and the read. Why row_products.rows_token computes Q8_0 2 rows a pass, Q4_0 8 (2 with
AVX-512 VNNI: session 54) and the K-quants 2 (session 16, 2 rows against 4: Q4_K 1.00-1.05x, Q6_K 1.02-1.20x, the
most while slow).
--l2: the kernels' arithmetic alone, one core, 128 rows of one expert's gate in L2 (1 row a pass too).
--l2 --tokens T (K-quants): T tokens a pass, 2 and 4 rows (the fused rows of prefill and several streams), in
G token-weights/s.
--l2 --threads N: the same loop on 1 and on N threads (each its own copy of the rows, in its own L2),
alternating rounds, Q8_0 / Q4_0 only: the arithmetic ceiling of N threads and how it scales
(decode_l2_scaling; bench_executor.py times DecodeRowsL2 beside the kernel bars).
Q4_0 on an AVX-512 VNNI CPU: the executor's VNNI rows (vnni.py), and simd.py's int16 8 rows beside them.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit, prange

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import executor  # noqa: E402,F401  (first: sets OMP_WAIT_POLICY before torch loads OpenMP)
from calibration.bench_kernel import _ROW_BYTES, _synth_tensor  # noqa: E402
from executor import kernels as K  # noqa: E402
from executor import iquants, kquants, simd, vnni  # noqa: E402
from executor import row_products as RP  # noqa: E402

THREADS = 2


def runner(kernel, nr: int):
    """A compiled token of whole experts per thread: gate, up (ffn rows) and down (hidden rows) of each."""
    @njit(nogil=True)
    def matvec(w, rows, x16, dx, out):  # one matrix's product with the token, `nr` rows a kernel call
        rb = np.int64(w.shape[0] // rows)
        nb = np.int64(x16.shape[1] // 32)
        for r in range(0, rows, nr):
            kernel(w, np.int64(r * rb), rb, x16, dx, 0, nb, out, np.int64(r))

    @njit(parallel=True)
    def run(gate, up, down, experts, ffn, hidden, x16, dx, h16, dh, og, od):
        for t in prange(THREADS):
            for j in range(t, experts.shape[0], THREADS):
                e = experts[j]
                matvec(gate[e], ffn, x16, dx, og[t:t + 1])
                matvec(up[e], ffn, x16, dx, og[t:t + 1])
                matvec(down[e], hidden, h16, dh, od[t:t + 1])
    return run


def in_l2(kernel, nr: int):
    """A compiled loop of `reps` passes over `rows` rows of w on the calling thread (w small: in L2).

    The row loop is written out here, not called through runner's `matvec`: called a product at a time (session 16's
    last commit to 17), Q4_0 4 rows a pass timed 0.97-0.98x 8 rows, where this loop times 0.76-0.86x, real
    `small-q4` rows in the same loop 0.78-0.86x, and the executor itself runs 8 rows at 1.08-1.13x 4 rows
    (`bench_executor.py`, alternating checkouts, session 17)."""
    @njit(nogil=True)
    def loop(w, rows, x16, dx, out, reps):
        rb = np.int64(w.shape[0] // rows)
        nb = np.int64(x16.shape[1] // 32)
        for _ in range(reps):
            for r in range(0, rows, nr):
                kernel(w, np.int64(r * rb), rb, x16, dx, 0, nb, out, np.int64(r))
    return loop


def in_l2_threads(kernel, nr: int):
    """in_l2's loop on each of ws.shape[0] threads at once, thread t over its own copy ws[t] of the rows."""
    loop = in_l2(kernel, nr)

    @njit(parallel=True, nogil=True)
    def par(ws, rows, x16, dx, outs, reps):
        for t in prange(ws.shape[0]):
            loop(ws[t], rows, x16, dx, outs[t], reps)
    return par


class DecodeRowsL2:
    """The executor's one-token rows for `fmt` (its largest row group in row_products.rows_token: Q8_0 2 rows a
    pass, Q4_0 8, or 2 with AVX-512 VNNI) over `rows` rows in L2, each thread its own copy: the arithmetic ceiling of
    a decode kernel, nothing read from DRAM.
    Called with n threads -> G weights/s (~20 ms a call); `gbs_per_gw`: GB/s of `fmt` bytes per G weights/s."""

    def __init__(self, fmt: str, threads: int, hidden: int = 2048, rows: int = 128):
        rng = np.random.default_rng(0)
        nr, kernel = RP._TOKEN[RP.Q4_0 if fmt == "Q4_0" else RP.Q8_0][0]
        w = np.ascontiguousarray(_synth_tensor(fmt, 1, rows, hidden, rng).data.reshape(-1))
        self.ws = np.ascontiguousarray(np.broadcast_to(w, (threads, w.size)))
        self.x16, self.dx = K._quant_rows(rng.standard_normal((1, hidden)).astype(np.float32))
        self.outs = np.zeros((threads, 1, rows), np.float32)
        self.rows, self.reps = rows, max(1, int(2e8 // w.nbytes))
        self.gbs_per_gw = _ROW_BYTES[fmt](hidden) / hidden
        self.par = in_l2_threads(kernel, nr)
        self.par(self.ws[:1], rows, self.x16, self.dx, self.outs, 1)  # compile

    def __call__(self, n: int) -> float:
        t = time.perf_counter()
        self.par(self.ws[:n], self.rows, self.x16, self.dx, self.outs, self.reps)
        return n * self.reps * self.rows * self.x16.shape[1] / (time.perf_counter() - t) / 1e9


def decode_l2_scaling(fmt: str, threads: int, hidden: int = 2048, rounds: int = 8) -> dict:
    """DecodeRowsL2 on 1 and `threads` threads, alternating rounds -> medians {'one', 'all': G weights/s,
    'scaling': per-round ratio all / one, 'gbs': the `threads` threads' rate in GB/s of `fmt` bytes}."""
    probe = DecodeRowsL2(fmt, threads, hidden)
    r: dict[int, list[float]] = {1: [], threads: []}
    for i in range(rounds):
        for n in ((1, threads) if i % 2 == 0 else (threads, 1)):
            r[n].append(probe(n))
    all_ = float(np.median(r[threads]))
    return {"one": float(np.median(r[1])), "all": all_, "scaling": per_round_ratio(r[threads], r[1]),
            "gbs": all_ * probe.gbs_per_gw}


def per_round_ratio(v: list[float], ref: list[float]) -> float:
    """Median of the per-round ratios v / ref (rounds ran side by side)."""
    return float(np.median(np.array(v) / np.array(ref)))


def l2_rates(kernels: dict, w: np.ndarray, rows: int, x16, dx, rounds: int) -> dict[str, list[float]]:
    """G (token-)weights/s of each kernel {label: (kernel, rows a pass)} on one core, `rows` rows of w in L2 and
    the x16.shape[0] tokens of x16 (each kernel's tokens a pass), rotating order."""
    loops = {name: in_l2(k, nr) for name, (k, nr) in kernels.items()}
    out = np.zeros((x16.shape[0], rows), np.float32)
    reps = max(1, int(2e8 // w.nbytes))
    for loop in loops.values():  # compile
        loop(w, rows, x16, dx, out, 1)
    rates: dict[str, list[float]] = {name: [] for name in loops}
    order = list(loops)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            t = time.perf_counter()
            loops[name](w, rows, x16, dx, out, reps)
            rates[name].append(reps * rows * x16.size / (time.perf_counter() - t) / 1e9)
    return rates


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fmt", choices=("Q8_0", "Q4_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"),
                    default="Q8_0")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--layers", type=int, default=24, help="layers of top-k experts a call (a token)")
    ap.add_argument("--l2", action="store_true", help="one core, 128 rows of one expert's gate in L2 (compute)")
    ap.add_argument("--threads", type=int, default=1, help="with --l2: also on this many threads, alternating")
    ap.add_argument("--tokens", type=int, default=1, help="with --l2 and a K-quant: tokens a pass (the fused rows)")
    a = ap.parse_args()
    if a.tokens > 1 and not (a.l2 and a.fmt.endswith("_K")):
        ap.error("--tokens T: with --l2 and a K-quant --fmt only")
    if a.threads > 1 and not (a.l2 and a.fmt in ("Q8_0", "Q4_0")):
        ap.error("--threads N: with --l2 and --fmt Q8_0 or Q4_0 only (the executor's decode rows)")
    if a.threads > 1:
        K.set_threads(a.threads)
        s = decode_l2_scaling(a.fmt, a.threads, a.hidden, a.rounds)
        print(f"{a.fmt} decode rows in L2: 1 thread {s['one']:.1f}, {a.threads} threads {s['all']:.1f} G weights/s "
              f"({s['scaling']:.2f}x, median of per-round ratios) = {s['gbs']:.1f} GB/s of {a.fmt} bytes")
        return 0
    K.set_threads(THREADS)
    rng = np.random.default_rng(0)
    h, f, k = a.hidden, a.ffn, a.top_k
    eb = 2 * f * _ROW_BYTES[a.fmt](h) + h * _ROW_BYTES[a.fmt](f)
    pool = max(4 * k, (1 << 30) // eb)  # 1 GiB of experts: far beyond the last-level cache
    w = [t.data.reshape(pool, -1) for t in (_synth_tensor(a.fmt, pool, f, h, rng), _synth_tensor(a.fmt, pool, f, h, rng),
                                            _synth_tensor(a.fmt, pool, h, f, rng))]
    x16, dx = K._quant_rows(rng.standard_normal((1, h)).astype(np.float32))  # int16 activations, as decode
    h16, dh = K._quant_rows(rng.standard_normal((1, f)).astype(np.float32))
    og, od = np.zeros((THREADS, f), np.float32), np.zeros((THREADS, h), np.float32)
    if a.fmt in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"):
        gen, slow = {"Q2_K": (kquants._rows_q2_k_ir, kquants._slow_q2_k),
                     "Q3_K": (kquants._rows_q3_k_ir, kquants._slow_q3_k),
                     "Q4_K": (kquants._rows_q4_k_ir, kquants._slow_q4_k),
                     "Q5_K": (kquants._rows_q5_k_ir, kquants._slow_q5_k),
                     "Q6_K": (kquants._rows_q6_k_ir, kquants._slow_q6_k)}[a.fmt]
        kernels = ({f"{nr} rows": (kquants._k_kernel(gen, slow, nr, 1), nr) for nr in (4, 2, 1)} if a.tokens == 1 else
                   {f"{nr} rows x {a.tokens} tokens": (kquants._k_kernel(gen, slow, nr, a.tokens), nr) for nr in (4, 2)})
    elif a.fmt in ("IQ4_NL", "IQ4_XS"):
        gen, slow = {"IQ4_NL": (iquants._rows_iq4_ir, iquants._slow_iq4_nl),
                     "IQ4_XS": (iquants._rows_iq4_xs_ir, iquants._slow_iq4_xs)}[a.fmt]
        kernels = {f"{nr} rows": (kquants._k_kernel(gen, slow, nr, 1), nr) for nr in (4, 2, 1)}
    elif a.fmt == "Q4_0" and vnni.HAVE_VNNI512:  # the executor's VNNI rows, beside simd.py's int16 ones
        kernels = {f"{nr} rows (VNNI)": (vnni.vnni_kernel(nr, 1), nr) for nr in (8, 4, 2, 1)}
        kernels["8 rows (int16)"] = (simd._qkernel(True, 8, 1), 8)
    else:
        kernels = {f"{nr} rows": (simd._qkernel(a.fmt == "Q4_0", nr, 1), nr) for nr in (8, 4, 2, 1)}
    most = next(iter(kernels))  # the ratios' reference: the most rows a pass
    if a.l2:
        rows = 128
        if a.tokens > 1:
            x16, dx = K._quant_rows(rng.standard_normal((a.tokens, h)).astype(np.float32))
        rates = l2_rates(kernels, np.ascontiguousarray(w[0][0][:rows * _ROW_BYTES[a.fmt](h)]), rows, x16, dx, a.rounds)
        print(f"{a.fmt} {rows} rows of {h} in L2, one core, {a.rounds} rounds")
        unit = "G weights/s" if a.tokens == 1 else "G token-weights/s"
        for name, v in rates.items():
            print(f"  {name} a pass: {np.median(v):.2f} {unit}; {per_round_ratio(v, rates[most]):.2f}x {most} "
                  "(median of per-round ratios)")
        return 0
    variants = {name: runner(k, nr) for name, (k, nr) in kernels.items() if nr > 1}
    for run in variants.values():  # compile; every page mapped
        run(*w, np.arange(pool), f, h, x16, dx, h16, dh, og, od)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    reads, order = [], list(variants)
    big = np.ones((1 << 30) // 8, np.uint64)
    for r in range(a.rounds):
        reads.append(K.read_bandwidth(pool=big, repeat=1))
        for name in order[r % len(order):] + order[:r % len(order)]:
            experts = np.concatenate([rng.choice(pool, k, replace=False) for _ in range(a.layers)])
            t = time.perf_counter()
            variants[name](*w, experts, f, h, x16, dx, h16, dh, og, od)
            rates[name].append(experts.size * eb / (time.perf_counter() - t) / 1e9)
    print(f"{a.fmt} experts {h}x{f} (rows of {_ROW_BYTES[a.fmt](h)} B), top-{k}, {THREADS} threads, {a.rounds} rounds; "
          f"read {np.median(reads):.1f} GB/s")
    for name, v in rates.items():
        print(f"  {name} a pass: {np.median(v):.1f} GB/s = {np.median(v) / np.median(reads):.0%} of the read; "
              f"{per_round_ratio(v, rates[most]):.2f}x {most} (median of per-round ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
