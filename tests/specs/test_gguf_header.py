"""GGUF header loader: exact tensor bytes from type and shape, data never read (gguf package)."""
import gguf
import numpy as np
import pytest

from specs.errors import SpecError
from specs.loaders import load_model

Q = gguf.GGMLQuantizationType
H, F, E, L, V = 64, 32, 8, 3, 300


def _raw(rng, qtype, shape):
    """Random bytes for a quantised tensor of logical numpy `shape` (outermost first)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    byte_shape = (*shape[:-1], shape[-1] // block * size)
    return rng.integers(0, 256, size=byte_shape, dtype=np.uint8)


def write_moe_gguf(path, engram_rows=1000):
    """A small qwen3moe GGUF: experts in Q4_0 / Q8_0 / Q4_K, F16 attention, IQ4_NL table as raw bytes."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
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


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("g") / "moe.gguf"
    return path, write_moe_gguf(path)


def test_gguf_byte_counts_equal_the_sum_of_its_tensors(gguf_file):
    path, written = gguf_file
    m = load_model(str(path))
    by = {t.name: t.bytes for t in m.tensors}
    assert by == written
    exps = sum(v for k, v in written.items() if "_exps" in k)
    assert m.routed_bytes == exps
    assert m.embedding_bytes == written["token_embd.weight"]
    assert m.engram_table_bytes == written["per_layer_token_embd.weight"] == 1000 * 144
    assert m.dense_resident_bytes == sum(v for k, v in written.items() if "_exps" not in k and "per_layer" not in k)


def test_gguf_shape_metadata(gguf_file):
    m = load_model(str(gguf_file[0]))
    assert (m.n_layers, m.hidden, m.n_experts, m.top_k, m.expert_ffn) == (L, H, E, 2, F)
    assert m.routed_experts == L * E and m.vocab == V and m.context_length == 4096
    assert m.engram.row_bytes == 144 and m.engram.rows == 1000


@pytest.mark.parametrize("keep", [0.5, 0.99, 64])
def test_truncated_gguf_is_one_clear_error(gguf_file, tmp_path, keep):
    """Cut in the data, at the very end, or inside the header: all name the file as truncated."""
    data = gguf_file[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep) if keep < 1 else keep])
    with pytest.raises(SpecError, match="truncated"):
        load_model(str(cut))


def test_non_gguf_file_is_rejected(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 100)
    with pytest.raises(SpecError, match="not a GGUF file"):
        load_model(str(bad))
