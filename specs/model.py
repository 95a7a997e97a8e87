"""ModelSpec: the shape of a MoE model and the exact bytes each part costs per token.

Figures follow DESIGN.md "The physics": one expert = 3 matrices of hidden x expert_ffn; decode
reads top_k experts in each MoE layer, the dense path once, one embedding row, and Engram rows
at page granularity.
"""
from __future__ import annotations

import math
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .formats import WeightFormat, parse_format

KV_DTYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "fp8": 1.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_format(v: str) -> str:
    parse_format(v)  # raises ValueError with the reason
    return v


class AttentionSpec(_Strict):
    n_heads: int = Field(ge=1)
    n_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    kv_layers: int | None = Field(default=None, ge=0)  # layers that hold a KV cache (None: all)
    # KV elements per token over all layers, when the cache is not plain K and V (MLA, compressed).
    kv_elems_per_token: int | None = Field(default=None, ge=1)


class EngramSpec(_Strict):
    """n-gram lookup tables: `rows` rows of `row_values` values, read by hashing recent tokens."""

    rows: int = Field(ge=1)
    row_values: int = Field(ge=1)
    format: str = "IQ4_NL"
    layers: list[int]  # layers that read the table
    orders: int = Field(default=3, ge=1)  # n-gram orders hashed per layer
    heads: int = Field(default=8, ge=1)  # hash heads per order
    row_align: int = Field(default=16, ge=1)  # bytes; rows start at multiples of this

    _fmt = field_validator("format")(classmethod(lambda cls, v: _check_format(v)))

    @property
    def row_bytes(self) -> float:
        """Bytes of one row in the table's format (256 values of IQ4_NL = 144)."""
        return parse_format(self.format).bytes_for(self.row_values)

    @property
    def table_bytes(self) -> float:
        """Bytes of the whole table."""
        return self.rows * self.row_bytes

    @property
    def rows_per_token_per_layer(self) -> int:
        """Rows one layer reads per token: orders x heads (3 x 8 = 24)."""
        return self.orders * self.heads

    @property
    def rows_per_token(self) -> int:
        """Rows read per token over all Engram layers (2 x 24 = 48)."""
        return self.rows_per_token_per_layer * len(self.layers)

    def page_crossing_fraction(self, page_bytes: int) -> float:
        """Fraction of rows that straddle a page edge, over aligned start offsets within a page."""
        step, rb = self.row_align, int(self.row_bytes)
        n = -(-page_bytes // step)  # aligned starts 0, step, .. below page_bytes
        first = (page_bytes - rb) // step + 1 if page_bytes >= rb else 0  # first start whose row crosses
        return max(0, n - first) / n

    def bytes_per_token(self, page_bytes: int) -> float:
        """Bytes read from storage per token: whole pages, MADV_RANDOM (no read-ahead)."""
        pages_per_row = -(-int(self.row_bytes) // page_bytes)  # rows longer than a page
        return self.rows_per_token * (pages_per_row + self.page_crossing_fraction(page_bytes)) * page_bytes

    def used_bytes_per_token(self) -> float:
        """Bytes the model actually uses per token (48 x 144 = 6,912)."""
        return self.rows_per_token * self.row_bytes


class MTPSpec(_Strict):
    """A multi-token-prediction drafter shipped with the model (published acceptance)."""

    acceptance: float = Field(ge=0, le=1)
    tokens_per_step: float = Field(ge=1)


class TensorInfo(_Strict):
    """One tensor of a GGUF file: exact bytes from its type and shape."""

    name: str
    type: str
    shape: list[int]
    bytes: int
    group: Literal["experts", "embedding", "engram", "dense"]


def _tally(items) -> dict[str, tuple[float, float]]:
    """{type: (bytes, weights)} summed over (type, bytes, weights) items."""
    out: dict[str, tuple[float, float]] = {}
    for typ, nbytes, weights in items:
        b, w = out.get(typ, (0.0, 0.0))
        out[typ] = (b + nbytes, w + float(weights))
    return out


def _mixed_rate(types: dict[str, tuple[float, float]], rate: Callable[[WeightFormat], float], per: str) -> float:
    """The rate of one pass over `types` ({type: (bytes, weights)}) when each type runs at rate(format): the
    bytes (per="bytes") or weights (per="weights") over the sum of each type's time."""
    i = 0 if per == "bytes" else 1
    return sum(v[i] for v in types.values()) / sum(v[i] / rate(parse_format(f)) for f, v in types.items() if v[i])


class ModelSpec(_Strict):
    name: str
    arch: str = "moe"
    source: str = ""  # where the shape came from (config.json URL, GGUF file, article)
    n_layers: int = Field(ge=1)
    moe_layers: list[int] | None = None  # None: every layer is MoE
    hidden: int = Field(ge=1)
    n_experts: int = Field(ge=1)  # routed experts per MoE layer
    top_k: int = Field(ge=1)
    expert_ffn: int = Field(ge=1)
    n_shared_experts: int = Field(default=0, ge=0)
    shared_ffn: int = Field(default=0, ge=0)
    dense_ffn: int = Field(default=0, ge=0)  # FFN width of the non-MoE layers
    vocab: int = Field(ge=1)
    context_length: int | None = Field(default=None, ge=1)  # longest context the model supports
    tied_embeddings: bool = False
    attention: AttentionSpec
    expert_format: str
    dense_format: str = "F16"
    embedding_format: str | None = None  # default: dense_format
    # Reported resident dense path (bytes), when the engine's layout is not derivable from the
    # config (e.g. dsv41-flash-offload expands wo_a to FP16): overrides the computed figure.
    dense_resident_bytes_reported: float | None = Field(default=None, gt=0)
    embedding_bytes_reported: float | None = Field(default=None, gt=0)
    engram: EngramSpec | None = None
    mtp: MTPSpec | None = None
    tensors: list[TensorInfo] | None = None  # exact accounting from a GGUF header

    _formats = field_validator("expert_format", "dense_format", "embedding_format")(
        classmethod(lambda cls, v: v if v is None else _check_format(v)))

    @model_validator(mode="after")
    def _consistent(self):
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k {self.top_k} exceeds n_experts {self.n_experts}")
        if self.moe_layers is not None and any(not 0 <= i < self.n_layers for i in self.moe_layers):
            raise ValueError(f"moe_layers must lie in [0, {self.n_layers})")
        if self.engram and any(not 0 <= i < self.n_layers for i in self.engram.layers):
            raise ValueError(f"engram.layers must lie in [0, {self.n_layers})")
        return self

    # ---- routed experts -------------------------------------------------------------------
    @property
    def layers_moe(self) -> list[int]:
        """Indices of the MoE layers."""
        return list(range(self.n_layers)) if self.moe_layers is None else list(self.moe_layers)

    @property
    def n_moe_layers(self) -> int:
        return len(self.layers_moe)

    @property
    def fmt_experts(self) -> WeightFormat:
        return parse_format(self.expert_format)

    @property
    def params_per_expert(self) -> int:
        """Weights in one routed expert: gate, up and down, 3 x hidden x expert_ffn."""
        return 3 * self.hidden * self.expert_ffn

    @property
    def routed_experts(self) -> int:
        """Routed experts in the whole model (40 x 384 = 15,360)."""
        return self.n_moe_layers * self.n_experts

    @property
    def routed_params(self) -> int:
        """Routed-expert weights in the whole model."""
        return self.routed_experts * self.params_per_expert

    def _group_bytes(self, group: str) -> float | None:
        if self.tensors is None:
            return None
        return float(sum(t.bytes for t in self.tensors if t.group == group))

    @property
    def routed_bytes(self) -> float:
        """Bytes of all routed experts (exact tensor bytes when read from a GGUF)."""
        exact = self._group_bytes("experts")
        if exact is not None:
            return exact
        return self.routed_experts * self.fmt_experts.bytes_for(self.params_per_expert)

    @property
    def expert_bytes(self) -> float:
        """Bytes of one routed expert (average over layers when types are mixed)."""
        return self.routed_bytes / self.routed_experts

    def routed_bytes_per_token(self, experts_per_token: int | None = None) -> float:
        """Routed-expert bytes one token reads: MoE layers x top-k x expert bytes."""
        k = self.top_k if experts_per_token is None else experts_per_token
        return self.n_moe_layers * k * self.expert_bytes

    def expert_types(self) -> dict[str, tuple[float, float]]:
        """{type: (bytes, weights)} of the routed experts: each tensor's own type from a GGUF header (llama.cpp's
        Q4_K_M files hold Q4_K gate / up and Q6_K or Q4_K down; its Q2_K files Q2_K, Q3_K and Q4_K), else all of
        them in expert_format. A token reads each type's share of its bytes, at that type's rate."""
        if self.tensors is None:
            return {self.expert_format: (self.routed_bytes, float(self.routed_params))}
        return _tally((t.type, t.bytes, math.prod(t.shape)) for t in self.tensors if t.group == "experts")

    def expert_rate(self, rate: Callable[[WeightFormat], float], per: str = "bytes") -> float:
        """The rate of one pass over the routed experts when each weight type runs at rate(format): their bytes
        (per="bytes": GB/s) or weights (per="weights": GFLOP/s, the multiply-adds follow the weights) over the
        sum of each type's time. One type: its own rate."""
        return _mixed_rate(self.expert_types(), rate, per)

    # ---- dense path -----------------------------------------------------------------------
    @property
    def embedding_bytes(self) -> float:
        """Bytes of the input embedding table (one row is read per token)."""
        exact = self._group_bytes("embedding")
        if exact is not None:
            return exact
        if self.embedding_bytes_reported is not None:
            return self.embedding_bytes_reported
        fmt = parse_format(self.embedding_format or self.dense_format)
        return fmt.bytes_for(self.vocab * self.hidden)

    def _computed_dense_params(self) -> int:
        a = self.attention
        q_dim, kv_dim = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        attn = self.hidden * q_dim * 2 + self.hidden * kv_dim * 2  # q, o, k, v
        n_dense = self.n_layers - self.n_moe_layers
        shared = 3 * self.hidden * self.shared_ffn * self.n_shared_experts
        router = self.hidden * self.n_experts
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return (self.n_layers * attn + self.n_moe_layers * (shared + router)
                + n_dense * 3 * self.hidden * self.dense_ffn + head)

    @property
    def dense_resident_bytes(self) -> float:
        """Bytes of the dense path held resident: attention, shared experts, routers, norms,
        embeddings and head (everything but routed experts and Engram tables)."""
        exact = self._group_bytes("dense")
        if exact is not None:
            return exact + self.embedding_bytes
        if self.dense_resident_bytes_reported is not None:
            return self.dense_resident_bytes_reported
        return parse_format(self.dense_format).bytes_for(self._computed_dense_params()) + self.embedding_bytes

    @property
    def head_is_embedding(self) -> bool:
        """Whether the output head is the embedding table (tied: `tie_word_embeddings`, or a GGUF without
        `output.weight`, which llama.cpp then reads from `token_embd.weight`)."""
        if self.tensors is not None:
            return not any(t.name == "output.weight" for t in self.tensors)
        return self.tied_embeddings

    @property
    def head_bytes(self) -> float:
        """Bytes of the output head, read once a token after the last layer: the embedding table when tied;
        from `output.weight` for a GGUF header, else vocab x hidden at the dense format."""
        if self.head_is_embedding:
            return self.embedding_bytes
        if self.tensors is not None:
            return float(sum(t.bytes for t in self.tensors if t.name == "output.weight"))
        return min(parse_format(self.dense_format).bytes_for(self.vocab * self.hidden), self.dense_bytes_per_token)

    @property
    def layer_dense_bytes(self) -> float:
        """Dense bytes one layer reads per token on average: the dense path less the head and the embedding row."""
        row = self.embedding_bytes / self.vocab
        return max(0.0, self.dense_bytes_per_token - self.head_bytes - row) / self.n_layers

    @property
    def dense_bytes_per_token(self) -> float:
        """Dense bytes read per token: resident dense path minus the embedding table plus one row
        (an upper estimate: every dense weight is read once per token), plus the whole table when it
        is the output head (tied)."""
        row = self.embedding_bytes / self.vocab
        tied = self.embedding_bytes if self.head_is_embedding else 0.0
        return self.dense_resident_bytes - self.embedding_bytes + row + tied

    def dense_types(self) -> dict[str, tuple[float, float]]:
        """{type: (bytes, weights)} of what one token reads on the dense path (dense_bytes_per_token): a GGUF
        header's dense tensors each in its own type (llama.cpp's Q4_K_M files: Q4_K attention, Q6_K attn_v and
        head), the embedding row, and the whole table when it is the head; else all of it in dense_format."""
        if self.tensors is None:
            return {self.dense_format: (self.dense_bytes_per_token, self.dense_params_per_token)}
        items = [(t.type, t.bytes, math.prod(t.shape)) for t in self.tensors if t.group == "dense"]
        emb = next((t for t in self.tensors if t.group == "embedding"), None)
        if emb is not None:  # one row a token, and every row when the table is the head
            rows = 1 + (self.vocab if self.head_is_embedding else 0)
            items.append((emb.type, self.embedding_bytes / self.vocab * rows, self.hidden * rows))
        return _tally(items)

    def dense_rate(self, rate: Callable[[WeightFormat], float], per: str = "bytes") -> float:
        """expert_rate for the dense path: each of dense_types at rate(format)."""
        return _mixed_rate(self.dense_types(), rate, per)

    def prefill_dense_rate(self, rate: Callable[[WeightFormat], float]) -> float:
        """GFLOP/s of a prefill batch's dense products, the head aside (it runs for the outputs only:
        prefill_dense_flops), when each dense weight type runs at rate(format): dense_types less the head's weights."""
        types = dict(self.dense_types())
        head = [t for t in self.tensors or () if t.name == "output.weight"]
        for t in head:  # a tied head is the embedding table, whose one row a token is all dense_types holds
            b, w = types[t.type]
            types[t.type] = (max(0.0, b - t.bytes), max(0.0, w - math.prod(t.shape)))
        if not any(w for _, w in types.values()):  # nothing but the head: its own type's rate
            return rate(parse_format(self.dense_format))
        return _mixed_rate(types, rate, "weights")

    @property
    def dense_params_per_token(self) -> float:
        """Dense weights multiplied per token: each tensor's shape for a GGUF header; else from the config (from
        bytes at the dense format when reported)."""
        if self.tensors is not None:
            return sum(w for _, w in self.dense_types().values())
        if self.dense_resident_bytes_reported is None:  # a tied head: the table's weights
            return float(self._computed_dense_params()) + (self.vocab * self.hidden if self.head_is_embedding else 0)
        return self.dense_bytes_per_token * 8 / parse_format(self.dense_format).bits

    @property
    def head_params(self) -> float:
        """Weights of the output head: `output.weight`'s (or the tied table's) shape for a GGUF header; else its
        share of the dense bytes, of dense_params_per_token."""
        if self.tensors is not None:
            tied = self.head_is_embedding  # once: it scans the tensors itself
            head = [t for t in self.tensors if t.name == "output.weight" or (tied and t.group == "embedding")]
            return float(sum(math.prod(t.shape) for t in head))
        if self.dense_bytes_per_token <= 0:
            return 0.0
        return self.dense_params_per_token * min(1.0, self.head_bytes / self.dense_bytes_per_token)

    @property
    def dense_flops_per_token(self) -> float:
        """FLOPs of the dense path per token, 2 per weight (Kaplan et al. 2020, C = 2N)."""
        return 2.0 * self.dense_params_per_token

    def prefill_dense_flops(self, n: int, outputs: int = 1) -> float:
        """Dense-path FLOPs of an n-token prefill batch whose logits are wanted for `outputs` tokens: the
        output head runs only for those (llama.cpp outputs a batch's last token unless asked for more;
        the executor its last position), every other dense weight for all n (head_params)."""
        head = min(2.0 * self.head_params, self.dense_flops_per_token)
        return (self.dense_flops_per_token - head) * n + head * min(outputs, n)

    @property
    def expert_flops(self) -> float:
        """FLOPs of one routed expert on one token (2 per weight)."""
        return 2.0 * self.params_per_expert

    def attention_flops_per_token(self, context: int) -> float:
        """Attention-score FLOPs of one token against `context` earlier ones (QK^T and PV)."""
        a = self.attention
        layers = self.n_layers if a.kv_layers is None else a.kv_layers
        return 4.0 * a.n_heads * a.head_dim * context * layers

    # ---- KV cache and Engram ----------------------------------------------------------------
    def kv_bytes_per_token(self, dtype: str = "f16") -> float:
        """KV-cache bytes one token of context costs, over all KV layers."""
        a = self.attention
        if a.kv_elems_per_token is not None:
            elems = a.kv_elems_per_token
        else:
            layers = self.n_layers if a.kv_layers is None else a.kv_layers
            elems = 2 * a.n_kv_heads * a.head_dim * layers
        return elems * KV_DTYPE_BYTES[dtype]

    def engram_bytes_per_token(self, page_bytes: int = 4096) -> float:
        """Engram bytes read from storage per token at page granularity (0 without tables)."""
        return self.engram.bytes_per_token(page_bytes) if self.engram else 0.0

    @property
    def engram_table_bytes(self) -> float:
        exact = self._group_bytes("engram")
        if exact is not None:
            return exact
        return self.engram.table_bytes if self.engram else 0.0
