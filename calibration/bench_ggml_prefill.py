"""The CPU prefill rate of an engine built like llama.cpp's ggml: its MUL_MAT_ID on a batch of tokens, by the
path ggml takes for the experts' weight layout (llama.cpp 0.3.36's vendored ggml-cpu):

- `vecdot` (Q8_0, Q4_0 and IQ4_NL not repacked, ...): an expert's rows x its tokens in 16 x 16 blocks, one dot
  product per (row, token) pair, the chunks handed to the threads in turn (ggml-cpu.c
  `ggml_compute_forward_mul_mat_id_one_chunk`), each op's activations quantised to Q8_0 first.
- `repacked` (the formats llama.cpp interleaves 8 rows at load: Q4_0 and Q4_K on AVX2, Q2_K on
  AVX-512 F): each thread takes the
  same eighth-aligned share of every expert's rows and runs it token by token, 8 rows a pass
  (repack.cpp `forward_mul_mat_id`, a gemv per token: no GEMM, each token re-reads the share from cache).
- `tiled` (K-quants and IQ4_XS in place from 8 tokens an expert): each thread its share of every expert's 64-row
  groups, the weights unpacked to bytes a 256-wide slab at a time and multiplied with the tokens' Q8_K codes in
  16 x 16 microtiles (tiled/tiled.cpp; rebuilt in calibration.ggml_tiled with its AVX-512 VNNI microtile);
  `tiled-narrow` with 16 tokens or fewer an expert: slabs long in K, 16 rows unpacked at a time, timed at 16.
  calibrate times `tiled` twice, at 64 tokens an expert and at a full window of 256: the weights are unpacked once a
  window, so the rate rises with the tokens that share it (ggml's Q3_K gate products on one Zen 4 core: 86 / 109 /
  143 / 153 GFLOP/s at 32 / 64 / 128 / 256 tokens an expert; Q4_K's 152 / 176 / 191 / 200), and the two rates give
  what a window shares (CPU.ggml_prefill_fixed_tokens; simulator.resources.ggml_window_scale).
Which path a format takes is specs.formats.llamacpp_prefill_path. Beside the experts,
- `sgemm` (F16 dense weights: an attention block's Q, K, V and output products): llamafile's tinyBLAS, the tokens
  converted to F16 first (rebuilt in calibration.ggml_sgemm; specs.formats.llamacpp_dense_prefill_key).

Only the structures whose rebuild here runs at ggml's own rate are timed (`TIMED`). The dot products are
ggml's AVX2 vec_dot rebuilt (calibration.ggml_vec_dot: int8 activations, vpmaddubsw): at 32-128 tokens an
expert on one Zen 3 core it runs Q4_0 at 27 GFLOP/s where ggml's MUL_MAT_ID does 26.7 and Q8_0 at 29-30
against 34.4 (test-backend-ops perf, qwen3-30b-a3b's 768 x 2048 experts, 32 tokens an expert). Repacked
Q4_0 runs ggml's AVX2 q4_0 8x8 gemv rebuilt (ggml_vec_dot.gemv_q4_0x8: int8 activations, 8 rows' blocks side
by side): 46-55 GFLOP/s on one Zen 3 core, where llama-bench's pp512 implies ~48 for ggml's own (the executor's
int16 interleaved rows, which stood in for it before, 38-45). Repacked Q4_K and Q2_K run the same structure with
their own 8x8 gemvs on Q8_K tokens, rebuilt too (calibration.ggml_gemv_q4_k, _q2_k); the other repacked formats
(IQ4_NL, MXFP4) take the Q4_0 gemv's rate (specs.formats.LLAMACPP_REPACKED_STAND_IN), as Q4_K and Q2_K did before.
The tiled GEMM is timed where its VNNI microtile runs (ggml_tiled.HAVE_TILED); on an AVX2-only CPU (its maddubs
microtile, not rebuilt) a llama.cpp plan prefills those types at the executor's GEMM rate (0.73x of ggml's tiled
GEMM on Zen 4), as every other plan does. The simulator's llama.cpp plans take these rates for their CPU prefill
(`cpu.ggml_prefill_gflops`; simulator.resources).
"""
from __future__ import annotations


import numba
import numpy as np
from numba import njit, prange

from executor.gemm import Q2_K
from executor.nbcache import drop_stale_cache
from executor.simd import HAVE_AVX2

from .bench_kernel import _synth_tensor
from .bench_rowwise import REPACK_ROWS, gemv_name, repacked_share
from .ggml_gemv_q2_k import repack_q2_k_x8
from .ggml_gemv_q4_k import repack_q4_k_x8
from .ggml_tiled import HAVE_TILED, TILED_ISA, TILED_TYPES, quantize_q8_k
from .ggml_vec_dot import quantize_row_q8_0

# kernels compiled in here come from ggml_vec_dot, bench_rowwise's constants and the executor's codegen helpers
drop_stale_cache(__file__)

BLOCK = 16  # ggml's 16 x 16 (rows x tokens) blocks of dot products (blck_0, blck_1)
PATHS = ("vecdot", "repacked", "tiled", "tiled-narrow")  # of specs.formats.llamacpp_prefill_path's, those timed here
TILED_PATHS = ("tiled", "tiled-narrow")
# AVX2 only (ggml_vec_dot); the tiled path where its VNNI microtile runs (ggml_tiled.HAVE_TILED)
TIMED = ((("Q8_0", "vecdot"), ("Q4_0", "vecdot"), ("IQ4_NL", "vecdot"), ("Q4_0", "repacked"), ("Q4_K", "repacked"),
          ("Q2_K", "repacked")) + tuple((t, p) for t in TILED_TYPES for p in TILED_PATHS))
# the repacked formats whose gemv takes Q8_K tokens (the others Q8_0), and llama.cpp's load-time copy of each
REPACK_X8 = {"Q4_K": repack_q4_k_x8, "Q2_K": repack_q2_k_x8}
Q8_K_REPACKED = tuple(REPACK_X8)
DENSE = ("F16", "sgemm")  # llama.cpp's dense products on llamafile's tinyBLAS (ggml_dense_prefill_job)
# its multiply of the expert outputs by their router weights (calibration.ggml_binary.weighting_job): a multiply a
# value, so its "GFLOP/s" are giga-values a second
WEIGHTING = ("F32", "weighting")

if HAVE_TILED:
    from .ggml_tiled import CODES, tiled_matrix

if HAVE_AVX2:
    from .ggml_gemv_q2_k import gemv_q2_kx8
    from .ggml_gemv_q4_k import gemv_q4_kx8
    from .ggml_vec_dot import gemv_q4_0x8, vec_dot

    @njit(parallel=True, nogil=True, fastmath=True, cache=True)
    def _vecdot_matrix(w, code, rows, X8, DX, out):
        """out[e, t, r] = W_e[r] . X8[e, t] * DX[e, t] (w [E, bytes] Q8_0 / Q4_0 / IQ4_NL, X8 int8 / DX [E, T, ...]) in
        16 x 16 blocks, ggml's vec_dot a pair at a time; one parallel region over every expert's chunks."""
        E, T = X8.shape[0], X8.shape[1]
        rb = np.int64(w.shape[1] // rows)
        nb = np.int64(X8.shape[2] // 32)
        n0, n1 = (rows + BLOCK - 1) // BLOCK, (T + BLOCK - 1) // BLOCK
        for i in prange(E * n0 * n1):
            e, c = i // (n0 * n1), i % (n0 * n1)
            r0, t0 = (c % n0) * BLOCK, (c // n0) * BLOCK
            for t in range(t0, min(T, t0 + BLOCK)):
                for r in range(r0, min(rows, r0 + BLOCK)):
                    vec_dot(code, w[e], np.int64(r * rb), rb, X8[e, t], DX[e, t], nb, out[e, t], np.int64(r))

    @njit(parallel=True, nogil=True, fastmath=True, cache=True)
    def _repacked_matrix(w, rows, X8, DX, out, nthr, BS=None, code=0):
        """out[e, t, r] = W_e[r] . X8[e, t] * DX[e, t] for Q4_0 in llama.cpp's repacked layout (block_q4_0x8) as
        ggml's repacked MUL_MAT_ID runs it: each thread its eighth-aligned share of every expert's rows, token by
        token, 8 rows a pass (ggml's q4_0 8x8 gemv, int8 activations); given BS, the Q8_K tokens' code sums, a
        K-quant (`code`: Q4_K or Q2_K) in block_q4_Kx8 / block_q2_Kx8 by ggml's q4_K / q2_K 8x8 gemv
        (calibration.ggml_gemv_q4_k, _q2_k). Each layout holds 8 rows' blocks side by side, so a row's bytes stay rb.
        nthr: numba's thread count, passed in (read inside, it would keep the function out of numba's on-disk
        cache)."""
        E, T = X8.shape[0], X8.shape[1]
        rb = np.int64(w.shape[1] // rows)
        for th in prange(nthr):
            r0, r1 = repacked_share(th, rows, nthr)
            for e in range(E):
                for t in range(T):
                    for r in range(r0, r1, REPACK_ROWS):
                        if BS is None:
                            gemv_q4_0x8(w[e], np.int64(r * rb), X8[e, t], DX[e, t], np.int64(X8.shape[2] // 32),
                                        out[e, t], np.int64(r))
                        elif code == Q2_K:
                            gemv_q2_kx8(w[e], np.int64(r * rb), X8[e, t], DX[e, t], BS[e, t],
                                        np.int64(X8.shape[2] // 256), out[e, t], np.int64(r))
                        else:
                            gemv_q4_kx8(w[e], np.int64(r * rb), X8[e, t], DX[e, t], BS[e, t],
                                        np.int64(X8.shape[2] // 256), out[e, t], np.int64(r))

def quantize_q8_0(a):
    """a [E, T, n] float32 -> (int8 [E, T, n], float32 scales [E, T, n/32]): ggml's Q8_0 activations."""
    x8 = np.empty(a.shape, np.int8)
    dx = np.empty(a.shape[:2] + (a.shape[2] // 32,), np.float32)
    _quantize_rows(a.reshape(-1, a.shape[2]), x8.reshape(-1, a.shape[2]), dx.reshape(-1, dx.shape[2]))
    return x8, dx


@njit(nogil=True, cache=True)
def _quantize_rows(a, x8, dx):
    for i in range(a.shape[0]):
        quantize_row_q8_0(a[i], x8[i], dx[i])


def job_tokens(path: str, tokens: int, n_experts: int, top_k: int) -> int:
    """The batch a path is timed on: `tokens`, but for the tiled GEMM's narrow path at most as many as put 16 tokens
    on an expert (its widest case, specs.formats.LLAMACPP_TILED_NARROW_MAX_TOKENS)."""
    from specs.formats import LLAMACPP_TILED_NARROW_MAX_TOKENS
    return min(tokens, LLAMACPP_TILED_NARROW_MAX_TOKENS * n_experts // top_k) if path == "tiled-narrow" else tokens


def ggml_prefill_job(fmt: str = "Q8_0", path: str = "vecdot", hidden: int = 2048, ffn: int = 768,
                     n_experts: int = 32, top_k: int = 8, tokens: int = 64, seed: int = 0):
    """(run, flops): one prefill batch of `tokens` tokens, top_k of n_experts synthetic `fmt` SwiGLU experts
    each (an even split: tokens * top_k / n_experts tokens an expert), gate, up and down as three ggml ops on
    `path`. SwiGLU's activation is not applied (values don't matter to the timing). Each op first converts its
    activations to its dot type as ggml's MUL_MAT_ID does, once a row of its src1: gate and up each the batch's
    `tokens` rows (its experts then read them by pointer), down each (token, expert) pair's own row."""
    if (fmt, path) not in TIMED or not HAVE_AVX2 or (path in TILED_PATHS and not HAVE_TILED):
        raise ValueError(f"no rebuild of ggml's {path} path for {fmt} here (have {TIMED}, AVX2 only; "
                         "tiled with AVX-512 VNNI)")
    rng = np.random.default_rng(seed)
    per = max(1, tokens * top_k // n_experts)  # tokens an expert
    mats = [_synth_tensor(fmt, n_experts, r, c, rng) for r, c in ((ffn, hidden), (ffn, hidden), (hidden, ffn))]
    ws = [m.data.reshape(n_experts, -1) for m in mats]
    q8_k = fmt in Q8_K_REPACKED and path == "repacked"
    if q8_k:  # llama.cpp's load-time copy into block_q4_Kx8 / block_q2_Kx8
        ws = [np.stack([REPACK_X8[fmt](m.data[e].reshape(-1), m.rows).reshape(-1) for e in range(n_experts)])
              for m in mats]
    code = mats[0].code
    x = rng.standard_normal((n_experts, per, hidden)).astype(np.float32)  # the rows each expert reads
    batch = x.reshape(-1, hidden)[:tokens][None]  # the batch's own rows, [1, tokens, hidden]
    h = (rng.standard_normal((n_experts, per, ffn)) * 0.1).astype(np.float32)
    tiled = path in TILED_PATHS
    quantize = quantize_q8_k if tiled or q8_k else quantize_q8_0
    qx = quantize(x)  # the gathered rows gate and up read (ggml: pointers into its converted batch)

    g, y = np.zeros((n_experts, per, ffn), np.float32), np.zeros((n_experts, per, hidden), np.float32)

    def product(w, rows, q, out):
        if path == "vecdot":
            _vecdot_matrix(w, code, rows, *q, out)
        elif tiled:
            tiled_matrix(CODES[fmt], w, rows, *q, out, numba.get_num_threads())
        elif q8_k:
            x8, dx, bs = q
            _repacked_matrix(w, rows, x8, dx, out, numba.get_num_threads(), bs, code)
        else:
            _repacked_matrix(w, rows, *q, out, numba.get_num_threads())

    def run():
        for w in ws[:2]:  # gate, up: the batch converted, then the experts' products
            quantize(batch)
            product(w, ffn, qx, g)
        product(ws[2], hidden, quantize(h), y)  # down: every pair's row converted
    return run, 6.0 * hidden * ffn * per * n_experts


def ggml_dense_prefill_job(hidden: int = 2048, head_dim: int = 64, tokens: int = 512, seed: int = 0):
    """(run, flops): one prefill batch of `tokens` tokens through an F16 attention block's Q, K, V and output
    products as llama.cpp's graph runs them, four MUL_MATs on llamafile's tinyBLAS (calibration.ggml_sgemm), each
    converting its activations to F16 first. The heads as executor_dense_prefill_jobs': a quarter of the hidden
    width in query heads, half that in K / V."""
    from .ggml_sgemm import sgemm
    rng = np.random.default_rng(seed)
    rq = max(1, hidden // (4 * head_dim)) * head_dim
    rk = max(head_dim, rq // 2)
    shapes = ((rq, hidden), (rk, hidden), (rk, hidden), (hidden, rq))  # (rows, k): q, k, v, o
    ws = [(rng.standard_normal(s, dtype=np.float32) * 0.02).astype(np.float16).view(np.uint16) for s in shapes]
    x = rng.standard_normal((tokens, hidden)).astype(np.float32)
    o = rng.standard_normal((tokens, rq)).astype(np.float32)
    outs = [np.empty((tokens, r), np.float32) for r, _ in shapes]
    wdata = np.empty(tokens * max(hidden, rq), np.uint16)  # ggml's work buffer: each op's tokens as F16 rows

    def run():
        for w, a, out in zip(ws, (x, x, x, o), outs):
            if not sgemm(w, a, out, numba.get_num_threads(), wdata[:a.size].reshape(a.shape)):
                raise ValueError(f"llamafile declines {w.shape} x {a.shape}")
    return run, 2.0 * tokens * sum(r * k for r, k in shapes)


def dense_job(isa: list[str]) -> tuple[str, str] | None:
    """(format, path) of llama.cpp's dense prefill products timed on a CPU with `isa` (DENSE), or None where
    llamafile's tinyBLAS does not take F16 there or this CPU does not run its rebuild."""
    from specs.formats import llamacpp_dense_prefill_key

    from .ggml_sgemm import HAVE_F16C
    return DENSE if HAVE_F16C and llamacpp_dense_prefill_key(DENSE[0], isa) else None


def profile_jobs(formats, isa: list[str], own=frozenset()) -> list[tuple[str, str]]:
    """(format, path) of every ggml prefill structure a llama.cpp plan of these expert formats takes on a CPU
    with `isa` at a prefill batch (>= 8 tokens an expert), of those rebuilt here (`TIMED`, AVX2 only; the tiled
    path where ggml compiles its AVX-512 VNNI microtile and this CPU runs its rebuild) or in `own`, the (format,
    path) pairs a llama.cpp build's own kernels time (calibration.bench_ggml_own)."""
    from specs.formats import LLAMACPP_TILED_NARROW_MAX_TOKENS, llamacpp_prefill_path, llamacpp_repacks, parse_format
    if "avx2" not in isa and not own:
        return []
    jobs = []
    for fmt in formats:
        wf = parse_format(fmt)
        paths = ({llamacpp_prefill_path(wf, False, m, isa) for m in (LLAMACPP_TILED_NARROW_MAX_TOKENS, 64)}
                 | ({"repacked"} if llamacpp_repacks(wf, isa) else set()))
        jobs += [(fmt, p) for p in PATHS if p in paths and ((fmt, p) in own or "avx2" in isa and (fmt, p) in TIMED
                 and (p not in TILED_PATHS or (HAVE_TILED and all(f in isa for f in TILED_ISA))))]
    return jobs


def label(fmt: str, path: str, hidden: int, ffn: int) -> str:
    """The method line of a ggml prefill rate in a profile."""
    how = {"vecdot": "ggml's int8 vec_dot per (row, token) in 16 x 16 blocks",
           "repacked": f"each thread's share of rows token by token, ggml's {gemv_name(fmt)}"
                       + (" on Q8_K tokens" if fmt in Q8_K_REPACKED else ""),
           "tiled": "64-row groups unpacked to bytes by 256-wide slabs, Q8_K tokens, 16 x 16 VNNI microtiles",
           "tiled-narrow": "16 rows at a time unpacked by slabs long in K, Q8_K tokens, 16 x 16 VNNI microtiles"}.get(path)
    if path == "weighting":
        return (f"ggml's MUL of build_moe_ffn, expert outputs x router weights broadcast over rows of {hidden} "
                f"(a scalar multiply a value; calibration.ggml_binary), GFLOP/s = giga-values a second")
    if path == "sgemm":
        return (f"llamafile's tinyBLAS for {fmt} dense weights (ggml MUL_MAT, tokens to F16, 4-row tiles; "
                f"calibration.ggml_sgemm) Q/K/V/output of an attention block of {hidden}")
    return f"ggml's MUL_MAT_ID structure for {fmt} ({path}: {how}; calibration.bench_ggml_prefill) SwiGLU {hidden}x{ffn}"
