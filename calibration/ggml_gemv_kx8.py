"""What ggml's AVX2 gemvs of K-quants repacked 8 rows at a time share (llama.cpp 0.3.36's ggml-cpu
arch/x86/repack.cpp `ggml_gemv_q4_K_8x8_q8_K`, `ggml_gemv_q2_K_8x8_q8_K`), as llvmlite codegen for the rebuilds in
calibration.ggml_gemv_q4_k and calibration.ggml_gemv_q2_k.

Both layouts (block_q4_Kx8, block_q2_Kx8) open each super-block with the 8 rows' fp16 d, then their 8 dmin, and
interleave the rows' quant bytes 8 at a time (byte chunk c of row r at chunk 8c + r). Both gemvs take a Q8_K token
(int8 codes, one float scale and sixteen 16-code sums a super-block) and per super-block add, in 32-bit integers,
the rows' scaled products (in lanes 0, 4, 1, 5, 2, 6, 3, 7: `vpmaddubsw` pairs a 4-byte half of each of two rows'
chunks with 4 codes) and their mins against the code sums (lanes 0-7); then one convert and fused multiply-add each
with d and dmin times the token's scale, and at the end the rows put in order and the mins taken off.
"""
from __future__ import annotations

from functools import partial

import numpy as np
from llvmlite import binding, ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from executor.simd import F32, I8, I16, I32, I64, V, _fn, _splat

binding.initialize_native_asmparser()  # numba's JIT assembles the inline `vpshufd` / `vperm2i128` below

LANE_ROWS = (0, 4, 1, 5, 2, 6, 3, 7)  # the row in each 32-bit lane of the products (ggml's deltamask)

ROWS = 8  # rows interleaved


def interleave_rows(w: np.ndarray, rows: int, block_bytes: int, fmt: str, d_at: int) -> tuple[np.ndarray, np.ndarray]:
    """The start of make_block_*x8: `fmt` rows (uint8, `rows` rows of nb super-blocks of block_bytes, row-major) ->
    (their blocks [rows / 8, nb, 8, block_bytes], the 8x layout [rows / 8, nb, 8 * block_bytes] with each super-block's
    8 rows' fp16 d (at byte d_at of a block) and then their dmin (d_at + 2) in its first 32 bytes)."""
    if rows % ROWS:
        raise ValueError(f"llama.cpp repacks {fmt} in groups of {ROWS} rows (got {rows})")
    nb = w.size // (rows * block_bytes)
    b = np.ascontiguousarray(w).reshape(rows // ROWS, ROWS, nb, block_bytes).transpose(0, 2, 1, 3)  # [G, nb, 8, B]
    out = np.empty((b.shape[0], nb, ROWS * block_bytes), np.uint8)
    out[..., 0:16] = b[..., d_at:d_at + 2].reshape(b.shape[0], nb, 16)
    out[..., 16:32] = b[..., d_at + 2:d_at + 4].reshape(b.shape[0], nb, 16)
    return b, out


def interleave_bytes(q: np.ndarray) -> np.ndarray:
    """The 8 rows' quant bytes [G, nb, 8, n] -> [G, nb, 8 n], 8 bytes at a time: byte chunk c of row r to chunk
    8 c + r."""
    g, nb, _, n = q.shape
    return q.reshape(g, nb, ROWS, n // 8, 8).transpose(0, 1, 3, 2, 4).reshape(g, nb, ROWS * n)


def v32(vals) -> ir.Constant:
    """An <n x i32> constant (a shuffle mask)."""
    vals = list(vals)
    return ir.Constant(V(I32, len(vals)), vals)


def load_vec(builder, base, off, ty, align=1):
    """Codegen: the `ty` at element `off` of pointer base (an unaligned load, as _mm256_loadu_si256)."""
    return builder.load(builder.bitcast(builder.gep(base, [off]), ty.as_pointer()), align=align)


# ggml's shuffles as GCC compiles them: `vpshufd` of a register for every _mm256_shuffle_epi32 and `vperm2i128` for
# the token's 16 codes in both lanes, written as inline assembly so that LLVM keeps them. As shufflevector, LLVM folded
# each lane_dword of a token into a `vpbroadcastd` from memory and each pair_rows into one `vpermt2d`: one shuffle a
# `vpmaddubsw` where ggml's loop issues two and a blend, and on the Zen 5 VM the rebuilt Q4_K / Q2_K gemvs ran 1.28x /
# 1.37x ggml's own (calibrate --ggml-lib, 2026-12-07).
def _pshufd(builder, v, imm: int):
    """Codegen: `vpshufd $imm` of the <8 x i32> v (a register)."""
    t = V(I32, 8)
    return builder.asm(ir.FunctionType(t, [t]), f"vpshufd $${imm}, $1, $0", "=x,x", [v], side_effect=False)


def lane_dword(builder, v, j):
    """Codegen: _mm256_shuffle_epi32(v, j * 85), dword j of each 128-bit lane of a <32 x i8> across that lane."""
    return builder.bitcast(_pshufd(builder, builder.bitcast(v, V(I32, 8)), j * 85), V(I8, 32))


def pair_rows(builder, a, b, first):
    """Codegen: blend(a, swap(b), 170) (first) / blend(swap(a), b, 170) of rows 0-3's 8-byte chunks (a) and rows
    4-7's (b): the first / second 4 bytes of each row's chunk, a row a 32-bit lane in LANE_ROWS order (the swap a
    `vpshufd` 177, the blend a `vpblendd`, as ggml's)."""
    a, b = builder.bitcast(a, V(I32, 8)), builder.bitcast(b, V(I32, 8))
    if first:
        b = _pshufd(builder, b, 177)
    else:
        a = _pshufd(builder, a, 177)
    return builder.bitcast(builder.shuffle_vector(a, b, v32([0, 9, 2, 11, 4, 13, 6, 15])), V(I8, 32))


def shift_bytes(builder, v, bits):
    """Codegen: _mm256_srli_epi16(v, bits) of a <32 x i8> (each 16-bit lane shifted; the caller masks the bytes)."""
    if not bits:
        return v
    return builder.bitcast(builder.lshr(builder.bitcast(v, V(I16, 16)), ir.Constant(V(I16, 16), [bits] * 16)),
                           V(I8, 32))


def token_codes(builder, xd, off):
    """Codegen: the token's 16 codes at element off, in both 128-bit lanes of a <32 x i8> (a 16-byte load, then
    `vperm2i128` as ggml's _mm256_permute2f128_si256)."""
    h = load_vec(builder, xd, off, V(I8, 16))
    w = builder.shuffle_vector(h, ir.Constant(V(I8, 16), ir.Undefined), v32(range(32)))  # the permute reads the low lane
    t = V(I8, 32)
    return builder.asm(ir.FunctionType(t, [t]), "vperm2i128 $$0, $1, $1, $0", "=x,x", [w], side_effect=False)


def utmp_scales_mins(builder, q):
    """Codegen: Q4_K's / Q5_K's 12 bytes of 6-bit scales and mins at q -> <16 x i8>: the 8 scales, then the 8 mins
    (ggml's `utmp` shuffle, get_scale_min_k4 for all eight at once)."""
    i32 = lambda v: ir.Constant(I32, v)  # noqa: E731
    u = [load_vec(builder, q, ir.Constant(I64, 4 * i), I32) for i in range(3)]
    k1, k2, k3 = i32(0x3F3F3F3F), i32(0x0F0F0F0F), i32(0x03030303)
    t3 = builder.or_(builder.and_(builder.lshr(u[2], i32(4)), k2),
                     builder.shl(builder.and_(builder.lshr(u[1], i32(6)), k3), i32(4)))
    t1 = builder.or_(builder.and_(u[2], k2), builder.shl(builder.and_(builder.lshr(u[0], i32(6)), k3), i32(4)))
    t2, t0 = builder.and_(u[1], k1), builder.and_(u[0], k1)
    v = ir.Constant(V(I32, 4), ir.Undefined)
    for i, t in enumerate((t0, t1, t2, t3)):
        v = builder.insert_element(v, t, i32(i))
    return builder.bitcast(v, V(I8, 16))


class Ops:
    """The intrinsics of one codegen: maddubs (vpmaddubsw), pmaddwd (vpmaddwd)."""

    def __init__(self, builder):
        self.maddubs = _fn(builder, "llvm.x86.avx2.pmadd.ub.sw", V(I16, 16), [V(I8, 32)] * 2)
        self.pmaddwd = _fn(builder, "llvm.x86.avx2.pmadd.wd", V(I32, 8), [V(I16, 16)] * 2)


def gemv_kx8_codegen(context, builder, sig, args, block_bytes: int, integer_sums):
    """Codegen: res[ro + k] = row_k . (x8 * dx), k < 8, for the 8 rows of super-blocks of block_bytes at byte woff of
    w (nb of them) against a Q8_K token (x8 int8 codes, dx float32 a super-block, bs int32 sums of 16 codes).
    integer_sums(builder, ops, p, xd, bd, b) -> (<8 x i32> scaled products in LANE_ROWS order, <8 x i32> mins x
    code sums in row order) of super-block b at pointer p."""
    wa, woff, xa, da, ba, nb, ra, roff = args
    data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
    wd, xd, dd, bd, rd = data(0, wa), data(2, xa), data(3, da), data(4, ba), data(6, ra)
    ops = Ops(builder)
    fma = _fn(builder, "llvm.fma.v8f32", V(F32, 8), [V(F32, 8)] * 3)
    zero8 = ir.Constant(V(F32, 8), [0.0] * 8)
    acc_row = cgutils.alloca_once_value(builder, zero8)
    acc_min = cgutils.alloca_once_value(builder, zero8)
    half8 = lambda v: builder.fpext(builder.bitcast(v, V(ir.HalfType(), 8)), V(F32, 8))  # noqa: E731
    with cgutils.for_range(builder, nb) as loop:
        b = loop.index
        p = builder.gep(wd, [builder.add(woff, builder.mul(b, ir.Constant(I64, block_bytes)))])
        row_scale = _splat(builder, builder.load(builder.gep(dd, [b])), 8)
        d = load_vec(builder, p, ir.Constant(I64, 0), V(I16, 8))
        col_scale = half8(builder.shuffle_vector(d, d, v32(LANE_ROWS)))  # the rows' d in the products' lanes
        col_dmin = half8(load_vec(builder, p, ir.Constant(I64, 16), V(I16, 8)))
        iacc_b, iacc_min_b = integer_sums(builder, ops, p, xd, bd, b)
        builder.store(builder.call(fma, [builder.sitofp(iacc_b, V(F32, 8)), builder.fmul(col_scale, row_scale),
                                         builder.load(acc_row)]), acc_row)
        builder.store(builder.call(fma, [builder.sitofp(iacc_min_b, V(F32, 8)), builder.fmul(col_dmin, row_scale),
                                         builder.load(acc_min)]), acc_min)
    a = builder.load(acc_row)
    a = builder.shuffle_vector(a, a, v32([0, 2, 4, 6, 1, 3, 5, 7]))  # finalpermutemask: rows in order
    builder.store(builder.fsub(a, builder.load(acc_min)),
                  builder.bitcast(builder.gep(rd, [roff]), V(F32, 8).as_pointer()), align=4)
    return context.get_dummy_value()


def q8_k_intrinsic(codegen, name: str):
    """The numba intrinsic f(w, wo, x8, dx, bs, nb, res, ro) whose body is `codegen(context, builder, sig, args)`: a
    product of rows of super-blocks at byte wo of w (nb of them) with a Q8_K token (x8 codes, dx scales, bs 16-code
    sums) into res from ro."""
    def f(typingctx, w, wo, x8, dx, bs, nb, res, ro):
        return types.none(w, wo, x8, dx, bs, nb, res, ro), codegen
    f.__name__ = f.__qualname__ = name
    return intrinsic(f)


def kx8_gemv(block_bytes: int, integer_sums, name: str):
    """The numba intrinsic gemv(w, wo, x8, dx, bs, nb, res, ro): res[ro:ro + 8] = the 8 rows of super-blocks of
    block_bytes at byte wo of w (nb of them) . the Q8_K token (x8 codes, dx scales, bs 16-code sums), as
    gemv_kx8_codegen with integer_sums."""
    return q8_k_intrinsic(partial(gemv_kx8_codegen, block_bytes=block_bytes, integer_sums=integer_sums), name)
