"""Benchmark: what one node of a ggml graph costs on this machine's CPU backend, on 1 and 2 threads.

llama.cpp computes a decode token as one graph: each node's op split over the threads, then a barrier
(ggml-cpu.c, ggml_graph_compute_thread; empty ops such as views are skipped). This times chains of 64 and 512 adds of
`--width` floats through a llama.cpp build's own `ggml_graph_compute_with_ctx` (ctypes; libggml-base.so and
libggml-cpu.so of the build `--ggml-lib` names, as calibrate finds it) and prints the cost per node from the
difference: the op's own work plus, on several threads, the barrier. Each result is checked (the chain's sum).

Run: python benchmarks/bench_ggml_nodes.py --ggml-lib <llama.cpp build>/bin [--width 2048] [--rounds 200]
"""
from __future__ import annotations

import argparse
import ctypes as C
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.ggml_library import find_ggml_cpu  # noqa: E402

GGML_TYPE_F32 = 0


class _InitParams(C.Structure):  # ggml.h: struct ggml_init_params
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]


def _libs(cpu_path: Path):
    base = C.CDLL(str(cpu_path.with_name("libggml-base.so")), mode=C.RTLD_GLOBAL)
    cpu = C.CDLL(str(cpu_path), mode=C.RTLD_GLOBAL)
    for name, res, args in (("ggml_init", C.c_void_p, [_InitParams]),
                            ("ggml_new_tensor_1d", C.c_void_p, [C.c_void_p, C.c_int, C.c_int64]),
                            ("ggml_add", C.c_void_p, [C.c_void_p] * 3),
                            ("ggml_new_graph_custom", C.c_void_p, [C.c_void_p, C.c_size_t, C.c_bool]),
                            ("ggml_build_forward_expand", None, [C.c_void_p, C.c_void_p]),
                            ("ggml_get_data", C.c_void_p, [C.c_void_p]), ("ggml_free", None, [C.c_void_p])):
        f = getattr(base, name)
        f.restype, f.argtypes = res, args
    cpu.ggml_graph_compute_with_ctx.restype = C.c_int
    cpu.ggml_graph_compute_with_ctx.argtypes = [C.c_void_p, C.c_void_p, C.c_int]
    cpu.ggml_cpu_init()
    return base, cpu


def _floats(base, t, n: int) -> np.ndarray:
    return np.ctypeslib.as_array(C.cast(base.ggml_get_data(t), C.POINTER(C.c_float)), (n,))


def chain_us(base, cpu, nodes: int, width: int, threads: int, rounds: int) -> float:
    """Median us to compute a graph of `nodes` chained adds of `width` floats on `threads` threads."""
    ctx = base.ggml_init(_InitParams(64 * width * (nodes + 2) + (16 << 20), None, False))
    try:
        a, b = (base.ggml_new_tensor_1d(ctx, GGML_TYPE_F32, width) for _ in range(2))
        _floats(base, a, width)[:] = 0.0
        _floats(base, b, width)[:] = 1.0
        x = a
        for _ in range(nodes):
            x = base.ggml_add(ctx, x, b)
        gf = base.ggml_new_graph_custom(ctx, max(2048, 2 * nodes), False)
        base.ggml_build_forward_expand(gf, x)
        times = []
        for _ in range(rounds + 1):
            t0 = time.perf_counter()
            if cpu.ggml_graph_compute_with_ctx(ctx, gf, threads) != 0:
                raise RuntimeError("ggml_graph_compute_with_ctx failed")
            times.append(time.perf_counter() - t0)
        got = _floats(base, x, width)
        if not np.all(got == nodes):
            raise RuntimeError(f"the chain of {nodes} adds gave {got[:4]}")
        return float(np.median(times[1:])) * 1e6
    finally:
        base.ggml_free(ctx)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ggml-lib", default="auto", help="a llama.cpp build's libggml-cpu.so or its folder, or auto")
    ap.add_argument("--width", type=int, default=2048, help="floats an add reads twice and writes once")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args(argv)
    path = find_ggml_cpu(a.ggml_lib)
    if path is None:
        print(f"no llama.cpp build found for --ggml-lib {a.ggml_lib}", file=sys.stderr)
        return 2
    base, cpu = _libs(Path(path))
    print(f"{path}, adds of {a.width} floats, median of {a.rounds} graphs")
    for th in a.threads:
        small, big = (chain_us(base, cpu, n, a.width, th, a.rounds) for n in (64, 512))
        print(f"  {th} thread{'s' if th > 1 else ''}: 64 nodes {small:.1f} us, 512 nodes {big:.1f} us: "
              f"{(big - small) / 448:.3f} us a node")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
