"""ggml's AVX2 products of Q8_0 / Q4_0 / IQ4_NL rows with int8-quantised activations (its vec_dot, and its repacked Q4_0
8x8 gemv), rebuilt as numba intrinsics.

llama.cpp quantises each op's activations to Q8_0 (ggml's `quantize_row_q8_0`: int8 and one float scale per
32-block) and dots them with `vec_dot_q8_0_q8_0` / `vec_dot_q4_0_q8_0` (ggml-cpu arch/x86/quants.c): per
block the weights as int8 (Q4_0's nibbles minus 8), |w| times sign(w) x with `vpmaddubsw`, the pair sums to
int32 by a `vpmaddwd` with ones (`mul_sum_i8_pairs_float`; with AVX-512 VNNI and VL one 256-bit `vpdpbusd`, as
ggml compiles it natively on such a CPU), converted and fused-multiplied
with the two blocks' scales into one 8-lane accumulator, summed across lanes at the end. The scales are fp16, read
as ggml's x86 build reads them, through its 256 KiB table ggml_table_f32_f16 (`fp16_lookup`): from DRAM the table's
lines compete with the streamed rows, and on one Zen 4 core that took a Q8_0 row from 26.6-29.1 GB/s (an F16C
conversion) to 22.8-23.8, ggml's own 22.9-23.6 (2026-12-06; in L2, 67-72 ns a row either way). The codegen here
is that loop for `nr` rows against one token (nr = 1 is ggml's vec_dot; benchmarks/bench_int8_kernel.py
times nr = 4 against the executor's int16 kernel). IQ4_NL's `vec_dot_iq4_nl_q8_0` is the same loop with each
nibble looked up in the codebook (`vpshufb`), its products by `vpmaddubsw` and `vpmaddwd` whatever the CPU, and even
and odd blocks in two accumulators. The executor keeps int16 activations by default (executor/simd.py): int8's
1e-2 relative error fails its logits bar, so these kernels only time ggml's structures for the simulator's llama.cpp
plans (calibration.bench_rowwise for a token, bench_ggml_prefill for a batch). AVX2 only: HAVE_AVX2 says whether
the intrinsics exist.

Weights llama.cpp repacks at load (Q4_0 on AVX2: block_q4_0x8, 8 rows' blocks side by side) go through its
`gemv_q4_b32_8x8_q8_0_lut_avx` instead (arch/x86/repack.cpp), rebuilt as `gemv_q4_0x8`: per block the 8 rows'
nibbles become signed bytes by a table (`vpshufb`), 8 int8 products accumulate in one int32 register for all
8 rows, and one convert and one fused multiply-add with the 8 scales finish the block.
"""
from __future__ import annotations

import math
import os
from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from executor.gemm import IQ4_NL, Q4_0
from executor.nbcache import drop_stale_cache
from executor.iquants import KVALUES
from executor.qgemm import HAVE_VNNI256 as CPU_VNNI256
from executor.simd import F32, HAVE_AVX2, I8, I16, I32, I64, V, _fn, _splat, hsum8

from .ggml_gemv_kx8 import lane_dword, pair_rows, token_codes

drop_stale_cache(__file__)

# ggml's int8 products take vpdpbusd on 256-bit vectors where the CPU has AVX-512 VNNI and VL (MOE_OFFLOAD_NO_VNNI=1:
# its AVX2 loop instead, as executor.vnni; the same sums)
HAVE_VNNI256 = HAVE_AVX2 and CPU_VNNI256 and os.environ.get("MOE_OFFLOAD_NO_VNNI") != "1"
Q4_0X8_BYTES = 8 * 18  # block_q4_0x8: 8 fp16 scales, then 8 x 16 bytes of nibbles interleaved 8 bytes a row


def repack_q4_0_x8(w: np.ndarray, rows: int, xor: int = 0x88) -> np.ndarray:
    """Q4_0 rows (uint8, `rows` rows of nb blocks, row-major) -> llama.cpp's block_q4_0x8 layout (uint8 [rows / 8,
    nb * 144]): make_block_q4_0x8 for every 8 rows and block, the nibbles XOR 0x88 (signed, as its gemv reads them).
    IQ4_NL's block_iq4_nlx8 is the same without the XOR (make_block_iq4_nlx8: xor=0)."""
    if rows % 8:
        raise ValueError(f"llama.cpp repacks {'Q4_0' if xor else 'IQ4_NL'} in groups of 8 rows (got {rows})")
    nb = w.size // (rows * 18)
    b = np.ascontiguousarray(w).reshape(rows // 8, 8, nb, 18).transpose(0, 2, 1, 3)  # [G, nb, 8 rows, 18]
    out = np.empty((rows // 8, nb, Q4_0X8_BYTES), np.uint8)
    out[..., :16] = b[..., :2].reshape(rows // 8, nb, 16)
    out[..., 16:] = (b[..., 2:].reshape(rows // 8, nb, 8, 2, 8).transpose(0, 1, 3, 2, 4) ^ xor).reshape(rows // 8, nb, 128)
    return out.reshape(rows // 8, nb * Q4_0X8_BYTES)


def mul_sum_i8(builder, w, x, acc=None, vnni: bool = True):
    """Codegen: ggml's mul_sum_i8_pairs: <32 x i8> w, x -> <8 x i32> (plus `acc`), each lane the sum of four w * x,
    |w| times sign(w) x. With AVX-512 VNNI and VL one 256-bit `vpdpbusd` (ggml's mul_sum_us8_pairs_float /
    _acc_int32x8 under __AVX512VNNI__ && __AVX512VL__, as a native build on such a CPU compiles them); else, or
    vnni=False (ggml's mul_add_epi8, which IQ4_NL's vec_dot takes on every AVX2 CPU), `vpmaddubsw`, the pair sums
    widened by a `vpmaddwd` with ones."""
    psign = _fn(builder, "llvm.x86.avx2.psign.b", V(I8, 32), [V(I8, 32)] * 2)
    aw, sx = builder.call(psign, [w, w]), builder.call(psign, [x, w])
    if HAVE_VNNI256 and vnni:
        dp = _fn(builder, "llvm.x86.avx512.vpdpbusd.256", V(I32, 8), [V(I32, 8)] * 3)
        zero = ir.Constant(V(I32, 8), [0] * 8)
        return builder.call(dp, [acc if acc is not None else zero, builder.bitcast(aw, V(I32, 8)),
                                 builder.bitcast(sx, V(I32, 8))])
    maddubs = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", V(I16, 16), [V(I8, 32)] * 2)
    pmadd = _fn(builder, "llvm.x86.avx2.pmadd.wd", V(I32, 8), [V(I16, 16)] * 2)
    sums = builder.call(pmadd, [builder.call(maddubs, [aw, sx]), ir.Constant(V(I16, 16), [1] * 16)])
    return builder.add(acc, sums) if acc is not None else sums


@lru_cache(maxsize=1)
def _fp16_floats() -> ir.Constant:
    """The float of every fp16 bit pattern, as an LLVM constant array (made once: 65,536 values)."""
    ty = ir.ArrayType(F32, 1 << 16)
    return ir.Constant(ty, [float(v) for v in np.arange(1 << 16, dtype=np.uint16).view(np.float16)])


def fp16_table(module) -> ir.GlobalVariable:
    """ggml_table_f32_f16 as a constant of `module` (added once): the float of every fp16 bit pattern, 256 KiB."""
    g = module.globals.get("ggml_table_f32_f16")
    if g is None:
        g = ir.GlobalVariable(module, _fp16_floats().type, "ggml_table_f32_f16")
        g.initializer = _fp16_floats()
        g.global_constant = True
        g.linkage = "internal"
        g.align = 64
    return g


def fp16_lookup(builder, p):
    """Codegen: the fp16 at byte pointer p as a float, as ggml's GGML_CPU_FP16_TO_FP32 does on x86 (ggml-cpu
    simd-mappings.h: F16C defines only the _COMPUTE_ form, so the lookup in ggml_table_f32_f16 stands): a load of the
    bits, then a load from the table at them."""
    h = builder.load(builder.bitcast(p, I16.as_pointer()), align=1)
    tab = fp16_table(builder.module)
    return builder.load(builder.gep(tab, [ir.Constant(I64, 0), builder.zext(h, I64)]))


def rows_i8_codegen(q4: bool, nr: int, prefetch: bool, book: tuple = ()):
    """Codegen: res[ro + k] = row_k . (x8 * dx), k < nr, for Q8_0 / Q4_0 rows at byte woff + k * rb of w
    (nb 32-blocks each); with `prefetch` the next nr-row group is prefetched a block ahead. book (16 int8 values,
    with q4): IQ4_NL's rows, as ggml_vec_dot_iq4_nl_q8_0: each nibble looked up in the codebook (`vpshufb`), the
    products by vpmaddubsw and vpmaddwd (no VNNI there), even and odd blocks in two accumulators."""
    bs = 18 if q4 else 34
    nacc = 2 if book else 1

    def gen(context, builder, sig, args):
        wa, woff, rb, xa, da, nb, ra, roff = args
        data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        wd, xd, dd, rd = data(0, wa), data(3, xa), data(4, da), data(6, ra)
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(V(F32, 8), [0.0] * 8)) for _ in range(nacc)]
                for _ in range(nr)]
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        pshufb = _fn(builder, "llvm.x86.avx2.pshuf.b", V(I8, 32), [V(I8, 32)] * 2)
        pref = _fn(builder, "llvm.prefetch.p0i8", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        pfo = builder.add(woff, builder.mul(rb, i64(nr)))  # the next row group
        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            if prefetch:
                pf = builder.gep(wd, [builder.add(pfo, builder.mul(b, i64(bs)))])
                for k in range(nr):
                    builder.call(pref, [builder.gep(pf, [builder.mul(rb, i64(k))]), ir.Constant(I32, 0),
                                        ir.Constant(I32, 3), ir.Constant(I32, 1)])
            xv = builder.load(builder.bitcast(builder.gep(xd, [builder.mul(b, i64(32))]), V(I8, 32).as_pointer()),
                              align=1)
            dxb = builder.load(builder.gep(dd, [b]))
            for k in range(nr):
                p = builder.gep(wd, [builder.add(builder.add(woff, builder.mul(rb, i64(k))), builder.mul(b, i64(bs)))])
                pq = builder.gep(p, [i64(2)])
                if q4:  # bytes_from_nibbles_32, minus 8 (IQ4_NL: the codebook's values)
                    qv = builder.load(builder.bitcast(pq, V(I8, 16).as_pointer()), align=1)
                    lo = builder.and_(qv, ir.Constant(V(I8, 16), [0x0F] * 16))
                    hi = builder.lshr(qv, ir.Constant(V(I8, 16), [4] * 16))
                    w = builder.shuffle_vector(lo, hi, ir.Constant(V(I32, 32), list(range(32))))
                    if book:
                        w = builder.call(pshufb, [ir.Constant(V(I8, 32), [int(v) for v in book] * 2), w])
                    else:
                        w = builder.sub(w, ir.Constant(V(I8, 32), [8] * 32))
                else:
                    w = builder.load(builder.bitcast(pq, V(I8, 32).as_pointer()), align=1)
                m = mul_sum_i8(builder, w, xv, vnni=not book)  # [8] int32
                # the two scales' product on every lane: ggml reads the block's fp16 through its 256 KiB table
                d = _splat(builder, builder.fmul(fp16_lookup(builder, p), dxb), 8)
                acc = accs[k][0]
                if nacc == 2:  # the block's parity picks its accumulator
                    acc = builder.select(builder.trunc(b, ir.IntType(1)), accs[k][1], accs[k][0])
                builder.store(builder.call(fma, [builder.sitofp(m, V(F32, 8)), d, builder.load(acc)]), acc)
        for k in range(nr):
            tot = builder.load(accs[k][0])
            if nacc == 2:
                tot = builder.fadd(tot, builder.load(accs[k][1]))
            builder.store(hsum8(builder, tot), builder.gep(rd, [builder.add(roff, ir.Constant(I64, k))]))
        return context.get_dummy_value()

    return gen


def gemv_q4_0x8_codegen():
    """Codegen: res[ro + k] = row_k . (x8 * dx), k < 8, for 8 rows in llama.cpp's block_q4_0x8 layout from byte woff
    of w (nb blocks of Q4_0X8_BYTES: the rows' 8 fp16 scales, then 128 bytes, row k's values j and j + 16 in the low
    and high nibble of byte 64 (j % 16 // 8) + 32 (k // 4) + 8 (k % 4) + j % 8, stored xor 8), as ggml's AVX2
    gemv: the nibbles to signed bytes by a table, a 32-bit lane per (row, 4 values), pairs of rows in the even
    and odd lanes, int8 products by vpsignb / vpmaddubsw / vpmaddwd into one int32 accumulator."""
    def gen(context, builder, sig, args):
        wa, woff, xa, da, nb, ra, roff = args
        data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
        wd, xd, dd, rd = data(0, wa), data(2, xa), data(3, da), data(5, ra)
        i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        v32 = lambda vals: ir.Constant(V(I32, len(vals)), list(vals))  # noqa: E731
        pshufb = _fn(builder, "llvm.x86.avx2.pshuf.b", V(I8, 32), [V(I8, 32)] * 2)
        fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
        lut = ir.Constant(V(I8, 32), [0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1] * 2)
        low = ir.Constant(V(I8, 32), [0x0F] * 32)
        acc = cgutils.alloca_once_value(builder, ir.Constant(V(F32, 8), [0.0] * 8))

        with cgutils.for_range(builder, nb) as loop:
            b = loop.index
            p = builder.gep(wd, [builder.add(woff, builder.mul(b, i64(Q4_0X8_BYTES)))])
            raw = [builder.load(builder.bitcast(builder.gep(p, [i64(16 + 32 * i)]), V(I8, 32).as_pointer()), align=1)
                   for i in range(4)]  # 0123_0, 4567_0, 0123_1, 4567_1
            lo = [builder.call(pshufb, [lut, builder.and_(r, low)]) for r in raw]
            hi = [builder.call(pshufb, [lut, builder.and_(builder.bitcast(builder.lshr(
                builder.bitcast(r, V(I16, 16)), ir.Constant(V(I16, 16), [4] * 16)), V(I8, 32)), low)]) for r in raw]
            xp = builder.gep(xd, [builder.mul(b, i64(32))])
            lhs = [token_codes(builder, xp, i64(16 * h)) for h in range(2)]  # each half in both lanes
            iacc = ir.Constant(V(I32, 8), [0] * 8)
            # values 0-7 (lo of raw 0/1), 8-15 (lo of 2/3), 16-23 (hi of 0/1), 24-31 (hi of 2/3)
            for q, (r0123, r4567, x) in enumerate(((lo[0], lo[1], lhs[0]), (lo[2], lo[3], lhs[0]),
                                                    (hi[0], hi[1], lhs[1]), (hi[2], hi[3], lhs[1]))):
                for first in (True, False):
                    wv = pair_rows(builder, r0123, r4567, first)  # ggml's shuffles (calibration.ggml_gemv_kx8)
                    xv = lane_dword(builder, x, 2 * (q % 2) + (0 if first else 1))
                    iacc = mul_sum_i8(builder, wv, xv, iacc)
            hv = builder.load(builder.bitcast(p, V(I16, 8).as_pointer()), align=1)
            # the scales in the accumulator's lane order (ggml's changemask: rows 0, 4, 1, 5, 2, 6, 3, 7)
            hv = builder.shuffle_vector(hv, hv, v32([0, 4, 1, 5, 2, 6, 3, 7]))
            sc = builder.fpext(builder.bitcast(hv, V(ir.HalfType(), 8)), V(F32, 8))
            sc = builder.fmul(sc, _splat(builder, builder.load(builder.gep(dd, [b])), 8))
            builder.store(builder.call(fma, [builder.sitofp(iacc, V(F32, 8)), sc, builder.load(acc)]), acc)
        a = builder.load(acc)
        a = builder.shuffle_vector(a, a, v32([0, 2, 4, 6, 1, 3, 5, 7]))
        builder.store(a, builder.bitcast(builder.gep(rd, [roff]), V(F32, 8).as_pointer()), align=4)
        return context.get_dummy_value()

    return gen


if HAVE_AVX2:
    @intrinsic
    def vec_dot_q8_0(typingctx, w, wo, rb, x8, dx, nb, res, ro):
        """res[ro] = the Q8_0 row at byte wo of w . x8 * dx (ggml's ggml_vec_dot_q8_0_q8_0)."""
        return types.none(w, wo, rb, x8, dx, nb, res, ro), rows_i8_codegen(False, 1, False)

    @intrinsic
    def vec_dot_q4_0(typingctx, w, wo, rb, x8, dx, nb, res, ro):
        """res[ro] = the Q4_0 row at byte wo of w . x8 * dx (ggml's ggml_vec_dot_q4_0_q8_0)."""
        return types.none(w, wo, rb, x8, dx, nb, res, ro), rows_i8_codegen(True, 1, False)

    @intrinsic
    def vec_dot_iq4_nl(typingctx, w, wo, rb, x8, dx, nb, res, ro):
        """res[ro] = the IQ4_NL row at byte wo of w . x8 * dx (ggml's ggml_vec_dot_iq4_nl_q8_0)."""
        return types.none(w, wo, rb, x8, dx, nb, res, ro), rows_i8_codegen(True, 1, False, tuple(KVALUES))

    @njit(inline="always")
    def vec_dot(code, w, wo, rb, x8, dx, nb, res, ro):
        """res[ro] = the row of type `code` (Q8_0, Q4_0 or IQ4_NL) at byte wo of w . x8 * dx: ggml's vec_dot for it."""
        if code == Q4_0:
            vec_dot_q4_0(w, wo, rb, x8, dx, nb, res, ro)
        elif code == IQ4_NL:
            vec_dot_iq4_nl(w, wo, rb, x8, dx, nb, res, ro)
        else:
            vec_dot_q8_0(w, wo, rb, x8, dx, nb, res, ro)

    @intrinsic
    def gemv_q4_0x8(typingctx, w, wo, x8, dx, nb, res, ro):
        """res[ro:ro + 8] = the 8 block_q4_0x8 rows at byte wo of w . x8 * dx (ggml's AVX2 q4_0 8x8 gemv)."""
        return types.none(w, wo, x8, dx, nb, res, ro), gemv_q4_0x8_codegen()


@njit(cache=True)
def fp16_round(f):
    """The float32 f rounded to the nearest fp16 (ties to even), as a float32: GGML_CPU_FP32_TO_FP16 then back (|f|
    under 65,520)."""
    if f == 0:
        return np.float32(0.0)
    e = max(math.frexp(abs(f))[1] - 11, -24)  # fp16's step at |f|: 11 significant bits, 2^-24 for its subnormals
    s = math.ldexp(1.0, -e)
    return np.float32(np.round(np.float64(f) * s) / s)  # exact in float64, rounded half to even


@njit(cache=True)  # no fastmath: 127 / max must stay a division, as ggml's
def quantize_row_q8_0(x, x8, dx):
    """x [n] -> x8 int8, dx [n/32] float32 with x ~= x8 * dx per 32-block, as ggml's quantize_row_q8_0: the codes
    round-to-even(x 127 / max|x|), the block's scale max|x| / 127 stored as fp16 (dx holds its value)."""
    for b in range(x.shape[0] // 32):
        m = np.float32(0.0)
        for j in range(32):
            m = max(m, abs(x[b * 32 + j]))
        inv = np.float32(127.0) / m if m > 0 else np.float32(0.0)
        for j in range(32):
            x8[b * 32 + j] = np.int8(np.round(x[b * 32 + j] * inv))
        dx[b] = fp16_round(m / np.float32(127.0))
