"""Numba CPU matrix drivers reading F16 / Q8_0 / Q4_0 / K-quant / IQ4 weights in place from the mmap (the routed
SwiGLU experts built on them are in cpu_experts.py).

Weights are uint8 views of the file mapping (no copies). A driver splits a matrix's rows across threads (prange;
little work runs serially) and hands each row range to the type's row products (row_products.rows_matmul) through
kernel_table's table of C functions, so no driver compiles the kernels in. The products: one to _FUSED tokens an
expert read the rows in place with int16 activations (simd.py for Q8_0 / Q4_0, vnni.py's Q4_0 rows on AVX-512
VNNI, kquants.py for the K-quants of llama.cpp's Q2_K .. Q5_K_M files, iquants.py for its IQ4_NL / IQ4_XS; F16 with
float32 activations; an int8 build's Q4_0, IQ4_NL and K-quant rows on AVX-512 VNNI read int8 ones, vnni.lanes8's:
vnni.py, kquants_vnni.py); more dequantise each row once (gemm.py: dot blocks, from GEMM_TOKENS a packed register-tile
GEMM in few large items). Kernels release the GIL (nogil). Type codes: 1 = F16, 2 = Q8_0, 3 = Q4_0, 4 = Q4_K,
5 = Q6_K, 6 = Q5_K (Q5_K_M files: Q5_K with Q6_K), 7 = Q3_K, 8 = Q2_K (Q3_K_M and Q2_K files), 9 = IQ4_NL,
10 = IQ4_XS.
"""
from __future__ import annotations

import time

import numba
import numpy as np
from numba import njit, prange

from .gemm import (F16, GEMM_TOKENS, IQ4_NL, IQ4_XS, MR, NT, Q2_K, Q3_K, Q4_0, Q4_K, Q5_K, Q6_K,  # noqa: F401
                   Q8_0, pack_tokens)  # (the type codes are re-exported)
from .kernel_table import table_rows_matmul
from .nbcache import drop_stale_cache
from .qgemm import HAVE_QGEMM, INT8, gemm_pack, gemm_width, row_range
from .row_products import _FUSED, ROWS_INT8, gemm_path  # noqa: F401 (re-exported)
from .simd import quant16, run_sums16
from .vnni import HAVE_VNNI512, RUN_SUMS_AT, dx8_at, lanes8, split8

drop_stale_cache(__file__)



def prange_only() -> dict:
    """njit's `parallel` option for kernels whose only parallel loop is a prange. parallel=True also turns
    the array expressions around it (np.zeros, out += a, a == t) into parallel regions of their own,
    ~2 us each where one suffices: cpu_experts._moe paid four a decode layer, ~7 of its ~28 us on `tiny`.
    A new dict each call: numba's ParallelOptions consumes the dict it is given."""
    return dict(prange=True, comprehension=False, reduction=False, inplace_binop=False, setitem=False,
                numpy=False, stencil=False, fusion=False)

_ROWS = 32  # rows per parallel work item (16 -> 32: ~5% on Q4_0 expert GB/s, fewer item switches)


@njit(fastmath=True, cache=True)
def quant_empty(T, C):
    """Uninitialised int16 activations of T rows of C values in _quant_rows's layout -> (x16 [T, C], dx)."""
    nb = C // 32
    extra = 4 * nb * ROWS_INT8  # an int8 build's dx8, sums8 and runs8 (vnni.lanes8)
    return np.empty((T, C), np.int16), np.empty((T, dx8_at(nb) + extra), np.float32)


@njit(fastmath=True, inline="always")
def quant_row(x, x16, dx):
    """One row of _quant_rows: x [C] into x16 [C] / dx (simd.quant16, then vnni.split8 with AVX-512 VNNI, or in an
    int8 build vnni.lanes8 of x, then the 16-value runs' sums, simd.run_sums16)."""
    nb = x.shape[0] // 32
    quant16(x, x16, dx)
    if ROWS_INT8:
        lanes8(np.ascontiguousarray(x), dx, nb)  # (a no-op on the C-contiguous rows callers pass)
    elif HAVE_VNNI512:
        split8(x16, dx, nb)
    run_sums16(x16, dx, nb, RUN_SUMS_AT * nb)


@njit(fastmath=True, cache=True)
def _quant_rows(x):
    """int16 activations of x [T, C]: (x16 [T, C], dx [T, ~4 C/32], with AVX-512 VNNI [T, ~36 C/32]: the scales
    and block sums, the split bytes of the VNNI Q4_0 rows, then the 16-value runs' sums) (layouts: simd.quant16,
    vnni.split8, simd.run_sums16; quant_empty's sizes)."""
    x16, dx = quant_empty(x.shape[0], x.shape[1])
    for t in range(x.shape[0]):
        quant_row(x[t], x16[t], dx[t])
    return x16, dx


@njit(inline="always")
def int_panels(c0, c1=0, c2=0, R1=0, R2=0):
    """Whether the token panels read by products of types c0 (and c1 where R1, c2 where R2) are qgemm's integer ones
    (HAVE_QGEMM and no F16 among them), else gemm's float ones."""
    return HAVE_QGEMM and c0 != F16 and (R1 == 0 or c1 != F16) and (R2 == 0 or c2 != F16)


@njit(inline="always")
def reads_int16(T, c0, c1=0, c2=0, R1=0, R2=0):
    """Whether products of T tokens with types c0 (and c1 where R1, c2 where R2) read the tokens' int16 rows (_quant_rows):
    a product off the GEMM path (rows_fused), or integer panels packed from them (int16, not INT8's from the floats)."""
    off = not gemm_path(T, c0) or (R1 > 0 and not gemm_path(T, c1)) or (R2 > 0 and not gemm_path(T, c2))
    return off or (int_panels(c0, c1, c2, R1, R2) and not INT8)


@njit(fastmath=True, cache=True)
def _quant_needed(x, need):
    """_quant_rows(x) where `need` (reads_int16), else empty rows (the products read none)."""
    if need:
        return _quant_rows(x)
    return quant_empty(np.int64(0), x.shape[1])


@njit(fastmath=True, cache=True)
def panels(x, x16, dx, gemm, ints):
    """The GEMM's packed token panels of x [T, C] where a product takes the GEMM path (gemm: gemm_path), else none
    ([0, C, NT]): integer ones where `ints` (int_panels: qgemm.gemm_pack, from the int16 rows x16 / dx or, int8, from
    x), else float ones from x (gemm.pack_tokens)."""
    T, C = x.shape
    if not gemm:
        return np.zeros((0, C, NT), np.float32)
    if ints:
        P = np.empty(((T + NT - 1) // NT, gemm_width(C), NT), np.float32)
        gemm_pack(P, np.int64(0), x, x16, dx, row_range(T))
        return P
    return pack_tokens(x)


_GEMM_ITEMS = 16  # a dense matrix's items on the GEMM path: two a thread up to 8 threads (a constant: numba cannot
# cache a kernel that asks for its thread count)


@njit(fastmath=True, inline="always")
def item_rows(gemm, R, items):
    """Rows per parallel work item of an R-row matrix: _ROWS; on the GEMM path R / items in whole 6-row panels.
    Every GEMM item streams all the tokens' panels once (a KC slice of them stays in L2 while the item's
    panels pass), so few large items: at pp512 on `small`, 24-row items re-read an expert's 1 MB of panels
    32 times a matrix (2 GB a layer, more than L3 holds) and ran no faster than the dot products."""
    return MR * (-(-R // (items * MR))) if gemm else _ROWS


@njit(fastmath=True, cache=True)
def _chunk_off(wd, code, R, x, x16, dx, P, n, it, out, off):
    """Rows [it * n, (it + 1) * n) of W (R rows) into columns off + r of out [T, *] = x W^T, in
    place (a scratch block per item and its copy cost ~30% of a short-row product: `tiny`'s head)."""
    r0 = it * n
    table_rows_matmul(code, wd, r0, min(R, r0 + n), wd.shape[0] // R, x, x16, dx, P, out, off + r0)


@njit(parallel=prange_only(), nogil=True, fastmath=True, cache=True)
def _matmul(wd, code, R, x, out):
    """out[t, r] = W[r] . x[t] for one matrix (flat bytes wd, in place), rows across threads."""
    x16, dx = _quant_rows(x)
    gemm = gemm_path(x.shape[0], code)
    P = panels(x, x16, dx, gemm, int_panels(code))
    n = item_rows(gemm, R, _GEMM_ITEMS)
    for it in prange((R + n - 1) // n):
        _chunk_off(wd, code, R, x, x16, dx, P, n, np.int64(it), out, np.int64(0))


@njit(nogil=True, fastmath=True, cache=True)
def _matmul_serial(wd, code, R, x, out):
    """_matmul on the calling thread (small matrices: a parallel region costs more than it saves)."""
    x16, dx = _quant_rows(x)
    P = panels(x, x16, dx, gemm_path(x.shape[0], code), int_panels(code))
    table_rows_matmul(code, wd, np.int64(0), R, wd.shape[0] // R, x, x16, dx, P, out, np.int64(0))


_SERIAL_BYTES = 1 << 20  # weight bytes x tokens below which _matmul_serial is used
# The same where nothing else computes on these cores between a layer's kernels (the CPU step; an
# attention block). A parallel region costs ~2 us while the kernel threads still spin from the last
# one, 43-46 us once they sleep (after ~100 us idle: GOMP_SPINCOUNT, executor/__init__.py;
# bench_executor.py prints both): small products in regions of their own keep them spinning. 1 MB ->
# 128 KB on all-CPU decode, three alternating rounds, quiet: `tiny` 1,342-1,532 -> 1,941-2,595 tok/s,
# the llama-bench fixture's shape 414-455 -> 485-780, `small` unchanged (its products are larger);
# beside a busy process `tiny` 613-858 -> 1,568-2,085, the fixture 170-219 -> 150-167. Beside torch
# on the same cores (a CPU device's cache plans) the 1 MB threshold stays: there a parallel job of
# small experts races torch's threads for the two cores.
SERIAL_BYTES_HOT = 128 << 10


def flat(w) -> np.ndarray:
    """ExpertTensor bytes as a flat [E, rows * row_bytes] uint8 view (no copy)."""
    return w.data.reshape(w.data.shape[0], -1)


def expert_matmul(w, e: int, x: np.ndarray) -> np.ndarray:
    """W_e x for ExpertTensor `w`, expert `e`, x [T, cols] f32 -> [T, rows] f32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], w.rows), np.float32)
    _matmul(flat(w)[int(e)], w.code, w.rows, x, out)
    return out


def linear(flat_w: np.ndarray, code: int, rows: int, x: np.ndarray) -> np.ndarray:
    """x [T, cols] f32 times a 2-D weight read in place (flat bytes, type code) -> [T, rows] f32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], rows), np.float32)
    (_matmul_serial if flat_w.nbytes * x.shape[0] < _SERIAL_BYTES else _matmul)(flat_w, code, rows, x, out)
    return out


@njit(fastmath=True, cache=True)
def _parts_item(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, x16, dx, P, n, it, out):
    """Work item `it` over the n-row chunks of up to three stacked matrices (R = 0: absent)."""
    n0 = (R0 + n - 1) // n
    n1 = (R1 + n - 1) // n
    if it < n0:
        _chunk_off(w0, c0, R0, x, x16, dx, P, n, it, out, np.int64(0))
    elif it < n0 + n1:
        _chunk_off(w1, c1, R1, x, x16, dx, P, n, it - n0, out, R0)
    else:
        _chunk_off(w2, c2, R2, x, x16, dx, P, n, it - n0 - n1, out, R0 + R1)


@njit(fastmath=True, cache=True)
def _token_item(w, code, R, x, x16, dx, P, it, out, off):
    """_chunk_off for one token, the chunk a constant: rows [it * _ROWS, (it + 1) * _ROWS) of W."""
    r0 = it * _ROWS
    table_rows_matmul(code, w, r0, min(R, r0 + _ROWS), w.shape[0] // R, x, x16, dx, P, out, off + r0)


@njit(fastmath=True, cache=True)
def _parts_gemm(T, c0, c1, R1, c2, R2):
    """Whether any of the stacked matrices takes the GEMM path for T tokens."""
    return gemm_path(T, c0) or (R1 > 0 and gemm_path(T, c1)) or (R2 > 0 and gemm_path(T, c2))


@njit(parallel=prange_only(), nogil=True, fastmath=True, cache=True)
def _parts(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, out):
    """out [T, R0 + R1 + R2] = x [W0; W1; W2]^T: one activation quantisation (where read), rows across threads."""
    x16, dx = _quant_needed(x, reads_int16(x.shape[0], c0, c1, c2, R1, R2))
    gemm = _parts_gemm(x.shape[0], c0, c1, R1, c2, R2)
    P = panels(x, x16, dx, gemm, int_panels(c0, c1, c2, R1, R2))
    if x.shape[0] == 1:  # decode: items straight into the row kernels (_token_item), the chunk a constant:
        # the llama-bench fixture's 17 MB Q8_0 head 1.05-1.07x against the general items below (paired rounds),
        # its all-CPU decode 1.05x / 1.11x (alternating processes); `small` and `tiny` within noise
        n0, n1 = (R0 + _ROWS - 1) // _ROWS, (R1 + _ROWS - 1) // _ROWS
        for it in prange(n0 + n1 + (R2 + _ROWS - 1) // _ROWS):
            if it < n0:
                _token_item(w0, c0, R0, x, x16, dx, P, np.int64(it), out, np.int64(0))
            elif it < n0 + n1:
                _token_item(w1, c1, R1, x, x16, dx, P, np.int64(it - n0), out, R0)
            else:
                _token_item(w2, c2, R2, x, x16, dx, P, np.int64(it - n0 - n1), out, R0 + R1)
        return
    n = item_rows(gemm, R0 + R1 + R2, _GEMM_ITEMS)
    items = (R0 + n - 1) // n + (R1 + n - 1) // n + (R2 + n - 1) // n
    for it in prange(items):
        _parts_item(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, x16, dx, P, n, np.int64(it), out)


@njit(nogil=True, fastmath=True, cache=True)
def _parts_serial(w0, c0, R0, w1, c1, R1, w2, c2, R2, x, out):
    """_parts on the calling thread, each matrix in one call (no row chunks: their calls cost ~30% of a
    short-row product, `tiny`'s)."""
    x16, dx = _quant_needed(x, reads_int16(x.shape[0], c0, c1, c2, R1, R2))
    P = panels(x, x16, dx, _parts_gemm(x.shape[0], c0, c1, R1, c2, R2), int_panels(c0, c1, c2, R1, R2))
    if R0:
        table_rows_matmul(c0, w0, np.int64(0), R0, w0.shape[0] // R0, x, x16, dx, P, out, np.int64(0))
    if R1:
        table_rows_matmul(c1, w1, np.int64(0), R1, w1.shape[0] // R1, x, x16, dx, P, out, R0)
    if R2:
        table_rows_matmul(c2, w2, np.int64(0), R2, w2.shape[0] // R2, x, x16, dx, P, out, R0 + R1)


def linear_parts(parts, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x [T, cols] f32 times 1..3 stacked weights read in place, parts [(flat, code, rows, _)] -> [T, sum rows]
    in one kernel call (the activations are quantised once)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    rows = sum(p[2] for p in parts)
    if out is None:
        out = np.empty((x.shape[0], rows), np.float32)
    ps = list(parts) + [(parts[0][0][:0], parts[0][1], 0, None)] * (3 - len(parts))
    nbytes = sum(p[0].nbytes for p in parts)
    fn = _parts_serial if nbytes * x.shape[0] < _SERIAL_BYTES else _parts
    fn(ps[0][0], ps[0][1], ps[0][2], ps[1][0], ps[1][1], ps[1][2], ps[2][0], ps[2][1], ps[2][2], x, out)
    return out


@njit(parallel=True, nogil=True, fastmath=True, cache=True)
def _sum_u64(a):
    s = np.uint64(0)
    for i in prange(a.shape[0]):
        s += a[i]
    return s


def read_bandwidth(nbytes: int = 1 << 30, repeat: int = 5, pool: np.ndarray | None = None) -> float:
    """Measured memory read bandwidth (GB/s, best of `repeat`) of a parallel numba sum over nbytes (or
    over `pool`, uint64, allocated once by a caller that reads often)."""
    a = np.ones(nbytes // 8, np.uint64) if pool is None else pool
    nbytes = a.nbytes
    _sum_u64(a[:1024])
    best = 0.0
    for _ in range(repeat):
        t = time.perf_counter()
        _sum_u64(a)
        best = max(best, nbytes / (time.perf_counter() - t) / 1e9)
    return best


def set_threads(n: int | None) -> None:
    """Use `n` CPU threads for the kernels (None: all)."""
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS) if n else numba.config.NUMBA_NUM_THREADS)
