"""Shared fixtures: a small MoE GGUF written with the `gguf` package (real file, real header)."""
import gguf
import numpy as np
import pytest

Q = gguf.GGMLQuantizationType
H, F, E, L, V = 64, 32, 8, 3, 300


def _raw(rng, qtype, shape):
    """Random bytes for a quantised tensor of logical numpy `shape` (outermost first)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    byte_shape = (*shape[:-1], shape[-1] // block * size)
    return rng.integers(0, 256, size=byte_shape, dtype=np.uint8)


def write_moe_gguf(path, engram_rows=1000, arch="qwen3moe", extra_kv=None):
    """A small qwen3moe GGUF: experts in Q4_0 / Q8_0 / Q4_K, F16 attention, IQ4_NL table as raw bytes.
    arch, extra_kv ({key without the arch prefix: value}): the same tensors under another architecture."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in (extra_kv or {}).items():
        w.add_key_value(f"{arch}.{k}", v, gguf.GGUFValueType.UINT32 if isinstance(v, int) else gguf.GGUFValueType.BOOL)
    w.add_block_count(L); w.add_embedding_length(H); w.add_context_length(4096)
    w.add_expert_count(E); w.add_expert_used_count(2); w.add_expert_feed_forward_length(F)
    w.add_head_count(4); w.add_head_count_kv(2); w.add_key_length(16); w.add_value_length(16)
    w.add_token_list([f"t{i}".encode() for i in range(V)])
    tensors = {}

    def add(name, arr, qtype=None):
        tensors[name] = arr.nbytes
        w.add_tensor(name, arr, raw_dtype=qtype)

    add("token_embd.weight", rng.standard_normal((V, H)).astype(np.float16))
    add("output.weight", _raw(rng, Q.Q8_0, (V, H)), Q.Q8_0)
    add("per_layer_token_embd.weight", _raw(rng, Q.IQ4_NL, (engram_rows, 256)), Q.IQ4_NL)
    exp_types = [Q.Q4_0, Q.Q8_0, Q.Q4_K]
    for i in range(L):
        add(f"blk.{i}.attn_q.weight", rng.standard_normal((64, H)).astype(np.float16))
        add(f"blk.{i}.ffn_gate_inp.weight", rng.standard_normal((E, H)).astype(np.float32))
        t = exp_types[i]
        hk = H if t != Q.Q4_K else 256  # K-quants need 256-wide rows
        add(f"blk.{i}.ffn_gate_exps.weight", _raw(rng, t, (E, F, hk)), t)
        add(f"blk.{i}.ffn_up_exps.weight", _raw(rng, t, (E, F, hk)), t)
        add(f"blk.{i}.ffn_down_exps.weight", _raw(rng, Q.Q8_0, (E, hk, F)), Q.Q8_0)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return tensors




@pytest.fixture(scope="session")
def moe_gguf(tmp_path_factory):
    """(path, {tensor name: bytes}) of a 3-layer qwen3moe GGUF with mixed expert types."""
    path = tmp_path_factory.mktemp("gguf") / "moe.gguf"
    return path, write_moe_gguf(path)


@pytest.fixture
def write_gguf():
    """write_moe_gguf, for tests that write the same tensors under another architecture or metadata."""
    return write_moe_gguf
