"""bench_rowwise's decode jobs on a llama.cpp build's own kernels (calibration.bench_ggml_own), and which jobs
calibrate times on them (calibrate._decode_jobs)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from calibration import bench_rowwise as BR
from calibration import ggml_library as L
from calibration.calibrate import _decode_jobs, _decode_label
from calibration.ggml_library import GgmlCpu

AVX512 = ["avx2", "avx512f"]


def test_the_decode_jobs_take_ggmls_own_kernels_where_the_build_has_them():
    """A build with Q4_K's vec_dot and gemv: Q4_K's in place and repacked jobs are its own; Q8_0 keeps the rebuild;
    Q2_K is repacked only where llama.cpp repacks it (AVX-512 F), on the rebuild here; on ARM no 8x8 gemv is timed."""
    g = GgmlCpu(path=Path("/b/libggml-cpu.so"), vec_dot={"Q4_K": None}, gemv={"Q4_K": None})
    jobs = {(kind, fmt): (what, make) for kind, fmt, make, what in _decode_jobs(("Q8_0", "Q4_K", "Q2_K"), AVX512, g)}
    assert jobs[("rowwise", "Q4_K")][0] == "ggml's own rows" and jobs[("repacked", "Q4_K")][0] == "ggml's own repacked rows"
    assert jobs[("rowwise", "Q8_0")] == ("rows without prefetch", BR.rowwise_expert_job)
    assert jobs[("repacked", "Q2_K")][1] is BR.repacked_expert_job
    assert ("repacked", "Q2_K") not in {(k, f) for k, f, _, _ in _decode_jobs(("Q2_K",), ["avx2"], g)}
    # on ARM llama.cpp repacks Q4_K 4 rows wide (with dotprod): not the 8x8 gemv the library's check covers
    arm = {(k, f): w for k, f, _, w in _decode_jobs(("Q4_K",), ["asimddp"], g)}
    assert arm[("rowwise", "Q4_K")] == "ggml's own rows" and arm.get(("repacked", "Q4_K")) != "ggml's own repacked rows"
    assert "ggml_gemv_q4_K_8x8_q8_K (/b/libggml-cpu.so)" in _decode_label(g, "repacked", "Q4_K", 2048, 768)
    assert "ggml_vec_dot_q4_K_q8_K" in _decode_label(g, "rowwise", "Q4_K", 2048, 768)
    assert _decode_label(None, "rowwise", "Q4_K", 2048, 768) == BR.label("Q4_K", 2048, 768)


FOUND = L.find_ggml_cpu("auto")
needs_ggml = pytest.mark.skipif(FOUND is None, reason=f"no llama.cpp build here (${L.ENV}, or llama-bench on PATH)")


@pytest.fixture(scope="module")
def ggml():
    return L.load_ggml_cpu(FOUND)


def _reference(fmt, w, rows, x):
    """Dequantised weights [E, rows, n] . x (float64), the token unquantised."""
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize
    return dequantize(w.reshape(-1), QT[fmt]).reshape(w.shape[0], rows, -1).astype(np.float64) @ x[0]


@needs_ggml
@pytest.mark.parametrize("fmt", ["Q8_0", "Q4_0", "Q2_K", "Q4_K", "Q6_K", "IQ4_XS", "F16"])
def test_ggmls_own_rows_compute_each_routed_expert(ggml, fmt):
    """The in-place matvec over two of three experts, its chunks handed to one thread or two: each output row the expert's row dotted
    with the token to within the token's int8 quantisation (1e-2 of the row's |w| . |x|; F16 1e-3)."""
    from calibration.bench_ggml_own import _rowwise_matvec_of
    from calibration.bench_kernel import _synth_tensor
    rows, n = 72, 512  # two 64-row chunks, the second short
    rng = np.random.default_rng(3)
    w = _synth_tensor(fmt, 3, rows, n, rng).data.reshape(3, -1)
    x = rng.standard_normal((1, n)).astype(np.float32)
    es = np.array([2, 0], np.int64)
    q = np.zeros(L.TOKEN_BYTES[L.VEC_DOT_TYPE[fmt]](n), np.uint8)
    matvec = _rowwise_matvec_of(ggml.vec_dot[fmt], ggml.quantize[L.VEC_DOT_TYPE[fmt]])
    want = _reference(fmt, w, rows, x)[es]
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import dequantize
    scale = np.abs(dequantize(w.reshape(-1), QT[fmt]).reshape(3, rows, n)[es]) @ np.abs(x[0])
    for threads in (1, 2):
        out = np.zeros((2, rows), np.float32)
        matvec(w, es, rows, x, q, out, threads)
        assert np.all(np.abs(out - want) <= (1e-3 if fmt == "F16" else 1e-2) * scale)


@needs_ggml
@pytest.mark.parametrize("fmt", ["Q4_0", "IQ4_NL", "Q2_K", "Q4_K"])
def test_ggmls_own_repacked_gemv_computes_each_thread_share(ggml, fmt):
    """The repacked matvec on llama.cpp's layout (the pool repacked as one tensor), on 1 and 3 threads (shares of
    24 and 16 rows): every row of both routed experts equals ggml's own vec_dot on the same row."""
    from calibration.bench_ggml_own import _repacked_matvec_of, _rowwise_matvec_of
    from calibration.bench_kernel import _synth_tensor
    rows, n = 48, 512
    rng = np.random.default_rng(4)
    w = _synth_tensor(fmt, 3, rows, n, rng).data.reshape(3, -1)
    packed = np.ascontiguousarray(L.repack_x8(fmt)(w.reshape(-1), 3 * rows)).reshape(3, -1)
    x = rng.standard_normal((1, n)).astype(np.float32)
    es = np.array([1, 2], np.int64)
    t = L.VEC_DOT_TYPE[fmt]
    q = np.zeros(L.TOKEN_BYTES[t](n), np.uint8)
    want = np.zeros((2, rows), np.float32)
    _rowwise_matvec_of(ggml.vec_dot[fmt], ggml.quantize[t])(w, es, rows, x, q, want, 1)
    matvec = _repacked_matvec_of(ggml.gemv[fmt], ggml.quantize[t])
    for nthr in (1, 3):
        out = np.zeros((2, rows), np.float32)
        matvec(packed, es, rows, x, q, out, nthr)
        assert np.allclose(out, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@needs_ggml
@pytest.mark.parametrize("fmt,path", [("Q4_0", "vecdot"), ("Q8_0", "vecdot"), ("Q4_K", "repacked"),
                                      ("IQ4_NL", "repacked")])
def test_ggmls_own_prefill_products_cover_every_expert_token_and_row(ggml, fmt, path):
    """A batch's products on ggml's own kernels (bench_ggml_own's prefill matrices: 16 x 16 blocks of vec_dots, or
    the gemv a token over each thread's share): out[e, t, r] is expert e's row r dotted with token t, each equal to
    ggml's vec_dot on that pair; 3 experts of 40 rows (a short row block), 18 tokens each (a short token block)."""
    from calibration.bench_ggml_own import (_quantize_rows_of, _repacked_matrix_of, _rowwise_matvec_of,
                                            _vecdot_matrix_of)
    from calibration.bench_kernel import _synth_tensor
    E, T, rows, n = 3, 18, 40, 512
    rng = np.random.default_rng(5)
    w = _synth_tensor(fmt, E, rows, n, rng).data.reshape(E, -1)
    x = rng.standard_normal((E, T, n)).astype(np.float32)
    t = L.VEC_DOT_TYPE[fmt]
    q = np.zeros((E, T, L.TOKEN_BYTES[t](n)), np.uint8)
    _quantize_rows_of(ggml.quantize[t])(x.reshape(E * T, n), q.reshape(E * T, -1))
    out = np.zeros((E, T, rows), np.float32)
    if path == "vecdot":
        _vecdot_matrix_of(ggml.vec_dot[fmt])(w, rows, n, q, out, 2)
    else:
        packed = np.ascontiguousarray(L.repack_x8(fmt)(w.reshape(-1), E * rows)).reshape(E, -1)
        _repacked_matrix_of(ggml.gemv[fmt])(packed, rows, n, q, out, 2)
    matvec = _rowwise_matvec_of(ggml.vec_dot[fmt], ggml.quantize[t])
    for e, tok in ((0, 0), (1, 17), (2, 9)):
        want = np.zeros((1, rows), np.float32)
        matvec(w, np.array([e], np.int64), rows, x[e, tok][None], np.zeros(q.shape[2], np.uint8), want, 1)
        assert np.allclose(out[e, tok], want[0], rtol=1e-5, atol=1e-5 * np.abs(want).max()), (e, tok)
