"""ggml's fp16 scales as its x86 build reads them (calibration.ggml_vec_dot.fp16_lookup): through the 256 KiB table
ggml_table_f32_f16, one load of the bits and one from the table, where F16C would convert in a register. From DRAM the
table's lines compete with the streamed weights: ggml's own Q8_0 vec_dot read 22.9-23.6 GB/s on one Zen 4 core, the
rebuild with an F16C conversion 26.6-29.1 and with the table 22.8-23.8 (2026-12-06, README session 48)."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from calibration.ggml_vec_dot import fp16_lookup
from executor.simd import HAVE_AVX2


@intrinsic
def _lookup(typingctx, bits, out, i):
    """out[i] = the fp16 bit pattern bits[i], as a float, through ggml's table."""
    def codegen(context, builder, sig, args):
        data = lambda k, v: cgutils.create_struct_proxy(sig.args[k])(context, builder, value=v).data  # noqa: E731
        b, o = data(0, args[0]), data(1, args[1])
        p = builder.bitcast(builder.gep(b, [args[2]]), cgutils.int8_t.as_pointer())
        builder.store(fp16_lookup(builder, p), builder.gep(o, [args[2]]))
        return context.get_dummy_value()
    return types.none(bits, out, i), codegen


@njit
def _all(bits, out):
    for i in range(bits.shape[0]):
        _lookup(bits, out, np.int64(i))


def test_the_table_holds_every_fp16_as_its_float():
    """All 65,536 bit patterns, infinities and NaNs included: the float numpy converts each to."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    out = np.zeros(1 << 16, np.float32)
    _all(bits, out)
    want = bits.view(np.float16).astype(np.float32)
    assert np.array_equal(out, want, equal_nan=True)


@pytest.mark.skipif(not HAVE_AVX2, reason="ggml's vec_dot is rebuilt for AVX2 only")
def test_q8_0_and_k_quant_rows_read_their_scales_through_the_table():
    """The compiled products of a Q8_0 and a Q4_K row load from ggml_table_f32_f16 (one table a module)."""
    from calibration.ggml_vec_dot import vec_dot_q8_0
    from calibration.ggml_vec_dot_k import vec_dot_q4_k

    @njit
    def q8(w, x8, dx, out):
        vec_dot_q8_0(w, np.int64(0), np.int64(w.shape[0]), x8, dx, np.int64(1), out, np.int64(0))

    @njit
    def q4k(w, x8, dx, bs, out):
        vec_dot_q4_k(w, np.int64(0), x8, dx, bs, np.int64(1), out, np.int64(0))

    out = np.zeros(1, np.float32)
    q8(np.zeros(34, np.uint8), np.zeros(32, np.int8), np.ones(1, np.float32), out)
    q4k(np.zeros(144, np.uint8), np.zeros(256, np.int8), np.ones(1, np.float32), np.zeros(16, np.int16), out)
    for f in (q8, q4k):
        ir_text = f.inspect_llvm(f.signatures[0])
        table = [ln for ln in ir_text.splitlines() if ln.startswith("@ggml_table_f32_f16 = internal")]
        assert len(table) == 1 and "constant [65536 x float]" in table[0]
        assert "ptr @ggml_table_f32_f16, i64 %" in ir_text  # a load at the scale's bits


def test_fp16_round_is_numpys_float16_to_the_bit():
    """Ties to even, carries into the exponent, subnormal fp16s (under 2^-14) and zero: 200,000 floats over 2^-30 ..
    2^15 and both signs, plus every half-way point between consecutive fp16s of one binade."""
    from calibration.ggml_vec_dot import fp16_round
    rng = np.random.default_rng(0)
    f = (np.exp2(rng.uniform(-30, 15, 200_000)) * rng.choice([-1, 1], 200_000)).astype(np.float32)
    h = np.arange(0x3C00, 0x4000, dtype=np.uint16).view(np.float16).astype(np.float32)  # [1, 2)
    ties = ((h[:-1].astype(np.float64) + h[1:]) / 2).astype(np.float32)
    for x in np.concatenate([f, ties, np.float32([0.0, 2.0 ** -14, 2.0 ** -25, 65504.0])]):
        assert np.float32(fp16_round(x)) == np.float32(np.float16(x))


def test_the_q8_0_token_is_ggmls_codes_and_fp16_scales():
    """quantize_row_q8_0: codes round-to-even(x 127 / max|x|), dx each block's max|x| / 127 as an fp16 value."""
    from calibration.ggml_vec_dot import quantize_row_q8_0
    x = np.random.default_rng(1).standard_normal(2048).astype(np.float32)
    x8, dx = np.zeros(2048, np.int8), np.zeros(64, np.float32)
    quantize_row_q8_0(x, x8, dx)
    m = np.abs(x.reshape(64, 32)).max(axis=1)
    assert np.array_equal(dx, (m / np.float32(127)).astype(np.float16).astype(np.float32))
    assert np.array_equal(x8, np.round(x.reshape(64, 32) * (np.float32(127) / m)[:, None]).astype(np.int8).ravel())


FOUND = None
if HAVE_AVX2:
    from calibration import ggml_library as L
    FOUND = L.find_ggml_cpu("auto")


@pytest.mark.skipif(FOUND is None, reason="no llama.cpp build here ($MOE_OFFLOAD_GGML_LIB, or llama-bench on PATH)")
@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "IQ4_NL"])
def test_q8_0_family_products_are_ggmls_own_to_the_bit(fmt):
    """32 rows of 2048: the token quantised here is ggml's quantize_row_q8_0's, byte for byte, and each row's product
    is ggml_vec_dot_<type>_q8_0's float exactly."""
    from calibration.bench_kernel import _synth_tensor
    from calibration.ggml_vec_dot import quantize_row_q8_0, vec_dot
    from executor.gemm import IQ4_NL, Q4_0, Q8_0

    code = {"Q8_0": Q8_0, "Q4_0": Q4_0, "IQ4_NL": IQ4_NL}[fmt]

    @njit
    def matvec(w, x8, dx, out):
        for r in range(w.shape[0]):
            vec_dot(code, w[r], np.int64(0), np.int64(w.shape[1]), x8, dx, np.int64(x8.shape[0] // 32), out,
                    np.int64(r))

    g = L.load_ggml_cpu(FOUND, formats=(fmt,))
    rng = np.random.default_rng(2)
    w = np.ascontiguousarray(_synth_tensor(fmt, 1, 32, 2048, rng).data[0])
    x = rng.standard_normal(2048).astype(np.float32)
    q = L.quantise_token(g, "q8_0", x).reshape(64, 34)  # block_q8_0: fp16 d, 32 int8 codes
    x8, dx = np.zeros(2048, np.int8), np.zeros(64, np.float32)
    quantize_row_q8_0(x, x8, dx)
    assert np.array_equal(x8, q[:, 2:].copy().view(np.int8).ravel())
    assert np.array_equal(dx, q[:, :2].copy().view(np.float16).astype(np.float32).ravel())
    out, own = np.zeros(32, np.float32), np.zeros(32, np.float32)
    matvec(w, x8, dx, out)
    for r in range(32):
        g.vec_dot[fmt](2048, own[r:].ctypes.data, 0, w[r].ctypes.data, 0, q.ctypes.data, 0, 1)
    assert np.array_equal(out, own)
