"""Synthetic `qwen3moe` GGUF models that llama.cpp loads: seeded random weights, streamed to disk.

Quantised tensors are written as random quant bytes with a sane fp16 scale per block, tensor by
tensor (a 1.5 GB file takes well under a minute). The optional Engram (n-gram) table goes in a
separate GGUF (`<model>.engram.gguf`) since llama.cpp rejects unknown tensors.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

from specs.loaders import output_file

ENGRAM_ARCH = "engram"


@dataclass(frozen=True)
class Preset:
    """Shape and weight types of a synthetic model."""

    n_layers: int
    hidden: int
    n_heads: int
    n_kv: int
    head_dim: int
    n_experts: int
    top_k: int
    expert_ff: int
    vocab: int
    context: int = 4096
    rope_base: float = 1_000_000.0
    eps: float = 1e-6
    dense_type: str = "F16"  # attention projections
    embd_type: str = "Q8_0"  # token_embd and output
    # expert types per layer (cycled): "Q8_0", "Q4_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "F16",
    # or "gate_up/down" e.g. "Q4_0/Q8_0"
    expert_types: tuple[str, ...] = ("Q8_0",)
    # Engram: layers that add rows, n-gram orders, heads per order, rows, row type
    engram_layers: tuple[int, ...] = (1,)
    engram_orders: tuple[int, ...] = (2, 3, 4)
    engram_heads: int = 8
    engram_rows: int = 65536
    engram_type: str = "Q8_0"
    arch: str = "qwen3moe"  # or "llama" (Mixtral-style: no Q/K norm, interleaved RoPE)


PRESETS: dict[str, Preset] = {
    # ~27 MB; every expert kernel type appears (Q8_0, Q4_0, F16, mixed)
    "tiny": Preset(n_layers=4, hidden=256, n_heads=6, n_kv=2, head_dim=64, n_experts=32, top_k=4,
                   expert_ff=192, vocab=512, expert_types=("Q8_0", "Q4_0", "F16", "Q4_0/Q8_0"),
                   engram_rows=16384),
    # ~1.4 GB, memory-bound decode: experts Q8_0 dominate the bytes read per token
    "small": Preset(n_layers=8, hidden=2048, n_heads=8, n_kv=4, head_dim=64, n_experts=32,
                    top_k=8, expert_ff=768, vocab=8192, expert_types=("Q8_0",), engram_rows=1 << 20),
}
PRESETS["small-q4"] = replace(PRESETS["small"], expert_types=("Q4_0",))
PRESETS["tiny-q8"] = replace(PRESETS["tiny"], expert_types=("Q8_0",))
# the K-quants of llama.cpp's Q4_K_M files (gate / up Q4_K, down Q6_K or Q4_K): rows of 256-weight super-blocks,
# so the expert width is a multiple of 256
PRESETS["tiny-k"] = replace(PRESETS["tiny"], expert_ff=256, expert_types=("Q4_K/Q6_K", "Q4_K", "Q6_K", "Q8_0/Q4_K"))
PRESETS["small-q4k"] = replace(PRESETS["small"], expert_types=("Q4_K/Q6_K", "Q4_K"))
# llama.cpp's Q5_K_M files: gate / up Q5_K, down Q6_K or Q5_K (and Q5_K beside the other kernels' types in `tiny-k5`)
PRESETS["tiny-k5"] = replace(PRESETS["tiny"], expert_ff=256, expert_types=("Q5_K/Q6_K", "Q5_K", "Q4_K/Q5_K", "Q8_0/Q5_K"))
PRESETS["small-q5k"] = replace(PRESETS["small"], expert_types=("Q5_K/Q6_K", "Q5_K"))
# llama.cpp's Q3_K_M files: gate / up Q3_K, down Q4_K or Q5_K; its Q2_K files: gate / up Q2_K, down Q3_K or Q4_K
# (`tiny-k3` has both beside the other types)
PRESETS["tiny-k3"] = replace(PRESETS["tiny"], expert_ff=256, expert_types=("Q3_K/Q4_K", "Q2_K/Q3_K", "Q3_K/Q5_K", "Q8_0/Q2_K"))
PRESETS["small-q3k"] = replace(PRESETS["small"], expert_types=("Q3_K/Q5_K", "Q3_K/Q4_K"))
PRESETS["small-q2k"] = replace(PRESETS["small"], expert_types=("Q2_K/Q4_K", "Q2_K/Q3_K"))
# llama.cpp's IQ4_XS and IQ4_NL files (codebook nibbles: iquants.py); `tiny-iq4` holds both, beside Q4_K and Q8_0, in its
# experts, its attention (IQ4_NL: attn_output's rows of 384 weights are no whole super-blocks) and its embeddings and head
PRESETS["tiny-iq4"] = replace(PRESETS["tiny"], expert_ff=256, expert_types=("IQ4_XS", "IQ4_NL", "IQ4_XS/Q4_K", "Q8_0/IQ4_NL"),
                              dense_type="IQ4_NL", embd_type="IQ4_XS")
PRESETS["small-iq4xs"] = replace(PRESETS["small"], expert_types=("IQ4_XS",))
PRESETS["small-iq4nl"] = replace(PRESETS["small"], expert_types=("IQ4_NL",))


def _byte_table() -> list[str]:
    """GPT-2 byte-to-unicode mapping (256 printable stand-ins, one per byte)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def _add_tokenizer(w: gguf.GGUFWriter, vocab: int) -> None:
    """A gpt2 BPE tokenizer: 256 byte tokens, a few merges, fillers, bos/eos (llama.cpp loads it)."""
    toks = _byte_table()
    merges = [("Ġ", "t"), ("h", "e"), ("i", "n"), ("Ġt", "he"), ("e", "r")]
    for a, b in merges:
        toks.append(a + b)
    n_special = 2
    toks += [f"<|filler_{i}|>" for i in range(vocab - len(toks) - n_special)]
    toks += ["<|bos|>", "<|eos|>"]
    if len(toks) != vocab:
        raise ValueError(f"vocab {vocab} too small for the tokenizer")
    types = [1] * (vocab - n_special) + [3, 3]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(vocab - 2)
    w.add_eos_token_id(vocab - 1)
    w.add_pad_token_id(vocab - 1)
    w.add_add_bos_token(False)


def _rand_tensor(rng: np.random.Generator, shape: tuple[int, ...], qt: QT, std: float) -> np.ndarray:
    """Random weights of numpy shape `shape` in type `qt` (quant bytes with per-block fp16 scales)."""
    if qt == QT.F32:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float32)
    if qt == QT.F16:
        return (rng.standard_normal(shape, dtype=np.float32) * std).astype(np.float16)
    block, size = gguf.GGML_QUANT_SIZES[qt]
    n = int(np.prod(shape))
    nb = n // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    if qt == QT.Q8_0:
        q_std = 73.6  # std of uniform int8
    elif qt == QT.Q4_0:
        q_std = 4.6  # std of uniform nibble - 8
    elif qt == QT.IQ4_NL:
        q_std = 67.2  # std of the codebook's 16 values (iquants.KVALUES), nibbles uniform
    elif qt in (QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS):
        _k_scales(rng, raw, qt, std)
        return raw.reshape(gguf.quant_shape_to_byte_shape(shape, qt))
    else:  # other types: random bytes (enough for load / rejection tests)
        return raw.reshape(gguf.quant_shape_to_byte_shape(shape, qt))
    d = (std / q_std) * rng.uniform(0.5, 1.5, size=nb).astype(np.float32)
    raw[:, :2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(gguf.quant_shape_to_byte_shape(shape, qt))


def _k_scales(rng: np.random.Generator, raw: np.ndarray, qt: QT, std: float) -> None:
    """Sane scales in random K-quant super-blocks raw [n, bytes] (quants left uniform), in place.

    Q4_K: 6-bit sub-block scales sc in [32, 63] and mins m = sc, with dmin = 7.5 d, so each sub-block's
    values d sc (q - 7.5) are centred on zero (q uniform in 0..15); Q5_K the same with dmin = 15.5 d (q
    uniform in 0..31: nibble and fifth bit both uniform); Q3_K: 6-bit scales in [40, 63] (8..31 once 32 is taken
    off) times q in -4..3 (uniform: std 2.29, mean -0.5); Q2_K: 4-bit run scales in [8, 15], mins m = sc and
    dmin = 1.5 d (q uniform in 0..3); Q6_K: int8 scales in [32, 127] times
    q - 32 (uniform 6-bit); IQ4_XS: 6-bit sub-block scales in [40, 63] (8..31 once 32 is taken off) times the
    codebook values of uniform nibbles. d per super-block sets the weights' std to about `std`."""
    n = raw.shape[0]
    d = rng.uniform(0.5, 1.5, size=n).astype(np.float32)
    if qt in (QT.Q4_K, QT.Q5_K):
        mid = 7.5 if qt == QT.Q4_K else 15.5  # the middle of q's range
        d *= std / (47.5 * (4.61 if qt == QT.Q4_K else 9.23))  # mean scale x std of a uniform nibble / 5-bit value
        sc = rng.integers(32, 64, size=(n, 8), dtype=np.uint8)
        raw[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(n, 2)
        raw[:, 2:4] = (mid * d.astype(np.float16).astype(np.float32)).astype(np.float16).view(np.uint8).reshape(n, 2)
        # the 12-byte packing of ggml's get_scale_min_k4: 6 bits of sc / m for sub-blocks 0..3 in bytes 0..3 / 4..7,
        # sub-blocks 4..7 as low / high nibbles of bytes 8..11 plus the top two bits of bytes 0..3 / 4..7
        lo, hi = sc[:, :4], sc[:, 4:]
        raw[:, 4:8] = lo | ((hi >> 4) << 6)
        raw[:, 8:12] = lo | ((hi >> 4) << 6)  # m = sc
        raw[:, 12:16] = (hi & 15) | ((hi & 15) << 4)
    elif qt == QT.Q2_K:
        d *= std / (11.5 * 1.118)  # mean scale x std of a uniform 2-bit value
        sc = rng.integers(8, 16, size=(n, 16), dtype=np.uint8)
        raw[:, 0:16] = sc | (sc << 4)
        raw[:, 80:82] = d.astype(np.float16).view(np.uint8).reshape(n, 2)
        raw[:, 82:84] = (1.5 * d.astype(np.float16).astype(np.float32)).astype(np.float16).view(np.uint8).reshape(n, 2)
    elif qt == QT.IQ4_XS:
        d *= std / (19.5 * 67.2)  # mean scale x std of the codebook's values
        ls = rng.integers(40, 64, size=(n, 8), dtype=np.uint16)
        raw[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(n, 2)
        # ggml's packing: bits 4-5 of sub-block c's scale at bit pair c of the u16 at 2, its low nibble at nibble
        # c % 2 of byte 4 + c // 2
        hi = ((ls >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1).astype(np.uint16)
        raw[:, 2:4] = hi.view(np.uint8).reshape(n, 2)
        raw[:, 4:8] = ((ls[:, 0::2] & 15) | ((ls[:, 1::2] & 15) << 4)).astype(np.uint8)
    elif qt == QT.Q3_K:
        d *= std / (19.5 * 2.29)  # mean scale x std of a uniform 3-bit value
        sc = rng.integers(40, 64, size=(n, 16), dtype=np.uint8)
        # ggml's packing: low nibbles of runs 0..7 / 8..15 in the low / high nibbles of bytes 0..7, the top two bits
        # of run r at bit pair r // 4 of byte 8 + r % 4
        raw[:, 96:104] = (sc[:, :8] & 15) | ((sc[:, 8:] & 15) << 4)
        hi = sc >> 4
        raw[:, 104:108] = hi[:, 0:4] | (hi[:, 4:8] << 2) | (hi[:, 8:12] << 4) | (hi[:, 12:16] << 6)
        raw[:, 108:110] = d.astype(np.float16).view(np.uint8).reshape(n, 2)
    else:
        d *= std / (79.5 * 18.5)  # mean scale x std of a uniform 6-bit value
        raw[:, 192:208] = rng.integers(32, 128, size=(n, 16), dtype=np.uint8)
        raw[:, 208:210] = d.astype(np.float16).view(np.uint8).reshape(n, 2)


def _expert_types(p: Preset, layer: int) -> tuple[QT, QT]:
    """(gate/up type, down type) of `layer`."""
    s = p.expert_types[layer % len(p.expert_types)]
    gu, _, dn = s.partition("/")
    return QT[gu], QT[dn or gu]


def _layer_specs(p: Preset, i: int) -> list[tuple[str, tuple[int, ...], QT, float]]:
    """(name, numpy shape, type, std) of the tensors of block `i`."""
    H, F, E, hd = p.hidden, p.expert_ff, p.n_experts, p.head_dim
    dt = QT[p.dense_type]
    gu, dn = _expert_types(p, i)
    b = f"blk.{i}."
    return [
        (b + "attn_norm.weight", (H,), QT.F32, -1.0),
        (b + "attn_q.weight", (p.n_heads * hd, H), dt, H ** -0.5),
        (b + "attn_k.weight", (p.n_kv * hd, H), dt, H ** -0.5),
        (b + "attn_v.weight", (p.n_kv * hd, H), dt, H ** -0.5),
        (b + "attn_output.weight", (H, p.n_heads * hd), dt, (p.n_heads * hd) ** -0.5),
    ] + ([
        (b + "attn_q_norm.weight", (hd,), QT.F32, -1.0),
        (b + "attn_k_norm.weight", (hd,), QT.F32, -1.0),
    ] if p.arch == "qwen3moe" else []) + [
        (b + "ffn_norm.weight", (H,), QT.F32, -1.0),
        (b + "ffn_gate_inp.weight", (E, H), QT.F32, 4 * H ** -0.5),
        (b + "ffn_gate_exps.weight", (E, F, H), gu, H ** -0.5),
        (b + "ffn_up_exps.weight", (E, F, H), gu, H ** -0.5),
        (b + "ffn_down_exps.weight", (E, H, F), dn, F ** -0.5),
    ]


def _write(path: Path, arch: str, kv, specs, seed: int) -> None:
    """Stream tensors `specs` [(name, shape, type, std)] to `path` atomically (std < 0: norm weights)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        _write_to(tmp, arch, kv, specs, seed)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no partial file behind


def _write_to(tmp: Path, arch: str, kv, specs, seed: int) -> None:
    """The GGUF of _write, streamed to `tmp`."""
    w = gguf.GGUFWriter(tmp, arch)
    kv(w)
    for name, shape, qt, _ in specs:
        nbytes = gguf.quant_shape_to_byte_shape(shape, qt)[-1] * int(np.prod(shape[:-1]))
        if qt in (QT.F32, QT.F16):
            nbytes = int(np.prod(shape)) * (4 if qt == QT.F32 else 2)
        w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for k, (name, shape, qt, std) in enumerate(specs):
        rng = np.random.default_rng([seed, k])
        if std < 0:  # norm weights around 1
            arr = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            arr = _rand_tensor(rng, shape, qt, std)
        w.write_tensor_data(arr)
    w.close()


def make_model(preset: str, out: str | Path, seed: int = 0, engram: bool = False) -> Path:
    """Write preset `preset` as a qwen3moe GGUF at `out` (plus `<out>.engram.gguf` if engram); returns the path."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} ({', '.join(PRESETS)})")
    return write_model(PRESETS[preset], out, seed, engram, name=preset)


def write_model(p: Preset, out: str | Path, seed: int = 0, engram: bool = False, name: str = "custom") -> Path:
    """Write the model `p` describes at `out` (plus its Engram table if engram); returns the path."""
    out = output_file(out)  # checked before minutes of writing
    if engram:
        output_file(engram_path(out))

    def kv(w: gguf.GGUFWriter) -> None:
        w.add_name(f"moe-offload synthetic {name}")
        w.add_context_length(p.context)
        w.add_embedding_length(p.hidden)
        w.add_block_count(p.n_layers)
        w.add_feed_forward_length(p.expert_ff)
        w.add_expert_feed_forward_length(p.expert_ff)
        w.add_expert_count(p.n_experts)
        w.add_expert_used_count(p.top_k)
        w.add_head_count(p.n_heads)
        w.add_head_count_kv(p.n_kv)
        w.add_key_length(p.head_dim)
        w.add_value_length(p.head_dim)
        w.add_layer_norm_rms_eps(p.eps)
        w.add_rope_dimension_count(p.head_dim)
        w.add_rope_freq_base(p.rope_base)
        w.add_file_type(1)
        _add_tokenizer(w, p.vocab)

    et = QT[p.embd_type]
    specs = [("token_embd.weight", (p.vocab, p.hidden), et, 1.0)]
    for i in range(p.n_layers):
        specs += _layer_specs(p, i)
    specs += [("output_norm.weight", (p.hidden,), QT.F32, -1.0),
              ("output.weight", (p.vocab, p.hidden), et, p.hidden ** -0.5)]
    _write(out, p.arch, kv, specs, seed)
    if engram:
        make_engram(p, engram_path(out), seed)
    return out


def engram_path(model: str | Path) -> Path:
    """Where the Engram table of `model` lives: `<model>.engram.gguf`."""
    model = Path(model)
    return model.with_name(model.name + ".engram.gguf")


def make_engram(p: Preset, out: Path, seed: int = 0) -> Path:
    """Write an Engram table for preset `p`: rows of `hidden` values hashed from n-grams."""

    def kv(w: gguf.GGUFWriter) -> None:
        w.add_uint32("engram.embedding_length", p.hidden)
        w.add_uint64("engram.rows", p.engram_rows)
        w.add_array("engram.layers", list(p.engram_layers))
        w.add_array("engram.orders", list(p.engram_orders))
        w.add_uint32("engram.heads", p.engram_heads)

    _write(out, ENGRAM_ARCH, kv, [("per_layer_token_embd.weight", (p.engram_rows, p.hidden),
                                   QT[p.engram_type], 0.5)], seed + 7919)
    return out
