"""ModelSpec from a Hugging Face config.json: Mixtral, gpt-oss, OLMoE, Qwen2/Qwen3-MoE (and Qwen3-Next),
DeepSeek-V2/V3 (and GLM-4.5, Kimi K2: the same keys), Llama 4 (its text_config)."""
from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from .errors import SpecError, from_validation
from .model import ModelSpec


def _need(cfg: dict, key: str, path: str) -> Any:
    if key not in cfg:
        raise SpecError(path, key, "missing (needed for a MoE model)")
    return cfg[key]


def _family(cfg: dict) -> str:
    mt = str(cfg.get("model_type", "")).lower()
    if mt.startswith("llama4"):
        return "llama4"
    if "n_routed_experts" in cfg or mt.startswith("deepseek"):
        return "deepseek"
    if "num_local_experts" in cfg or mt in ("mixtral", "gpt_oss"):
        return "mixtral"
    if mt == "olmoe":  # num_experts of width intermediate_size, no shared expert
        return "olmoe"
    if "num_experts" in cfg or mt in ("qwen2_moe", "qwen3_moe", "qwen3_next"):
        return "qwen"
    return ""


def _default_format(cfg: dict) -> str:
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    if method == "fp8":
        return "BPW:8"
    if method == "mxfp4":  # gpt-oss: the experts in MXFP4 (32 values and one E8M0 scale in 17 bytes)
        return "MXFP4"
    return "BF16" if str(cfg.get("torch_dtype", "bfloat16")) == "bfloat16" else "F16"


def _int(cfg: dict, key: str, default: int, path: str) -> int:
    """cfg[key] as an integer (default when absent or null), or a SpecError naming the key."""
    v = cfg.get(key)
    try:
        return default if v is None else int(v)
    except (TypeError, ValueError):
        raise SpecError(path, key, f"expects an integer (got {v!r})") from None


def _kv_layers(cfg: dict, n_layers: int, path: str) -> int | None:
    """Layers whose KV cache grows with the context: the full-attention ones of a hybrid model
    (`layer_types`: gpt-oss's sliding windows, Qwen3-Next's linear attention; or Qwen3-Next's
    `full_attention_interval`); None when every layer is full attention. A sliding layer's window
    (gpt-oss: 128 tokens) and a linear layer's fixed state are left out."""
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        full = sum(1 for t in types if str(t) == "full_attention")
        return None if full == len(types) else full
    every = _int(cfg, "full_attention_interval", 1, path)
    return n_layers // every if every > 1 else None


def model_from_config(cfg: Any, path: str, expert_format: str | None = None) -> ModelSpec:
    """Read the expert count, width, top-k and attention shape from a config.json mapping."""
    if not isinstance(cfg, dict):
        raise SpecError(path, None, "expected a JSON object")
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):  # a multimodal wrapper (Llama 4)
        tc = cfg["text_config"]
        cfg = {**tc, "_name_or_path": cfg.get("_name_or_path") or tc.get("_name_or_path"),
               "torch_dtype": tc.get("torch_dtype", cfg.get("torch_dtype", "bfloat16")),
               "quantization_config": tc.get("quantization_config") or cfg.get("quantization_config")}
    fam = _family(cfg)
    if not fam:
        raise SpecError(path, "model_type", f"not a supported MoE config ({cfg.get('model_type')!r}; "
                        "supported: Mixtral, gpt-oss, OLMoE, Qwen2/3-MoE, Qwen3-Next, DeepSeek-V2/V3, "
                        "GLM-4.5, Llama 4)")
    n_layers = _need(cfg, "num_hidden_layers", path)
    hidden = _need(cfg, "hidden_size", path)
    heads = _need(cfg, "num_attention_heads", path)
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None)
    fmt = expert_format or _default_format(cfg)
    spec: dict[str, Any] = dict(
        name=str(cfg.get("_name_or_path") or cfg.get("model_type") or path), arch=fam, source=path,
        n_layers=n_layers, hidden=hidden, vocab=_need(cfg, "vocab_size", path),
        top_k=_need(cfg, "num_experts_per_tok", path),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        context_length=cfg.get("max_position_embeddings"),
        expert_format=fmt, dense_format=fmt if fmt in ("BF16", "F16") else "BF16",
        attention=dict(n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
                       kv_layers=_kv_layers(cfg, n_layers, path) if isinstance(n_layers, int) else None),
    )
    if fam == "mixtral":
        spec.update(n_experts=_need(cfg, "num_local_experts", path),
                    expert_ffn=_need(cfg, "intermediate_size", path))
    elif fam == "olmoe":
        spec.update(n_experts=_need(cfg, "num_experts", path), expert_ffn=_need(cfg, "intermediate_size", path))
    elif fam == "llama4":  # MoE every interleave_moe_layer_step-th layer, each with one shared expert
        step = max(1, _int(cfg, "interleave_moe_layer_step", 1, path))
        moe = [i for i in range(n_layers) if (i + 1) % step == 0]
        ffn = _need(cfg, "intermediate_size", path)
        spec.update(n_experts=_need(cfg, "num_local_experts", path), expert_ffn=ffn,
                    moe_layers=None if len(moe) == n_layers else moe, n_shared_experts=1, shared_ffn=ffn,
                    dense_ffn=int(cfg.get("intermediate_size_mlp") or 0))
    elif fam == "qwen":
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        moe = [i for i in range(n_layers) if i not in mlp_only and (i + 1) % step == 0]
        shared_ffn = int(cfg.get("shared_expert_intermediate_size") or 0)
        spec.update(n_experts=_need(cfg, "num_experts", path),
                    expert_ffn=_need(cfg, "moe_intermediate_size", path),
                    moe_layers=None if len(moe) == n_layers else moe,
                    n_shared_experts=1 if shared_ffn else 0, shared_ffn=shared_ffn,
                    dense_ffn=int(cfg.get("intermediate_size") or 0))
    else:  # deepseek: MLA caches a latent of kv_lora_rank + qk_rope_head_dim per layer
        first_dense = int(cfg.get("first_k_dense_replace", 0) or 0)
        freq = int(cfg.get("moe_layer_freq", 1) or 1)
        moe = [i for i in range(first_dense, n_layers) if i % freq == 0]
        n_shared = int(cfg.get("n_shared_experts") or 0)
        moe_ffn = _need(cfg, "moe_intermediate_size", path)
        spec.update(n_experts=_need(cfg, "n_routed_experts", path), expert_ffn=moe_ffn,
                    moe_layers=None if len(moe) == n_layers else moe,
                    n_shared_experts=n_shared, shared_ffn=moe_ffn if n_shared else 0,
                    dense_ffn=int(cfg.get("intermediate_size") or 0))
        if cfg.get("kv_lora_rank"):
            latent = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
            spec["attention"]["kv_elems_per_token"] = latent * n_layers
            spec["attention"]["head_dim"] = int(cfg.get("qk_nope_head_dim") or 0) + int(cfg.get("qk_rope_head_dim") or 0) or head_dim
    try:
        return ModelSpec.model_validate(spec)
    except ValidationError as e:
        raise from_validation(path, e) from None
