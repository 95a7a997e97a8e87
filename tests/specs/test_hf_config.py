"""config.json of each supported family loads to the right expert count and width."""
import json

import pytest

from specs.errors import SpecError
from specs.loaders import load_model

MIXTRAL_8X7B = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
QWEN15_MOE_A27B = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                   "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                   "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                   "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
                   "mlp_only_layers": [], "vocab_size": 151936}
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
               "num_hidden_layers": 61, "first_k_dense_replace": 3, "moe_layer_freq": 1,
               "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
               "n_shared_experts": 1, "num_attention_heads": 128, "num_key_value_heads": 128,
               "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
               "v_head_dim": 128, "vocab_size": 129280,
               "quantization_config": {"quant_method": "fp8"}}
DEEPSEEK_V2_LITE = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
                    "num_hidden_layers": 27, "first_k_dense_replace": 1, "n_routed_experts": 64,
                    "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "n_shared_experts": 2,
                    "num_attention_heads": 16, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                    "qk_nope_head_dim": 128, "vocab_size": 102400}


def _load(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return load_model(str(p))


@pytest.mark.parametrize("cfg, experts, per_layer, width, top_k", [
    (MIXTRAL_8X7B, 32 * 8, 8, 14336, 2),
    (QWEN15_MOE_A27B, 24 * 60, 60, 1408, 4),
    (QWEN3_30B_A3B, 48 * 128, 128, 768, 8),
    (DEEPSEEK_V3, 58 * 256, 256, 2048, 8),
    (DEEPSEEK_V2_LITE, 26 * 64, 64, 1408, 6),
], ids=["mixtral", "qwen2-moe", "qwen3-moe", "deepseek-v3", "deepseek-v2"])
def test_config_loads_expert_count_and_width(tmp_path, cfg, experts, per_layer, width, top_k):
    m = _load(tmp_path, cfg)
    assert (m.routed_experts, m.n_experts, m.expert_ffn, m.top_k) == (experts, per_layer, width, top_k)


def test_deepseek_v3_routed_weights_and_mla_cache(tmp_path):
    """58 MoE layers x 256 x 3 x 7168 x 2048 = 653.9B routed weights; MLA caches 576 per layer."""
    m = _load(tmp_path, DEEPSEEK_V3)
    assert round(m.routed_params / 1e9, 1) == 653.9
    assert m.kv_bytes_per_token("f16") == 576 * 61 * 2
    assert m.fmt_experts.bits == 8


def test_mixtral_is_46_7B_total_with_dense(tmp_path):
    m = _load(tmp_path, MIXTRAL_8X7B)
    total = m.routed_params + m.dense_params_per_token + m.vocab * m.hidden
    assert round(total / 1e9, 1) == 46.7


def test_dense_config_is_not_moe(tmp_path):
    with pytest.raises(SpecError, match="model_type: not a supported MoE config"):
        _load(tmp_path, {"model_type": "llama", "hidden_size": 4096})


def test_missing_key_is_named(tmp_path):
    cfg = dict(QWEN3_30B_A3B)
    del cfg["moe_intermediate_size"]
    with pytest.raises(SpecError, match="config.json: moe_intermediate_size: missing"):
        _load(tmp_path, cfg)


# openai/gpt-oss-120b and -20b config.json (the keys the loader reads); model card: 116.83B total
# and 5.13B active parameters (120b), 20.91B and 3.61B (20b)
GPT_OSS_120B = {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
                "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
                "num_experts_per_tok": 4, "vocab_size": 201088, "tie_word_embeddings": False,
                "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 18,
                "quantization_config": {"quant_method": "mxfp4"}, "torch_dtype": "bfloat16"}
GPT_OSS_20B = {**GPT_OSS_120B, "num_hidden_layers": 24, "num_local_experts": 32,
               "layer_types": ["sliding_attention", "full_attention"] * 12}


def _total_and_active(m):
    """(total, active) parameters: routed + dense path + the input embedding; active reads top-k experts."""
    dense = m.dense_params_per_token + m.vocab * m.hidden
    return m.routed_params + dense, m.n_moe_layers * m.top_k * m.params_per_expert + dense - m.vocab * m.hidden


@pytest.mark.parametrize("cfg, total, active", [(GPT_OSS_120B, 116.8, 5.13), (GPT_OSS_20B, 20.9, 3.61)],
                         ids=["gpt-oss-120b", "gpt-oss-20b"])
def test_gpt_oss_parameters_and_mxfp4_experts_as_its_model_card(tmp_path, cfg, total, active):
    """Experts in MXFP4 (4.25 bits), attention in BF16; half the layers slide over 128 tokens, so only
    the full-attention half holds a KV cache that grows with the context."""
    m = _load(tmp_path, cfg)
    t, a = _total_and_active(m)
    assert round(t / 1e9, 1) == total and round(a / 1e9, 2) == active
    assert m.expert_format == "MXFP4" and m.fmt_experts.bits == 4.25 and m.dense_format == "BF16"
    assert m.kv_bytes_per_token("f16") == 2 * 8 * 64 * (cfg["num_hidden_layers"] // 2) * 2


# meta-llama/Llama-4-Maverick-17B-128E: its text_config (the keys the loader reads); MoE every second
# layer with one shared expert, the other layers dense of width intermediate_size_mlp; "400B total"
LLAMA4_MAVERICK = {"model_type": "llama4", "text_config": {
    "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "num_local_experts": 128, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "vocab_size": 202048,
    "torch_dtype": "bfloat16"}}


def test_llama4_reads_its_text_config_with_interleaved_moe_layers(tmp_path):
    m = _load(tmp_path, LLAMA4_MAVERICK)
    assert m.n_moe_layers == 24 and m.moe_layers == list(range(1, 48, 2))
    assert (m.n_experts, m.top_k, m.n_shared_experts, m.dense_ffn) == (128, 1, 1, 16384)
    assert _total_and_active(m)[0] / 1e9 == pytest.approx(400, rel=0.005)


# allenai/OLMoE-1B-7B-0924: experts of width intermediate_size; "6.9B total"
OLMOE = {"model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024, "num_hidden_layers": 16,
         "num_attention_heads": 16, "num_key_value_heads": 16, "num_experts": 64, "num_experts_per_tok": 8,
         "vocab_size": 50304}


def test_olmoe_experts_are_intermediate_size_wide(tmp_path):
    m = _load(tmp_path, OLMOE)
    assert (m.n_experts, m.expert_ffn, m.top_k) == (64, 1024, 8)
    assert round(_total_and_active(m)[0] / 1e9, 1) == 6.9


def test_qwen3_next_caches_kv_in_one_layer_of_four(tmp_path):
    """Qwen3-Next: full attention every 4th layer, linear attention (a fixed state) in the others."""
    cfg = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
           "num_key_value_heads": 2, "head_dim": 256, "num_experts": 512, "num_experts_per_tok": 10,
           "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "full_attention_interval": 4,
           "vocab_size": 151936}
    m = _load(tmp_path, cfg)
    assert m.attention.kv_layers == 12 and m.kv_bytes_per_token("f16") == 2 * 2 * 256 * 12 * 2


def test_a_wrappers_quantization_applies_to_its_text_model(tmp_path):
    """Llama-4-Maverick-17B-128E-Instruct-FP8 keeps quantization_config beside text_config."""
    m = _load(tmp_path, {**LLAMA4_MAVERICK, "quantization_config": {"quant_method": "fp8"}})
    assert m.fmt_experts.bits == 8


def test_a_bad_hybrid_or_interleave_key_is_named(tmp_path):
    with pytest.raises(SpecError, match="config.json: full_attention_interval: expects an integer"):
        _load(tmp_path, {**QWEN3_30B_A3B, "full_attention_interval": "four"})
    with pytest.raises(SpecError, match="config.json: interleave_moe_layer_step: expects an integer"):
        _load(tmp_path, {"model_type": "llama4", "text_config": {**LLAMA4_MAVERICK["text_config"],
                                                                "interleave_moe_layer_step": [2]}})


def test_a_tied_head_reads_the_embedding_table_every_token(tmp_path):
    """tie_word_embeddings: the output head is the embedding table, read whole each decoded token. With the
    embedding at the dense format, a tied Qwen3-30B-A3B reads what the untied one reads per token (its own
    head), while holding one table fewer; before, its per-token dense bytes left the head out."""
    untied, tied = _load(tmp_path, QWEN3_30B_A3B), _load(tmp_path, {**QWEN3_30B_A3B, "tie_word_embeddings": True})
    assert tied.head_is_embedding and not untied.head_is_embedding
    assert tied.head_bytes == pytest.approx(tied.embedding_bytes) == pytest.approx(untied.head_bytes)
    assert tied.dense_bytes_per_token == pytest.approx(untied.dense_bytes_per_token)
    assert tied.dense_params_per_token == pytest.approx(untied.dense_params_per_token)
    assert tied.dense_resident_bytes == pytest.approx(untied.dense_resident_bytes - untied.head_bytes)


def test_a_model_folder_reads_its_config_json(tmp_path):
    """`--model ./Qwen3-30B-A3B/` (a downloaded model's folder) is its config.json: 128 experts, top-8."""
    folder = tmp_path / "Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_30B_A3B))
    m = load_model(str(folder))
    assert (m.n_experts, m.top_k) == (128, 8) and m == load_model(str(folder / "config.json"))


def test_a_folder_without_a_config_json_is_named(tmp_path):
    with pytest.raises(SpecError, match="a folder without a config.json"):
        load_model(str(tmp_path))
