"""The AVX-512 VNNI Q4_0 rows (executor/vnni.py): int16 activations split into two bytes, two rows a 512-bit
register; a token gets the same bits from every row group and token group, and simd.py's 256-bit int16 kernel's
results to float rounding (its offset term summed in another order). IQ4_NL's rows there (a codebook lookup) are
checked against the dequantised
product with every other type (test_kernels.py)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import njit

from executor import kernels as K
from executor import row_products as RP
from executor import simd, vnni
from executor.iquants import KVALUES

QT = gguf.GGMLQuantizationType
needs_vnni = pytest.mark.skipif(not vnni.HAVE_VNNI512, reason="no AVX-512 VNNI on this CPU")


@njit
def _split8(x16, dx, nb):
    vnni.split8(x16, dx, np.int64(nb))


@settings(max_examples=30, deadline=None)
@given(nb=st.integers(1, 8), scale=st.floats(1e-30, 1e30), seed=st.integers(0, 2**31))
def test_split_bytes_rebuild_every_x16(nb, scale, seed):
    """split8 (a word permute, the split, two truncations a block): for every activation j of every block,
    256 h + l == x16 at both of its places (row k's dword, row k + 1's), h and l signed bytes; quant16 keeps
    |x16| <= 32639 so that h fits (vnni.X16_MAX). Behind them each int32 lane's -128 x the sum of its four h, then of
    its four l (where IQ4_NL's rows start their integer sums)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(nb * 32) * scale).astype(np.float32)
    x16, dx = np.empty(nb * 32, np.int16), np.zeros((2 + vnni.SPLIT_FLOATS) * nb, np.float32)
    simd.quant16(x, x16, dx)
    assert np.abs(x16.astype(np.int32)).max() <= vnni.X16_MAX
    _split8(x16, dx, nb)
    blocks = dx[2 * nb:].reshape(nb, vnni.SPLIT_FLOATS)
    sp = blocks[:, :32].view(np.int8).reshape(nb, 2, 64).astype(np.int32)  # [block, h | l, byte]
    starts = blocks[:, 32:].view(np.int32).reshape(nb, 2, 16)  # [block, h | l, lane]
    np.testing.assert_array_equal(starts, -128 * sp.reshape(nb, 2, 16, 4).sum(axis=3))
    for b in range(nb):
        for j in range(32):
            want = int(x16[b * 32 + (j % 2) * 16 + j // 2])  # quant16's even-first order
            for p in vnni._split_pos(j):
                assert 256 * sp[b, 0, p] + sp[b, 1, p] == want


def test_split_places_cover_each_byte_once():
    """The 32 activations of a block take its 64 places, each exactly once (a row pair's two copies)."""
    places = sorted(p for j in range(32) for p in vnni._split_pos(j))
    assert places == list(range(64))


def _kernel_loop(kernel, NR):
    @njit
    def run(w, rows, x16, dx, k0, out):
        rb = np.int64(w.shape[0] // rows)
        nb = np.int64(x16.shape[1] // 32)
        r = 0
        while r + NR <= rows:
            kernel(w, np.int64(r * rb), rb, x16, dx, k0, nb, out, np.int64(r))
            r += NR
    return run


_PAIRS = {(NR, MT): (_kernel_loop(vnni.vnni_kernel(NR, MT), NR), _kernel_loop(simd._qkernel(True, NR, MT), NR))
          for NR, MT in ((8, 1), (4, 1), (2, 1), (1, 1), (4, 2), (8, 2), (8, 4))} if vnni.HAVE_VNNI512 else {}


@needs_vnni
@settings(max_examples=25, deadline=None)
@given(shape=st.sampled_from(sorted(_PAIRS) or [(1, 1)]), groups=st.integers(1, 5), nb=st.integers(1, 20),
       seed=st.integers(0, 2**31))
def test_vnni_rows_give_a_token_the_same_bits_in_any_group(qk, shape, groups, nb, seed):
    """Each VNNI row kernel (8, 4, 2 or 1 rows a pass; 1, 2 or 4 tokens) gives every token the bits the lone-row,
    one-token kernel gives it: the same int32 sum per lane of four weights, the same float products and adds, Q4_0's
    offset term in the same 16 lanes (8 blocks at a time from registers with one token, from a stack buffer with
    several: up to 20 blocks, two whole groups and a part). simd.py's kernel of the same shape (a CPU without VNNI)
    subtracts that term block by block, so it agrees to float rounding (1e-6 of the terms); both match
    gguf.dequantize then a float product."""
    NR, MT = shape
    rng = np.random.default_rng(seed)
    rows = NR * groups
    w = qk.tensor(rng, QT.Q4_0, 1, rows, nb * 32)
    x = rng.standard_normal((MT + 1, nb * 32)).astype(np.float32)
    x16, dx = K._quant_rows(x)
    vn, i16 = _PAIRS[shape]
    got, want = np.full((MT + 1, rows), np.nan, np.float32), np.full((MT + 1, rows), np.nan, np.float32)
    vn(w.data[0].reshape(-1), rows, x16, dx, 1, got)  # tokens from k0 = 1
    i16(w.data[0].reshape(-1), rows, x16, dx, 1, want)
    assert np.isnan(got[0]).all()
    one = np.full((MT + 1, rows), np.nan, np.float32)
    for k in range(1, MT + 1):  # each token alone, a row a pass (paired with itself)
        _PAIRS[(1, 1)][0](w.data[0].reshape(-1), rows, x16, dx, k, one)
    assert np.array_equal(got[1:], one[1:])
    mag = np.abs(x[1:]) @ np.abs(qk.deq(w, 0)).T
    qk.close(got[1:], want[1:], mag, tol=1e-6)
    qk.close(got[1:], x[1:] @ qk.deq(w, 0).T, mag)


@needs_vnni
def test_executor_runs_the_vnni_rows_where_the_cpu_has_them():
    """row_products' Q4_0 rows are vnni.py's on an AVX-512 VNNI CPU, and _quant_rows writes their split bytes."""
    assert RP.rows8_q4 is not simd.rows8_q4 and RP.rows8x4_q4 is not simd.rows8x4_q4
    assert RP._TOKEN[RP.Q4_0][0] == (2, RP.rows2_q4)  # a decode token's rows two a pass (row_products' _TOKEN)
    x16, dx = K._quant_rows(np.ones((2, 64), np.float32))
    assert dx.shape == (2, (2 + vnni.SPLIT_FLOATS) * 2 + 8)  # 2 blocks: the split bytes, then a group of run sums


@settings(max_examples=30, deadline=None)
@given(nb=st.integers(1, 8), scale=st.floats(1e-30, 1e30), seed=st.integers(0, 2**31))
def test_lanes8_writes_qpack8s_int8_values_at_the_split_places(qk, nb, scale, seed):
    """lanes8 (an int8 build's activations for these rows): each activation j of block b at both of its places
    (_split_pos) is x8 = round-to-even(x 127 / max|x|), the very bytes qgemm.qpack8_into packs for the prefill GEMM
    (llama.cpp's Q8_0); behind them each int32 lane's start, -8 x the sum of its four bytes for Q4_0 (-128 x in lanes
    8-15, whose weights come x 16) and -128 x for IQ4_NL; dx8 = max|x| / 127 (to an ulp), qpack8_into's, at
    dx[dx8_at(nb) + b], behind the run sums."""
    from executor import qgemm
    from executor.gemm import NT
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((1, nb * 32)) * scale).astype(np.float32)
    x[0, :32] *= rng.integers(0, 2)  # sometimes an all-zero block: x8 and dx8 0
    _, dx = qk.int8_activations(x)
    d8 = vnni.dx8_at(nb)
    blocks = dx[0, 2 * nb:2 * nb + vnni.SPLIT_FLOATS * nb].reshape(nb, vnni.SPLIT_FLOATS)
    x8 = blocks[:, :16].view(np.int8).astype(np.int64)  # [block, place]
    lanes = x8.reshape(nb, 16, 4).sum(axis=2)
    np.testing.assert_array_equal(blocks[:, 16:32].view(np.int32), lanes * np.array([-8] * 8 + [-128] * 8))
    np.testing.assert_array_equal(blocks[:, 32:48].view(np.int32), -128 * lanes)
    P = np.zeros((1, qgemm.panel_width8(nb * 32), NT), np.float32)
    qgemm.qpack8_into(P, np.int64(0), x, qgemm.row_range(1))
    packed = np.ascontiguousarray(P[0, :8 * nb, 0]).view(np.int8).reshape(nb, 32)
    for b in range(nb):
        for j in range(32):
            for p in vnni._split_pos(j):
                assert x8[b, p] == packed[b, j]
    np.testing.assert_array_equal(dx[0, d8:d8 + nb], P[0, 8 * nb:9 * nb, 0])
    a = np.abs(x[0].reshape(nb, 32)).max(axis=1).astype(np.float64)
    np.testing.assert_allclose(dx[0, d8:d8 + nb], a / 127.0, rtol=2 ** -23)  # within an ulp


_INT8 = {(qt, NR, MT): _kernel_loop(vnni.vnni_kernel(NR, MT, tuple(KVALUES) if qt == QT.IQ4_NL else (), int8=True), NR)
         for qt in (QT.Q4_0, QT.IQ4_NL) for NR, MT in ((8, 1), (4, 1), (2, 1), (1, 1), (4, 2), (8, 2), (8, 4))
         } if vnni.HAVE_VNNI512 else {}


@needs_vnni
@settings(max_examples=30, deadline=None)
@given(shape=st.sampled_from(sorted(_INT8) or [(QT.Q4_0, 1, 1)]), groups=st.integers(1, 4), nb=st.integers(1, 12),
       seed=st.integers(0, 2**31))
def test_int8_rows_are_the_int8_activations_times_ggufs_values(qk, shape, groups, nb, seed):
    """The int8 build's Q4_0 and IQ4_NL rows (vnni_kernel(int8=True), one vpdpbusd a row pair and block): each token's
    result is its int8 activations (x8 dx8, lanes8's) times gguf's dequantised rows up to float32 rounding (1e-5 of
    the terms: the integer sums are exact), the same bits whichever row group (8, 4, 2, 1) computed it, and within int8
    precision (llama.cpp's) of the float product."""
    qt, NR, MT = shape
    rng = np.random.default_rng(seed)
    rows = 8 * groups
    w = qk.tensor(rng, qt, 1, rows, nb * 32)
    W = qk.deq(w, 0).astype(np.float64)
    x = rng.standard_normal((MT + 1, nb * 32)).astype(np.float32)
    x16, dx = qk.int8_activations(x)
    d8 = vnni.dx8_at(nb)
    got = np.full((MT + 1, rows), np.nan, np.float32)
    _INT8[shape](w.data[0].reshape(-1), rows, x16, dx, 1, got)  # tokens from k0 = 1
    assert np.isnan(got[0]).all()
    xq = qk.int8_values(x, dx[:, d8:d8 + nb])
    qk.close(got[1:], xq[1:] @ W.T, np.abs(xq[1:]) @ np.abs(W).T, tol=1e-5)
    one = np.full((MT + 1, rows), np.nan, np.float32)
    for k in range(1, MT + 1):  # each token alone, a row a pass (paired with itself)
        _INT8[(qt, 1, 1)](w.data[0].reshape(-1), rows, x16, dx, k, one)
    assert np.array_equal(got[1:], one[1:])
    qk.close(got[1:], x[1:] @ W.T, np.abs(x[1:]) @ np.abs(W).T, tol=2e-2)


_LOOKUPS = {(i8, vb): _kernel_loop(vnni.vnni_kernel(4, 1, tuple(KVALUES), int8=i8, vbmi=vb), 4)
            for i8 in (False, True) for vb in (False, True)} if vnni.HAVE_VNNI512 and vnni.HAVE_VBMI else {}


@pytest.mark.skipif(not _LOOKUPS, reason="no AVX-512 VNNI and VBMI on this CPU")
@settings(max_examples=10, deadline=None)
@given(nb=st.integers(1, 12), seed=st.integers(0, 2**31))
def test_iq4_nl_lookups_by_vpermb_and_vpshufb_give_the_same_bits(qk, nb, seed):
    """IQ4_NL's codebook lookup by vpermb (AVX-512 VBMI: the nibbles unmasked, the 16 values four times over) and by
    vpshufb after a mask give the same bytes, so the same bits, with int16 and int8 activations, over arbitrary bytes
    (every nibble value, in either half of a byte)."""
    rng = np.random.default_rng(seed)
    rows = 8
    w = rng.integers(0, 256, (rows, nb, 18), dtype=np.uint8)
    w[:, :, :2] = rng.uniform(1e-3, 1e-2, (rows, nb, 1)).astype(np.float16).view(np.uint8)
    w = w.reshape(-1)
    x = rng.standard_normal((1, nb * 32)).astype(np.float32)
    for i8 in (False, True):
        x16, dx = qk.int8_activations(x) if i8 else K._quant_rows(x)
        got = {vb: np.zeros((1, rows), np.float32) for vb in (False, True)}
        for vb in (False, True):
            _LOOKUPS[(i8, vb)](w, rows, x16, dx, 0, got[vb])
        assert np.array_equal(got[False], got[True]) and np.abs(got[True]).max() > 0


_GUARDED = {(kind, NR): _kernel_loop(vnni.vnni_kernel(NR, 1, tuple(KVALUES) if kind == "iq4" else (),
                                                    int8=kind == "int8"), NR)
            for kind in ("q4", "iq4", "int8") for NR in (2, 1)} if vnni.HAVE_VNNI512 else {}


@needs_vnni
@pytest.mark.parametrize("nb", [3, 11, 16])
@pytest.mark.parametrize("kind", ["q4", "iq4", "int8"])
def test_rows_read_nothing_past_the_last_rows_end(qk, kind, nb):
    """The rows gather a group's scales from a row's first 128 bytes; in a row's last group, of fewer than 8 blocks,
    the loads are masked to its blocks (vnni._masked_load), so rows that end right before an unreadable page (the
    end of a mapped file) compute without a fault, and give the results of the same rows anywhere else."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    rows = 4
    qt = QT.IQ4_NL if kind == "iq4" else QT.Q4_0
    w = qk.tensor(np.random.default_rng(nb), qt, 1, rows, nb * 32).data[0].reshape(-1)
    page = mmap.PAGESIZE
    span = -(-w.nbytes // page) * page
    buf = mmap.mmap(-1, span + page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.mprotect(ctypes.c_void_p(base + span), ctypes.c_size_t(page), 0) == 0  # PROT_NONE past the rows
    guarded = np.frombuffer(buf, np.uint8, w.nbytes, span - w.nbytes)  # the rows end at the guard page
    guarded[:] = w
    x = np.random.default_rng(0).standard_normal((1, nb * 32)).astype(np.float32)
    x16, dx = qk.int8_activations(x) if kind == "int8" else K._quant_rows(x)
    for NR in (2, 1):
        got, want = np.zeros((1, rows), np.float32), np.zeros((1, rows), np.float32)
        _GUARDED[(kind, NR)](guarded, rows, x16, dx, 0, got)
        _GUARDED[(kind, NR)](w, rows, x16, dx, 0, want)
        assert np.array_equal(got, want) and np.abs(got).max() > 0
    del guarded
    libc.mprotect(ctypes.c_void_p(base + span), ctypes.c_size_t(page), mmap.PROT_READ | mmap.PROT_WRITE)
