"""llamafile's tinyBLAS GEMM of F16 (and F32) weights (llama.cpp 0.3.36's ggml-cpu llamafile/sgemm.cpp), rebuilt for
the simulator's llama.cpp prefill of its dense path.

ggml's MUL_MAT of F16 weights on a batch (ggml-cpu.c ggml_compute_forward_mul_mat, built with GGML_USE_LLAMAFILE)
converts the F32 activations to F16 (the type's vec_dot_type; each thread a share of every token's row), then hands
the whole product to llamafile_sgemm: tinyBLAS<KN, ...>::matmul(m weight rows, n tokens, k). F32 weights (the MoE
router) take the same template on the F32 activations as they are.
- KN floats a vector: 16 with AVX-512 (32 vector registers), 8 with AVX2 and F16C (16 registers).
- Tiles of RM = 4 rows x RN tokens (RN <= 6 with 32 registers, <= 3 with 16: `tile_plan`); per KN of k the 4 rows'
  F16 loaded and widened (vcvtph2ps), then each token's, and RM x RN fused multiply-adds into as many vector
  accumulators (gemm_bloc); each accumulator summed across its lanes into C at the end.
- RN = BLOCK_SIZE<RN max>(n): n split into as few blocks as keep each at most RN max, as even as they go; the
  tokens left over take tiles one narrower.
- The work as jobs of BM row tiles (16 rows where m / 16 covers the threads) x a block of about BN token tiles
  (12 / 24), handed out through an atomic counter, each thread starting at its own index (gemm<RM, RN, BM>).
m not a multiple of 4, or k of KN: llamafile declines and ggml runs its vec_dot loop (`tile_plan` gives None).

The float arithmetic is tinyBLAS's, per accumulator in k order: tests check the products against float64 ones of
the same F16 values to float rounding.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from executor.nbcache import drop_stale_cache
from executor.simd import F32, I32, I64, V, _fn, _slice
from executor.vnni import _FEATURES

drop_stale_cache(__file__)

HAVE_AVX512F = "+avx512f" in _FEATURES
HAVE_F16C = HAVE_AVX512F or all(f"+{f}" in _FEATURES for f in ("avx2", "f16c"))
KN = 16 if HAVE_AVX512F else 8  # floats a vector register (tinyBLAS's KN)
RM = 4  # rows a tile
# per register file: (RN max, BN): tinyBLAS::matmul's VECTOR_REGISTERS 32 (AVX-512) / 16 branches
TILES = {32: (6, 12), 16: (3, 24)}
REGISTERS = 32 if HAVE_AVX512F else 16
HALF = ir.HalfType()


def tile_plan(m: int, n: int, k: int, nth: int, registers: int = REGISTERS, kn: int = KN):
    """(RN, BM, BN) tinyBLAS::matmul picks for m weight rows x n tokens x k on nth threads, or None where it
    declines (k not a multiple of kn, m of 4)."""
    if k % kn or m % RM or n < 1:
        return None
    rn_max, bn = TILES[registers]
    bm = 4 if m % 16 == 0 and m // 16 >= nth else 2 if m % 8 == 0 else 1
    nb = (n + rn_max - 1) // rn_max  # BLOCK_SIZE<RN max>(n)
    return (n // nb if n % nb == 0 else n // nb + 1), bm, bn


# ---- gemm_bloc<RM, RN>: one tile, all of k -------------------------------------------------------------------------

def _bloc_codegen(rn: int):
    """Codegen of gemm_bloc<4, rn>: C[(jj + j) * ldc + ii + i] = sum_l A[ii + i, l] * B[jj + j, l], i < 4, j < rn,
    A's rows at lda, B's at ldb (elements; F16 bits where A is uint16, else float32), k a multiple of KN."""
    vt = V(F32, KN)

    def gen(context, builder, sig, args):
        A, ao, lda, B, bo, ldb, k, C, co, ldc = args
        data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        ad, bd, cd = data(0, A), data(3, B), data(7, C)
        half = sig.args[0].dtype == types.uint16
        fma = _fn(builder, f"llvm.fma.v{KN}f32", vt, [vt] * 3)
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(vt, [0.0] * KN)) for _ in range(RM)]
                for _ in range(rn)]
        rows_a = [builder.gep(ad, [builder.add(ao, builder.mul(lda, ir.Constant(I64, i)))]) for i in range(RM)]
        rows_b = [builder.gep(bd, [builder.add(bo, builder.mul(ldb, ir.Constant(I64, j)))]) for j in range(rn)]

        def load(p, l):  # tinyBLAS's load<V>: KN halves widened (vcvtph2ps), or KN floats
            if half:
                return builder.fpext(builder.load(builder.bitcast(builder.gep(p, [l]), V(HALF, KN).as_pointer()),
                                                  align=1), vt)
            return builder.load(builder.bitcast(builder.gep(p, [l]), vt.as_pointer()), align=4)

        def madd(a, b, acc):
            builder.store(builder.call(fma, [a, b, builder.load(acc)]), acc)

        with cgutils.for_range_slice(builder, ir.Constant(I64, 0), k, ir.Constant(I64, KN)) as (l, _):
            if RM <= rn:  # "help compiler for op order": the rows first, then token by token
                av = [load(rows_a[i], l) for i in range(RM)]
                for j in range(rn):
                    bv = load(rows_b[j], l)
                    for i in range(RM):
                        madd(av[i], bv, accs[j][i])
            else:  # the tokens first, then row by row
                bv = [load(rows_b[j], l) for j in range(rn)]
                for i in range(RM):
                    av = load(rows_a[i], l)
                    for j in range(rn):
                        madd(av, bv[j], accs[j][i])
        for j in range(rn):
            for i in range(RM):
                s = builder.load(accs[j][i])
                w = KN
                while w > 1:  # _mm512_reduce_add_ps: halves added until one lane
                    w //= 2
                    s = builder.fadd(_slice(builder, s, 0, w), _slice(builder, s, w, w)) if w > 1 else \
                        builder.fadd(builder.extract_element(s, ir.Constant(I32, 0)),
                                     builder.extract_element(s, ir.Constant(I32, 1)))
                off = builder.add(co, builder.add(builder.mul(ldc, ir.Constant(I64, j)), ir.Constant(I64, i)))
                builder.store(s, builder.gep(cd, [off]))
        return context.get_dummy_value()
    return gen


def _bloc(rn: int):
    @intrinsic
    def bloc(typingctx, A, ao, lda, B, bo, ldb, k, C, co, ldc):
        return types.none(A, ao, lda, B, bo, ldb, k, C, co, ldc), _bloc_codegen(rn)
    return bloc


_B1, _B2, _B3, _B4, _B5, _B6 = (_bloc(r) for r in range(1, 7))


@njit(inline="always")
def _run_bloc(rn, A, ao, lda, B, bo, ldb, k, C, co, ldc):
    """gemm_bloc<4, rn> on one tile (rn <= 6)."""
    if rn == 6:
        _B6(A, ao, lda, B, bo, ldb, k, C, co, ldc)
    elif rn == 5:
        _B5(A, ao, lda, B, bo, ldb, k, C, co, ldc)
    elif rn == 4:
        _B4(A, ao, lda, B, bo, ldb, k, C, co, ldc)
    elif rn == 3:
        _B3(A, ao, lda, B, bo, ldb, k, C, co, ldc)
    elif rn == 2:
        _B2(A, ao, lda, B, bo, ldb, k, C, co, ldc)
    else:
        _B1(A, ao, lda, B, bo, ldb, k, C, co, ldc)


@njit(inline="always")
def _bloc_pos(ib, ibn, size):
    """BLOC_POS: where block ib starts when the first ibn blocks are `size` long and the rest size - 1."""
    return ib * size if ib < ibn else ibn * size + (ib - ibn) * (size - 1)


# ---- gemm<RM, RN, BM>: the jobs ------------------------------------------------------------------------------------

@njit(parallel=True, nogil=True, cache=True)
def _gemm(A, B, C, m, n, k, rn, bm, bn, nthr):
    """C [n, m] = B [n, k] . A [m, k]^T by tinyBLAS::gemm<4, rn, bm>, BN = bn: the jobs of bm row tiles x a block
    of about bn token tiles in turn, thread th from job th on (ggml's atomic chunk counter; nthr: numba's threads,
    passed in); A and B F16 bits (uint16), or float32."""
    ytiles = m // (RM * bm)
    xtiles = (n + rn - 1) // rn
    jj_rn = xtiles - (xtiles * rn - n)  # tiles rn wide; the rest rn - 1
    nb_bn = 1 if xtiles < bn else (xtiles + bn // 2) // bn
    size_bn = xtiles // nb_bn if xtiles % nb_bn == 0 else xtiles // nb_bn + 1
    jj_bn = nb_bn - (nb_bn * size_bn - xtiles)
    nb_job = ytiles * nb_bn
    for th in prange(nthr):
        for job in range(th, nb_job, nthr):
            ii = (job % ytiles) * RM * bm
            jb = job // ytiles
            jj0 = _bloc_pos(_bloc_pos(jb, jj_bn, size_bn), jj_rn, rn)
            jj2 = _bloc_pos(_bloc_pos(jb + 1, jj_bn, size_bn), jj_rn, rn)
            jj1 = min(jj2, jj_rn * rn)
            for bi in range(0, bm * RM, RM):
                jj = jj0
                while jj < jj1:
                    _run_bloc(rn, A, np.int64((ii + bi) * k), np.int64(k), B, np.int64(jj * k), np.int64(k),
                              k, C, np.int64(jj * m + ii + bi), np.int64(m))
                    jj += rn
                while jj < jj2:
                    _run_bloc(rn - 1, A, np.int64((ii + bi) * k), np.int64(k), B, np.int64(jj * k),
                              np.int64(k), k, C, np.int64(jj * m + ii + bi), np.int64(m))
                    jj += rn - 1


# ---- the activations to F16 (ggml's from_float into wdata) -----------------------------------------------------------

@intrinsic
def _to_f16(typingctx, src, so, dst, do):
    """dst[do:do + KN] = src[so:so + KN] as F16 bits (vcvtps2ph, round to nearest even)."""
    def gen(context, builder, sig, args):
        s, so_, d, do_ = args
        data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        v = builder.load(builder.bitcast(builder.gep(data(0, s), [so_]), V(F32, KN).as_pointer()), align=4)
        builder.store(builder.fptrunc(v, V(HALF, KN)),
                      builder.bitcast(builder.gep(data(2, d), [do_]), V(HALF, KN).as_pointer()), align=2)
        return context.get_dummy_value()
    return types.none(src, so, dst, do), gen


@njit(parallel=True, nogil=True, cache=True)
def to_f16(x, out, nthr):
    """out [n, k] uint16 = x [n, k] float32 as F16 bits, each thread its share of every row (k a multiple of KN)."""
    n, k = x.shape
    nb = k // KN
    xf, of = x.reshape(-1), out.reshape(-1)
    for th in prange(nthr):
        b0, b1 = th * nb // nthr, (th + 1) * nb // nthr
        for t in range(n):
            for b in range(b0, b1):
                _to_f16(xf, np.int64(t * k + b * KN), of, np.int64(t * k + b * KN))


def sgemm(w, x, out, nthr: int, x16=None) -> bool:
    """out [n, m] = x [n, k] . w [m, k]^T as ggml's MUL_MAT runs it through llamafile: w F16 bits (uint16) with x
    converted to F16 first (into x16 [n, k] uint16 where given), or w float32 with x as it is. False where
    llamafile declines the shape (tile_plan)."""
    m, k = w.shape
    n = x.shape[0]
    plan = tile_plan(m, n, k, nthr)
    if plan is None or not HAVE_F16C:
        return False
    rn, bm, bn = plan
    if w.dtype == np.uint16:
        b = x16 if x16 is not None else np.empty(x.shape, np.uint16)
        to_f16(x, b, nthr)
    else:
        b = x
    _gemm(w, b, out, np.int64(m), np.int64(n), np.int64(k), np.int64(rn), np.int64(bm),
          np.int64(bn), nthr)
    return True
