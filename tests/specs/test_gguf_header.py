"""GGUF header loader: exact tensor bytes from type and shape, data never read (gguf package)."""
import pytest

from specs.errors import SpecError
from specs.loaders import load_model

H, F, E, L, V = 64, 32, 8, 3, 300  # the shape conftest.moe_gguf writes


@pytest.fixture(scope="module")
def gguf_file(moe_gguf):
    return moe_gguf


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


def test_mixed_expert_types_are_named_by_the_one_holding_most_bytes(gguf_file):
    """conftest's file: layer 0 Q4_0 gate/up, layer 1 all Q8_0, layer 2 Q4_K gate/up, every down Q8_0:
    Q8_0 holds most expert bytes, so it names the file (as Q4_K names a Q4_K_M file whose first
    expert tensor, blk.0.ffn_down_exps, is Q6_K), not the first tensor's Q4_0."""
    m = load_model(str(gguf_file[0]))
    by_type: dict[str, int] = {}
    for t in m.tensors:
        if t.group == "experts":
            by_type[t.type] = by_type.get(t.type, 0) + t.bytes
    assert m.expert_format == max(by_type, key=by_type.get) == "Q8_0"
    assert next(t.type for t in m.tensors if t.group == "experts") == "Q4_0"


def test_head_is_the_output_tensor_and_layers_share_the_rest(gguf_file):
    """The output head (output.weight, Q8_0 300 x 64) is read once a token after the last layer; each
    layer's dense bytes are the dense path's less the head and the embedding row, over the layers."""
    path, written = gguf_file
    m = load_model(str(path))
    assert m.head_bytes == written["output.weight"]
    row = written["token_embd.weight"] / V
    assert m.layer_dense_bytes == pytest.approx((m.dense_bytes_per_token - m.head_bytes - row) / L)


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


@pytest.mark.parametrize("arch, kv, full", [
    ("gpt-oss", {"attention.sliding_window": 128}, L // 2),  # llama.cpp's default pattern for gpt-oss: 2
    ("qwen3next", {"full_attention_interval": 3}, 1),
    ("qwen3moe", {}, None),
], ids=["gpt-oss", "qwen3next", "all-layers"])
def test_kv_cache_layers_of_a_hybrid_gguf(tmp_path, write_gguf, arch, kv, full):
    """Only full-attention layers hold a KV cache that grows with the context."""
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, arch=arch, extra_kv=kv)
    m = load_model(str(path))
    assert m.attention.kv_layers == full
    assert m.kv_bytes_per_token("f16") == 2 * 2 * 16 * (L if full is None else full) * 2


def test_expert_types_split_the_experts_bytes_and_weights_by_tensor_type(gguf_file):
    """conftest's file (layer 0 Q4_0 gate / up, layer 1 Q8_0, layer 2 Q4_K gate / up; every down Q8_0): each
    type's bytes are its tensors' bytes, its weights their shapes' products, and together they are the
    routed experts' bytes and weights."""
    path, written = gguf_file
    m = load_model(str(path))
    types = m.expert_types()
    assert set(types) == {"Q4_0", "Q8_0", "Q4_K"}
    assert types["Q4_0"][0] == written["blk.0.ffn_gate_exps.weight"] + written["blk.0.ffn_up_exps.weight"]
    assert types["Q4_K"][1] == 2 * E * F * 256  # gate and up, 256-wide rows
    assert types["Q4_0"][1] == 2 * E * F * H
    assert sum(b for b, _ in types.values()) == m.routed_bytes
    assert types["Q8_0"][0] == sum(v for k, v in written.items() if "_exps" in k) - types["Q4_0"][0] - types["Q4_K"][0]


def test_a_spec_without_a_header_has_one_expert_type():
    """A preset or config.json names one expert format: all routed bytes and weights are of it."""
    m = load_model("deepseek-v4.1-flash")
    assert m.expert_types() == {m.expert_format: (m.routed_bytes, float(m.routed_params))}


def test_dense_types_are_what_a_token_reads_on_the_dense_path(gguf_file):
    """conftest's file: F16 attn_q (64 x H a layer), F32 routers (E x H), the Q8_0 head (V x H) and one F16
    embedding row: their bytes are dense_bytes_per_token, their weights dense_params_per_token (each tensor's
    shape, not the bytes at the attention's bits), and the head's weights its shape's."""
    m = load_model(str(gguf_file[0]))
    types = m.dense_types()
    assert types["F16"][1] == L * 64 * H + H
    assert types["F32"][1] == L * E * H
    assert types["Q8_0"][1] == V * H
    assert sum(b for b, _ in types.values()) == m.dense_bytes_per_token
    assert m.dense_params_per_token == L * 64 * H + H + L * E * H + V * H
    assert m.head_params == V * H
    assert m.prefill_dense_flops(10, 1) == 2 * (m.dense_params_per_token - V * H) * 10 + 2 * V * H


def test_a_prefill_batchs_dense_rate_leaves_the_head_out(gguf_file):
    """The head runs for a batch's outputs only (prefill_dense_flops): the dense products' rate weighs the F16
    attention, the F32 routers and the embedding row by their weights, without the Q8_0 head's."""
    m = load_model(str(gguf_file[0]))
    rates = {"F16": 40.0, "F32": 10.0, "Q8_0": 1.0}
    w16, w32, w8 = L * 64 * H + H, L * E * H, 0  # the one embedding row is F16 here
    want = (w16 + w32 + w8) / (w16 / 40.0 + w32 / 10.0)
    assert m.prefill_dense_rate(lambda f: rates[f.name]) == pytest.approx(want, rel=1e-12)


def test_a_tied_head_reads_the_whole_embedding_table_in_its_type(gguf_file):
    """Without output.weight the head is token_embd (F16 here): every row of it a token, plus the input row."""
    m = load_model(str(gguf_file[0]))
    tied = m.model_copy(update={"tensors": [t for t in m.tensors if t.name != "output.weight"]})
    types = tied.dense_types()
    assert "Q8_0" not in types
    assert types["F16"][1] == L * 64 * H + (V + 1) * H
    assert sum(b for b, _ in types.values()) == tied.dense_bytes_per_token
    assert tied.head_params == V * H
