"""The decode rows on int8 activations (an int8 build's: `execute --gemm-int8`) against the default build's int16 rows,
side by side in one process, for the K-quants and IQ4_XS (kquants_vnni.py against kquants.py / iquants.py):

    python benchmarks/bench_int8_rows.py [--types Q4_K Q6_K Q5_K Q3_K Q2_K IQ4_XS] [--rounds 200]   # one core, in L2
    python benchmarks/bench_int8_rows.py --dram [--types Q4_K ...] [--rounds 15]                # two threads, DRAM

In L2: a `small` expert matrix (768 x 2048), 1 / 2 / 4 tokens a pass (the token rows, the pairs' 4-row groups, the
fours' 2-row groups), each kernel's median over five spells of rounds / 5 calls, the two kernels' spells alternating,
in G token-weights/s. --dram: 192 Ki rows of 2048
(158-300 MB: past the last-level cache), one token, split over two threads, each variant once a round in turn;
medians of GB/s of rows read. Needs AVX-512 VNNI (the int8 rows' `vpdpbusd`). Synthetic rows: calibrate's.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import executor  # noqa: E402,F401  (first: sets OMP_WAIT_POLICY before torch loads OpenMP)
from executor import iquants, kquants, vnni  # noqa: E402
from executor.kernels import _quant_rows  # noqa: E402
from executor.kquants_vnni import k_vnni_kernel  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_qgemm import median_s, rows_of  # noqa: E402


def int8_rows(x: np.ndarray):
    """lanes8's activations of the float tokens x [T, C] -> (x16 [T, C], unread by the int8 rows, DX)."""
    return np.zeros(x.shape, np.int16), vnni.lanes8_rows(x)


def _int16(name: str, kernel: str):
    """The default build's int16 row kernel `kernel` (e.g. rows2_q4_k) of type `name`: kquants.py's, IQ4_XS's iquants.py's."""
    return getattr(iquants if name.startswith("IQ") else kquants, kernel)


def _loop(kernel, NR: int, MT: int, nogil: bool = False):
    """A numba loop running `kernel` over rows [r0, r1) of w, MT tokens at a time from k0 = 0."""
    @njit(nogil=nogil)
    def run(w, r0, r1, rb, x16, dx, out):
        nb = np.int64(x16.shape[1] // 32)
        for k0 in range(0, x16.shape[0], MT):
            r = r0
            while r + NR <= r1:
                kernel(w, np.int64(r * rb), np.int64(rb), x16, dx, np.int64(k0), nb, out, np.int64(r))
                r += NR
    return run


# (tokens, int16 rows a pass and kernel name, int8 rows a pass): row_products' groups of each token count
_SHAPES = ((1, 2, "rows2_{}", 2), (2, 2, "rows2x2_{}", 2), (4, 2, "rows2x4_{}", 2))


def bench_l2(types, rounds: int) -> None:
    rng = np.random.default_rng(0)
    rows, cols = 768, 2048
    for name in types:
        raw = rows_of(name, rows, cols, rng)
        w, rb = raw.reshape(-1), raw.shape[1]
        for MT, n16, k16, n8 in _SHAPES:
            x = rng.standard_normal((MT, cols)).astype(np.float32)
            out = np.zeros((MT, rows), np.float32)
            (x16, dx), (a16, adx) = _quant_rows(x), int8_rows(x)
            f16 = _loop(_int16(name, k16.format(name.lower())), n16, MT)
            f8 = _loop(k_vnni_kernel(n8, MT, name.lower()), n8, MT)
            t16s, t8s = [], []
            for _ in range(5):  # alternating spells, so that the host's drift falls on both alike
                t16s.append(median_s(lambda: f16(w, 0, rows, rb, x16, dx, out), max(1, rounds // 5)))
                t8s.append(median_s(lambda: f8(w, 0, rows, rb, a16, adx, out), max(1, rounds // 5)))
            t16, t8 = float(np.median(t16s)), float(np.median(t8s))
            g = rows * cols * MT / 1e9
            print(f"{name} {MT} token{'s' if MT > 1 else ' '}  int16 {g / t16:5.1f}  int8 {g / t8:5.1f} G token-weights/s"
                  f"  int8 / int16 {t16 / t8:4.2f}", flush=True)


def bench_dram(types, rounds: int) -> None:
    rng = np.random.default_rng(1)
    rows, cols = 768 * 256, 2048
    for name in types:
        raw = rows_of(name, rows, cols, rng)
        w, rb = raw.reshape(-1), raw.shape[1]
        x = rng.standard_normal((1, cols)).astype(np.float32)
        out = np.zeros((1, rows), np.float32)
        (x16, dx), (a16, adx) = _quant_rows(x), int8_rows(x)
        variants = [("int16, 2 rows a pass", _loop(_int16(name, f"rows2_{name.lower()}"), 2, 1, True), x16, dx)]
        variants += [(f"int8, {n} row{'s' if n > 1 else ''} a pass", _loop(k_vnni_kernel(n, 1, name.lower()), n, 1, True),
                      a16, adx) for n in (2, 1)]

        def run(f, xa, da):
            half = rows // 2
            th = [threading.Thread(target=f, args=(w, i * half, (i + 1) * half, rb, xa, da, out)) for i in range(2)]
            t0 = time.perf_counter()
            for t in th:
                t.start()
            for t in th:
                t.join()
            return time.perf_counter() - t0
        for _, f, xa, da in variants:
            run(f, xa, da)  # compile, warm
        times = {v[0]: [] for v in variants}
        for _ in range(rounds):
            for label, f, xa, da in variants:
                times[label].append(run(f, xa, da))
        for label, ts in times.items():
            print(f"{name} {label}: {w.nbytes / np.median(ts) / 1e9:5.1f} GB/s ({w.nbytes / 1e6:.0f} MB, 2 threads)",
                  flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--types", nargs="+", default=["Q4_K", "Q6_K", "Q5_K", "Q3_K", "Q2_K", "IQ4_XS"])
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--dram", action="store_true", help="one token from DRAM on two threads")
    a = ap.parse_args()
    if not vnni.HAVE_VNNI512:
        sys.exit("bench_int8_rows.py: the int8 rows need AVX-512 VNNI; this CPU has none")
    if a.dram:
        bench_dram(a.types, a.rounds or 15)
    else:
        bench_l2(a.types, a.rounds or 200)


if __name__ == "__main__":
    main()
