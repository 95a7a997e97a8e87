"""Cached causal GQA attention (executor.attention) against a plain float64 numpy reference."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from executor import attention as A


def reference(qkv, kc, vc, p0, n, nh, nkv):
    """softmax(q K^T / sqrt(hd)) V per stream, head and new token, in float64; K / V of the new tokens
    taken from qkv, the older ones from the caches."""
    S = qkv.shape[0] // n
    hd = qkv.shape[2]
    out = np.empty((S * n, nh * hd))
    for s in range(S):
        new = qkv[s * n:(s + 1) * n].astype(np.float64)
        K = np.concatenate([kc[s, :, :p0], new[:, nh:nh + nkv].transpose(1, 0, 2)], 1)  # [nkv, p0 + n, hd]
        V = np.concatenate([vc[s, :, :p0], new[:, nh + nkv:].transpose(1, 0, 2)], 1)
        for j in range(n):
            for h in range(nh):
                kv = h // (nh // nkv)
                sc = K[kv, :p0 + j + 1] @ new[j, h] / np.sqrt(hd)
                p = np.exp(sc - sc.max())
                out[s * n + j, h * hd:(h + 1) * hd] = p @ V[kv, :p0 + j + 1] / p.sum()
    return out


def run(S, n, p0, nh, nkv, hd, seed=0, ctx=None):
    rng = np.random.default_rng(seed)
    ctx = ctx or p0 + n
    qkv = rng.standard_normal((S * n, nh + 2 * nkv, hd), dtype=np.float32)
    kc = rng.standard_normal((S, nkv, ctx, hd), dtype=np.float32)
    vc = rng.standard_normal((S, nkv, ctx, hd), dtype=np.float32)
    want = reference(qkv, kc, vc, p0, n, nh, nkv)
    out = np.empty((S * n, nh * hd), np.float32)
    A.attn_cached(qkv, kc, vc, p0, n, nh, nkv, out)
    return out, want, qkv, kc, vc


@settings(max_examples=25, deadline=None)
@given(S=st.integers(1, 3), n=st.integers(1, 9), p0=st.integers(0, 40), g=st.sampled_from([1, 2, 3]),
       nkv=st.integers(1, 3), hd=st.sampled_from([8, 32, 64]))
def test_matches_float64_reference(S, n, p0, g, nkv, hd):
    """Any streams, new tokens, cached length and GQA grouping: within 1e-5 of the float64 reference."""
    out, want, *_ = run(S, n, p0, g * nkv, nkv, hd)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_new_keys_and_values_are_appended_at_p0():
    """The n new tokens' K / V land at positions p0..p0 + n - 1 of each stream's cache; the rest is kept."""
    out, want, qkv, kc, vc = run(S=2, n=3, p0=5, nh=4, nkv=2, hd=16, ctx=12)
    for s in range(2):
        for j in range(3):
            np.testing.assert_array_equal(kc[s, :, 5 + j], qkv[s * 3 + j, 4:6])
            np.testing.assert_array_equal(vc[s, :, 5 + j], qkv[s * 3 + j, 6:8])


def parallel_and_serial():
    """(the work items across threads, the serial loop's) for a 64-token prompt on a 300-token context."""
    rng = np.random.default_rng(1)
    S, n, p0, nh, nkv, hd = 1, 64, 300, 8, 4, 64
    assert 2 * S * nh * hd * (n * p0 + n * (n + 1) // 2) >= A.SERIAL_MACS
    qkv = rng.standard_normal((S * n, nh + 2 * nkv, hd), dtype=np.float32)
    kc = rng.standard_normal((S, nkv, p0 + n, hd), dtype=np.float32)
    vc = rng.standard_normal((S, nkv, p0 + n, hd), dtype=np.float32)
    par = np.empty((S * n, nh * hd), np.float32)
    A.attn_cached(qkv, kc, vc, p0, n, nh, nkv, par)
    ser = np.empty_like(par)
    assert A.by_blocks(n, hd)  # a prompt: QB queries an item
    KT = A._keys_transposed(kc, p0 + n)
    Qb, P, Ob = (np.empty((A.QB, c), np.float32) for c in (hd, KT.shape[3], hd))
    for it in range(S * (n // A.QB) * nh):
        A._attend_block(qkv, KT, vc, it, p0, n, nh, nkv, Qb, P, Ob, ser)
    return par, ser


def test_parallel_and_serial_items_same_bits():
    """Above SERIAL_MACS the work items run across threads; each item is computed the same way, so the
    result is bitwise the one of the serial loop (a 64-token prompt on a 300-token context)."""
    np.testing.assert_array_equal(*parallel_and_serial())


@settings(max_examples=20, deadline=None)
@given(n=st.integers(4, 23), p0=st.integers(0, 70), hd=st.sampled_from([32, 64, 128]), serial=st.booleans())
def test_query_blocks_match_a_query_at_a_time(n, p0, hd, serial):
    """A prompt's queries QB at a time through attention_tiles' register tiles (short last blocks, keys past a
    KT_KEYS boundary, one thread or several) give _attend's outputs to float rounding (2e-6 of the largest): the
    value sums add the keys in the same order, the scores sum the head dimensions in another."""
    rng = np.random.default_rng(n * 1000 + p0)
    nh, nkv, ctx = 4, 2, p0 + n
    qkv = rng.standard_normal((n, nh + 2 * nkv, hd), dtype=np.float32)
    kc = rng.standard_normal((1, nkv, ctx, hd), dtype=np.float32)
    vc = rng.standard_normal((1, nkv, ctx, hd), dtype=np.float32)
    mp = pytest.MonkeyPatch()
    if serial:
        mp.setattr(A, "SERIAL_MACS", 1 << 62)  # read at call time from Python only: the blocks' own loop below
    got = np.empty((n, nh * hd), np.float32)
    if serial:
        A.attn_cached.py_func(qkv, kc, vc, p0, n, nh, nkv, got)
    else:
        A._append(qkv, kc, vc, p0, n, nh, nkv)
        A._attend_all(qkv, kc, vc, p0, n, nh, nkv, got)
    mp.undo()
    one = np.empty_like(got)
    sc = np.empty(p0 + n, np.float32)
    for it in range(n * nh):
        A._attend(qkv, kc, vc, it, p0, n, nh, nkv, sc, one)
    assert np.abs(got - one).max() <= 2e-6 * np.abs(one).max()


_IN_A_PROCESS = """
import runpy, sys
import numpy as np
par, ser = runpy.run_path(sys.argv[1])["parallel_and_serial"]()
print("SAME" if np.array_equal(par, ser) else "DIFFERENT")
"""


def test_parallel_items_keep_their_bits_when_loaded_from_numbas_cache(tmp_path):
    """The same comparison in two fresh processes sharing an empty numba cache: the first compiles and
    writes it, the second loads it. With _attend's sums as plain fastmath loops the second came out 1 ulp
    off the serial items on 11% of the outputs (Zen 4): numba's cached parallel code grouped them otherwise."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), PYTHONPATH=str(root))
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _IN_A_PROCESS, __file__], env=env, capture_output=True, text=True,
                             cwd=root, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip().splitlines()[-1] == "SAME"


@settings(max_examples=15, deadline=None)
@given(hd=st.sampled_from([32, 64, 128]), T=st.integers(1, 40), seed=st.integers(0, 2**31))
def test_register_tiles_match_their_plain_loops(hd, T, seed):
    """attention_tiles' scores tile (QB queries x KT_KEYS keys) and value tile (QB x PV_DIMS dims, added to what
    the output holds, keys in order) against the plain loops CPUs without AVX2 run: within float rounding."""
    from numba import njit

    from executor import attention_tiles as AT
    scores_tile = njit(lambda Q, KT, t0, S: AT.scores_tile(Q, KT, t0, S))  # the tiles run in numba code only
    values_tile = njit(lambda P, Vr, tn, d0, O: AT.values_tile(P, Vr, tn, d0, O))
    rng = np.random.default_rng(seed)
    Tp = (T + AT.KT_KEYS - 1) // AT.KT_KEYS * AT.KT_KEYS
    Q = rng.standard_normal((AT.QB, hd), dtype=np.float32)
    KT = rng.standard_normal((hd, Tp), dtype=np.float32)
    S1, S2 = np.zeros((AT.QB, Tp), np.float32), np.zeros((AT.QB, Tp), np.float32)
    for t0 in range(0, Tp, AT.KT_KEYS):
        scores_tile(Q, KT, np.int64(t0), S1)
        AT.scores_plain(Q, KT, np.int64(t0), S2)
    np.testing.assert_allclose(S1, S2, rtol=1e-5, atol=1e-5 * np.abs(S2).max())
    P = rng.random((AT.QB, Tp), dtype=np.float32)
    Vr = rng.standard_normal((T, hd), dtype=np.float32)
    O1 = rng.standard_normal((AT.QB, hd), dtype=np.float32)
    O2 = O1.copy()
    for d0 in range(0, hd, AT.PV_DIMS):
        values_tile(P, Vr, np.int64(T), np.int64(d0), O1)
        AT.values_plain(P, Vr, np.int64(T), np.int64(d0), O2)
    np.testing.assert_allclose(O1, O2, rtol=1e-5, atol=1e-5 * np.abs(O2).max())
