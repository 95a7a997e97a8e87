"""ggml's AVX2 gemv of Q2_K weights repacked at load (calibration.ggml_gemv_q2_k): llama.cpp's block_q2_Kx8 layout
(make_block_q2_Kx8) (its products: tests/calibration/test_ggml_gemv_kx8.py)."""
from __future__ import annotations

import numpy as np
import pytest

from calibration import ggml_gemv_q2_k as G
from calibration.bench_kernel import _synth_tensor

avx2 = pytest.mark.skipif(not G.HAVE_AVX2, reason="ggml's q2_K 8x8 gemv needs AVX2")


def test_the_repacked_layout_interleaves_eight_rows_eight_bytes_at_a_time():
    """make_block_q2_Kx8: the 8 rows' d, then their dmin; scales byte i is row (i % 16) // 2's byte
    (i // 16) * 2 + i % 2; code byte j of row r at 160 + (j // 8) * 64 + r * 8 + j % 8."""
    rng = np.random.default_rng(1)
    w = _synth_tensor("Q2_K", 1, 16, 512, rng).data.reshape(16, 2, G.Q2_K_BYTES)
    out = G.repack_q2_k_x8(w.reshape(-1), 16).reshape(2, 2, G.Q2_KX8_BYTES)  # [group, super-block, bytes]
    g, b = 1, 1
    for r in (0, 5):
        blk = w[8 * g + r, b]
        assert out[g, b, 2 * r:2 * r + 2].tobytes() == blk[80:82].tobytes()
        assert out[g, b, 16 + 2 * r:18 + 2 * r].tobytes() == blk[82:84].tobytes()
        for j in (0, 13, 63):
            assert out[g, b, 160 + (j // 8) * 64 + r * 8 + j % 8] == blk[16 + j]
    for i in (0, 1, 37, 127):
        assert out[g, b, 32 + i] == w[8 * g + (i % 16) // 2, b, (i // 16) * 2 + i % 2]


def test_rows_not_a_multiple_of_eight_are_refused():
    with pytest.raises(ValueError, match="groups of 8 rows"):
        G.repack_q2_k_x8(np.zeros(12 * G.Q2_K_BYTES, np.uint8), 12)



@avx2
def test_the_compiled_gemv_moves_ggmls_spilled_vectors_through_the_stack():
    """GCC's build of ggml's loop keeps 18 shifted code vectors and 7 scale vectors a half on the stack (perf annotate
    of llama-bench: 25 vector stores, 18 `vpandq` and 7 `vpmaddwd` from it a half); the compiled rebuild stores as many
    (at least 25 a half, two halves a super-block) and reads each back."""
    import numba
    from test_ggml_gemv_kx8 import matvec_q2_k
    fresh = numba.njit(matvec_q2_k.py_func)  # compiled here: a cached kernel has no asm
    w = np.zeros((1, G.Q2_KX8_BYTES), np.uint8)
    fresh(w, 8, np.zeros(256, np.int8), np.zeros(1, np.float32), np.zeros(16, np.int32), np.zeros(8, np.float32))
    # an encoding prefix off the mnemonic: LLVM writes `{vex} vpdpwssd` where the CPU has AVX-VNNI too (Zen 5)
    asm = [ln.split("#")[0].replace("{vex}", "").replace("{evex}", "")
           for ln in next(iter(fresh.inspect_asm().values())).splitlines()]
    stores = [ln for ln in asm if ln.strip().startswith("vmovdqa") and "%ymm" in ln.split(",")[0] and "(%rsp)" in ln]
    reads = [ln for ln in asm if ln.strip().split(" ")[0].split("\t")[0] in ("vpand", "vpandd", "vpandq", "vpmaddwd",
                                                                              "vpdpwssd", "vmovdqa", "vmovdqa64")
             and "(%rsp)" in ln.split(",")[0]]
    assert len(stores) >= 2 * (G.SPILLED_SHIFTS + G.SPILLED_SCALES)
    assert len(reads) >= 2 * (G.SPILLED_SHIFTS + G.SPILLED_SCALES)
