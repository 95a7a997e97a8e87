"""bench_rowwise's decode jobs on ggml's own kernels (a llama.cpp build's libggml-cpu.so, calibration.ggml_library).

The same token's job of k SwiGLU experts (gate, up, then down: three ops, each one parallel region over all k
experts, as ggml's MUL_MAT_ID), the same pools of synthetic experts, the same structure; only the arithmetic is
ggml's own, called through ctypes from numba:
- in place (`own_rowwise_job`): the token quantised to the format's vec_dot type by ggml's quantize_row_q8_0 / _q8_K
  (F16: ggml_cpu_fp32_to_fp16) once an op, then each expert's 64-row chunks handed to the threads in turn, expert
  after expert (bench_rowwise.GGML_SCHEDULE), ggml's vec_dot a row (ggml-cpu.c ggml_compute_forward_mul_mat_id_one_chunk
  with one token);
- repacked (`own_repacked_job`): the pool copied into llama.cpp's 8-row layout (block_q4_0x8, block_q4_Kx8,
  block_q2_Kx8, as llama.cpp copies it at load), then each thread one gemv call an expert over its contiguous
  eighth-aligned share of the rows (repack.cpp forward_mul_mat_id).
And bench_ggml_prefill's batch (`own_prefill_job`) on the same kernels: path 'vecdot', ggml's vec_dot a (row, token)
pair in 16 x 16 blocks; path 'repacked', its gemv a token over each thread's share of an expert's rows.
The kernels are arguments of the compiled loops: numba passes C functions of one signature as values, so each loop
compiles once for every format (a loop a kernel took ~15 s of `calibrate --quick --ggml-lib`'s 71, session 46), and a
small closure a kernel holds them as constants (_bound_matvec).
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from .bench_kernel import _synth_tensor, expert_pool, token_experts
from .bench_rowwise import CHUNK_ROWS, _flat, repacked_share
from .ggml_library import GEMV, TOKEN_BYTES, VEC_DOT_TYPE, GgmlCpu, repack_x8, vec_dot_name


@njit(parallel=True, nogil=True)
def _rowwise_matvec(vec_dot, quantize, w, es, rows, x, q, out, nthr):
    """out[j, r] = W_{es[j]}[r] . x[0] for one matrix of experts es (w [E, bytes], `rows` rows) by ggml's `vec_dot`,
    the token quantised by `quantize` into q, each expert's 64-row chunks handed to the threads in turn
    (bench_rowwise.GGML_SCHEDULE)."""
    n = x.shape[1]
    quantize(x.ctypes.data, q.ctypes.data, n)
    rb, wp, qp, op = w.shape[1] // rows, w.ctypes.data, q.ctypes.data, out.ctypes.data
    nc = (rows + CHUNK_ROWS - 1) // CHUNK_ROWS
    for t in prange(nthr):
        for j in range(es.shape[0]):
            base = wp + es[j] * w.shape[1]
            for c in range(t, nc, nthr):
                for r in range(c * CHUNK_ROWS, min(rows, (c + 1) * CHUNK_ROWS)):
                    vec_dot(n, op + 4 * (j * out.shape[1] + r), 0, base + r * rb, 0, qp, 0, 1)


def _bound_matvec(loop, kernel, quantize):
    """loop(kernel, quantize, *args) as a compiled closure matvec(*args). Calling a compiled function with C functions
    as arguments costs ~260 us a call here (numba types each ctypes argument), against ~7 us for a closure that holds
    them as constants; the closure compiles in ~0.1 s, the loop it calls once for all kernels of one signature."""
    @njit(nogil=True)
    def matvec(w, es, rows, x, q, out, nthr):
        loop(kernel, quantize, w, es, rows, x, q, out, nthr)
    return matvec


def _rowwise_matvec_of(vec_dot, quantize):
    """matvec(w, es, rows, x, q, out, nthr) over ggml's `vec_dot` and `quantize` (_rowwise_matvec)."""
    return _bound_matvec(_rowwise_matvec, vec_dot, quantize)


@njit(parallel=True, nogil=True)
def _repacked_matvec(gemv, quantize, w, es, rows, x, q, out, nthr):
    """out[j, r] = W_{es[j]}[r] . x[0] for one matrix of experts es (w [E, bytes] repacked, `rows` rows) by ggml's
    `gemv`: each thread one call an expert over its eighth-aligned share of the rows."""
    n = x.shape[1]
    quantize(x.ctypes.data, q.ctypes.data, n)
    rb, wp, qp, op = w.shape[1] // rows, w.ctypes.data, q.ctypes.data, out.ctypes.data
    for t in prange(nthr):
        r0, r1 = repacked_share(t, rows, nthr)
        for j in range(es.shape[0]):
            gemv(n, op + 4 * (j * out.shape[1] + r0), rows, wp + es[j] * w.shape[1] + r0 * rb, qp, 1, r1 - r0)


def _repacked_matvec_of(gemv, quantize):
    """matvec(w, es, rows, x, q, out, nthr) over ggml's repacked `gemv` (_repacked_matvec)."""
    return _bound_matvec(_repacked_matvec, gemv, quantize)


@njit(nogil=True)
def _quantize_rows(quantize, a, q):
    """Each row of a (float32 [R, n]) into q's row (uint8 [R, bytes]) by ggml's own `quantize`, as MUL_MAT_ID converts
    its src1 a row at a time."""
    for i in range(a.shape[0]):
        quantize(a.ctypes.data + i * a.strides[0], q.ctypes.data + i * q.strides[0], a.shape[1])


def _quantize_rows_of(quantize):
    """quantize_rows(a, q) by ggml's own `quantize` (_quantize_rows; a compiled closure, see _bound_matvec)."""
    @njit(nogil=True)
    def quantize_rows(a, q):
        _quantize_rows(quantize, a, q)
    return quantize_rows


@njit(parallel=True, nogil=True)
def _vecdot_matrix(vec_dot, w, rows, n, q, out):
    """out[e, t, r] = W_e[r] . the token in q[e, t] (w [E, bytes], q [E, T, bytes]) by ggml's `vec_dot`: ggml's
    MUL_MAT_ID on a batch, in place, 16 x 16 blocks of (row, token) pairs (blck_0 x blck_1) handed to the threads in
    turn, one parallel region over every expert's blocks."""
    E, T = q.shape[0], q.shape[1]
    rb, wp, qp, op = w.shape[1] // rows, w.ctypes.data, q.ctypes.data, out.ctypes.data
    n0, n1 = (rows + 15) // 16, (T + 15) // 16
    for i in prange(E * n0 * n1):
        e, c = i // (n0 * n1), i % (n0 * n1)
        r0, t0 = (c % n0) * 16, (c // n0) * 16
        for t in range(t0, min(T, t0 + 16)):
            for r in range(r0, min(rows, r0 + 16)):
                vec_dot(n, op + 4 * ((e * T + t) * rows + r), 0, wp + e * w.shape[1] + r * rb, 0,
                        qp + (e * T + t) * q.shape[2], 0, 1)


def _vecdot_matrix_of(vec_dot):
    """matrix(w, rows, n, q, out, nthr) over ggml's `vec_dot` (_vecdot_matrix, whose blocks numba's threads share
    out: nthr only matches _repacked_matrix_of's call; a compiled closure, see _bound_matvec)."""
    @njit(nogil=True)
    def matrix(w, rows, n, q, out, nthr):
        _vecdot_matrix(vec_dot, w, rows, n, q, out)
    return matrix


@njit(parallel=True, nogil=True)
def _repacked_matrix(gemv, w, rows, n, q, out, nthr):
    """out[e, t, r] = W_e[r] . the token in q[e, t] (w [E, bytes] repacked) by ggml's `gemv`: each thread its
    eighth-aligned share of every expert's rows, one gemv call a token (repack.cpp forward_mul_mat_id)."""
    E, T = q.shape[0], q.shape[1]
    rb, wp, qp, op = w.shape[1] // rows, w.ctypes.data, q.ctypes.data, out.ctypes.data
    for th in prange(nthr):
        r0, r1 = repacked_share(th, rows, nthr)
        for e in range(E):
            for t in range(T):
                gemv(n, op + 4 * ((e * T + t) * rows + r0), rows, wp + e * w.shape[1] + r0 * rb,
                     qp + (e * T + t) * q.shape[2], 1, r1 - r0)


def _repacked_matrix_of(gemv):
    """matrix(w, rows, n, q, out, nthr) over ggml's `gemv` (_repacked_matrix; a compiled closure, see _bound_matvec)."""
    @njit(nogil=True)
    def matrix(w, rows, n, q, out, nthr):
        _repacked_matrix(gemv, w, rows, n, q, out, nthr)
    return matrix


def own_prefill_job(g: GgmlCpu, fmt: str, path: str, hidden: int = 2048, ffn: int = 768, n_experts: int = 32,
                    top_k: int = 8, tokens: int = 64, seed: int = 0):
    """(run, flops): bench_ggml_prefill.ggml_prefill_job's batch (gate, up and down of top_k of n_experts synthetic
    experts a token, an even split) on ggml's own kernels, `path` 'vecdot' or 'repacked'. As there, each op first
    converts its activations, by ggml's own quantiser: gate and up each the batch's rows, down each pair's row."""
    kernels = {"vecdot": g.vec_dot, "repacked": g.gemv}.get(path, {})
    if fmt not in kernels:
        raise ValueError(f"{g.path} gives no verified kernel for {fmt}'s {path} path")
    rng = np.random.default_rng(seed)
    per = max(1, tokens * top_k // n_experts)  # tokens an expert
    mats = [_synth_tensor(fmt, n_experts, r, c, rng) for r, c in ((ffn, hidden), (ffn, hidden), (hidden, ffn))]
    ws = [m.data.reshape(n_experts, -1) for m in mats]
    if path == "repacked":  # llama.cpp's load-time copy; the experts' rows are a multiple of 8 apart
        ws = [np.ascontiguousarray(repack_x8(fmt)(w.reshape(-1), n_experts * m.rows)).reshape(n_experts, -1)
              for w, m in zip(ws, mats)]
    t = VEC_DOT_TYPE[fmt]
    quantize_rows = _quantize_rows_of(g.quantize[t])
    x = rng.standard_normal((n_experts, per, hidden)).astype(np.float32)  # the rows each expert reads
    batch = np.ascontiguousarray(x.reshape(-1, hidden)[:tokens])  # the batch's own rows
    h = (rng.standard_normal((n_experts * per, ffn)) * 0.1).astype(np.float32)
    qx = np.zeros((n_experts, per, TOKEN_BYTES[t](hidden)), np.uint8)
    quantize_rows(x.reshape(-1, hidden), qx.reshape(n_experts * per, -1))  # ggml: pointers into its converted batch
    qb = np.zeros((tokens, qx.shape[2]), np.uint8)
    qh = np.zeros((n_experts, per, TOKEN_BYTES[t](ffn)), np.uint8)
    gout, yout = np.zeros((n_experts, per, ffn), np.float32), np.zeros((n_experts, per, hidden), np.float32)
    matrix = (_vecdot_matrix_of if path == "vecdot" else _repacked_matrix_of)(kernels[fmt])

    def run():
        for w in ws[:2]:  # gate, up: the batch converted, then the experts' products
            quantize_rows(batch, qb)
            matrix(w, ffn, hidden, qx, gout, numba.get_num_threads())
        quantize_rows(h, qh.reshape(n_experts * per, -1))  # down: every pair's row converted
        matrix(ws[2], hidden, ffn, qh, yout, numba.get_num_threads())
    return run, 6.0 * hidden * ffn * per * n_experts


def _decode_job(p, mats, matvec, t: str, hidden: int, ffn: int, max_k: int):
    """run_job(k, first): a token's gate, up and down of k experts of pool p (bench_kernel.token_experts), the
    matrices `mats` ([E, bytes] each), each one `matvec` call on the token quantised to the vec_dot type t."""
    routes = token_experts(p.n)
    tokens = [np.zeros(TOKEN_BYTES[t](v.shape[1]), np.uint8) for v in (p.x, p.h)]
    g_out, y_out = np.zeros((max_k, ffn), np.float32), np.zeros((max_k, hidden), np.float32)

    def run_job(k: int, first: int):
        es = routes(k, first)
        for m, rows, v, q, out in ((0, ffn, p.x, tokens[0], g_out), (1, ffn, p.x, tokens[0], g_out),
                                   (2, hidden, p.h, tokens[1], y_out)):
            matvec(mats[m], es, rows, v, q, out, numba.get_num_threads())
    return run_job


def own_rowwise_job(g: GgmlCpu, fmt: str, hidden: int = 2048, ffn: int = 768, pool_bytes: int = 256 << 20,
                    max_k: int = 8, seed: int = 0, file_runs: int | None = None, folder: str = ".",
                    file_bytes: int = 0):
    """(run_job, expert_bytes): bench_rowwise.rowwise_expert_job's job on ggml's own vec_dot for `fmt` (file_runs,
    folder, file_bytes: as there)."""
    if fmt not in g.vec_dot:
        raise ValueError(f"{g.path} gives no verified {vec_dot_name(fmt)}")
    p, t = expert_pool(fmt, hidden, ffn, pool_bytes, max_k, seed, file_runs, folder, file_bytes), VEC_DOT_TYPE[fmt]
    matvec = _rowwise_matvec_of(g.vec_dot[fmt], g.quantize[t])
    return _decode_job(p, _flat(p), matvec, t, hidden, ffn, max_k), p.expert_bytes


def own_repacked_job(g: GgmlCpu, fmt: str, hidden: int = 2048, ffn: int = 768, pool_bytes: int = 256 << 20,
                     max_k: int = 8, seed: int = 0):
    """(run_job, expert_bytes): bench_rowwise.repacked_expert_job's job on ggml's own repacked gemv for `fmt`, the
    pool copied into llama.cpp's layout."""
    if fmt not in g.gemv:
        raise ValueError(f"{g.path} gives no verified repacked gemv for {fmt}")
    p, t = expert_pool(fmt, hidden, ffn, pool_bytes, max_k, seed), VEC_DOT_TYPE[fmt]
    # every expert's rows are a multiple of 8 apart, so the whole pool repacks as one tensor of n x rows rows
    packed = [np.ascontiguousarray(repack_x8(fmt)(f.reshape(-1), p.n * rows)).reshape(p.n, -1)
              for f, rows in zip(_flat(p), (ffn, ffn, hidden))]
    matvec = _repacked_matvec_of(g.gemv[fmt], g.quantize[t])
    return _decode_job(p, packed, matvec, t, hidden, ffn, max_k), p.expert_bytes


def own_prefill_label(g: GgmlCpu, fmt: str, path: str, hidden: int, ffn: int) -> str:
    """The method line of a ggml prefill rate timed on its own kernels in a profile."""
    how = (f"ggml's own {vec_dot_name(fmt)} per (row, token) in 16 x 16 blocks" if path == "vecdot" else
           f"each thread's share of rows token by token, ggml's own {GEMV[fmt]}")
    return (f"ggml's MUL_MAT_ID structure for {fmt} ({path}: {how}, {g.path}; calibration.bench_ggml_own) "
            f"SwiGLU {hidden}x{ffn}")


def own_label(g: GgmlCpu, fmt: str, hidden: int, ffn: int, repacked: bool = False) -> str:
    """The method line of a rate timed on ggml's own kernels in a profile."""
    if repacked:
        return (f"ggml's own {GEMV[fmt]} ({g.path}), each thread one call an expert over a contiguous share of its "
                f"rows (ggml's repacked MUL_MAT_ID; calibration.bench_ggml_own) {fmt} SwiGLU {hidden}x{ffn}, 1 token")
    return (f"one row per dot product (ggml's own {vec_dot_name(fmt)}, {g.path}), {CHUNK_ROWS}-row chunks across "
            f"threads (ggml's MUL_MAT_ID; calibration.bench_ggml_own) {fmt} SwiGLU {hidden}x{ffn}, 1 token")
