"""Is the CPU expert kernel bound by its memory access pattern or by its arithmetic? The same bytes read
three ways, side by side, two threads, page-cached `small-q4` (or `small`: Q8_0):

    python benchmarks/bench_expert_access.py [--preset small-q4|small] [--dir /tmp/moe-offload-bench] [--rounds 5]

Per round, a decode step's routes (top-k random experts of every layer, whole experts per thread as the
executor's decode runs them): one byte of every block touched in the kernel's order (8 rows a block
step) without software prefetch, the same with the kernel's prefetch of the next row group, and the
kernel itself; beside the machine's read bandwidth (kernels.read_bandwidth, one pass). If the touch
with prefetch reads near the bandwidth while the kernel reads less, the kernel's arithmetic is the
limit, not the pattern.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import executor  # noqa: E402,F401  (first: sets OMP_WAIT_POLICY before torch loads OpenMP)
from executor import cpu_experts as CE  # noqa: E402
from executor import kernels as K  # noqa: E402
from executor.gguf_model import GGUFModel  # noqa: E402
from calibration.local import ensure_model  # noqa: E402

GROUP = 8  # rows a block step, as simd.rows8_*


@intrinsic
def _prefetch(typingctx, arr, off):
    """llvm.prefetch of arr's byte `off` (read, into L1), as simd.py's kernels issue it."""
    def gen(context, builder, sig, args):
        data = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=args[0]).data
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
            ir.VoidType(), [ir.IntType(8).as_pointer()] + [ir.IntType(32)] * 3), "llvm.prefetch.p0i8")
        i32 = lambda v: ir.Constant(ir.IntType(32), v)  # noqa: E731
        builder.call(fn, [builder.gep(data, [args[1]]), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
    return types.none(arr, off), gen


@njit(nogil=True)
def _touch_matrix(w, rows, bs, pf):
    """Sum of one byte of every block of a matrix (flat bytes w, `rows` rows of bs-byte blocks), GROUP
    rows a block step; pf: prefetch the next row group linearly, one line per 64 bytes of the step."""
    rb = w.shape[0] // rows
    s = np.uint64(0)
    for g in range(0, rows, GROUP):
        nxt = (g + GROUP) * rb
        for b in range(rb // bs):
            if pf:
                for i in range(0, GROUP * bs, 64):
                    _prefetch(w, np.int64(min(nxt + b * GROUP * bs + i, w.shape[0] - 1)))
            for k in range(GROUP):
                s += w[(g + k) * rb + b * bs + 2]
    return s


@njit(parallel=True)
def _touch(gate, up, down, experts, rows_in, rows_out, bs, pf):
    """_touch_matrix over the experts' three matrices, experts dealt to 2 threads in turn."""
    tot = np.zeros(2, np.uint64)
    for t in prange(2):
        s = np.uint64(0)
        for j in range(t, experts.shape[0], 2):
            e = experts[j]
            s += (_touch_matrix(gate[e], rows_in, bs, pf) + _touch_matrix(up[e], rows_in, bs, pf)
                  + _touch_matrix(down[e], rows_out, bs, pf))
        tot[t] = s
    return tot


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", choices=("small-q4", "small"), default="small-q4")
    ap.add_argument("--dir", default="/tmp/moe-offload-bench", help="where the model is made once")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    path = ensure_model(a.preset, a.dir, engram=False)
    K.set_threads(2)
    with open(path, "rb") as f:  # into the page cache
        while f.read(1 << 24):
            pass
    m = GGUFModel(path)
    c = m.cfg
    W = [tuple(m.experts(i, p) for p in ("gate", "up", "down")) for i in range(c.n_layers)]
    bs = 18 if W[0][0].code == K.Q4_0 else 34
    flat = [tuple(K.flat(w) for w in Wi) for Wi in W]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c.hidden)).astype(np.float32)
    nbytes = c.n_layers * c.top_k * m.expert_bytes(0)
    pool = np.ones(1 << 27, np.uint64)  # 1 GiB
    _touch(*flat[0], np.arange(2), W[0][0].rows, W[0][2].rows, bs, True)  # compile
    for i in range(c.n_layers):  # the kernel compiled or loaded, every page mapped once
        CE.moe_cpu(*W[i], x, *CE.csr(np.arange(c.n_experts)[None, :], np.ones((1, c.n_experts), np.float32)))
    print(f"{path.name}: GB/s of expert bytes, 2 threads, {a.rounds} rounds")
    rows = []
    for _ in range(a.rounds):
        routes = [rng.choice(c.n_experts, c.top_k, replace=False) for _ in range(c.n_layers)]
        got = [K.read_bandwidth(pool=pool, repeat=1)]
        for pf in (False, True):
            t = time.perf_counter()
            for i in range(c.n_layers):
                _touch(*flat[i], routes[i], W[i][0].rows, W[i][2].rows, bs, pf)
            got.append(nbytes / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        for i in range(c.n_layers):
            CE.moe_cpu(*W[i], x, *CE.csr(routes[i][None, :], np.full((1, c.top_k), 1 / c.top_k, np.float32)))
        got.append(nbytes / (time.perf_counter() - t) / 1e9)
        rows.append(got)
        print("  read {:.1f} | touch {:.1f} | touch + prefetch {:.1f} | kernel {:.1f}".format(*got))
    med = np.median(np.array(rows), axis=0)
    print("medians: read {:.1f} GB/s; touch {:.1f} ({:.0%}); touch + prefetch {:.1f} ({:.0%}); kernel {:.1f} ({:.0%})"
          .format(med[0], med[1], med[1] / med[0], med[2], med[2] / med[0], med[3], med[3] / med[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
