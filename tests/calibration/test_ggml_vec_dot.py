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
