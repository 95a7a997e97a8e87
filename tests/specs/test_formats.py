

def test_iquant_mix_is_a_codebook_format():
    """'IQMIX:1.94' (an average over GGUF i-quants, e.g. a GSQ-RCO file) decodes like a codebook
    format; a plain 'MIX' average does not claim to."""
    from specs.formats import parse_format
    f = parse_format("IQMIX:1.9437")
    assert f.codebook and f.bits == 1.9437 and f.name == "IQMIX:1.9437"
    assert not parse_format("MIX:3.5").codebook


def test_llamacpp_prefill_path_follows_ggml_mul_mat_id():
    """ggml's MUL_MAT_ID (llama.cpp 0.3.36): repacked weights a gemv per token; K-quants in place from 8 tokens an
    expert its tiled GEMM (on x86 with AVX); every other case a dot product per (row, token) pair."""
    from specs.formats import llamacpp_prefill_key, llamacpp_prefill_path, parse_format
    q4k, q8, q4 = parse_format("Q4_K"), parse_format("Q8_0"), parse_format("Q4_0")
    assert llamacpp_prefill_path(q4k, False, 128, ["avx2"]) == "tiled"
    assert llamacpp_prefill_path(q4k, False, 17, ["avx2"]) == "tiled"
    assert llamacpp_prefill_path(q4k, False, 16, ["avx2"]) == "tiled-narrow"
    assert llamacpp_prefill_path(q4k, False, 8, ["avx2"]) == "tiled-narrow"
    assert llamacpp_prefill_path(q4k, False, 7, ["avx2"]) == "vecdot"
    assert llamacpp_prefill_path(q4k, False, 128, ["asimddp"]) == "vecdot"
    assert llamacpp_prefill_path(q4k, True, 128, ["avx2"]) == "repacked"
    assert llamacpp_prefill_path(q8, False, 128, ["avx2"]) == "vecdot"
    assert llamacpp_prefill_path(q4, True, 128, ["avx2"]) == "repacked"
    assert [llamacpp_prefill_key("Q4_K", p) for p in ("vecdot", "tiled", "repacked")] == \
        ["Q4_K", "Q4_K:tiled", "Q4_K:repacked"]


def test_the_tiled_gemms_narrow_path_falls_back_to_its_standard_rate():
    """A profile written before the narrow path was timed (session 41) rates it at the standard path's figure."""
    from specs.formats import llamacpp_prefill_keys
    assert llamacpp_prefill_keys("Q6_K", "tiled-narrow") == ("Q6_K:tiled-narrow", "Q6_K:tiled")
    assert llamacpp_prefill_keys("Q6_K", "tiled") == ("Q6_K:tiled",)


def test_iq4_types_decode_like_block_formats_and_lattice_iquants_like_codebooks():
    """IQ4_NL / IQ4_XS nibbles index one 16-entry table (a byte shuffle: the executor's iquants.py runs them at
    Q4_K's pace), so the simulator gives them block-format rates; IQ1 .. IQ3 index lattice grids: codebook rates."""
    from specs.formats import parse_format
    assert not parse_format("IQ4_XS").codebook and not parse_format("IQ4_NL").codebook
    assert all(parse_format(f).codebook for f in ("IQ3_S", "IQ3_XXS", "IQ2_XXS", "IQ1_M"))
    assert parse_format("IQ4_XS").bits == 4.25 and parse_format("IQ4_NL").bits == 4.5


def test_llamas_f16_dense_products_take_llamafiles_tinyblas_with_avx512f_or_avx2_and_f16c():
    """ggml's MUL_MAT of F16 weights goes to llamafile_sgemm on x86 with AVX-512 F (tinyBLAS<16, __m512>) or AVX2
    and F16C (<8, __m256>); other types, and a CPU with neither, keep the profile's one prefill rate."""
    from specs.formats import llamacpp_dense_prefill_key
    assert llamacpp_dense_prefill_key("F16", ["avx2", "f16c", "avx512f"]) == "F16:sgemm"
    assert llamacpp_dense_prefill_key("F16", ["avx2", "f16c"]) == "F16:sgemm"
    assert llamacpp_dense_prefill_key("F16", ["avx2"]) is None
    assert llamacpp_dense_prefill_key("Q8_0", ["avx2", "f16c", "avx512f"]) is None
