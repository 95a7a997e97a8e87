"""ggml's AVX2 gemv of Q2_K weights repacked at load (llama.cpp 0.3.36's ggml-cpu arch/x86/repack.cpp
`ggml_gemv_q2_K_8x8_q8_K`), rebuilt as a numba intrinsic, for the simulator's llama.cpp plans.

On a CPU with AVX-512 F llama.cpp copies Q2_K weights at load into `block_q2_Kx8` (repack.cpp make_block_q2_Kx8;
ggml_repack_get_optimal_repack_type): for each 8 rows and each 256-weight super-block, the 8 rows' fp16 d, their 8
dmin, 128 bytes of 4-bit scales and mins (16 bytes a pair of sub-blocks: row r's two bytes at 2r, as Q2_K keeps
them, scale in the low nibble, min in the high), then their 512 bytes of 2-bit codes interleaved 8 bytes a row. Its
MUL_MAT_ID runs a gemv per token over each thread's share of rows, as for Q4_0 and Q4_K, the gemv itself AVX2 code.
Per super-block and half (128 weights) it takes the 8 rows' 256 bytes in eight 32-byte loads, shifts and masks each
four ways to the half's 8 sub-blocks of 2-bit values, and multiplies them with the token's codes by `vpmaddubsw`
(two rows' 4 values to a 32-bit lane), 4 products a sub-block added in 16 bits, then `vpmaddwd` with the rows'
sub-block scales into 32 bits; the mins against the token's 16-code sums by one `vpmaddwd` a pair of sub-blocks
(calibration.ggml_gemv_kx8 holds the loop around it). Twice Q4_K's sub-blocks for half its bytes: as many
`vpmaddubsw` a weight as Q4_K, twice the `vpmaddwd`.

The rebuild is that loop (the same loads, shifts, shuffles and integer products; the token's code sums kept as
int32 and narrowed in the loop, where ggml stores them as int16), with the stack traffic of ggml's compiled loop
(SPILLED_SHIFTS, SPILLED_SCALES), and `repack_q2_k_x8` is make_block_q2_Kx8. On one Zen 4 core it runs 105 GFLOP/s at
`small`'s shapes (benchmarks/bench_repacked_gemv.py; the stack traffic costs it 0-3%) where ggml's runs ~97 in situ
(perf of llama-bench): GCC pairs the rows by vpshufd + vpblendd and broadcasts the token's codes by vpshufd, where
LLVM takes one vpermt2d, broadcasts from memory and fuses vpmaddwd with its add into vpdpwssd. Its products
equal the dequantised weights times the Q8_K token to float rounding (tests/calibration/test_ggml_gemv_kx8.py).
Before it, llama.cpp's repacked Q2_K took the rebuilt Q4_0 gemv's rate (specs.formats.LLAMACPP_REPACKED_STAND_IN).
AVX2 only (HAVE_AVX2).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import cgutils

from executor.nbcache import drop_stale_cache
from executor.simd import HAVE_AVX2, I8, I16, I32, I64, V, _splat

from .ggml_gemv_kx8 import (LANE_ROWS, ROWS, interleave_bytes, interleave_rows, kx8_gemv, lane_dword, load_vec,
                           pair_rows, shift_bytes, token_codes, v32)

drop_stale_cache(__file__)

Q2_K_BYTES = 84  # block_q2_K: 16 bytes of 4-bit scales and mins, 64 of 2-bit codes, fp16 d, fp16 dmin
Q2_KX8_BYTES = 8 * Q2_K_BYTES  # block_q2_Kx8: 8 d, 8 dmin, 128 bytes of scales and mins, 512 of codes


def repack_q2_k_x8(w: np.ndarray, rows: int) -> np.ndarray:
    """Q2_K rows (uint8, `rows` rows of nb super-blocks, row-major) -> llama.cpp's block_q2_Kx8 layout (uint8
    [rows / 8, nb * 672]): make_block_q2_Kx8 for every 8 rows and super-block."""
    b, out = interleave_rows(w, rows, Q2_K_BYTES, "Q2_K", 80)  # [G, nb, 8, 84], [G, nb, 672]
    g, nb = b.shape[:2]
    # scales[16 p + 2 r + h] = row r's byte 2 p + h: a pair of sub-blocks a 16 bytes
    out[..., 32:160] = b[..., 0:16].reshape(g, nb, ROWS, 8, 2).transpose(0, 1, 3, 2, 4).reshape(g, nb, 128)
    out[..., 160:] = interleave_bytes(b[..., 16:80])
    return out.reshape(rows // ROWS, nb * Q2_KX8_BYTES)


# GCC 12's build of ggml's loop (-O3 -march=native, AVX-512: 32 vector registers) keeps 18 of a half's 32 shifted
# code vectors and 7 of its 8 sub-block scale vectors on the stack: perf annotate of llama-bench finds, a half, 25
# vector stores to the stack, 18 `vpandq` and 7 `vpmaddwd` reading them back (86 stack operands in the function; its
# Q4_K gemv keeps none there). The rebuild moves the same vectors through a stack buffer.
SPILLED_SHIFTS = 18  # of the 32 shifted vectors, the last 18 the products use
SPILLED_SCALES = 7  # of the 8 sub-block scale vectors, all but the first


def _q2_k_sums(builder, ops, p, xd, bd, b):
    """Codegen: (scaled products, mins x code sums) of block_q2_Kx8 super-block b at p (calibration.ggml_gemv_kx8)."""
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    m3 = ir.Constant(V(I8, 32), [3] * 32)
    m4 = ir.Constant(V(I8, 16), [0x0F] * 16)
    iacc_b = ir.Constant(V(I32, 8), [0] * 8)
    iacc_min_b = iacc_b
    stack = cgutils.alloca_once(builder, V(I8, 32), size=SPILLED_SHIFTS + SPILLED_SCALES)
    for sb in range(2):  # a half (128 weights) a pass: its 8 sub-blocks of 16
        # rows 0-3, then 4-7, of each row's bytes 8q to 8q + 7 of the half's 32 (0123_0, 4567_0, 0123_1, ...)
        raw = [[load_vec(builder, p, i64(160 + sb * 256 + 64 * q + 32 * h), V(I8, 32)) for h in (0, 1)]
               for q in range(4)]
        bs = builder.trunc(load_vec(builder, bd, builder.add(builder.mul(b, i64(16)), i64(8 * sb)), V(I32, 8), 4),
                           V(I16, 8))
        q8s = builder.bitcast(bs, V(I32, 4))  # the code sums of sub-blocks 2j and 2j + 1 in dword j
        scales, mins, shifted = [], [], {}
        for j in range(4):  # sub-blocks 2j (bytes 0-15 of each row, shifted 2j) and 2j + 1 (bytes 16-31)
            ms = load_vec(builder, p, i64(32 + sb * 64 + 16 * j), V(I8, 16))  # [r0 2j, r0 2j+1, r1 2j, ...]
            sc = builder.and_(ms, m4)
            mins.append(builder.zext(builder.and_(builder.lshr(ms, ir.Constant(V(I8, 16), [4] * 16)), m4), V(I16, 16)))
            for h in (0, 1):  # sub-block 2j + h
                scales.append(builder.zext(builder.shuffle_vector(sc, sc, v32([2 * r + h for r in LANE_ROWS
                                                                               for _ in (0, 1)])), V(I16, 16)))
                for qq in (0, 1):
                    for i in (0, 1):
                        shifted[(2 * j + h, qq, i)] = shift_bytes(builder, raw[2 * h + qq][i], 2 * j)
        # the spills: stored once all are made, as GCC's schedule does, and read back where used
        keys = list(shifted)[-SPILLED_SHIFTS:]
        slots = {}
        for n, v in enumerate([shifted[k] for k in keys] + scales[1:]):
            slots[n] = builder.gep(stack, [ir.Constant(I32, n)])
            builder.store(builder.bitcast(v, V(I8, 32)), slots[n], align=32)
        builder.asm(ir.FunctionType(ir.VoidType(), [stack.type]), "", "r,~{memory}", [stack], True)  # no reordering
        for n, k in enumerate(keys):
            shifted[k] = builder.load(slots[n], align=32)
        scales[1:] = [builder.bitcast(builder.load(slots[SPILLED_SHIFTS + n], align=32), V(I16, 16))
                      for n in range(SPILLED_SCALES)]
        for k in range(8):
            x = token_codes(builder, xd, builder.add(builder.mul(b, i64(256)), i64(sb * 128 + 16 * k)))
            iacc = ir.Constant(V(I16, 16), [0] * 16)
            for qq in (0, 1):  # the sub-block's bytes 0-7, then 8-15, of each row
                lo4, hi4 = (builder.and_(shifted[(k, qq, i)], m3) for i in (0, 1))
                for first in (True, False):
                    prod = builder.call(ops.maddubs, [pair_rows(builder, lo4, hi4, first),
                                                      lane_dword(builder, x, 2 * qq + (0 if first else 1))])
                    iacc = builder.add(iacc, prod)
            iacc_b = builder.add(iacc_b, builder.call(ops.pmaddwd, [iacc, scales[k]]))
        for j in range(4):
            q8s_j = builder.bitcast(_splat(builder, builder.extract_element(q8s, ir.Constant(I32, j)), 8), V(I16, 16))
            iacc_min_b = builder.add(iacc_min_b, builder.call(ops.pmaddwd, [q8s_j, mins[j]]))
    return iacc_b, iacc_min_b


if HAVE_AVX2:  # gemv_q2_kx8(w, wo, x8, dx, bs, nb, res, ro): ggml's AVX2 ggml_gemv_q2_K_8x8_q8_K
    gemv_q2_kx8 = kx8_gemv(Q2_KX8_BYTES, _q2_k_sums, "gemv_q2_kx8")
