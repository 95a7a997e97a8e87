"""llama.cpp's weight kernels in situ (calibration.in_situ): ggml's kernel symbols as weight types and layouts, perf's
sample counts, the bytes a decode token reads through each kernel from a file's tensors, and the rate that gives."""
from __future__ import annotations

import math

import pytest
from gguf import GGUFReader

from calibration.in_situ import bytes_per_token, in_situ_rates, kernel_of_symbol, perf_samples
from executor.make_model import make_model
from specs.gguf_header import model_from_gguf

ZEN4_ISA = ["sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"]

# `perf report -n --no-children --sort sym --stdio` of llama-bench small-q2k tg64 -t 1 --repack 1 (2026-12-06)
REPORT = """# Samples: 5K of event 'cpu-clock'
#
# Overhead       Samples  Symbol
# ........  ............  ......
#
    34.43%          1914  [.] ggml_gemv_q2_K_8x8_q8_K
    14.77%           821  [.] ggml_vec_dot_q3_K_q8_K
    13.26%           737  [.] ggml_vec_dot_f16
     9.61%           534  [.] ggml_gemv_q4_K_8x8_q8_K
     5.22%           290  [.] ggml_vec_dot_q8_0_q8_0
     4.21%           234  [.] repack_q2_K_to_q2_K_8_bl
     2.66%           148  [.] ggml_compute_forward_mul
     1.17%            65  [k] clear_page_erms
"""


@pytest.mark.parametrize("sym, kernel", [
    ("ggml_vec_dot_q8_0_q8_0", ("Q8_0", False)), ("ggml_vec_dot_f16", ("F16", False)),
    ("ggml_vec_dot_f32", ("F32", False)), ("ggml_vec_dot_q3_K_q8_K", ("Q3_K", False)),
    ("ggml_vec_dot_iq4_xs_q8_K", ("IQ4_XS", False)), ("ggml_vec_dot_iq4_nl_q8_0", ("IQ4_NL", False)),
    ("ggml_gemv_q4_K_8x8_q8_K", ("Q4_K", True)), ("ggml_gemv_q2_K_8x8_q8_K", ("Q2_K", True)),
    ("gemv_q4_b32_8x8_q8_0_lut_avx<block<4, 8> >", ("Q4_0", True)),
    ("ggml_compute_forward_mul", None), ("repack_q2_K_to_q2_K_8_bl", None), ("clear_page_erms", None)])
def test_ggmls_kernel_symbols_name_their_weight_type_and_layout(sym, kernel):
    """vec_dots read in place, gemvs repacked; the Q4_0 / IQ4_NL template is the file's repacked one of the two."""
    assert kernel_of_symbol(sym, repacked_lut="Q4_0") == kernel


def test_perf_report_lines_give_samples_a_symbol():
    s = perf_samples(REPORT)
    assert s["ggml_gemv_q2_K_8x8_q8_K"] == 1914 and s["ggml_vec_dot_f16"] == 737 and s["clear_page_erms"] == 65
    assert len(s) == 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model("tiny", tmp_path_factory.mktemp("in-situ") / "tiny.gguf", seed=0)


def test_a_token_reads_the_routed_share_of_each_expert_type_and_every_dense_weight(tiny):
    """`tiny` (top 4 of 32 experts; Q8_0, Q4_0, F16 and Q4_0 / Q8_0 expert layers, F16 attention, a Q8_0 head) on a
    Zen 4's ISA with repacking: Q4_0 repacked, the rest in place; the expected bytes summed from gguf's reader."""
    r = GGUFReader(tiny)
    want: dict = {}
    for t in r.tensors:
        if t.name in ("token_embd.weight",) or len(t.shape) < 2 or "norm" in t.name:
            continue
        kind = t.tensor_type.name
        key = (kind, kind == "Q4_0")
        want[key] = want.get(key, 0.0) + int(t.n_bytes) * (4 / 32 if "_exps" in t.name else 1.0)
    got = bytes_per_token(model_from_gguf(tiny), ZEN4_ISA, repack=True)
    assert got.keys() == want.keys() and all(math.isclose(got[k], want[k]) for k in want)
    assert ("Q4_0", True) in got and ("Q4_0", False) not in got
    assert all(not rp for _, rp in bytes_per_token(model_from_gguf(tiny), ZEN4_ISA, repack=False))


def test_a_kernels_rate_is_its_bytes_over_its_samples_time():
    """1,000 samples at 2 kHz over 100 tokens on 2 threads: 2.5 ms a token; 50 MB a token in it: 20 GB/s; a profile
    at 25 GB/s runs it 1.25x faster. Symbols that are not weight kernels, or whose type the file lacks, are left out.
    A run 1.25x slower under perf (scale 0.8): 2.0 ms, 25 GB/s."""
    rows = in_situ_rates({"ggml_vec_dot_q8_0_q8_0": 1000, "ggml_compute_forward_mul": 50, "ggml_vec_dot_f16": 9},
                         1 / 2000, 100, 2, {("Q8_0", False): 50e6}, lambda fmt, rp: 25.0)
    assert len(rows) == 1
    r = rows[0]
    assert (r.fmt, r.repacked) == ("Q8_0", False)
    assert math.isclose(r.ms_per_token, 2.5) and math.isclose(r.gbs, 20.0) and math.isclose(r.profile_over, 1.25)
    (scaled,) = in_situ_rates({"ggml_vec_dot_q8_0_q8_0": 1000}, 1 / 2000, 100, 2, {("Q8_0", False): 50e6}, scale=0.8)
    assert math.isclose(scaled.ms_per_token, 2.0) and math.isclose(scaled.gbs, 25.0) and scaled.profile_over is None
