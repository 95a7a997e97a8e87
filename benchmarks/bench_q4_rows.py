"""The Q4_0-block decode rows (executor/vnni.py's with AVX-512 VNNI: Q4_0, IQ4_NL, the int8 build's Q4_0; simd.py's
256-bit Q4_0 rows, those of a CPU without it) of this tree against another checkout's, side by side in one process,
one core:

    python benchmarks/bench_q4_rows.py --root CHECKOUT [--cases q4:2:1 iq4:2:1 q4i8:2:1 q4:1:1 q4:8:2 q4:8:4]
                                       [--rounds 15]

A case is kind:rows a pass:tokens (kind q4, iq4 or q4i8: vnni.py's; avx2: simd.py's Q4_0, whose kernels are 8, 4 or 1
rows of 1 token, 4 rows of 2, 8 rows of 4). For `small`'s two expert shapes (2,048 and 768 columns) the rows of one
synthetic matrix run from L2 (512 KiB) and from DRAM (512 MiB), both trees' kernels alternating within a
round so a bus spell falls on both alike; printed: each tree's median GB/s of weight bytes, the median per-round
ratio, and whether both trees gave the same bits (with the largest difference relative to the largest result).
The CHECKOUT is e.g. `git worktree add /tmp/old REV`; its executor is imported beside this tree's
(bench_expert_job.other_executor).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import executor  # noqa: E402,F401  (first: sets OMP_WAIT_POLICY before torch loads OpenMP)
from bench_expert_job import other_executor  # noqa: E402
from executor import kernels as K  # noqa: E402
from executor import simd, vnni  # noqa: E402
from executor.iquants import KVALUES  # noqa: E402

SHAPES = {"L2": 512 << 10, "DRAM": 512 << 20}  # bytes of rows


def row_loop(kernel, NR: int):
    """A compiled loop of `kernel` over R rows of rb bytes, NR a pass."""
    @njit(nogil=True)
    def run(w, R, rb, X16, DX, nb, res):
        for r in range(0, R, NR):
            kernel(w, np.int64(r * rb), np.int64(rb), X16, DX, np.int64(0), nb, res, np.int64(r))
    return run


def activations(x, int8: bool):
    """(X16, DX) of the float tokens x for the rows (this tree's layout, both trees read it): quant16 and the
    split, or (int8) lanes8's."""
    return (np.zeros(x.shape, np.int16), vnni.lanes8_rows(x)) if int8 else K._quant_rows(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", required=True, help="another checkout, e.g. a git worktree of an earlier commit")
    ap.add_argument("--cases", nargs="+", default=["q4:2:1", "iq4:2:1", "q4i8:2:1", "q4:1:1", "q4:8:2", "q4:8:4"])
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    old_vnni, old_simd = other_executor(a.root, ("vnni", "simd"))
    rng = np.random.default_rng(0)
    for case in a.cases:
        kind, NR, MT = case.split(":")
        NR, MT = int(NR), int(MT)
        book, int8 = (tuple(KVALUES) if kind == "iq4" else ()), kind == "q4i8"
        if kind == "avx2":
            runs = {tag: row_loop(S._qkernel(True, NR, MT), NR) for tag, S in (("this", simd), ("root", old_simd))}
        elif vnni.HAVE_VNNI512:
            runs = {tag: row_loop(V.vnni_kernel(NR, MT, book, int8=int8), NR)
                    for tag, V in (("this", vnni), ("root", old_vnni))}
        else:
            print(f"{case}: this CPU has no AVX-512 VNNI (the executor runs simd.py's rows: case avx2:NR:T)")
            continue
        for cols in (2048, 768):
            nb, rb = cols // 32, cols // 32 * 18
            X16, DX = activations(rng.standard_normal((MT, cols)).astype(np.float32), int8)
            for where, nbytes in SHAPES.items():
                R = nbytes // rb // 8 * 8
                w = rng.integers(0, 256, R * rb, dtype=np.uint8)
                w.reshape(R, nb, 18)[:, :, 1] = 0x2C  # fp16 scales of ~0.06
                outs = {}
                for tag, run in runs.items():
                    outs[tag] = np.zeros((MT, R + 8), np.float32)
                    run(w, R, rb, X16, DX, np.int64(nb), outs[tag])
                rel = np.max(np.abs(outs["this"] - outs["root"])) / np.max(np.abs(outs["root"]))
                reps, res = max(1, (64 << 20) // nbytes), np.zeros((MT, R + 8), np.float32)
                gbs = {tag: [] for tag in runs}
                for i in range(a.rounds):
                    for tag in (("this", "root") if i % 2 else ("root", "this")):
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            runs[tag](w, R, rb, X16, DX, np.int64(nb), res)
                        gbs[tag].append(reps * R * rb / (time.perf_counter() - t0) / 1e9)
                ratio = statistics.median(x / y for x, y in zip(gbs["this"], gbs["root"]))
                print(f"{case:9s} {cols:5d} columns, {where:4s}: root {statistics.median(gbs['root']):5.1f}  this "
                      f"{statistics.median(gbs['this']):5.1f} GB/s ({ratio:.2f}x); same bits "
                      f"{np.array_equal(outs['this'], outs['root'])} (largest difference {rel:.1e})", flush=True)


if __name__ == "__main__":
    main()
