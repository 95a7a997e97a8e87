"""A decode layer of the CPU step with its two residual adds inside the kernels (attention_step's
`residual`, moe_routed's `fresh` / `resid`, as executor/cpu_step.py calls them) against the same kernels
with the adds and the zeroing as numpy calls between them (as before), interleaved in one process:

    python benchmarks/bench_residual_adds.py [--dir /tmp/moe-offload-bench] [--rounds 20]

On an overhead-bound model each numpy call is ~1.3-1.6 us of a ~60-85 us layer; across processes this
VM's spells (+-10-30%) hide that, so the two ways run in alternating blocks of 400 layers and the
median of the paired ratios is printed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import executor  # noqa: E402,F401  (first: sets OMP_WAIT_POLICY before torch loads OpenMP)
from executor import cpu_experts as CE  # noqa: E402
from executor import kernels as K  # noqa: E402
from executor.dense_kernels import attention_step, norm_route  # noqa: E402
from calibration.local import ensure_model  # noqa: E402
from executor.runner import Runner, default_prompts  # noqa: E402
from specs.plan import Placement, Plan  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/moe-offload-bench", help="where `tiny` is made once")
    ap.add_argument("--rounds", type=int, default=20)
    a = ap.parse_args()
    plan = Plan(placement=Placement(engram="none", dense="cpu"), cpu_threads=2, streams=1)
    r = Runner(plan, ensure_model("tiny", a.dir, engram=False), 600)
    r.generate(default_prompts(1, 16, r.c.vocab), 64)  # compiled, pages mapped, caches at 80 tokens
    cs, ex = r.cpu, r.experts
    p0, n = 100, 1
    a_, h, y, eid, w, act = cs._buffers(1)
    cos, sin = cs.cos[p0:p0 + n], cs.sin[p0:p0 + n]
    x = r.dense.embed_np(np.array([[5]]))
    nthr = numba.get_num_threads()
    L = r.c.n_layers

    def numpy_adds(i):
        pre, mid, wo = cs.att[i]
        attention_step(x, *pre, cos, sin, *mid, p0, n, *wo, a_, False)
        x.__iadd__(a_)
        norm_route(x, *cs.route[i], h, eid, w)
        args, eb = ex.moe_args[i]
        y.fill(0.0)
        CE.moe_routed(*args, h, eid, w, ex.all_experts, act, y, eb, K.SERIAL_BYTES_HOT, nthr, False, y[:0])
        x.__iadd__(y)
        np.multiply(x, 0.5, out=x)  # keeps the residual bounded over thousands of layers

    def in_kernels(i):
        pre, mid, wo = cs.att[i]
        attention_step(x, *pre, cos, sin, *mid, p0, n, *wo, a_, True)
        norm_route(x, *cs.route[i], h, eid, w)
        args, eb = ex.moe_args[i]
        CE.moe_routed(*args, h, eid, w, ex.all_experts, act, y, eb, K.SERIAL_BYTES_HOT, nthr, True, x)
        np.multiply(x, 0.5, out=x)

    ways = {"numpy adds": numpy_adds, "in the kernels": in_kernels}
    for f in ways.values():
        for i in range(2 * L):
            f(i % L)
    us: dict[str, list[float]] = {k: [] for k in ways}
    for rnd in range(a.rounds):
        for name in (list(ways) if rnd % 2 == 0 else list(ways)[::-1]):
            t = time.perf_counter()
            for it in range(400):
                ways[name](it % L)
            us[name].append((time.perf_counter() - t) / 400 * 1e6)
    for k, v in us.items():
        print(f"{k:15s} median {statistics.median(v):6.2f} us a layer, best {min(v):6.2f}")
    ratio = statistics.median(b / a for a, b in zip(us["numpy adds"], us["in the kernels"]))
    print(f"in the kernels / numpy adds, paired: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
