"""A llama.cpp build's own CPU kernels (calibration.ggml_library): where calibrate finds libggml-cpu.so, what it
refuses, the layouts and token values its check compares by, and (where a build is at hand: $MOE_OFFLOAD_GGML_LIB, or
llama-bench on PATH) the check itself on the real library."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from calibration import ggml_library as L
from calibration.bench_kernel import _synth_tensor
from calibration.ggml_vec_dot import Q4_0X8_BYTES, repack_q4_0_x8
from specs.errors import SpecError


def _lib_file(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / L.LIB_NAME).write_bytes(b"\x7fELF")
    return folder / L.LIB_NAME


def test_a_named_file_or_the_folder_holding_it_is_found(tmp_path, monkeypatch):
    monkeypatch.delenv(L.ENV, raising=False)
    f = _lib_file(tmp_path / "build" / "bin")
    assert L.find_ggml_cpu(f) == f
    assert L.find_ggml_cpu(tmp_path / "build") == f  # <build>/bin/libggml-cpu.so
    assert L.find_ggml_cpu(tmp_path / "build" / "bin") == f


def test_none_turns_the_library_off_and_the_environment_names_one(tmp_path, monkeypatch):
    f = _lib_file(tmp_path / "lib")
    monkeypatch.setenv(L.ENV, str(f))
    assert L.find_ggml_cpu("none") is None
    assert L.find_ggml_cpu("auto") == f
    monkeypatch.setenv(L.ENV, "none")
    assert L.find_ggml_cpu("auto") is None


def test_a_llama_bench_on_path_brings_its_library(tmp_path, monkeypatch):
    """A build's bin/ holds llama-bench and libggml-cpu.so side by side (cmake's default layout); an install puts the
    library in ../lib."""
    monkeypatch.delenv(L.ENV, raising=False)
    for bindir, f in ((tmp_path / "b1" / "bin", _lib_file(tmp_path / "b1" / "bin")),
                      (tmp_path / "b2" / "bin", _lib_file(tmp_path / "b2" / "lib"))):
        bindir.mkdir(parents=True, exist_ok=True)
        exe = bindir / "llama-bench"
        exe.write_text("#!/bin/sh\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ.get("PATH", ""))
        assert L.find_ggml_cpu("auto") == f


def test_a_named_place_without_the_library_is_one_clear_error(tmp_path, monkeypatch):
    """Named on the command line, or by the environment (the line says which)."""
    monkeypatch.delenv(L.ENV, raising=False)
    with pytest.raises(SpecError, match=f"no {L.LIB_NAME} there"):
        L.find_ggml_cpu(tmp_path / "nowhere")
    monkeypatch.setenv(L.ENV, str(tmp_path / "elsewhere"))
    with pytest.raises(SpecError) as e:
        L.find_ggml_cpu("auto")
    assert e.value.line().startswith(f"{tmp_path / 'elsewhere'}: ${L.ENV}: no {L.LIB_NAME} there")


def test_a_file_that_is_no_library_does_not_load(tmp_path):
    f = _lib_file(tmp_path)
    with pytest.raises(SpecError, match="cannot load it"):
        L.load_ggml_cpu(f)


def test_vec_dot_names_follow_ggml():
    assert L.vec_dot_name("Q4_K") == "ggml_vec_dot_q4_K_q8_K"
    assert L.vec_dot_name("IQ4_NL") == "ggml_vec_dot_iq4_nl_q8_0"
    assert L.vec_dot_name("F16") == "ggml_vec_dot_f16"


def _make_block_x8(blocks, xor):
    """make_block_q4_0x8 / make_block_iq4_nlx8 (repack.cpp) transcribed: 8 blocks of 18 bytes -> 144."""
    out = bytearray(Q4_0X8_BYTES)
    for i in range(8):
        out[2 * i:2 * i + 2] = blocks[i][:2]
    for i in range(16):
        src, off = i % 8, (i // 8) * 8
        out[16 + 8 * i:24 + 8 * i] = bytes(b ^ xor for b in blocks[src][2 + off:10 + off])
    return bytes(out)


@pytest.mark.parametrize("fmt,xor", [("Q4_0", 0x88), ("IQ4_NL", 0)])
def test_the_repacked_q4_0_and_iq4_nl_layouts_are_make_block_x8s(fmt, xor):
    """block_q4_0x8: the 8 rows' fp16 d, then 8 bytes of nibbles a row in turn, XOR 0x88; block_iq4_nlx8 the same
    without the XOR."""
    w = _synth_tensor(fmt, 1, 16, 64, np.random.default_rng(2)).data[0]  # 16 rows x 2 blocks of 18 bytes
    out = L.repack_x8(fmt)(w.reshape(-1), 16).reshape(2, 2, Q4_0X8_BYTES)
    for g in range(2):
        for b in range(2):
            blocks = [w[8 * g + r, 18 * b:18 * b + 18].tobytes() for r in range(8)]
            assert out[g, b].tobytes() == _make_block_x8(blocks, xor)
    with pytest.raises(ValueError, match="groups of 8 rows"):
        repack_q4_0_x8(np.zeros(4 * 18, np.uint8), 4)


def test_token_values_read_ggmls_q8_blocks():
    """block_q8_0: fp16 d then 32 int8 (34 bytes); block_q8_K: f32 d, 256 int8, 16 int16 sums (292 bytes)."""
    q0 = np.zeros(34, np.uint8)
    q0[:2] = np.array([0.5], np.float16).view(np.uint8)
    q0[2:] = np.arange(-16, 16, dtype=np.int8).view(np.uint8)
    assert np.array_equal(L._token_values("q8_0", q0, 32), 0.5 * np.arange(-16, 16))
    qk = np.zeros(292, np.uint8)
    qk[:4] = np.array([0.25], np.float32).view(np.uint8)
    qk[4:260] = (np.arange(256) % 200 - 100).astype(np.int8).view(np.uint8)
    assert np.array_equal(L._token_values("q8_K", qk, 256), 0.25 * (np.arange(256) % 200 - 100))


FOUND = L.find_ggml_cpu("auto")
needs_ggml = pytest.mark.skipif(FOUND is None, reason=f"no llama.cpp build here (${L.ENV}, or llama-bench on PATH)")


@needs_ggml
def test_every_kernel_of_a_real_build_passes_the_check():
    """llama.cpp 0.3.36's build on x86: a vec_dot for each timed format, the four repacked gemvs, none turned away."""
    g = L.load_ggml_cpu(FOUND)
    assert set(g.vec_dot) == set(L.VEC_DOT_TYPE) and not g.rejected, g.describe()
    assert set(g.gemv) == set(L.GEMV)


@needs_ggml
def test_a_kernel_reading_another_layout_is_turned_away():
    """The check catches a layout the rebuild's repack does not give: Q2_K's gemv handed Q4_K's blocks."""
    g = L.load_ggml_cpu(FOUND, formats=("Q2_K", "Q4_K"))
    g.gemv["Q4_K"] = g.gemv["Q2_K"]
    L.verify(g)
    assert "Q4_K" not in g.gemv and "Q2_K" in g.gemv and g.rejected["gemv Q4_K"].startswith("products off")
