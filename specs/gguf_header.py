"""ModelSpec from a GGUF header: exact bytes of every tensor from its type and shape.

The `gguf` package's reader memory-maps the file; no tensor data is read here.
"""
from __future__ import annotations

from pathlib import Path

import gguf
from pydantic import ValidationError

from .errors import SpecError, from_validation
from .formats import gguf_format_from_type
from .model import ModelSpec, TensorInfo

ENGRAM_TENSOR = "per_layer_token_embd.weight"


def _group(name: str) -> str:
    if "_exps" in name:
        return "experts"
    if name == "token_embd.weight":
        return "embedding"
    if name.startswith("per_layer_token_embd"):
        return "engram"
    return "dense"


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """A GGUFReader over `path`, or a SpecError for a truncated or non-GGUF file."""
    path = str(path)
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise SpecError(path, None, "not a GGUF file (bad magic)")
        return gguf.GGUFReader(path, "r")
    except SpecError:
        raise
    except OSError as e:
        raise SpecError(path, None, f"cannot read: {e.strerror or e}") from None
    except Exception as e:  # the reader raises ValueError/IndexError on short or corrupt files
        raise SpecError(path, None, f"truncated or corrupt GGUF ({type(e).__name__}: {e})") from None


def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def tensor_infos(reader: gguf.GGUFReader, path: str) -> list[TensorInfo]:
    """Every tensor's name, type, shape (GGUF order, innermost first) and exact byte size."""
    size = Path(path).stat().st_size
    out = []
    for t in reader.tensors:
        fmt = gguf_format_from_type(int(t.tensor_type))
        shape = [int(d) for d in t.shape]
        n = 1
        for d in shape:
            n *= d
        nbytes = int(fmt.bytes_for(n))
        if nbytes != int(t.n_bytes) or t.data_offset + nbytes > size:
            raise SpecError(path, t.name, f"tensor data ends past the end of the file ({size} bytes): truncated")
        out.append(TensorInfo(name=t.name, type=fmt.name, shape=shape, bytes=nbytes, group=_group(t.name)))
    return out


def _kv_layers(r: gguf.GGUFReader, arch: str, n_layers: int) -> int | None:
    """Layers whose KV cache grows with the context, as llama.cpp reads them (None: all): one in
    `full_attention_interval` (Qwen3-Next's linear-attention hybrid), or the non-sliding layers of
    `attention.sliding_window_pattern` (a flag per layer, true = sliding; or every n-th layer full;
    gpt-oss's default is 2, llama.cpp's models/openai-moe.cpp)."""
    every = _field(r, f"{arch}.full_attention_interval")
    if every and int(every) > 1:
        return n_layers // int(every)
    if _field(r, f"{arch}.attention.sliding_window") is None:
        return None
    pat = _field(r, f"{arch}.attention.sliding_window_pattern", 2 if arch == "gpt-oss" else None)
    if isinstance(pat, list):
        return sum(1 for x in pat if not x)
    return n_layers // int(pat) if pat else None


def model_from_gguf(path: str | Path) -> ModelSpec:
    """Read shape metadata and tensor bytes from a GGUF header into a ModelSpec."""
    path = str(path)
    r = open_gguf(path)
    arch = _field(r, "general.architecture")
    if not arch:
        raise SpecError(path, "general.architecture", "missing")

    def need(key: str):
        v = _field(r, f"{arch}.{key}")
        if v is None:
            raise SpecError(path, f"{arch}.{key}", "missing (needed for a MoE model)")
        return v

    tensors = tensor_infos(r, path)
    n_layers, hidden = int(need("block_count")), int(need("embedding_length"))
    kv_layers = _kv_layers(r, str(arch), n_layers)
    heads = int(need("attention.head_count"))
    kv_heads = int(_field(r, f"{arch}.attention.head_count_kv", heads))
    head_dim = int(_field(r, f"{arch}.attention.key_length", hidden // heads))
    tokens = _field(r, "tokenizer.ggml.tokens")
    vocab = int(_field(r, f"{arch}.vocab_size", len(tokens) if tokens else 0))
    exps = [t for t in tensors if t.group == "experts"]
    if not exps:
        raise SpecError(path, "tensors", "no expert tensors (*_exps): not a MoE model")
    moe_layers = sorted({int(t.name.split(".")[1]) for t in exps})
    n_experts = int(_field(r, f"{arch}.expert_count", exps[0].shape[-1]))
    shared_ffn = int(_field(r, f"{arch}.expert_shared_feed_forward_length", 0) or 0)
    n_shared = int(_field(r, f"{arch}.expert_shared_count", 1 if shared_ffn else 0) or 0)
    # the type holding most expert bytes names the file (a Q4_K_M file: Q4_K, with some ffn_down in
    # Q6_K); mixed types are averaged in routed_bytes
    by_type: dict[str, int] = {}
    for t in exps:
        by_type[t.type] = by_type.get(t.type, 0) + t.bytes
    spec = dict(
        name=str(_field(r, "general.name", Path(path).stem)), arch=str(arch), source=path,
        n_layers=n_layers, moe_layers=None if len(moe_layers) == n_layers else moe_layers,
        hidden=hidden, n_experts=n_experts, top_k=int(need("expert_used_count")),
        expert_ffn=int(need("expert_feed_forward_length")), n_shared_experts=n_shared,
        shared_ffn=shared_ffn, vocab=vocab or 1,
        context_length=_field(r, f"{arch}.context_length"),
        attention=dict(n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim, kv_layers=kv_layers),
        expert_format=max(by_type, key=lambda k: (by_type[k], k)),
        dense_format=next((t.type for t in tensors if t.name.endswith("attn_q.weight")), "F16"),
        embedding_format=next((t.type for t in tensors if t.group == "embedding"), None),
        tensors=[t.model_dump() for t in tensors],
    )
    eng = next((t for t in tensors if t.group == "engram"), None)
    if eng is not None:
        layers = _field(r, "engram.layers") or [1, min(14, n_layers - 1)]
        spec["engram"] = dict(rows=eng.shape[1], row_values=eng.shape[0], format=eng.type,
                              layers=[int(x) for x in layers],
                              orders=int(_field(r, "engram.orders", 3)), heads=int(_field(r, "engram.heads", 8)))
    try:
        return ModelSpec.model_validate(spec)
    except ValidationError as e:
        raise from_validation(path, e) from None
