"""The integer GEMM on int8 activations (executor/qgemm.py: qpack8_into, q_matmul8; `execute --gemm-int8`): the token
panels' layout, products equal to the int8 activations times gguf's values, llama.cpp's precision against the float
product, and the switch end to end, its kernels cached apart (executor/nbcache.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from numba import njit

from executor import nbcache, qgemm
from executor.gemm import NT
from executor.gguf_model import EXPERT_TYPES
from executor.make_model import make_model
from executor.runner import default_prompts

from .test_qgemm import TYPES, _raw_rows

ROOT = Path(__file__).resolve().parents[2]


def _pack8(x):
    """qpack8_into's panels of the float rows x [m, cols]."""
    P = np.empty(((x.shape[0] + NT - 1) // NT, qgemm.panel_width8(x.shape[1]), NT), np.float32)
    qgemm.qpack8_into(P, np.int64(0), x, qgemm.row_range(x.shape[0]))
    return P


def _unpack8(P, m, cols):
    """The activations a panel holds, x8 dx8 [m, cols] (float64), and its x8 [m, cols] and dx8 [m, cols / 32]."""
    nb = cols // 32
    x8 = np.empty((m, cols), np.int64)
    d = np.empty((m, nb))
    for t in range(m):
        B = P[t // NT]
        x8[t] = np.ascontiguousarray(B[:8 * nb, t % NT]).view(np.int8)  # 4 bytes an int32, natural order
        d[t] = B[8 * nb:9 * nb, t % NT]
    return x8 * np.repeat(d, 32, axis=1), x8, d


@lru_cache(maxsize=None)
def _matmul8(code: int):
    @njit(fastmath=True)
    def run(w, rows, rb, P, m, res):
        qgemm.q_matmul8(code, w, 0, rows, rb, P, m, res, 0)
    return run


def test_int8_panels_hold_value_quads_then_scales_and_sums():
    """qpack8_into's block [panel_width8(cols), NT]: token t's quad q of block b is round-to-even(x 127 / max|x|) of
    its values 4q .. 4q + 3 (natural order, one byte each: llama.cpp's quantize_row_q8_0), then each 32-block's dx8 =
    max|x| / 127, and as int32 the block's x8 sum and each 16-value half's; tokens past m are zeros."""
    rng = np.random.default_rng(5)
    m, cols = 3, 64
    x = rng.standard_normal((m, cols)).astype(np.float32)
    x[1, 32:] = 0.0  # an all-zero block: scale and values 0
    P = _pack8(x)
    assert P.shape == (1, 24, NT)
    _, x8, d = _unpack8(P, m, cols)
    sums = P[0, 18:24].view(np.int32)
    for t in range(m):
        for b in range(2):
            blk = x[t, 32 * b:32 * b + 32]
            a = np.abs(blk).max()
            want = np.rint(blk * (np.float32(127.0) / a)).astype(np.int64) if a else np.zeros(32, np.int64)
            np.testing.assert_array_equal(x8[t, 32 * b:32 * b + 32], want)
            assert d[t, b] == np.float32(a) / np.float32(127.0)
            assert sums[b, t] == want.sum()
            assert (sums[2 + 2 * b, t], sums[3 + 2 * b, t]) == (want[:16].sum(), want[16:].sum())
    assert x8[1, 32:].sum() == 0 and d[1, 1] == 0.0
    assert not P[0, :, m:].any()


@settings(max_examples=40, deadline=None)
@given(qt=st.sampled_from(TYPES), rows=st.integers(1, 13), units=st.integers(1, 3), m=st.integers(1, 40),
       seed=st.integers(0, 2**31))
def test_int8_products_are_the_int8_activations_times_gguf_values(qt, rows, units, m, seed):
    """For every type and token count (8-, 16- and 24-token tiles, short panels), each product is the panel's int8
    activations (x8 dx8) times gguf.dequantize's weights to float rounding (1e-5 of the sum of |terms|): the biased
    unsigned weights and the bias's term where the integer sums start cancel exactly."""
    rng = np.random.default_rng(seed)
    raw = _raw_rows(rng, qt, rows, units * (8 if gguf.GGML_QUANT_SIZES[qt][0] == 32 else 1))
    W = gguf.dequantize(raw, qt).reshape(rows, -1).astype(np.float64)
    cols = W.shape[1]
    x = rng.standard_normal((m, cols)).astype(np.float32)
    P = _pack8(x)
    xq, _, _ = _unpack8(P, m, cols)
    res = np.zeros((m, rows), np.float32)
    _matmul8(EXPERT_TYPES[qt])(raw.reshape(-1), rows, raw.shape[1], P, m, res)
    want = xq @ W.T
    scale = np.abs(xq) @ np.abs(W).T
    assert (np.abs(res - want) <= 1e-5 * scale + 1e-30).all()


def test_int8_products_keep_llama_cpps_precision():
    """Against the float product, int8 activations (a 32-block's step max / 127) leave at most 2e-2 of the largest
    product (measured 3.2e-3 to 9.4e-3 over the nine types, session 36), where int16's are within 1e-4."""
    rng = np.random.default_rng(11)
    for qt in TYPES:
        raw = _raw_rows(rng, qt, 13, 512 // gguf.GGML_QUANT_SIZES[qt][0])
        W = gguf.dequantize(raw, qt).reshape(13, -1).astype(np.float64)
        x = rng.standard_normal((21, W.shape[1])).astype(np.float32)
        res = np.zeros((21, 13), np.float32)
        _matmul8(EXPERT_TYPES[qt])(raw.reshape(-1), 13, raw.shape[1], _pack8(x), 21, res)
        want = x.astype(np.float64) @ W.T
        err = np.abs(res - want).max() / np.abs(want).max()
        assert 1e-4 < err < 2e-2, (qt.name, err)


def test_a_switch_caches_its_kernels_apart():
    """With MOE_OFFLOAD_GEMM_INT8=1 numba caches in executor/__pycache__/nb-gemm_int8-1 (nbcache.use_switch_cache),
    and drop_stale_cache stamps that folder: the default build's kernels are neither dropped nor rebuilt."""
    out = subprocess.run([sys.executable, "-c", "import executor, json; from numba.core import config; "
                          "from executor import nbcache, qgemm; from pathlib import Path; "
                          "print(json.dumps([config.CACHE_DIR, str(nbcache.cache_dir(Path(qgemm.__file__))), "
                          "qgemm.INT8]))"],
                         env={**os.environ, "MOE_OFFLOAD_GEMM_INT8": "1"}, capture_output=True, text=True, check=True)
    cache, qdir, int8 = json.loads(out.stdout)
    assert Path(cache) == ROOT / "executor" / "__pycache__" / "nb-gemm_int8-1"
    assert Path(qdir).parent == Path(cache) and (Path(qdir) / "qgemm.deps-stamp").exists()
    assert int8 == qgemm.HAVE_QGEMM
    assert nbcache.cache_dir(Path(qgemm.__file__)) == ROOT / "executor" / "__pycache__"  # this process: the default


def test_gemm_int8_flag_after_the_kernels_loaded_is_one_line_exit_2(tiny, tmp_path, capsys):
    """`execute --gemm-int8` in a process whose kernels loaded without it cannot take effect: one line, exit code 2."""
    from moe_offload.cli import main

    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    if qgemm.INT8:
        pytest.skip("this process runs the int8 build")
    assert main(["execute", "--gemm-int8", "--plan", str(plan), "--model", str(tiny)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--gemm-int8" in err and "MOE_OFFLOAD_GEMM_INT8" in err


def test_calibrate_gemm_int8_after_the_kernels_loaded_is_one_line_exit_2(tmp_path, capsys):
    """`calibrate --gemm-int8` (a profile of the int8 build's kernels) in a process whose kernels loaded without it: the
    same one line and exit code 2, before anything is measured."""
    from moe_offload.cli import main

    if qgemm.INT8:
        pytest.skip("this process runs the int8 build")
    assert main(["calibrate", "--gemm-int8", "--quick", "--out", str(tmp_path / "hw.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--gemm-int8" in err and "MOE_OFFLOAD_GEMM_INT8" in err
    assert not (tmp_path / "hw.yaml").exists()


@pytest.mark.skipif(not qgemm.HAVE_QGEMM, reason="the integer GEMM runs with AVX-512 VNNI (or MOE_OFFLOAD_QGEMM=1)")
def test_execute_gemm_int8_end_to_end_within_int8_precision(tmp_path_factory, reference):
    """`execute` with MOE_OFFLOAD_GEMM_INT8=1 (what `--gemm-int8` sets) on `tiny-k` (Q4_K / Q6_K / Q8_0 experts) and
    `tiny` (F16 / Q8_0 / Q4_0: with AVX-512 VNNI their Q4_0 and K-quant decode rows read int8 activations too), a
    128-token prompt (about 16 tokens an expert: the GEMM path) then 2 decoded tokens, one process: the result says
    int8, the greedy tokens are the fp32 reference's, and each position's logits stay within 1e-1 of its largest.
    Measured (positions P - 1 .. P + 1): int8 `tiny-k` 1.5e-2 / 6.3e-3 / 7.6e-3 at P = 64 and 2.0e-2 / 6.7e-2 / 4.7e-3
    at 128 (session 36; unchanged in session 38; with int8 K-quant decode rows, session 39: 1.1e-2 to 2.1e-2), `tiny`
    6.1e-3 to 1.1e-2 (session 38, at P = 64 and 128; 2.4e-3 to 1.0e-2 with int16 decode rows); int16 1e-4 or less on
    both, which the 1e-4 floor tells apart. (`tiny-k3`'s int8 decode rows, 1.2e-2 at P = 128, flip its second decoded
    token, whose top two logits the reference puts 6.7e-3 of the largest apart; 4.0e-3 with int16 decode rows.)"""
    d = tmp_path_factory.mktemp("int8")
    paths = [make_model(name, d / f"{name}.gguf", seed=0) for name in ("tiny-k", "tiny")]
    script = ("import json, numpy as np; from executor.runner import execute; from specs.plan import Plan; out = []\n"
              f"for i, p in enumerate({[str(p) for p in paths]!r}):\n"
              f"    r = execute(Plan(), p, 128, 3, trace_path={str(d)!r} + f'/t{{i}}.jsonl', keep_logits=True)\n"
              f"    np.save({str(d)!r} + f'/logits{{i}}.npy', np.stack([lg[0] for lg in r['logits']]))\n"
              "    out.append([r['gemm_activations'], r['tokens'][0]])\n"
              "from executor import iquants, kquants, row_products as RP\n"  # whether these rows read int8 activations
              "k8 = [RP._TOKEN[c][-1][1] is not getattr(iquants if c == 10 else kquants, f'rows1_{n}') for c, n in "
              "((4, 'q4_k'), (5, 'q6_k'), (6, 'q5_k'), (7, 'q3_k'), (8, 'q2_k'), (10, 'iq4_xs'))]\n"
              "print(json.dumps([out, RP.ROWS_INT8, k8]))")
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, "MOE_OFFLOAD_GEMM_INT8": "1"},
                         capture_output=True, text=True, check=True, cwd=ROOT)
    prompt = [int(t) for t in default_prompts(1, 128, 512)[0]]
    runs, rows_int8, k8 = json.loads(out.stdout.strip().splitlines()[-1])
    assert k8 == [rows_int8] * 6  # with AVX-512 VNNI, the K-quants' and IQ4_XS's rows are kquants_vnni's
    for i, (acts, toks) in enumerate(runs):
        assert acts == "int8"
        got = np.load(d / f"logits{i}.npy")  # [G, V] at positions 127 .. 129
        want = reference(paths[i], prompt + toks[:-1])[127:]
        rel = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
        assert 1e-4 < rel.max() < 1e-1, (paths[i].name, rel)
        assert toks == [int(t) for t in want.argmax(-1)], paths[i].name
