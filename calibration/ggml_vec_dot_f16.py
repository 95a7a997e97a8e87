"""ggml's F16 vec_dot (`ggml_vec_dot_f16`, ggml-cpu vec.cpp) rebuilt as a numba intrinsic, for the F16 weights of
llama.cpp's decode (the synthetic files' attention projections; any F16 experts).

llama.cpp's MUL_MAT converts the op's token to fp16 once (F16's vec_dot_type; ggml_cpu_fp32_to_fp16: `vcvtps2ph`,
to nearest even), then calls the vec_dot a weight row. On x86 without AVX512-FP16 that loop is (simd-mappings.h):
- GGML_F16_STEP values a pass in GGML_F16_ARR = 4 accumulators of EPR float lanes: 16 lanes on AVX-512 F
  (GGML_F32Cx16_LOAD, `vcvtph2ps` zmm), 8 on AVX with F16C (GGML_F32Cx8_LOAD, ymm);
- each accumulator a fused multiply-add of the row's values and the token's, converted from fp16;
- GGML_F32Cx16_REDUCE / GGML_F32Cx8_REDUCE: x0 + x2 and x1 + x3, then their sum; across lanes AVX-512's
  `_mm512_reduce_add_ps` (GCC: the 256-bit halves added, then the 128-bit halves, then lanes {2, 3, 0, 1} added,
  then lane 0 + lane 1), AVX's two 128-bit halves added and two `hadd`s;
- that sum as a double (ggml_float) plus the leftover values' products in double, stored as a float.

Before this, calibrate timed llama.cpp's F16 rows on the executor's float single-row arithmetic: on the Zen 4 VM
18.5 GB/s on one thread where perf of llama-bench's tg64 put ggml's vec_dot_f16 at ~26 (2026-12-06; README,
"Simulator against llama.cpp", session 49). The products equal ggml's own to the bit
(tests/calibration/test_ggml_vec_dot_f16.py). AVX2 only, as the other rebuilds: HAVE_AVX2 says whether it exists.
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

from executor.nbcache import drop_stale_cache
from executor.simd import F32, HAVE_AVX2, I16, I32, I64, V, _fn, _slice
from executor.vnni import _FEATURES

drop_stale_cache(__file__)

HAVE_AVX512F = HAVE_AVX2 and "+avx512f" in _FEATURES
EPR = 16 if HAVE_AVX512F else 8  # float lanes a vector (GGML_F16_EPR)
ARR = 4  # accumulators (GGML_F16_ARR = GGML_F16_STEP / GGML_F16_EPR)
STEP = ARR * EPR  # values a pass (GGML_F16_STEP: 64 on AVX-512 F, 32 on AVX)
HALF = ir.HalfType()
F64 = ir.DoubleType()


def _reduce(builder, sums):
    """GGML_F32Cx16_REDUCE / GGML_F32Cx8_REDUCE of the four accumulators, as a float."""
    x0 = builder.fadd(builder.fadd(sums[0], sums[2]), builder.fadd(sums[1], sums[3]))
    if EPR == 16:  # _mm512_reduce_add_ps, GCC's order
        t3 = builder.fadd(_slice(builder, x0, 8, 8), _slice(builder, x0, 0, 8))
        t6 = builder.fadd(_slice(builder, t3, 4, 4), _slice(builder, t3, 0, 4))
        t8 = builder.fadd(t6, builder.shuffle_vector(t6, t6, ir.Constant(V(I32, 4), [2, 3, 0, 1])))
        return builder.fadd(builder.extract_element(t8, ir.Constant(I32, 0)),
                            builder.extract_element(t8, ir.Constant(I32, 1)))
    t0 = builder.fadd(_slice(builder, x0, 0, 4), _slice(builder, x0, 4, 4))
    e = [builder.extract_element(t0, ir.Constant(I32, i)) for i in range(4)]  # hadd(t0, t0), then hadd of that
    return builder.fadd(builder.fadd(e[0], e[1]), builder.fadd(e[2], e[3]))


def _vec_dot_f16_codegen(context, builder, sig, args):
    """Codegen: the double sum of the first `np_` values (a multiple of STEP) of the fp16 row at byte wo of w times the
    fp16 token xh, in ggml's order."""
    wa, wo, xa, np_ = args
    data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
    wd, xd = data(0, wa), data(2, xa)
    vt = V(F32, EPR)
    fma = _fn(builder, f"llvm.fma.v{EPR}f32", vt, [vt] * 3)
    sums = [cgutils.alloca_once_value(builder, ir.Constant(vt, [0.0] * EPR)) for _ in range(ARR)]
    i64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    row = builder.bitcast(builder.gep(wd, [wo]), I16.as_pointer())

    def load(base, at):  # EPR fp16 values as floats (vcvtph2ps)
        p = builder.bitcast(builder.gep(base, [at]), V(I16, EPR).as_pointer())
        return builder.fpext(builder.bitcast(builder.load(p, align=1), V(HALF, EPR)), vt)
    with cgutils.for_range(builder, builder.udiv(np_, i64(STEP))) as loop:
        i = builder.mul(loop.index, i64(STEP))
        for j in range(ARR):
            at = builder.add(i, i64(j * EPR))
            builder.store(builder.call(fma, [load(row, at), load(xd, at), builder.load(sums[j])]), sums[j])
    return builder.fpext(_reduce(builder, [builder.load(s) for s in sums]), F64)


def _fp32_to_fp16_codegen(context, builder, sig, args):
    """Codegen: xh[i] = the fp16 bits of x[i] rounded to nearest even (ggml_cpu_fp32_to_fp16), i < n."""
    xa, ha, n = args
    data = lambda i, v: cgutils.create_struct_proxy(sig.args[i])(context, builder, value=v).data  # noqa: E731
    xd, hd = data(0, xa), data(1, ha)
    with cgutils.for_range(builder, n) as loop:
        h = builder.fptrunc(builder.load(builder.gep(xd, [loop.index])), HALF)
        builder.store(builder.bitcast(h, I16), builder.gep(hd, [loop.index]))
    return context.get_dummy_value()


if HAVE_AVX2:
    @intrinsic
    def _vec_dot_f16_main(typingctx, w, wo, xh, np_):
        return types.float64(w, wo, xh, np_), _vec_dot_f16_codegen

    @intrinsic
    def fp32_to_fp16_row(typingctx, x, xh, n):
        """xh[:n] = the fp16 bits (uint16) of the floats x[:n], to nearest even, as ggml converts an F16 op's token."""
        return types.none(x, xh, n), _fp32_to_fp16_codegen

    @njit(inline="always")
    def vec_dot_f16(w, wo, xh, n, res, ro):
        """res[ro] = the n-value fp16 row at byte wo of w (uint8) . the fp16 token xh (uint16): ggml's vec_dot_f16."""
        np_ = n - n % STEP
        s = _vec_dot_f16_main(w, wo, xh, np_)
        for i in range(np_, n):  # the leftovers, in double
            lo, hi = w[wo + 2 * i], w[wo + 2 * i + 1]
            s += _half(lo | (hi << 8)) * _half(xh[i])
        res[ro] = s


@njit(inline="always")
def _half(bits):
    """The float64 value of fp16 bits."""
    b = int(bits)
    e, m = (b >> 10) & 0x1F, b & 0x3FF
    if e == 31:
        v = float("nan") if m else float("inf")
    else:
        v = m * 2.0 ** -24 if e == 0 else (1024 + m) * 2.0 ** (e - 25)
    return -v if b & 0x8000 else v
