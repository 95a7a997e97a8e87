"""ggml's AVX2 gemv of Q4_K weights repacked at load (llama.cpp 0.3.36's ggml-cpu arch/x86/repack.cpp
`ggml_gemv_q4_K_8x8_q8_K`), rebuilt as a numba intrinsic, for the simulator's llama.cpp plans.

On a CPU with AVX2 llama.cpp copies Q4_K weights at load into `block_q4_Kx8` (repack.cpp make_block_q4_Kx8): for
each 8 rows and each 256-weight super-block, the 8 rows' fp16 d, their 8 dmin, 96 bytes of 6-bit scales and mins
(12 a sub-block: the 8 rows' values packed as Q4_K packs its own 8), then their 1024 bytes of nibbles interleaved 8
bytes a row. Its MUL_MAT_ID runs a gemv per token over each thread's share of rows (forward_mul_mat_id), the token
quantised to Q8_K (int8 codes, one float scale and sixteen 16-code sums a super-block). Per super-block and pair of
sub-blocks the gemv takes the 8 rows' 256 bytes of nibbles in eight 32-byte loads, masks and shifts them to the two
sub-blocks' unsigned values, and multiplies them with the token's codes by `vpmaddubsw` (two rows' 4 values to a 32-bit
lane, rows 0, 4, 1, 5, 2, 6, 3, 7 across the lanes), 8 products added in 16 bits, then `vpmaddwd` with the rows'
sub-block scales into 32 bits; the mins against the code sums by one more `vpmaddwd`; per super-block one convert and
fused multiply-add each with d and dmin times the token's scale. There is no VNNI form of it: ggml compiles this one
for every CPU with AVX2.

The rebuild is that loop (the same loads, shuffles and integer products; the token's code sums kept as int32 and
narrowed in the loop, where ggml stores them as int16; the super-block loop around it, shared with Q2_K's, in
calibration.ggml_gemv_kx8), and `repack_q4_k_x8` is make_block_q4_Kx8. Its products
equal the dequantised weights times the Q8_K token to float rounding (tests/calibration/test_ggml_gemv_kx8.py).
Before it, llama.cpp's repacked Q4_K took the rebuilt Q4_0 gemv's rate (specs.formats.LLAMACPP_REPACKED_STAND_IN).
AVX2 only (HAVE_AVX2).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from executor.nbcache import drop_stale_cache
from executor.simd import HAVE_AVX2, I8, I16, I32, I64, V, _splat

from .ggml_gemv_kx8 import (LANE_ROWS, ROWS, interleave_bytes, interleave_rows, kx8_gemv, lane_dword, load_vec,
                           pair_rows, shift_bytes, token_codes, utmp_scales_mins, v32)

drop_stale_cache(__file__)

Q4_K_BYTES = 144  # block_q4_K: fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
Q4_KX8_BYTES = 8 * Q4_K_BYTES  # block_q4_Kx8: 8 d, 8 dmin, 96 bytes of scales and mins, 1024 of nibbles


def _scales_mins(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 packed bytes [..., 12] -> (scales, mins) [..., 8] (ggml's get_scale_min_k4)."""
    sc = sc.astype(np.uint8)
    lo, hi = sc[..., 0:4], sc[..., 4:8]
    s = np.concatenate([lo & 63, (sc[..., 8:12] & 15) | ((lo >> 6) << 4)], axis=-1)
    m = np.concatenate([hi & 63, (sc[..., 8:12] >> 4) | ((hi >> 6) << 4)], axis=-1)
    return s, m


def repack_q4_k_x8(w: np.ndarray, rows: int) -> np.ndarray:
    """Q4_K rows (uint8, `rows` rows of nb super-blocks, row-major) -> llama.cpp's block_q4_Kx8 layout (uint8
    [rows / 8, nb * 1152]): make_block_q4_Kx8 for every 8 rows and super-block."""
    b, out = interleave_rows(w, rows, Q4_K_BYTES, "Q4_K", 0)  # [G, nb, 8, 144], [G, nb, 1152]
    g, nb = b.shape[:2]
    s, m = _scales_mins(b[..., 4:16])  # [G, nb, 8 rows, 8 sub-blocks]
    s, m = s.transpose(0, 1, 3, 2), m.transpose(0, 1, 3, 2)  # [G, nb, sub-block, row]
    packed = np.concatenate([(s[..., :4] & 63) + ((s[..., 4:] & 48) << 2), (m[..., :4] & 63) + ((m[..., 4:] & 48) << 2),
                             (s[..., 4:] & 15) + ((m[..., 4:] & 15) << 4)], axis=-1)  # [G, nb, 8, 12]
    out[..., 32:128] = packed.astype(np.uint8).reshape(g, nb, 96)
    out[..., 128:] = interleave_bytes(b[..., 16:])
    return out.reshape(rows // ROWS, nb * Q4_KX8_BYTES)


def _q4_k_sums(builder, ops, p, xd, bd, b):
    """Codegen: (scaled products, mins x code sums) of block_q4_Kx8 super-block b at p (calibration.ggml_gemv_kx8)."""
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    low = ir.Constant(V(I8, 32), [0x0F] * 32)
    bs = builder.trunc(load_vec(builder, bd, builder.mul(b, i64(16)), V(I32, 16), 4), V(I16, 16))
    q8s = builder.add(builder.shuffle_vector(bs, bs, v32(range(0, 16, 2))),  # hadd: each 32 codes' sum
                      builder.shuffle_vector(bs, bs, v32(range(1, 16, 2))))
    q8s = builder.bitcast(q8s, V(I32, 4))
    iacc_b = ir.Constant(V(I32, 8), [0] * 8)
    iacc_min_b = iacc_b
    for sb in range(4):  # two sub-blocks a pass: 2 sb in the low nibbles, 2 sb + 1 in the high
        raw = [load_vec(builder, p, i64(128 + sb * 256 + 32 * i), V(I8, 32)) for i in range(8)]  # 0123_0, 4567_0, ..
        lo = [builder.and_(r, low) for r in raw]
        hi = [builder.and_(shift_bytes(builder, r, 4), low) for r in raw]
        ms = [utmp_scales_mins(builder, builder.gep(p, [i64(32 + 24 * sb + 12 * h)])) for h in range(2)]
        order = [r for r in LANE_ROWS for _ in (0, 1)]  # each row's scale under both its 16-bit products
        scales = [builder.zext(builder.shuffle_vector(m, m, v32(order)), V(I16, 16)) for m in ms]
        mins = builder.zext(builder.shuffle_vector(ms[0], ms[1], v32([i for j in range(8, 16) for i in (j, 16 + j)])),
                            V(I16, 16))
        xb = builder.add(builder.mul(b, i64(256)), i64(sb * 64))
        lhs = [token_codes(builder, xd, builder.add(xb, i64(16 * q))) for q in range(4)]
        for half, (vals, xs) in enumerate(((lo, lhs[:2]), (hi, lhs[2:]))):
            iacc = ir.Constant(V(I16, 16), [0] * 16)
            for k in range(4):  # bytes 8k-8k+7 of each row: the sub-block's values 8k to 8k + 7
                x = xs[k // 2]
                for first in (True, False):
                    prod = builder.call(ops.maddubs, [pair_rows(builder, vals[2 * k], vals[2 * k + 1], first),
                                                      lane_dword(builder, x, 2 * (k % 2) + (0 if first else 1))])
                    iacc = builder.add(iacc, prod)
            iacc_b = builder.add(iacc_b, builder.call(ops.pmaddwd, [iacc, scales[half]]))
        q8s_sb = builder.bitcast(_splat(builder, builder.extract_element(q8s, ir.Constant(I32, sb)), 8), V(I16, 16))
        iacc_min_b = builder.add(iacc_min_b, builder.call(ops.pmaddwd, [q8s_sb, mins]))
    return iacc_b, iacc_min_b


if HAVE_AVX2:  # gemv_q4_kx8(w, wo, x8, dx, bs, nb, res, ro): ggml's AVX2 ggml_gemv_q4_K_8x8_q8_K
    gemv_q4_kx8 = kx8_gemv(Q4_KX8_BYTES, _q4_k_sums, "gemv_q4_kx8")
