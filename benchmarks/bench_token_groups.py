"""The integer GEMM's token groups (qgemm.GROUP_BYTES) against one group of all an expert's tokens.

    python benchmarks/bench_token_groups.py [--types Q4_K Q4_0 Q6_K] [--tokens 64 128 256 512] [--rounds 9]
    python benchmarks/bench_token_groups.py --model small-q4k.gguf [--rounds 7] [--pairs 3]

Kernel (the default): one `small` expert matrix (bench_qgemm.matrix_of: gate / up 768 x 2048, Q6_K the down 2048 x
768) against m tokens on one core, qgemm's GEMM built twice in this process, tokens in groups of GROUP_BYTES of panel
slice and in one group, called alternately; prints each one's GFLOP/s (median of rounds) and its rate at m over its
rate at 128 tokens, where one group's tokens still fit L2.

--model: a pp512 prompt's routed experts through cpu_experts.moe_routed on the model's own routing (one prefill of the
executor, all-CPU), every thread, the kernels built with and without groups in fresh processes
(MOE_OFFLOAD_TOKEN_GROUP_BYTES=0 for one group), `pairs` pairs alternating; prints each process's median time of the
layers' experts and, alternating with it in the process, the same tokens routed uniformly at random (what the
simulator prices: an expert's mean tokens), then the ratios of the medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from executor import qgemm  # noqa: E402
from executor.kernels import _quant_rows, panels  # noqa: E402


@lru_cache(maxsize=None)
def _gemm(code: int, group_bytes: int):
    """qgemm's GEMM of type `code` (a compile-time constant, as in the kernels), tokens in groups of group_bytes."""
    mm = qgemm._q_matmul(qgemm.INT8, qgemm.WIDE, group_bytes)

    @njit(fastmath=True)
    def run(w, rows, rb, P, m, res):
        mm(code, w, 0, rows, rb, P, m, res, 0)
    return run


def kernel(types, tokens, rounds: int) -> None:
    """Each type's matrix at each token count, grouped and one group, alternately (see the module's docstring)."""
    from benchmarks.bench_qgemm import matrix_of
    rng = np.random.default_rng(1)
    print(f"L2 {qgemm.cache_bytes(2)} B, groups of {qgemm.GROUP_BYTES} B of panel slice; one core", flush=True)
    for name in types:
        rows, cols, code, w, rb = matrix_of(name, rng)
        rate = {}
        for m in tokens:
            x = rng.standard_normal((m, cols)).astype(np.float32)
            P = panels(x, *_quant_rows(x), True, True)  # the build's integer panels (int16, or int8: qgemm.INT8)
            res = np.zeros((m, rows), np.float32)
            times = {g: [] for g in (qgemm.GROUP_BYTES, 0)}
            for g in times:
                _gemm(code, g)(w, rows, rb, P, m, res)
            for _ in range(rounds):
                for g, ts in times.items():
                    t = time.perf_counter()
                    _gemm(code, g)(w, rows, rb, P, m, res)
                    ts.append(time.perf_counter() - t)
            rate[m] = {g: 2.0 * rows * cols * m / statistics.median(ts) / 1e9 for g, ts in times.items()}
        for m in tokens:
            r = rate[m]
            rel = {g: r[g] / rate[128][g] for g in r} if 128 in rate else {g: float("nan") for g in r}
            print(f"{name} {rows}x{cols} {m:4d} tokens: groups {r[qgemm.GROUP_BYTES]:6.1f} GFLOP/s ({rel[qgemm.GROUP_BYTES]:.3f}"
                  f" of 128), one group {r[0]:6.1f} ({rel[0]:.3f}); groups / one {r[qgemm.GROUP_BYTES] / r[0]:.3f}")


def routed(model: str, rounds: int) -> dict:
    """The model's pp512 routed experts through moe_routed in this process -> {'median_ms', 'group_bytes'}."""
    import numba
    from executor import cpu_experts as CE
    from executor import kernels as K
    from executor.runner import Runner, default_prompts
    from specs.plan import Plan
    r = Runner(Plan.model_validate({"prefill": {"strategy": "cpu"}}), model, 600)
    c, k, T = r.c, r.k, 512
    r.generate(default_prompts(1, T, c.vocab), 1)
    if r.cpu is not None:
        r.cpu.flush()
    ids = [np.array(rec["routed"], np.int64) for rec in r.trace if rec["phase"] == "prefill"]
    rng = np.random.default_rng(1)
    h = rng.standard_normal((T, c.hidden)).astype(np.float32)
    y, resid = np.empty((T, c.hidden), np.float32), np.zeros((T, c.hidden), np.float32)
    act, w = np.empty((T * k, c.expert_ff), np.float32), np.full((T, k), 1.0 / k, np.float32)
    uniform = [np.argsort(rng.random((T, c.n_experts)), axis=1)[:, :k].astype(np.int64) for _ in ids]
    times = {"own": [], "uniform": []}
    for i in range(rounds + 1):  # the first: warm-up
        for how, routing in (("own", ids), ("uniform", uniform)):
            t = time.perf_counter()
            for layer, e in enumerate(routing):
                args, eb = r.experts.moe_args[layer]
                CE.moe_routed(*args, h, e, w, r.experts.all_experts, act, y, eb, K.SERIAL_BYTES_HOT,
                              numba.get_num_threads(), True, resid)
            if i:
                times[how].append(time.perf_counter() - t)
    return {"median_ms": statistics.median(times["own"]) * 1e3, "group_bytes": qgemm.GROUP_BYTES,
            "own_over_uniform": statistics.median(a / b for a, b in zip(times["own"], times["uniform"]))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["Q4_K", "Q4_0", "Q6_K"])
    ap.add_argument("--tokens", nargs="+", type=int, default=[64, 128, 256, 512])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--model", help="time a pp512 prompt's routed experts of this GGUF instead")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        print(json.dumps(routed(a.model, a.rounds)))
        return 0
    if not a.model:
        from numba import set_num_threads
        set_num_threads(1)
        kernel(a.types, a.tokens, a.rounds)
        return 0
    got, skew = {"groups": [], "one group": []}, {"groups": [], "one group": []}
    for _ in range(a.pairs):
        for mode, env in (("groups", {}), ("one group", {"MOE_OFFLOAD_TOKEN_GROUP_BYTES": "0"})):
            e = {k: v for k, v in os.environ.items() if k != "MOE_OFFLOAD_TOKEN_GROUP_BYTES"} | env
            out = subprocess.run([sys.executable, __file__, "--worker", "--model", a.model, "--rounds", str(a.rounds)],
                                 env=e, capture_output=True, text=True, check=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            got[mode].append(res["median_ms"])
            skew[mode].append(res["own_over_uniform"])
            print(f"{mode}: {got[mode][-1]:.1f} ms, own routing / uniform {skew[mode][-1]:.3f}", flush=True)
    g, o = statistics.median(got["groups"]), statistics.median(got["one group"])
    print(f"{Path(a.model).name} pp512 routed experts: groups {g:.1f} ms, one group {o:.1f} ms (medians of "
          f"{a.pairs}); one group / groups {o / g:.3f}; own routing / uniform: groups "
          f"{statistics.median(skew['groups']):.3f}, one group {statistics.median(skew['one group']):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
