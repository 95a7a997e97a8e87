"""The CPU expert rate of an engine built like llama.cpp's ggml: one dot product per weight row, 64-row
chunks handed to the threads in turn, no software prefetch (ggml-cpu.c `ggml_compute_forward_mul_mat`
and its `vec_dot` kernels; llama.cpp's rows are read as they are, one stream per thread, and the
hardware prefetcher alone runs ahead of them).

The executor's own kernel computes 8 rows at once and prefetches the next 8 in software: on this
VM's EPYC it streams Q8_0 experts at 17.5 GB/s on 2 threads where the same arithmetic one row at a
time without the prefetch streams at ~15, and at ~8.5 against ~10-11.6 on one thread (2026-11-30).
llama.cpp decoded `small` at 15.2 GB/s (2 threads) and 8.4 (1): the simulator's llama.cpp plans
read this rate (`cpu.rowwise_gbs`), the executor's plans the executor's (`cpu.expert_gbs`).

The arithmetic is the executor's (simd.py's single-row kernels, compiled without the prefetch; for Q4_0 on an
AVX-512 VNNI CPU, whose executor rows are vnni.py's, the same integer sums with the offset term added in another
order), so only the access pattern differs from `executor_expert_job`; the job is the same: k SwiGLU experts of
one token, gate and up, then down.

`repacked_expert_job` is the same job in the layout llama.cpp copies Q4_0 into at load on AVX2 (8 rows
interleaved block by block, computed 8 rows a pass; rows a multiple of 8, as llama.cpp requires to
repack): the rates of llama.cpp plans that repack (`cpu.repacked_gbs`).

Where ggml's own arithmetic is rebuilt (calibration.ggml_vec_dot, AVX2: Q8_0's, Q4_0's and IQ4_NL's int8 vec_dot,
the q4_0 8x8 gemv; calibration.ggml_vec_dot_k: the K-quants' Q2_K-Q6_K and IQ4_XS's), these jobs run it, on the
token quantised to Q8_0 (Q8_K for those six) as ggml does, in ggml's MUL_MAT_ID structure: one parallel region a
matrix for all k experts; F16 runs ggml's vec_dot_f16 (calibration.ggml_vec_dot_f16) on the token converted to fp16.
On Zen 3 and Zen 4 the int16 rows predicted llama.cpp's decode closely (median |error| 2.8%, session 34). On a
2-core Emerald Rapids Xeon VM (2026-12-05) they read Q8_0 from DRAM at 9.8-11.9 GB/s on two threads and the rebuilt
vec_dot at 13.8-14.8 (Q4_0 7.9-8.9 and 9.7-10.1; medians, a 1 GiB pool, a `/tmp` loop), where llama-bench's `small`
implies ~13, and on them the simulator under-predicted llama.cpp's decode by 18.7% on average over three sittings
(tests/calibration/test_xeon_llamacpp.py). In cache the rebuild runs ahead of ggml itself (one thread, Q8_0: 18-21
GB/s against test-backend-ops' 13.4).
"""
from __future__ import annotations


import numba
import numpy as np
from numba import njit, prange

from executor.gemm import F16, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_0, Q4_K, Q5_K, Q6_K, Q8_0
from executor.iquants import row_iq4_nl_noprefetch, row_iq4_xs_noprefetch
from executor.kernels import _quant_rows
from executor.kquants import row_q2_k_noprefetch, row_q3_k_noprefetch, row_q4_k_noprefetch, row_q5_k_noprefetch, row_q6_k_noprefetch
from executor.nbcache import drop_stale_cache
from executor.simd import HAVE_AVX2, row_f16_noprefetch, row_q4_noprefetch, row_q8_noprefetch

from .bench_kernel import ExpertPool, expert_pool, token_experts

# the kernels compiled in here live in the executor: a change there drops this module's cached kernels
drop_stale_cache(__file__)

CHUNK_ROWS = 64  # ggml's chunk for a one-token product (`chunk_size = 64` when nr1 == 1)
# GGML_SCHEDULE: ggml's MUL_MAT_ID takes the experts one after another, all threads on each: thread t starts at chunk t
# and takes the next free one from an atomic counter (ggml-cpu.c ggml_compute_forward_mul_mat_id), so with threads
# of one speed t computes chunks t, t + nthr, ... of every expert, the jobs here in that order. Two threads jumping
# from chunk to chunk of one expert stream less than two each running through its own experts: on the Zen 4 VM
# ggml's own Q4_K vec_dot read 24.3-24.5 GB/s in this order on 2 threads and 31.4-33.0 with the experts split
# between the threads, where perf of llama-bench `small-q4k` tg64 (-t 2, --repack 0) puts it at 24.2 (session 46).
FORMATS = ("Q8_0", "Q4_0", "F16", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS")  # with a single-row kernel here
# the formats with a kernel in llama.cpp's repacked layout here: its x86 layout (8 rows; ARM's is 4), ggml's own
# gemv rebuilt for each (Q4_0's in calibration.ggml_vec_dot, Q4_K's and Q2_K's in calibration.ggml_gemv_q4_k / _q2_k)
REPACKED_FORMATS = ("Q4_0", "Q4_K", "Q2_K") if HAVE_AVX2 else ()
REPACK_ROWS = 8  # rows interleaved (block_q4_0x8, block_q4_Kx8, block_q2_Kx8 on AVX2)


def gemv_name(fmt: str) -> str:
    """ggml's name for the 8x8 gemv of a repacked format: 'q4_0 8x8 int8 gemv', 'q2_K 8x8 int8 gemv'."""
    return f"{fmt.lower().replace('_k', '_K')} 8x8 int8 gemv"


@njit(nogil=True, inline="always")
def repacked_share(th, rows, nthr):
    """(first, end) of thread th's share of a matrix's `rows` rows in ggml's repacked MUL_MAT_ID (repack.cpp
    forward_mul_mat_id): an even split, each bound rounded up to a multiple of REPACK_ROWS."""
    r0 = (th * rows // nthr + REPACK_ROWS - 1) // REPACK_ROWS * REPACK_ROWS
    return r0, min(rows, ((th + 1) * rows // nthr + REPACK_ROWS - 1) // REPACK_ROWS * REPACK_ROWS)
# the formats whose ggml vec_dot is rebuilt: their rowwise job runs it (int8 activations), not the executor's rows;
# a Q8_0 token (GGML_INT8_FORMATS) or a Q8_K one (GGML_K_FORMATS)
GGML_INT8_FORMATS = ("Q8_0", "Q4_0", "IQ4_NL") if HAVE_AVX2 else ()
GGML_K_FORMATS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS") if HAVE_AVX2 else ()
GGML_F16_FORMATS = ("F16",) if HAVE_AVX2 else ()  # ggml's vec_dot_f16, the token converted to fp16 once an op


@njit(nogil=True, fastmath=True, inline="always")
def _row(code, w, off, rb, x16, dx, xf, out, r):
    """out[0, r] = the row at byte off of w (stride rb) . x (int16 x16 * dx, or float32 xf for F16)."""
    nb = np.int64(x16.shape[1] // 32)
    if code == Q8_0:
        row_q8_noprefetch(w, off, rb, x16, dx, 0, nb, out, r)
    elif code == Q4_0:
        row_q4_noprefetch(w, off, rb, x16, dx, 0, nb, out, r)
    elif code == Q4_K:
        row_q4_k_noprefetch(w, off, rb, x16, dx, 0, nb, out, r)
    elif code == Q5_K:
        row_q5_k_noprefetch(w, off, rb, x16, dx, 0, nb, out, r)
    elif code == Q3_K:
        row_q3_k_noprefetch(w, off, rb, x16, dx, 0, nb, out, r)
    elif code == Q2_K:
        row_q2_k_noprefetch(w, off, rb, x16, dx, 0, nb, out, r)
    elif code == Q6_K:
        row_q6_k_noprefetch(w, off, rb, x16, dx, 0, nb, out, r)
    elif code == IQ4_NL:
        row_iq4_nl_noprefetch(w, off, rb, x16, dx, 0, nb, out, r)
    elif code == IQ4_XS:
        row_iq4_xs_noprefetch(w, off, rb, x16, dx, 0, nb, out, r)
    else:
        row_f16_noprefetch(w, off, rb, xf[0], dx[0], np.int64(xf.shape[1] // 16), out[0], r)


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _rowwise_matvec(w, code, rows, x, out, nthr):
    """out[0, r] = W[r] . x[0] for one matrix (flat bytes w, `rows` rows), row by row in 64-row chunks
    handed to the threads in turn (one parallel region, as one ggml op; GGML_SCHEDULE)."""
    x16, dx = _quant_rows(x)
    rb = np.int64(w.shape[0] // rows)
    nc = (rows + CHUNK_ROWS - 1) // CHUNK_ROWS
    for t in prange(nthr):
        for c in range(t, nc, nthr):
            for r in range(c * CHUNK_ROWS, min(rows, (c + 1) * CHUNK_ROWS)):
                _row(code, w, np.int64(r * rb), rb, x16, dx, x, out, np.int64(r))


def _flat(p: ExpertPool) -> list:
    """The pool's gate, up and down as flat bytes [E, ...] a matrix."""
    return [t.data.reshape(p.n, -1) for t in (p.gate, p.up, p.down)]


if HAVE_AVX2:
    from .ggml_gemv_q2_k import gemv_q2_kx8
    from .ggml_gemv_q4_k import gemv_q4_kx8
    from .ggml_tiled import quantize_row_q8_k
    from .ggml_vec_dot import gemv_q4_0x8, quantize_row_q8_0, vec_dot
    from .ggml_vec_dot_f16 import fp32_to_fp16_row, vec_dot_f16
    from .ggml_vec_dot_k import vec_dot_iq4_xs, vec_dot_q2_k, vec_dot_q3_k, vec_dot_q4_k, vec_dot_q5_k, vec_dot_q6_k

    @njit(parallel=True, nogil=True, fastmath=True, cache=True)
    def _ggml_matvec(w, es, code, rows, x, out, nthr):
        """out[j, r] = W_{es[j]}[r] . x[0] for one matrix of experts es (w [E, bytes] of the type `code`: a
        GGML_INT8_FORMATS, GGML_K_FORMATS or GGML_F16_FORMATS one; `rows` rows), as ggml's MUL_MAT_ID runs one token:
        x converted once to ggml's vec_dot type (Q8_0; Q8_K for the K-quants; fp16 for F16), then each expert's 64-row
        chunks handed to the threads in turn, expert after expert, in one parallel region (GGML_SCHEDULE), ggml's
        vec_dot a row. nthr: numba's thread count, passed in."""
        n = x.shape[1]
        k = code == Q2_K or code == Q3_K or code == Q4_K or code == Q5_K or code == Q6_K or code == IQ4_XS
        x8, bs, xh = np.empty(n, np.int8), np.empty(n // 16, np.int32), np.empty(n, np.uint16)
        dx = np.empty(n // 256 if k else n // 32, np.float32)
        if code == F16:  # F16's vec_dot_type: the token as fp16
            fp32_to_fp16_row(x[0], xh, n)
        elif k:
            quantize_row_q8_k(x[0], x8, dx, bs)
        else:
            quantize_row_q8_0(x[0], x8, dx)
        bs16 = bs.astype(np.int16)  # block_q8_K's int16 sums
        rb, nb = np.int64(w.shape[1] // rows), np.int64(n // 256 if k else n // 32)
        nc = (rows + CHUNK_ROWS - 1) // CHUNK_ROWS
        # a chunk's rows in a loop of their own for each format: with one loop over rows around every format's
        # inlined vec_dot, LLVM's registers spread over all of them and Q2_K's rows ran 11% under ggml's own
        for t in prange(nthr):
            for j in range(es.shape[0]):
                we, oe = w[es[j]], out[j]
                for c in range(t, nc, nthr):
                    r0, r1 = c * CHUNK_ROWS, min(rows, (c + 1) * CHUNK_ROWS)
                    if code == F16:
                        for r in range(r0, r1):
                            vec_dot_f16(we, np.int64(r * rb), xh, n, oe, np.int64(r))
                    elif code == Q6_K:
                        for r in range(r0, r1):
                            vec_dot_q6_k(we, np.int64(r * rb), x8, dx, bs16, nb, oe, np.int64(r))
                    elif code == Q4_K:
                        for r in range(r0, r1):
                            vec_dot_q4_k(we, np.int64(r * rb), x8, dx, bs16, nb, oe, np.int64(r))
                    elif code == Q5_K:
                        for r in range(r0, r1):
                            vec_dot_q5_k(we, np.int64(r * rb), x8, dx, bs16, nb, oe, np.int64(r))
                    elif code == IQ4_XS:
                        for r in range(r0, r1):
                            vec_dot_iq4_xs(we, np.int64(r * rb), x8, dx, bs16, nb, oe, np.int64(r))
                    elif code == Q2_K:
                        for r in range(r0, r1):
                            vec_dot_q2_k(we, np.int64(r * rb), x8, dx, bs16, nb, oe, np.int64(r))
                    elif code == Q3_K:
                        for r in range(r0, r1):
                            vec_dot_q3_k(we, np.int64(r * rb), x8, dx, bs16, nb, oe, np.int64(r))
                    else:
                        for r in range(r0, r1):
                            vec_dot(code, we, np.int64(r * rb), rb, x8, dx, nb, oe, np.int64(r))

    @njit(parallel=True, nogil=True, fastmath=True, cache=True)
    def _repacked_matvec(w, es, rows, x, out, nthr):
        """out[j, r] = W_{es[j]}[r] . x[0] for one matrix of experts es (w [E, bytes] Q4_0 in llama.cpp's repacked
        layout, block_q4_0x8, `rows` rows) in one parallel region, as ggml's repacked MUL_MAT_ID: x quantised to Q8_0,
        then each thread the same contiguous eighth-aligned share of every expert's rows (repack.cpp
        forward_mul_mat_id), 8 rows a pass by ggml's q4_0 8x8 gemv, no software prefetch. nthr: numba's thread
        count, passed in (read inside, it would keep the function out of numba's on-disk cache: a dynamic global)."""
        n = x.shape[1]
        x8, dx = np.empty(n, np.int8), np.empty(n // 32, np.float32)
        quantize_row_q8_0(x[0], x8, dx)
        rb, nb = np.int64(w.shape[1] // rows), np.int64(n // 32)
        for t in prange(nthr):
            r0, r1 = repacked_share(t, rows, nthr)
            for j in range(es.shape[0]):
                for r in range(r0, r1, REPACK_ROWS):
                    gemv_q4_0x8(w[es[j]], np.int64(r * rb), x8, dx, nb, out[j], np.int64(r))

    @njit(parallel=True, nogil=True, fastmath=True, cache=True)
    def _repacked_k_matvec(w, code, es, rows, x, out, nthr):
        """The same for a K-quant (`code`: Q4_K or Q2_K) in llama.cpp's block_q4_Kx8 / block_q2_Kx8 layout: x
        quantised to Q8_K (ggml's vec_dot type for K-quants), 8 rows a pass by ggml's q4_K / q2_K 8x8 gemv (8 rows'
        blocks side by side, so a row's bytes stay rb)."""
        n = x.shape[1]
        x8, dx, bs = np.empty(n, np.int8), np.empty(n // 256, np.float32), np.empty(n // 16, np.int32)
        quantize_row_q8_k(x[0], x8, dx, bs)
        rb, nb = np.int64(w.shape[1] // rows), np.int64(n // 256)
        for t in prange(nthr):
            r0, r1 = repacked_share(t, rows, nthr)
            for j in range(es.shape[0]):
                for r in range(r0, r1, REPACK_ROWS):
                    if code == Q2_K:
                        gemv_q2_kx8(w[es[j]], np.int64(r * rb), x8, dx, bs, nb, out[j], np.int64(r))
                    else:
                        gemv_q4_kx8(w[es[j]], np.int64(r * rb), x8, dx, bs, nb, out[j], np.int64(r))

def repacked_expert_job(fmt: str = "Q4_0", hidden: int = 2048, ffn: int = 768, pool_bytes: int = 256 << 20,
                        max_k: int = 8, seed: int = 0):
    """(run_job, expert_bytes): rowwise_expert_job's job in llama.cpp's repacked layout (`fmt` in
    REPACKED_FORMATS): three ops a token (gate, up, down of all k experts, one parallel region each, as
    ggml's MUL_MAT_ID). The synthetic rows' bytes are read as if repacked, each 8 rows' blocks one block_q4_0x8 /
    block_q4_Kx8 / block_q2_Kx8 (the same bytes and count: the values don't matter to the timing)."""
    if fmt not in REPACKED_FORMATS:
        raise ValueError(f"no repacked kernel for {fmt} (have {', '.join(REPACKED_FORMATS)})")
    p = expert_pool(fmt, hidden, ffn, pool_bytes, max_k, seed)  # shared with the other jobs on these experts
    flat, routes = _flat(p), token_experts(p.n)
    g, y = np.zeros((max_k, ffn), np.float32), np.zeros((max_k, hidden), np.float32)

    def run_job(k: int, first: int):
        es = routes(k, first)
        for m, rows, v, out in ((0, ffn, p.x, g), (1, ffn, p.x, g), (2, hidden, p.h, y)):
            if fmt == "Q4_0":
                _repacked_matvec(flat[m], es, rows, v, out, numba.get_num_threads())
            else:
                _repacked_k_matvec(flat[m], p.gate.code, es, rows, v, out, numba.get_num_threads())
    return run_job, p.expert_bytes


def rowwise_expert_job(fmt: str = "Q8_0", hidden: int = 2048, ffn: int = 768, pool_bytes: int = 256 << 20,
                       max_k: int = 8, seed: int = 0, file_runs: int | None = None, folder: str = ".",
                       file_bytes: int = 0):
    """(run_job, expert_bytes): one token's job of k SwiGLU experts, each matrix one `_rowwise_matvec`
    (gate, up, then down: three ggml ops per expert), on synthetic `fmt` experts in a pool larger
    than the last-level cache; a job uses k experts as bench_kernel.token_experts routes them. Activations are not
    applied (values don't matter to the timing). file_runs: the pool, repeated to file_bytes, in files whose pages lie
    in physically contiguous runs of that many bytes (bench_kernel.pool_in_files), as llama.cpp reads a GGUF's pages
    in place."""
    if fmt not in FORMATS:
        raise ValueError(f"no single-row kernel for {fmt} (have {', '.join(FORMATS)})")
    p = expert_pool(fmt, hidden, ffn, pool_bytes, max_k, seed, file_runs, folder, file_bytes)  # shared by jobs
    flat, code, routes = _flat(p), p.gate.code, token_experts(p.n)
    if fmt in GGML_INT8_FORMATS or fmt in GGML_K_FORMATS or fmt in GGML_F16_FORMATS:  # ggml's arithmetic, MUL_MAT_ID
        gk, yk = np.zeros((max_k, ffn), np.float32), np.zeros((max_k, hidden), np.float32)

        def run_ggml(k: int, first: int):
            es = routes(k, first)
            for m, rows, v, out in ((0, ffn, p.x, gk), (1, ffn, p.x, gk), (2, hidden, p.h, yk)):  # three ops a token
                _ggml_matvec(flat[m], es, code, rows, v, out, numba.get_num_threads())
        return run_ggml, p.expert_bytes
    g, u, y = np.zeros((1, ffn), np.float32), np.zeros((1, ffn), np.float32), np.zeros((1, hidden), np.float32)

    def run_job(k: int, first: int):
        for e in routes(k, first):
            _rowwise_matvec(flat[0][e], code, ffn, p.x, g, numba.get_num_threads())
            _rowwise_matvec(flat[1][e], code, ffn, p.x, u, numba.get_num_threads())
            _rowwise_matvec(flat[2][e], code, hidden, p.h, y, numba.get_num_threads())
    return run_job, p.expert_bytes


def label(fmt: str, hidden: int, ffn: int, repacked: bool = False) -> str:
    """The method line of a rowwise (or repacked) rate in a profile."""
    if repacked:
        gemv = gemv_name(fmt) + ("" if fmt == "Q4_0" else " (Q8_K token)")
        return (f"{REPACK_ROWS} interleaved rows a pass by ggml's {gemv}, each thread a contiguous share "
                f"of every expert's rows, no software prefetch (ggml's repacked MUL_MAT_ID; calibration.bench_rowwise) "
                f"{fmt} SwiGLU {hidden}x{ffn}, 1 token")
    how = ("ggml's int8 vec_dot" if fmt in GGML_INT8_FORMATS else "ggml's int8 vec_dot, Q8_K token"
           if fmt in GGML_K_FORMATS else "ggml's vec_dot_f16, fp16 token" if fmt in GGML_F16_FORMATS
           else "the executor's float single-row arithmetic" if fmt == "F16"
           else "the executor's int16 single-row arithmetic")
    return (f"one row per dot product ({how}), {CHUNK_ROWS}-row chunks across threads, no software prefetch "
            f"(ggml's structure; calibration.bench_rowwise) {fmt} SwiGLU {hidden}x{ffn}, 1 token")
