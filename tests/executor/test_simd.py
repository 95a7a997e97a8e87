"""The vectorisable float32 math of executor/simd.py matches numpy's in float64; the row kernels' machine code
keeps the shape it was measured in."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import njit

from executor.simd import HAVE_AVX2, exp32, quant16, rows1_q8, silu_mul


@njit
def _exp32_all(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = exp32(x[i])
    return out


def test_exp32_within_2e7_relative_over_its_range():
    """exp32 (Cephes' expf: 2**n e**r, degree-6 polynomial) is within 2e-7 of e**x, relative, on
    200,001 points of [-87, 88] (float32's epsilon is 1.2e-7)."""
    x = np.linspace(-87, 88, 200_001).astype(np.float32)
    want = np.exp(x.astype(np.float64))
    assert np.max(np.abs(_exp32_all(x) - want) / want) < 2e-7


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 300), scale=st.floats(0.01, 50), seed=st.integers(0, 2**31))
def test_silu_mul_matches_float64(n, scale, seed):
    """silu_mul(g, u) sets g to g / (1 + e**-g) * u within 1e-6 of the product's terms (g up to +-50 x
    N(0, 1): e**-g saturates to the clamp at -87 / 88 without a NaN)."""
    rng = np.random.default_rng(seed)
    g = (rng.standard_normal(n) * scale).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    g64, u64 = g.astype(np.float64), u.astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * u64
    silu_mul(g, u)
    assert np.all(np.abs(g - want) <= 1e-6 * (np.abs(g64 * u64) + 1e-30))


def test_quant16_blocks_too_small_for_a_scale():
    """A block whose largest value is so small that max / 32767 underflows to 0 (or an all-zero block)
    quantises to zeros with scale 1, instead of dividing by zero."""
    x = np.zeros(64, np.float32)
    x[:32] = np.float32(1e-44)  # a subnormal: 1e-44 / 32767 == 0 in float32
    x16, dx = np.empty(64, np.int16), np.empty(4, np.float32)
    quant16(x, x16, dx)
    assert not x16.any() and list(dx) == [1.0, 1.0, 0.0, 0.0]


@njit
def _one_row_q8(w, rb, x16, dx, out):
    rows1_q8(w, 0, rb, x16, dx, 0, x16.shape[1] // 32, out, 0)


@pytest.mark.skipif(not HAVE_AVX2, reason="the AVX2 kernels' code")
def test_a_lone_rows_block_scale_is_no_lane_insert_into_a_live_register():
    """simd.h16_lane0: one row's block scale enters by movzwl + vmovd. As a lone 16-bit lane (vpinsrw $0)
    it merged into whatever register LLVM picked, the accumulator's, and each block's scale waited for
    the fma of the block before: one row of Q8_0 ran 8.96 G weights/s in L2 against 20.6 without it
    (`python benchmarks/bench_q8_rows.py --l2`, session 16)."""
    x16, dx = np.zeros((1, 64), np.int16), np.ones((1, 4), np.float32)
    out = np.zeros((1, 1), np.float32)
    _one_row_q8(np.zeros(68, np.uint8), 68, x16, dx, out)
    asm = next(iter(_one_row_q8.inspect_asm().values()))
    assert "vmovd" in asm and "vpinsrw\t$0," not in asm


def _sums_kernel(which: str):
    """A compiled f(a [8, 8] int32 or [4, 8], out [8] int32) applying simd.lane_sums / run_sums to a's rows."""
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from executor.simd import I32, I64, V, lane_sums, run_sums

    @intrinsic
    def apply(typingctx, a, out):
        def gen(context, builder, sig, args):
            pa, po = (cgutils.create_struct_proxy(t)(context, builder, value=v).data for t, v in zip(sig.args, args))
            vp = builder.bitcast(pa, V(I32, 8).as_pointer())
            n = 8 if which == "lane" else 4
            vs = [builder.load(builder.gep(vp, [ir.Constant(I64, i)]), align=4) for i in range(n)]
            r = (lane_sums if which == "lane" else run_sums)(builder, vs)
            builder.store(r, builder.bitcast(po, V(I32, 8).as_pointer()), align=4)
            return context.get_dummy_value()
        return types.none(a, out), gen

    @njit
    def f(a, out):
        apply(a, out)
    return f


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_lane_sums_lane_c_is_the_sum_of_vector_c(seed):
    """simd.lane_sums (the Q4_K / Q5_K rows' sub-block sums): eight <8 x i32> in, lane c of the result = the sum of
    vector c's eight lanes, exactly (int32 values up to 2^27, sums well inside int32)."""
    a = np.random.default_rng(seed).integers(-2**27, 2**27, (8, 8)).astype(np.int32)
    out = np.zeros(8, np.int32)
    _sums_kernel("lane")(a, out)
    assert out.tolist() == a.astype(np.int64).sum(axis=1).tolist()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_run_sums_gives_each_vectors_two_half_sums_in_run_order(seed):
    """simd.run_sums (the Q6_K / Q3_K / Q2_K rows' 16-value runs): four <8 x i32> a, b, c, d in, out
    [a0..3 b0..3 c0..3 d0..3 | a4..7 b4..7 c4..7 d4..7], each the exact sum of those four lanes."""
    a = np.random.default_rng(seed).integers(-2**27, 2**27, (4, 8)).astype(np.int32)
    out = np.zeros(8, np.int32)
    _sums_kernel("run")(a, out)
    half = a.astype(np.int64).reshape(4, 2, 4).sum(axis=2)  # [vector, half]
    assert out.tolist() == half[:, 0].tolist() + half[:, 1].tolist()


@pytest.mark.skipif(not HAVE_AVX2, reason="the AVX2 kernels' code")
def test_q4_k_row_loop_scales_a_super_block_by_one_fma_not_one_a_sub_block():
    """kquants._rows_q4_k_ir: a super-block's eight sub-block sums are reduced to one vector (simd.lane_sums) and
    scaled by one fma (its mins by another), not one fma a sub-block. The loop that scaled each sub-block by a
    broadcast of its scale (built by register shuffles) and unpacked the scales by byte shuffles ran 30.5 against
    34.8 G weights/s, one core in L2 (session 33;
    `python benchmarks/bench_q8_rows.py --fmt Q4_K --l2`)."""
    from executor.kquants import rows1_q4_k

    @njit(nogil=True)
    def one_row(w, x16, dx, nb, out):
        rows1_q4_k(w, 0, 144 * (nb // 8), x16, dx, 0, nb, out, 0)
    x16, dx = np.zeros((1, 512), np.int16), np.ones((1, 32), np.float32)
    one_row(np.zeros(288, np.uint8), x16, dx, 16, np.zeros((1, 1), np.float32))
    asm = next(iter(one_row.inspect_asm().values()))
    assert asm.count("vfmadd") <= 4  # the sums' fma and the mins', not one a sub-block (8)


@settings(max_examples=30, deadline=None)
@given(nb=st.integers(1, 20), seed=st.integers(0, 2**31))
def test_run_sums16_writes_each_16_value_runs_sum_where_the_q2_k_rows_read_it(nb, seed):
    """kernels._quant_rows ends each token's dx with its 16-value runs' x16 sums (simd.run_sums16): four blocks a
    group of eight floats, [run 0 of the four blocks, then run 1 of each], exactly the integer sums of x16 over
    values 16 r .. 16 r + 15 of the row (quant16's even-first order undone)."""
    from executor.kernels import _quant_rows
    from executor.vnni import RUN_SUMS_AT
    x = (np.random.default_rng(seed).standard_normal((1, 32 * nb)) * 3).astype(np.float32)
    x16, dx = _quant_rows(x)
    v = x16[0].reshape(nb, 2, 16).transpose(0, 2, 1).reshape(-1).astype(np.int64)  # values in their order
    runs = v.reshape(nb, 2, 16).sum(axis=2)  # [block, run]
    at = RUN_SUMS_AT * nb
    for b in range(nb):
        o = at + 8 * (b // 4) + b % 4
        assert dx[0, o] == runs[b, 0] and dx[0, o + 4] == runs[b, 1]


def _prefetch_offset_fn(nr: int):
    """simd.prefetch_offset for groups of nr rows, compiled alone: (woff, rb) -> the offset the rows prefetch from."""
    from numba import types
    from numba.extending import intrinsic

    from executor.simd import prefetch_offset

    @intrinsic
    def offset(typingctx, woff, rb):
        def gen(context, builder, sig, args):
            return prefetch_offset(builder, args[0], args[1], nr)
        return types.int64(types.int64, types.int64), gen

    return njit(lambda woff, rb: offset(woff, rb))


def test_decode_rows_prefetch_at_least_8_kib_ahead_in_whole_row_groups():
    """The decode rows prefetch the first row group at least PREFETCH_AHEAD_BYTES (8 KiB) ahead, the next group
    where a group is that long already (session 58: two rows of a 2,048-column Q8_0 matrix are 4,352 bytes, two
    groups ahead; Q4_0's and Q4_K's 2,304, four; a 7,168-column Q8_0 group of 15,232 bytes, the next one; F16 rows,
    one a pass, 4,096 bytes at 2,048 columns, two ahead, four at 512); a lone row passed rb = 0 prefetches from where
    it is."""
    from executor.simd import PREFETCH_AHEAD_BYTES
    assert PREFETCH_AHEAD_BYTES == 8192
    two = _prefetch_offset_fn(2)
    assert two(np.int64(1000), np.int64(2176)) == 1000 + 2 * 4352
    assert two(np.int64(0), np.int64(1152)) == 4 * 2304
    assert two(np.int64(64), np.int64(7616)) == 64 + 15232
    assert two(np.int64(64), np.int64(4096)) == 64 + 8192  # exactly 8 KiB: one group
    one = _prefetch_offset_fn(1)
    assert one(np.int64(500), np.int64(0)) == 500
    assert one(np.int64(0), np.int64(4096)) == 8192 and one(np.int64(0), np.int64(1024)) == 8192
