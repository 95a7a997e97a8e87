

def test_iquant_mix_is_a_codebook_format():
    """'IQMIX:1.94' (an average over GGUF i-quants, e.g. a GSQ-RCO file) decodes like a codebook
    format; a plain 'MIX' average does not claim to."""
    from specs.formats import parse_format
    f = parse_format("IQMIX:1.9437")
    assert f.codebook and f.bits == 1.9437 and f.name == "IQMIX:1.9437"
    assert not parse_format("MIX:3.5").codebook
