"""ggml's tiled GEMM for K-quant and IQ4_XS experts in place (llama.cpp 0.3.36's ggml-cpu tiled/), rebuilt with its
AVX-512 VNNI microtile, for the simulator's llama.cpp prefill.

ggml's MUL_MAT_ID hands an expert to this path when 8 or more tokens route to it and its weights sit in place in
one of these types (tiled.cpp ggml_compute_forward_mul_mat_id_tiled; specs.formats.llamacpp_prefill_path). Each
thread takes its share of the expert's 64-row groups (TILED_MMID_GROUP) and, for each window of up to 256 of the
expert's tokens, each group (tiled_mmid_gemm_window):
- unpacks the weights a 256-wide slab at a time (tiled_unpack_src0): each code widened to an unsigned byte, biased
  where the type's values are signed (Q6_K +32, Q3_K +4, IQ4_XS's codebook +128), each sub-block's integer scale
  (and min) to int32, d (and dmin) to float;
- stages the tokens' Q8_K rows (int8 codes, one float scale and sixteen 16-code sums a 256-block) into the thread's
  workspace, each band of 16 tokens interleaved four codes a token (tiled_repack_src1's 16 x 16 int32 transpose);
- runs 16 x 16 microtiles as two 8 x 16 bands (tiled_run_micro_vnni_8x16): per four codes of a row one broadcast
  and one 512-bit vpdpbusd against 16 tokens' four codes; per sub-block the sums minus BIAS times the tokens' code
  sums, times the row's scale (vpmulld), into an int32 accumulator; the mins' term from the code sums after; one
  convert and the float scales at the end, added into a float window of 64 rows x 256 tokens;
- scatters the window to the tokens' output rows, 16 rows x 8 tokens at a time, each token's 16 rows one run
  (tiled_store_window_scatter). Row by row, as the rebuild first wrote it, each write lands a token's output row
  apart (8 KiB for a down product's 2048 rows: one L1 set): the down products ran at 112 GFLOP/s a core against
  ggml's 196 (Q4_K, `small` at pp512), and calibrate's rates levelled near 150 (2026-12-06).
With 16 tokens or fewer an expert (the narrow path) a slab spans as much K as keeps 16 rows of codes in 31 KiB of
L1 (ggml_tiled_narrow_k_extent), each group's rows unpacked 16 at a time.

The integer arithmetic is ggml's, exact: tests check the products against the dequantised weights times the
quantised tokens to float rounding. Only the VNNI microtile is rebuilt (HAVE_TILED: AVX-512 F, BW, VL, DQ and
VNNI, the ISA under which ggml compiles it); AVX2-only CPUs run a maddubs microtile with no transpose, not timed here.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

from executor.iquants import KVALUES
from executor.kquant_blocks import _q3_k_scale, _q4_k_scale_min
from executor.nbcache import drop_stale_cache
from executor.simd import F32, I8, I16, I32, I64, V, _fn, _splat, h2f
from executor.vnni import _FEATURES
from specs.formats import LLAMACPP_TILED_WINDOW_TOKENS

drop_stale_cache(__file__)

# cpuinfo's names of the ISA under which ggml compiles the VNNI microtile (and AVX-512 DQ, which every CPU with
# AVX-512 VNNI has); HAVE_TILED: whether this CPU runs its rebuild
TILED_ISA = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
HAVE_TILED = all(f"+{f}" in _FEATURES for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vnni"))
TILE_K = 256  # one QK_K block: a slab of K
MICRO = 16  # microtile edge; also the Q8_K code sums' granularity
GROUP = 64  # weight rows a thread's window (TILED_MMID_GROUP)
WINDOW = LLAMACPP_TILED_WINDOW_TOKENS  # tokens a window (TILED_TILE_ROWS)
L1_BYTES = 31 * 1024  # the narrow path's budget for 16 rows of codes (ggml_tiled_narrow_k_extent)

# type -> (bytes a 256-block, SUBBLK, HAS_MIN, BIAS, ACTBIAS) (tiled.cpp ggml_tiled_matmul_type_dispatch)
TILED_TYPES = {"Q4_K": (144, 32, True, 0, False), "Q5_K": (176, 32, True, 0, False),
               "Q6_K": (210, 16, False, 32, True), "Q3_K": (110, 16, False, 4, True),
               "Q2_K": (84, 16, True, 0, False), "IQ4_XS": (136, 32, False, 128, False)}
CODES = {name: i for i, name in enumerate(TILED_TYPES)}
_BLOCK_BYTES = np.array([v[0] for v in TILED_TYPES.values()], np.int64)
_IQ4_LUT = (KVALUES.astype(np.int32) + 128).astype(np.uint8)  # the codebook stored as kvalues + 128 (BIAS 128)


@njit(cache=True)
def narrow_k_extent(n_tokens: int, k: int) -> int:
    """K elements a narrow-path slab spans (ggml_tiled_narrow_k_extent): 16 rows of codes and the tokens' within
    L1_BYTES, a multiple of 256 dividing k; 0 if none."""
    ke = L1_BYTES // (MICRO + max(n_tokens, MICRO))
    ke = min(ke - ke % TILE_K, WINDOW * TILE_K // MICRO)
    while ke >= TILE_K and k % ke:
        ke -= TILE_K
    return ke if ke >= TILE_K else 0


# ---- the weights: one 256-block of a row to unsigned codes, int32 scales (and mins), float d (and dmin)

def _bytes_codegen(lut: bool):
    """Codegen of ggml's 32-byte unpack primitives (tiled-kernel.h): dst[do + l] = ((src[so + l] >> S) & M) << D,
    l < 32, or-ed into dst's bytes where orin; with `lut`, 16 bytes through a 16-entry table at lut instead
    (tiled_lut8): dst[do + l] = table[(src[so + l] >> S) & 15]."""
    def gen(context, builder, sig, args):
        ptr = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        if lut:
            src, so, dst, do, S, tab = args
            n = 16
        else:
            src, so, dst, do, S, M, D, orin = args
            n = 32
        vt, wt = V(I8, n), V(I16, n // 2)
        at = lambda i, a, o: builder.bitcast(builder.gep(ptr(i, a), [o]), vt.as_pointer())  # noqa: E731

        def shift(op, v, k):  # shifted in 16-bit lanes, as ggml's epi32 shifts: a uniform count, the mask after
            return builder.bitcast(op(builder.bitcast(v, wt), _splat(builder, builder.trunc(k, I16), n // 2)), vt)

        mask = _splat(builder, builder.trunc(M, I8), n) if not lut else ir.Constant(vt, [15] * n)
        v = builder.and_(shift(builder.lshr, builder.load(at(0, src, so), align=1), S), mask)
        if lut:
            t = builder.load(builder.bitcast(ptr(5, tab), vt.as_pointer()), align=1)
            pshufb = _fn(builder, "llvm.x86.ssse3.pshuf.b.128", vt, [vt, vt])
            v = builder.call(pshufb, [t, v])
        else:
            v = shift(builder.shl, v, D)  # within each byte: M << D < 256 in every use
            old = builder.load(at(2, dst, do), align=1)
            v = builder.select(builder.icmp_signed("!=", orin, ir.Constant(I64, 0)), builder.or_(v, old), v)
        builder.store(v, at(2, dst, do), align=1)
        return context.get_dummy_value()
    return gen


@intrinsic
def _bits32(typingctx, src, so, dst, do, S, M, D, orin):
    """dst[do:do + 32] (| where orin) = ((src[so:so + 32] >> S) & M) << D, bytewise (tiled_unpk_nib4 / 2bit / or)."""
    return types.none(src, so, dst, do, S, M, D, orin), _bytes_codegen(False)


@intrinsic
def _lut16(typingctx, src, so, dst, do, S, tab):
    """dst[do:do + 16] = tab[(src[so:so + 16] >> S) & 15] (tiled_lut8 on tiled_unpk_nib4's halves)."""
    return types.none(src, so, dst, do, S, tab), _bytes_codegen(True)


def _bytesum_codegen(n: int):
    """Codegen: the sum of n unsigned bytes of q from o, as int32."""
    def gen(context, builder, sig, args):
        q, o = args
        p = cgutils.create_struct_proxy(sig.args[0])(context, builder, value=q).data
        v = builder.load(builder.bitcast(builder.gep(p, [o]), V(I8, n).as_pointer()), align=1)
        red = _fn(builder, f"llvm.vector.reduce.add.v{n}i32", I32, [V(I32, n)])
        return builder.call(red, [builder.zext(v, V(I32, n))])
    return gen


@intrinsic
def _bytesum16(typingctx, q, o):
    """The sum of the unsigned bytes q[o:o + 16] (tiled_byte_sum_16: maddubs with ones, then pair sums)."""
    return types.int32(q, o), _bytesum_codegen(16)


_0, _1, _2, _3, _4, _15 = (np.int64(v) for v in (0, 1, 2, 3, 4, 15))


@njit(inline="always")
def _nib4(w, so, q, lo, hi):
    """tiled_unpk_nib4: the low nibbles of w[so:so + 32] to q[lo:], the high to q[hi:]."""
    _bits32(w, so, q, lo, _0, _15, _0, _0)
    _bits32(w, so, q, hi, _4, _15, _0, _0)


@njit(inline="always")
def _unpack_k4(w, o, q, qo, d0, dm0, do, sc, mn, so, q5):
    """Q4_K, Q5_K (q5): d, dmin, 12 bytes of 6-bit scales and mins, (Q5_K: 32 bytes of fifth bits,) nibbles."""
    d0[do], dm0[do] = h2f(w[o], w[o + 1]), h2f(w[o + 2], w[o + 3])
    for c in range(8):
        sc[so + c], mn[so + c] = _q4_k_scale_min(w, np.uint64(o + 4), c)
    qs = o + (48 if q5 else 16)
    for j in range(4):
        _nib4(w, qs + 32 * j, q, qo + 64 * j, qo + 64 * j + 32)
    if q5:
        for j in range(8):
            _bits32(w, o + 16, q, qo + 32 * j, np.int64(j), _1, _4, _1)


@njit(inline="always")
def _unpack_q6(w, o, q, qo, d0, dm0, do, sc, mn, so):
    """Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, d."""
    d0[do] = h2f(w[o + 208], w[o + 209])
    for half in range(2):
        p, ql, qh = qo + 128 * half, o + 64 * half, o + 128 + 32 * half
        _nib4(w, ql, q, p, p + 64)
        _nib4(w, ql + 32, q, p + 32, p + 96)
        for j in range(4):
            _bits32(w, qh, q, p + 32 * j, np.int64(2 * j), _3, _4, _1)
    for s in range(16):
        sc[so + s] = np.int32(np.int8(w[o + 192 + s]))


@njit(inline="always")
def _unpack_q3(w, o, q, qo, d0, dm0, do, sc, mn, so):
    """Q3_K: 32 bytes of high bits, 64 of low bit pairs, 12 of 6-bit scales, d; code = low | high << 2."""
    d0[do] = h2f(w[o + 108], w[o + 109])
    for half in range(2):
        for j in range(4):
            _bits32(w, o + 32 + 32 * half, q, qo + 128 * half + 32 * j, np.int64(2 * j), _3, _0, _0)
            _bits32(w, o, q, qo + 128 * half + 32 * j, np.int64(4 * half + j), _1, _2, _1)
    for s in range(16):
        sc[so + s] = _q3_k_scale(w, np.uint64(o + 96), s)


@njit(inline="always")
def _unpack_q2(w, o, q, qo, d0, dm0, do, sc, mn, so):
    """Q2_K: 16 bytes of scale | min << 4, 64 of bit pairs, d, dmin."""
    d0[do], dm0[do] = h2f(w[o + 80], w[o + 81]), h2f(w[o + 82], w[o + 83])
    for half in range(2):
        for j in range(4):
            _bits32(w, o + 16 + 32 * half, q, qo + 128 * half + 32 * j, np.int64(2 * j), _3, _0, _0)
    for s in range(16):
        sc[so + s], mn[so + s] = w[o + s] & 15, w[o + s] >> 4


@njit(inline="always")
def _unpack_iq4(w, o, q, qo, d0, dm0, do, sc, mn, so):
    """IQ4_XS: d, scales_h (u16), 4 bytes scales_l, nibbles through the codebook."""
    d0[do] = h2f(w[o], w[o + 1])
    sh = np.int32(w[o + 2]) | (np.int32(w[o + 3]) << 8)
    for s in range(8):
        sc[so + s] = (((np.int32(w[o + 4 + s // 2]) >> (4 * (s % 2))) & 15) | (((sh >> (2 * s)) & 3) << 4)) - 32
    for u in range(4):
        b = o + 8 + 32 * u
        _lut16(w, b, q, qo + 64 * u, _0, _IQ4_LUT)
        _lut16(w, b, q, qo + 64 * u + 16, _4, _IQ4_LUT)
        _lut16(w, b + 16, q, qo + 64 * u + 32, _0, _IQ4_LUT)
        _lut16(w, b + 16, q, qo + 64 * u + 48, _4, _IQ4_LUT)


@njit(inline="always")
def _unpack_src0(code, w, base, rb, n_rows, kblk, num_k, ws):
    """n_rows rows from byte base of w (rb bytes a row), 256-blocks kblk..kblk + num_k, into the workspace; then
    tiled_repack_src0's act-bias correction (Q6_K, Q3_K: 128 sum_s scale_s (code sum_s - SUBBLK BIAS), unused
    by the VNNI microtile but computed wherever AVX2 is)."""
    q, d0, dm0, sc, mn = ws
    bs = _BLOCK_BYTES[code]
    nb = 16 if code == 2 or code == 3 or code == 4 else 8
    # the type's branch outside the row loop: inside it, numba's reference counts of the arrays (atomic, ~100 ns a
    # block) were not pruned across the branches
    for slab in range(num_k):
        if code <= 1:
            for r in range(n_rows):
                _unpack_k4(w, base + r * rb + (kblk + slab) * bs, q, r * num_k * TILE_K + slab * TILE_K,
                           d0, dm0, slab * MICRO + r, sc, mn, r * nb * num_k + slab * nb, code == 1)
        elif code == 2:
            for r in range(n_rows):
                _unpack_q6(w, base + r * rb + (kblk + slab) * bs, q, r * num_k * TILE_K + slab * TILE_K,
                           d0, dm0, slab * MICRO + r, sc, mn, r * nb * num_k + slab * nb)
        elif code == 3:
            for r in range(n_rows):
                _unpack_q3(w, base + r * rb + (kblk + slab) * bs, q, r * num_k * TILE_K + slab * TILE_K,
                           d0, dm0, slab * MICRO + r, sc, mn, r * nb * num_k + slab * nb)
        elif code == 4:
            for r in range(n_rows):
                _unpack_q2(w, base + r * rb + (kblk + slab) * bs, q, r * num_k * TILE_K + slab * TILE_K,
                           d0, dm0, slab * MICRO + r, sc, mn, r * nb * num_k + slab * nb)
        else:
            for r in range(n_rows):
                _unpack_iq4(w, base + r * rb + (kblk + slab) * bs, q, r * num_k * TILE_K + slab * TILE_K,
                            d0, dm0, slab * MICRO + r, sc, mn, r * nb * num_k + slab * nb)
    if code == 2 or code == 3:
        sub, bias = 16, (32 if code == 2 else 4)
        for slab in range(num_k):
            for r in range(n_rows):
                corr = np.int32(0)
                for s in range(16):
                    qsum = _bytesum16(q, r * num_k * TILE_K + slab * TILE_K + s * sub)
                    corr += 128 * sc[r * nb * num_k + slab * nb + s] * (qsum - sub * bias)
                mn[r * nb * num_k + slab * nb] = corr


# ---- the tokens: Q8_K rows staged, 16-token bands interleaved four codes a token

@njit(fastmath=True, cache=True)
def quantize_row_q8_k(x, x8, dx, bsums):
    """x [n] -> x8 int8, dx [n/256] float32, bsums [n/16] int32 (ggml's quantize_row_q8_K_ref: the value of largest
    magnitude maps to -127, codes rounded and capped at 127, the sum of each 16 codes)."""
    for b in range(x.shape[0] // TILE_K):
        xb = x[b * TILE_K:(b + 1) * TILE_K]
        amax = np.float32(0.0)
        for j in range(TILE_K):  # a max that vectorises; then the first value of that magnitude, as ggml's strict >
            amax = max(amax, abs(xb[j]))
        if amax == 0:
            dx[b] = 0.0
            x8[b * TILE_K:(b + 1) * TILE_K] = 0
            bsums[b * 16:(b + 1) * 16] = 0
            continue
        mx = amax
        for j in range(TILE_K):
            if abs(xb[j]) == amax:
                mx = xb[j]
                break
        iscale = np.float32(-127.0) / mx
        for j in range(TILE_K):  # nearest_int: round half to even
            x8[b * TILE_K + j] = np.int8(min(np.float32(127.0), np.rint(iscale * xb[j])))
        for s in range(16):
            t = np.int32(0)
            for j in range(16):
                t += np.int32(x8[b * TILE_K + 16 * s + j])
            bsums[b * 16 + s] = t
        dx[b] = np.float32(1.0) / iscale


# tiled_repack_src1's 16 x 16 int32 transpose: four butterfly phases of two-source permutes (vpermt2d), as ggml's
_PHASES = (([0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23], [8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31],
            [(i, i + 1) for i in range(0, 16, 2)]),
           ([0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29], [2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31],
            [(i + j, i + 2 + j) for i in range(0, 16, 4) for j in range(2)]),
           ([0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23], [8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31],
            [(i + j, i + 4 + j) for i in range(0, 16, 8) for j in range(4)]),
           (list(range(8)) + list(range(16, 24)), list(range(8, 16)) + list(range(24, 32)), [(i, i + 8) for i in range(8)]))
_COL_ORDER = (0, 8, 1, 9, 4, 12, 5, 13, 2, 10, 3, 11, 6, 14, 7, 15)


def _transpose_codegen(context, builder, sig, args):
    """dst[do + m * dstride + j] = src[(r0 + j) * sstride + c0 + m], m, j < 16 (int32 words; tokens j >= nvalid zero)."""
    src, r0, sstride, c0, nvalid, dst, do, dstride = args
    ptr = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
    sp, dp = ptr(0, src), ptr(5, dst)
    vt = V(I32, 16)
    zero = ir.Constant(vt, [0] * 16)
    v = []
    for j in range(16):  # the rows past nvalid read as zero (a select on a load kept in bounds)
        ok = builder.icmp_signed("<", ir.Constant(I64, j), nvalid)
        row = builder.select(ok, builder.add(r0, ir.Constant(I64, j)), r0)
        p = builder.bitcast(builder.gep(sp, [builder.add(builder.mul(row, sstride), c0)]), vt.as_pointer())
        v.append(builder.select(ok, builder.load(p, align=4), zero))
    for ia, ib, pairs in _PHASES:
        ma, mb = ir.Constant(V(I32, 16), ia), ir.Constant(V(I32, 16), ib)
        for i, k in pairs:
            v[i], v[k] = builder.shuffle_vector(v[i], v[k], ma), builder.shuffle_vector(v[i], v[k], mb)
    for g in range(16):
        at = builder.add(do, builder.mul(ir.Constant(I64, _COL_ORDER[g]), dstride))
        builder.store(v[g], builder.bitcast(builder.gep(dp, [at]), vt.as_pointer()), align=4)
    return context.get_dummy_value()


@intrinsic
def _transpose16(typingctx, src, r0, sstride, c0, nvalid, dst, do, dstride):
    """16 tokens' 16 code words (src's rows r0.., words c0..) to 16 rows of dst, one word a token (tiled_repack_src1)."""
    return types.none(src, r0, sstride, c0, nvalid, dst, do, dstride), _transpose_codegen


@njit(inline="always")
def _stage_src1(X8w, BS, DX, t0, n, kblk, num_k, q1w, bs, d1):
    """n tokens from t0 (X8w: their codes as int32 words), 256-blocks kblk..kblk + num_k, into the workspace: band
    j // 16 holds 16 rows of num_k * 256 bytes, row kg % 16 the four codes of group kg of each of its tokens
    (tiled_unpack_src1_q8_K, then tiled_repack_src1's layout); bsums [slab * 16 + s][token], d [slab * 16 + token]
    (the standard path's stride 256, the narrow path's 16); ragged tokens zero."""
    npad = (n + MICRO - 1) // MICRO * MICRO
    qkw = num_k * TILE_K // 4  # int32 words a row
    bstride = WINDOW if num_k == 1 else MICRO
    sw = X8w.shape[1]
    for slab in range(num_k):
        for band in range(npad // MICRO):
            for c in range(4):
                _transpose16(X8w, t0 + band * MICRO, sw, (kblk + slab) * 64 + 16 * c, n - band * MICRO,
                             q1w, band * MICRO * qkw + slab * 64 + c * 16, qkw)
        for j in range(npad):
            for s in range(16):
                bs[(slab * 16 + s) * bstride + j] = BS[t0 + j, (kblk + slab) * 16 + s] if j < n else 0
            d1[slab * MICRO + j] = DX[t0 + j, kblk + slab] if j < n else 0.0


# ---- the 8 x 16 band: ggml's tiled_run_micro_vnni_8x16

def _band_codegen(sub: int, has_min: bool, bias: int):
    """Codegen: buf[bo + (i0 + t) * 256 + j0 + j] += row i0 + t . token j0 + j over one slab, t < 8, j < 16.

    As ggml's tiled_run_micro_vnni_8x16, a loop over the slab's sub-blocks whose body holds one sub-block's four-code
    groups unrolled (8 rows x sub / 4 vpdpbusd, then each row's scale), and the mins' term in a loop of its own after.
    Unrolled over the sub-blocks as well (16 of them for Q2_K, Q3_K, Q6_K), a band was ~2,900 instructions, ~8x
    ggml's 2.3 KB function, and on the Zen 5 VM ran front-end bound, its rate moving with where it lay in the code:
    Q3_K's and Q6_K's bands, the same instructions, ran 288 and 446 GFLOP/s inside _microtile (2026-12-07)."""
    nb, ns, ng = TILE_K // sub, sub // 16, sub // 4

    def gen(context, builder, sig, args):
        q0a, q1a, sca, mna, bsa, d0a, dm0a, d1a, bufa, i0, j0, num_k, slab, bo = args
        ptr = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        q0, q1, sc, mn, bs, d0, dm0, d1, buf = (ptr(i, v) for i, v in enumerate(args[:9]))
        c = lambda v: ir.Constant(I64, v)  # noqa: E731
        add, mul = builder.add, builder.mul
        ld16 = lambda p, i: builder.load(builder.bitcast(builder.gep(p, [i]), V(I32, 16).as_pointer()), align=4)  # noqa: E731
        qk = mul(num_k, c(TILE_K))
        qk_off, nb_stride, nb_off = mul(slab, c(TILE_K)), mul(num_k, c(nb)), mul(slab, c(nb))
        bs_stride = builder.select(builder.icmp_signed("==", num_k, c(1)), c(WINDOW), c(MICRO))
        bs_off = mul(slab, c(MICRO))
        dp = _fn(builder, "llvm.x86.avx512.vpdpbusd.512", V(I32, 16), [V(I32, 16)] * 3)
        zero = ir.Constant(V(I32, 16), [0] * 16)
        band = add(mul(builder.sdiv(j0, c(MICRO)), mul(c(MICRO), qk)), qk_off)

        def bsums(s):  # the tokens' code sums over sub-block s (an IR value): ns 16-code sums each
            v = ld16(bs, add(mul(add(bs_off, mul(s, c(ns))), bs_stride), j0))
            for u in range(1, ns):
                v = add(v, ld16(bs, add(mul(add(bs_off, add(mul(s, c(ns)), c(u))), bs_stride), j0)))
            return v

        rows = [add(i0, c(t)) for t in range(8)]
        s1 = [cgutils.alloca_once_value(builder, zero) for _ in range(8)]  # registers once LLVM promotes them
        with cgutils.for_range(builder, c(nb)) as loop:
            s = loop.index
            b32 = bsums(s)
            acc = [zero] * 8
            for g in range(ng):
                kg = add(mul(s, c(ng)), c(g))
                at = add(add(band, mul(builder.and_(kg, c(15)), qk)), mul(builder.lshr(kg, c(4)), c(64)))
                codes = ld16(q1, at)  # [kg%16][kg/16][token][4]
                for t in range(8):
                    u4 = builder.load(builder.bitcast(builder.gep(q0, [add(add(mul(rows[t], qk), qk_off), mul(kg, c(4)))]),
                                                      I32.as_pointer()), align=4)
                    acc[t] = builder.call(dp, [acc[t], _splat(builder, u4, 16), codes])
            for t in range(8):
                raw = builder.sub(acc[t], mul(b32, ir.Constant(V(I32, 16), [bias] * 16))) if bias else acc[t]
                scale = builder.load(builder.gep(sc, [add(add(mul(rows[t], nb_stride), nb_off), s)]))
                builder.store(add(builder.load(s1[t]), mul(raw, _splat(builder, scale, 16))), s1[t])
        s2 = [cgutils.alloca_once_value(builder, zero) for _ in range(8)] if has_min else []
        if has_min:
            with cgutils.for_range(builder, c(nb)) as loop:
                s = loop.index
                b32 = bsums(s)
                for t in range(8):
                    m = builder.load(builder.gep(mn, [add(add(mul(rows[t], nb_stride), nb_off), s)]))
                    builder.store(add(builder.load(s2[t]), mul(b32, _splat(builder, m, 16))), s2[t])
        d1v = builder.load(builder.bitcast(builder.gep(d1, [add(bs_off, j0)]), V(F32, 16).as_pointer()), align=4)
        for t in range(8):
            do = add(bs_off, rows[t])
            res = builder.fmul(builder.sitofp(builder.load(s1[t]), V(F32, 16)),
                               _splat(builder, builder.load(builder.gep(d0, [do])), 16))
            if has_min:
                dmin = _splat(builder, builder.load(builder.gep(dm0, [do])), 16)
                res = builder.fsub(res, builder.fmul(dmin, builder.sitofp(builder.load(s2[t]), V(F32, 16))))
            p = builder.bitcast(builder.gep(buf, [add(add(bo, mul(rows[t], c(WINDOW))), j0)]), V(F32, 16).as_pointer())
            builder.store(builder.fadd(builder.load(p, align=4), builder.fmul(res, d1v)), p, align=4)
        return context.get_dummy_value()

    return gen


def _band(sub: int, has_min: bool, bias: int):
    @intrinsic
    def band(typingctx, q0, q1, sc, mn, bs, d0, dm0, d1, buf, i0, j0, num_k, slab, bo):
        return types.none(q0, q1, sc, mn, bs, d0, dm0, d1, buf, i0, j0, num_k, slab, bo), _band_codegen(sub, has_min, bias)
    return band


if HAVE_TILED:
    # one band a set of (SUBBLK, HAS_MIN, BIAS); Q5_K's are Q4_K's
    _band_k4, _band_q6, _band_q3, _band_q2, _band_iq4 = (_band(*TILED_TYPES[t][1:4])
                                                         for t in ("Q4_K", "Q6_K", "Q3_K", "Q2_K", "IQ4_XS"))

    @njit(nogil=True, cache=True)
    def _microtile(code, q0, q1, sc, mn, bs, d0, dm0, d1, buf, i0, j0, num_k, slab, bo):
        """One 16 x 16 microtile: rows i0..i0 + 16 of the unpacked slab by tokens j0..j0 + 16, two 8 x 16 bands."""
        for h in range(0, MICRO, 8):
            if code <= 1:
                _band_k4(q0, q1, sc, mn, bs, d0, dm0, d1, buf, i0 + h, j0, num_k, slab, bo)
            elif code == 2:
                _band_q6(q0, q1, sc, mn, bs, d0, dm0, d1, buf, i0 + h, j0, num_k, slab, bo)
            elif code == 3:
                _band_q3(q0, q1, sc, mn, bs, d0, dm0, d1, buf, i0 + h, j0, num_k, slab, bo)
            elif code == 4:
                _band_q2(q0, q1, sc, mn, bs, d0, dm0, d1, buf, i0 + h, j0, num_k, slab, bo)
            else:
                _band_iq4(q0, q1, sc, mn, bs, d0, dm0, d1, buf, i0 + h, j0, num_k, slab, bo)

    @njit(inline="always")
    def _store_window(acc, nr0, n, out, t0, r):
        """out[t0 + j, r + i] = acc[i * WINDOW + j] as tiled_store_window_scatter writes it: blocks of 16 rows x 8
        tokens, each token's 16 rows a contiguous run (token by token over rows i, each write would land a token's
        row stride apart: 8 KiB at 2048 rows, one L1 set, so every write missed and the down products ran at ~0.55x
        of ggml's, 2026-12-06)."""
        ri = 0
        while ri + MICRO <= nr0:
            for j in range(n):
                for t in range(MICRO):
                    out[t0 + j, r + ri + t] = acc[(ri + t) * WINDOW + j]
            ri += MICRO
        for i in range(ri, nr0):
            for j in range(n):
                out[t0 + j, r + i] = acc[i * WINDOW + j]

    @njit(nogil=True, fastmath=True, cache=True)
    def _window(code, w, rb, r, nr0, X8w, BS, DX, t0, n, K, out, ws0, q1w, bs, d1, acc):
        """One (64-row group, token window) of an expert: rows r..r + nr0 of w (rb bytes a row) by tokens t0..t0 + n
        (tiled_mmid_gemm_window): out[t0 + j, r + i] = the window's products."""
        q0, d0, dm0, sc, mn = ws0
        q1 = q1w.view(np.int8)
        npad = (n + MICRO - 1) // MICRO * MICRO
        acc[:nr0 * WINDOW] = 0.0
        if n <= MICRO:  # narrow: long slabs, 16 rows at a time
            ke = narrow_k_extent(n, K)
            num_k = ke // TILE_K
            for k0 in range(0, K, ke):
                _stage_src1(X8w, BS, DX, t0, n, k0 // TILE_K, num_k, q1w, bs, d1)
                for ir0 in range(0, nr0, MICRO):
                    _unpack_src0(code, w, (r + ir0) * rb, rb, min(MICRO, nr0 - ir0), k0 // TILE_K, num_k, ws0)
                    for slab in range(num_k):
                        _microtile(code, q0, q1, sc, mn, bs, d0, dm0, d1, acc, np.int64(0), np.int64(0), np.int64(num_k),
                                   np.int64(slab), np.int64(ir0 * WINDOW))
        else:  # standard: 256-wide slabs, the group's rows unpacked once a slab
            for kb in range(K // TILE_K):
                _unpack_src0(code, w, r * rb, rb, nr0, kb, 1, ws0)
                _stage_src1(X8w, BS, DX, t0, n, kb, 1, q1w, bs, d1)
                for j0 in range(0, npad, MICRO):
                    for i0 in range(0, nr0, MICRO):
                        _microtile(code, q0, q1, sc, mn, bs, d0, dm0, d1, acc, np.int64(i0), np.int64(j0), np.int64(1),
                                   np.int64(0), np.int64(0))
        _store_window(acc, nr0, n, out, t0, r)

    @njit(parallel=True, nogil=True, fastmath=True, cache=True)
    def tiled_matrix(code, w, rows, X8, DX, BS, out, nthr):
        """out[e, t, r] = W_e[r] . X8[e, t] (Q8_K: DX, BS) for w [E, rows * row bytes] in TILED_TYPES' `code`, as ggml's
        MUL_MAT_ID runs its tiled path: each of nthr threads its share of every expert's 64-row groups, windows of
        up to 256 tokens. nthr: numba's thread count, passed in (read inside, it would keep the function out of
        numba's on-disk cache)."""
        E, T, K = X8.shape
        rb = w.shape[1] // rows
        ngroups = (rows + GROUP - 1) // GROUP
        for th in prange(nthr):
            ws0 = (np.empty(WINDOW * TILE_K, np.uint8), np.zeros(WINDOW, np.float32), np.zeros(WINDOW, np.float32),
                   np.zeros(WINDOW * 16, np.int32), np.zeros(WINDOW * 16, np.int32))
            q1w = np.empty(WINDOW * TILE_K // 4, np.int32)
            bs, d1 = np.empty(WINDOW * 16, np.int32), np.empty(WINDOW, np.float32)
            acc = np.empty(GROUP * WINDOW, np.float32)
            g0, g1 = ngroups * th // nthr, ngroups * (th + 1) // nthr
            for e in range(E):
                X8w = X8[e].view(np.int32)
                for t0 in range(0, T, WINDOW):
                    n = min(WINDOW, T - t0)
                    for g in range(g0, g1):
                        _window(code, w[e], rb, g * GROUP, min(GROUP, rows - g * GROUP), X8w, BS[e], DX[e], t0, n, K,
                                out[e], ws0, q1w, bs, d1, acc)


def quantize_q8_k(a):
    """a [E, T, n] float32 -> (int8 [E, T, n], float32 [E, T, n/256], int32 bsums [E, T, n/16]): ggml's Q8_K tokens."""
    E, T, n = a.shape
    x8, dx, bs = np.empty(a.shape, np.int8), np.empty((E, T, n // TILE_K), np.float32), np.empty((E, T, n // 16), np.int32)
    _quantize_rows(a.reshape(-1, n), x8.reshape(-1, n), dx.reshape(E * T, -1), bs.reshape(E * T, -1))
    return x8, dx, bs


@njit(parallel=True, nogil=True, cache=True)
def _quantize_rows(a, x8, dx, bs):
    """Each row quantised (quantize_row_q8_k), the rows split over the threads as ggml's MUL_MAT_ID splits them."""
    for i in prange(a.shape[0]):
        quantize_row_q8_k(a[i], x8[i], dx[i], bs[i])
