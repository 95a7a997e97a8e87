"""Where a decode token's CPU expert job spends its cycles, for this tree's executor and other checkouts', side by side.

    python benchmarks/bench_expert_job.py [--model FILE.gguf] [--tokens 30] [--root CHECKOUT ...]

One token of top-k random experts through every layer of the model (default `small-q4`, made in
/tmp/moe-offload-bench if missing), whole experts per thread on 2 threads, as cpu_experts._moe runs a decode
layer, with the cycle counter read between the parts: a thread's gate + up products, its SwiGLU and
quantising, its down products; the serial part before the parallel region (quantising the token, gathering its
copies: cpu_experts._moe_prep), the region, how late the later thread starts in it and how far apart the two
finish. The layer is written out here with the timers (the products, SwiGLU and quantising are the package's
own functions). Each --root (a checkout, e.g. `git worktree add /tmp/old REV`) is imported as a second copy of
the executor and the packages run a token each in turn, so a bus spell falls on all of them alike. Printed per
package: expert GB/s (median token), then thousands of cycles a layer.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic
from numba.typed import List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import executor  # noqa: E402,F401  (first: sets OMP_WAIT_POLICY before torch loads OpenMP)
from executor import cpu_experts as CE0  # noqa: E402
from executor import kernels as K0  # noqa: E402
from executor.gguf_model import GGUFModel  # noqa: E402
from executor.make_model import make_model  # noqa: E402

THREADS = 2
PARTS = ("gate+up", "silu+quant", "down")


@intrinsic
def rdtsc(typingctx):
    """The time-stamp counter (llvm.readcyclecounter)."""
    def gen(context, builder, sig, args):
        f = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=ir.FunctionType(ir.IntType(64), []))
        return builder.call(f, [])
    return types.int64(), gen


def other_executor(root: str, names=("kernels", "cpu_experts", "simd")):
    """The executor package of checkout `root`, imported beside this tree's: its modules `names` (default (kernels,
    cpu_experts, simd))."""
    mine = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "executor" or k.startswith("executor.")}
    sys.path.insert(0, root)
    try:
        mods = tuple(importlib.import_module(f"executor.{m}") for m in names)
    finally:
        sys.path.pop(0)
        tag = f"executor@{root}"
        for k in [k for k in list(sys.modules) if k == "executor" or k.startswith("executor.")]:
            sys.modules[tag + k[len("executor"):]] = sys.modules.pop(k)
        sys.modules.update(mine)
    return mods


def timed_token(K, CE, silu_mul):
    """A compiled token through every layer, the parts of each decode layer timed into T [THREADS, 8]."""
    # the executor's products: through kernel_table's C functions where the checkout has them, else compiled in
    rows_matmul = getattr(K, "table_rows_matmul", None) or K._rows_matmul

    if "ints" in inspect.signature(K.panels.py_func).parameters:  # from session 31
        @njit
        def panels(x, x16, dx):
            return K.panels(x, x16, dx, False, False)
    else:
        @njit
        def panels(x, x16, dx):
            return K.panels(x, False)

    @njit(fastmath=True)
    def expert(e, gd, gc, ud, uc, dd, dc, F, H, xg, x16, dx, out, T, t):
        c0 = rdtsc()
        g, u = np.empty((1, F), np.float32), np.empty((1, F), np.float32)
        P = panels(xg, x16, dx)
        rows_matmul(gc, gd[e], 0, F, gd.shape[1] // F, xg, x16, dx, P, g, 0)
        rows_matmul(uc, ud[e], 0, F, ud.shape[1] // F, xg, x16, dx, P, u, 0)
        c1 = rdtsc()
        silu_mul(g[0], u[0])
        a16, da = K._quant_rows(g)
        c2 = rdtsc()
        y = np.empty((1, H), np.float32)
        rows_matmul(dc, dd[e], 0, H, dd.shape[1] // H, g, a16, da, panels(g, a16, da), y, 0)
        c3 = rdtsc()
        for h in range(H):
            out[0, h] += y[0, h]
        T[t, 0] += c1 - c0
        T[t, 1] += c2 - c1
        T[t, 2] += c3 - c2

    @njit
    def csr(ex):  # one token's top-k experts as a CSR list
        return ex, np.arange(ex.shape[0] + 1), np.zeros(ex.shape[0], np.int64)

    if "fused" in inspect.signature(CE._moe_prep.py_func).parameters:  # from session 20
        @njit
        def prep(x, ex):
            return CE._moe_prep(x, *csr(ex), 64)
    else:
        @njit
        def prep(x, ex):
            return CE._moe_prep(x, *csr(ex))

    @njit(parallel=True)
    def layer(gd, gc, ud, uc, dd, dc, F, H, x, ex, out, T):
        c0 = rdtsc()
        xg, x16, dx = prep(x, ex)[:3]
        c1 = rdtsc()
        part = np.zeros((THREADS, 1, H), np.float32)
        for t in prange(THREADS):
            s = rdtsc()
            T[t, 6] = s - c1
            for j in range(t, ex.shape[0], THREADS):
                expert(ex[j], gd, gc, ud, uc, dd, dc, F, H, xg[j:j + 1], x16[j:j + 1], dx[j:j + 1], part[t], T, t)
            T[t, 7] = rdtsc() - s
        c2 = rdtsc()
        T[0, 3] += c1 - c0
        T[0, 4] += c2 - c1
        T[0, 5] += max(T[0, 6], T[1, 6])
        T[1, 5] += abs(T[0, 7] - T[1, 7])
        for t in range(THREADS):
            out += part[t]

    @njit
    def token(gate, up, down, codes, F, H, x, experts, out, T):
        for i in range(len(gate)):
            layer(gate[i], codes[i, 0], up[i], codes[i, 1], down[i], codes[i, 2], F, H, x, experts[i], out, T)
    return token


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF MoE model (default: small-q4 in /tmp/moe-offload-bench)")
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--root", action="append", default=[], help="another checkout to time beside this tree")
    a = ap.parse_args()
    path = Path(a.model) if a.model else Path("/tmp/moe-offload-bench/small-q4.gguf")
    if not path.exists():
        make_model("small-q4", path)
    K0.set_threads(THREADS)
    packages = {"this tree": (K0, CE0, sys.modules["executor.simd"])}
    packages.update({root: other_executor(root) for root in a.root})
    m = GGUFModel(path)
    c = m.cfg
    W = [tuple(m.experts(i, p) for p in ("gate", "up", "down")) for i in range(c.n_layers)]
    lists = tuple(List([K0.flat(w[j]) for w in W]) for j in range(3))
    codes = np.array([[w.code for w in ws] for ws in W], np.int64)
    nbytes = c.top_k * sum(m.expert_bytes(i) for i in range(c.n_layers))
    F, H = W[0][0].rows, W[0][2].rows
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, c.hidden)).astype(np.float32)
    out = np.zeros((1, H), np.float32)
    for i in range(c.n_layers):  # map every page once
        CE0.moe_cpu(*W[i], x, *CE0.csr(np.arange(c.n_experts)[None, :], np.ones((1, c.n_experts), np.float32)))

    def routes():
        return List([rng.choice(c.n_experts, c.top_k, replace=False) for _ in range(c.n_layers)])

    tokens = {name: timed_token(K, CE, simd.silu_mul) for name, (K, CE, simd) in packages.items()}
    T = {name: np.zeros((THREADS, 8), np.int64) for name in tokens}
    dts: dict[str, list[float]] = {name: [] for name in tokens}
    for name, tok in tokens.items():  # compile
        tok(*lists, codes, F, H, x, routes(), out, T[name])
        T[name][:] = 0
    for _ in range(a.tokens):
        for name, tok in tokens.items():
            r = routes()
            t0 = time.perf_counter()
            tok(*lists, codes, F, H, x, r, out, T[name])
            dts[name].append(time.perf_counter() - t0)
    L = a.tokens * c.n_layers
    print(f"{path.name}: {c.n_layers} layers, top-{c.top_k} of {c.n_experts}, {THREADS} threads, "
          f"{a.tokens} tokens each")
    for name, t in T.items():
        k = lambda v: f"{v / L / 1e3:.0f}"  # noqa: E731
        parts = ", ".join(f"{p} {k(t[0, i])} / {k(t[1, i])}" for i, p in enumerate(PARTS))
        print(f"  {name}: {nbytes / np.median(dts[name]) / 1e9:.1f} GB/s; k cycles a layer: {parts} (thread 0 / 1); "
              f"serial prep {k(t[0, 3])}, region {k(t[0, 4])}, later thread's start {k(t[0, 5])}, "
              f"finishes apart {k(t[1, 5])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
