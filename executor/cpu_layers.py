"""A run of layers in one numba call: the all-CPU step without Python between the kernels.

CpuStep calls each layer's kernels from Python (attention block, router, routed experts): on `tiny`
that glue and the unboxing of ~40 arguments a layer cost ~60 us of a ~300 us decode token. Where
every layer of the run is plain CPU work (no device slots, no static layer, the `cpu` miss policy;
an Engram add ends a run, since its lookup is Python), `run_layers` does the layers in one call with
the arguments bound once (`LayerTables`: typed lists, cheap to pass) and returns what the trace needs:
routed ids, experts run and the clock at each part's end (clock_gettime(CLOCK_MONOTONIC), the clock
behind time.perf_counter on Linux).

numba compiles the kernels again into this function, with fast-math flags on the float ops of the
fastmath ones (norms, attention, SwiGLU, activation quantisation; the row kernels' own ops are exempt,
simd._EXACT), and LLVM optimises those copies in place: their sums can round differently from the
same kernels called from Python. So this path is not bitwise the general step's, as CpuStep's
per-layer path is: on `tiny` its logits are 1.4-2.2e-4 apart after 5 tokens (of values up to ~4),
with the same tokens and records (tests/executor/test_cpu_step.py checks both).
"""
from __future__ import annotations

import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.typed import List

from . import cpu_experts as CE
from . import experts as X
from .dense_kernels import attention_step, norm_route
from .nbcache import drop_stale_cache

drop_stale_cache(__file__)

CLOCK = getattr(time, "CLOCK_MONOTONIC", None)  # None (Windows): CpuStep keeps its per-layer path
AVAILABLE = CLOCK is not None


@intrinsic
def clock_ns(typingctx):
    """Nanoseconds of clock_gettime(CLOCK_MONOTONIC) (libc's, resolved in the process), as int64."""
    def gen(context, builder, sig, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        ts = cgutils.alloca_once(builder, ir.LiteralStructType([i64, i64]))  # struct timespec
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32, ts.type]), "clock_gettime")
        builder.call(fn, [ir.Constant(i32, CLOCK or 1), ts])
        sec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 0))
        nsec = builder.load(cgutils.gep_inbounds(builder, ts, 0, 1))
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)
    return types.int64(), gen


# meta columns: type codes and rows of Q, K, V, O; of gate, up, down; expert rows F, hidden H; bytes of an expert
CQ, RQ, CK, RK, CV, RV, CO, RO, CG, CU, CD, FF, HH, EB = range(14)


class LayerTables:
    """A model's per-layer kernel arguments, bound once in three typed lists (each ~1 us to pass, a tuple
    of arrays ~0.15 us an array): `u8` [wq, wk, wv, wo, gate, up, down] a layer (flat bytes read in place;
    the experts' [E * bytes], shaped back in run_layers), `f32` [attention, Q, K and FFN norm weights,
    router [E * H]], `f4` [K cache, V cache]; `meta` [L, 14] int64: type codes, rows, expert bytes."""

    def __init__(self, step):
        """From a CpuStep's bound arguments (its att / route lists) and its runner's experts."""
        self.u8, self.f32, self.f4 = List(), List(), List()
        meta = []
        for i, ((nw, eps, wq, cq, rq, wk, ck, rk, wv, cv, rv, qn, kn), (nh, nkv, neox, norm, kc, vc), (wo, co, ro)) \
                in enumerate(step.att):
            fn, _, rw, _ = step.route[i]
            (gd, gc, ud, uc, dd, dc, F, H), eb = step.r.experts.moe_args[i]
            for a in (wq, wk, wv, wo, gd.reshape(-1), ud.reshape(-1), dd.reshape(-1)):
                self.u8.append(a)
            for a in (nw, qn, kn, fn, rw.reshape(-1)):
                self.f32.append(a)
            self.f4.append(kc)
            self.f4.append(vc)
            meta.append((cq, rq, ck, rk, cv, rv, co, ro, gc, uc, dc, F, H, eb))
            self.eps, self.heads, self.n_experts = eps, (nh, nkv, neox, norm), rw.shape[0]
        self.meta = np.array(meta, np.int64)

    def args(self) -> tuple:
        """run_layers' arguments after x: the tables, the number of experts, eps and the head layout."""
        return (self.u8, self.f32, self.f4, self.meta, self.n_experts, self.eps, *self.heads)


def out_buffer(L: int, T: int, k: int, E: int) -> np.ndarray:
    """run_layers' output for T tokens: [L, 4 + E + T k] int64, a layer a row (see run_layers)."""
    return np.empty((L, 4 + E + T * k), np.int64)


@njit(nogil=True, fastmath=True, cache=True)
def run_layers(x, u8, f32, f4, meta, E, eps, nh, nkv, neox, norm, cos, sin, p0, n, k, keep, act, y, a, h,
               eid, w, serial_bytes, nthr, i0, i1, out):
    """Layers [i0, i1) on x [T, H] in place, each: attention block (x += its output), RMSNorm and top-k
    router into h / eid / w, every routed expert on the CPU (x += their sum), as CpuStep's per-layer path.
    Row i of out: the clock (ns) at the layer's start, after routing, after its experts; the number of
    experts run, nrun; the experts run (E columns, the first nrun used); its routed ids [T, k], flat."""
    for i in range(i0, i1):
        t0 = clock_ns()
        m, u, f = meta[i], 7 * i, 5 * i
        attention_step(x, f32[f], eps, u8[u], m[CQ], m[RQ], u8[u + 1], m[CK], m[RK], u8[u + 2], m[CV], m[RV],
                       f32[f + 1], f32[f + 2], cos, sin, nh, nkv, neox, norm, f4[2 * i], f4[2 * i + 1], p0, n,
                       u8[u + 3], m[CO], m[RO], a, np.bool_(True))
        norm_route(x, f32[f + 3], eps, f32[f + 4].reshape((E, -1)), k, h, eid, w)
        t1 = clock_ns()
        run = CE.moe_routed(u8[u + 4].reshape((E, -1)), m[CG], u8[u + 5].reshape((E, -1)), m[CU],
                            u8[u + 6].reshape((E, -1)), m[CD], m[FF], m[HH], h, eid, w, keep, act, y, m[EB],
                            serial_bytes, nthr, np.bool_(True), x)
        o = out[i]
        o[0], o[1], o[2], o[3] = t0, t1, clock_ns(), run.shape[0]
        o[4:4 + run.shape[0]] = run
        o[4 + E:] = eid.reshape(-1)


def layer_records(out: np.ndarray, i0: int, i1: int, T: int, k: int, ebytes: list[int], step: int, phase: str,
                  engram: tuple, streams: int = 1, kv_start: int = 0) -> list[dict]:
    """The trace records of layers [i0, i1) from run_layers' output, as CpuStep's per-layer path writes
    them (experts.cpu_record's fields, then the layer's: T tokens of `streams` streams, after kv_start tokens
    of each in the KV cache); engram: (pages, rows, major faults, seconds) of the Engram add before layer i0."""
    pages, rows, faults, t_eng = engram
    E = out.shape[1] - 4 - T * k
    recs = []
    for i, o in zip(range(i0, i1), out[i0:i1].tolist()):
        t0, t1, t2, nr = o[:4]
        miss, ids = o[4:4 + nr], o[4 + E:]
        rec = X.cpu_record(miss, (t2 - t1) * 1e-6, nr * ebytes[i])
        rec.update(step=step, phase=phase, streams=streams, layer=i, tokens=T, kv_start=kv_start,
                   routed=[ids[t * k:(t + 1) * k] for t in range(T)],
                   t_dense_ms=(t1 - t0) * 1e-6, t_experts_ms=(t2 - t1) * 1e-6, engram_pages=pages,
                   t_engram_ms=t_eng * 1e3, engram_rows=rows, engram_major_faults=faults)
        pages, rows, faults, t_eng = 0, 0, 0, 0.0
        recs.append(rec)
    return recs
