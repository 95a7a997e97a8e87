"""The dense path in torch (CUDA when present, else CPU; same code): norms, RoPE, GQA attention with
Q/K norm and a KV cache, the router, the output head. Streams decode in lock-step: tensors are
[S, n, ...] (S streams, n new tokens each)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as Fn

from .gguf_model import GGUFModel


def pick_device(want_gpu: bool = True) -> torch.device:
    """CUDA when present and wanted, else the CPU."""
    return torch.device("cuda") if want_gpu and torch.cuda.is_available() else torch.device("cpu")


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, times weight w."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_table(ctx: int, d: int, base: float, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [ctx, d/2] of the rotary angles (computed in float64)."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    ang = torch.arange(ctx, dtype=torch.float64)[:, None] * inv[None, :]  # [ctx, d/2]
    return ang.cos().to(device, dtype), ang.sin().to(device, dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """Rotary embedding of x [S, h, n, d] with cos/sin [n, d/2]; style 'neox' (halves) or 'norm' (pairs)."""
    d = x.shape[-1]
    if style == "neox":
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def _sdpa(q, k, v, mask, groups: int) -> torch.Tensor:
    """Scaled dot-product attention with grouped K/V heads (repeats them on torch < 2.5)."""
    if groups == 1:
        return Fn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    try:
        return Fn.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    except TypeError:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return Fn.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class KVCache:
    """Per-layer K and V [S, n_kv, ctx, hd] on the device."""

    def __init__(self, n_layers: int, streams: int, n_kv: int, ctx: int, hd: int, device, dtype):
        self.k = [torch.zeros(streams, n_kv, ctx, hd, device=device, dtype=dtype) for _ in range(n_layers)]
        self.v = [torch.zeros(streams, n_kv, ctx, hd, device=device, dtype=dtype) for _ in range(n_layers)]
        self.len = 0  # tokens stored (same for every stream)

    def nbytes(self) -> int:
        """Bytes held by the cache."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class Dense:
    """Dense weights dequantised once to `dtype` tensors on `device`; the embedding is read by rows."""

    def __init__(self, model: GGUFModel, device: torch.device, dtype=torch.float32):
        self.m, self.c, self.device, self.dtype = model, model.cfg, device, dtype
        t = lambda name: torch.from_numpy(model.dense(name)).to(device=device, dtype=dtype)  # noqa: E731
        self.layers = []
        for i in range(self.c.n_layers):
            b = f"blk.{i}."
            L = dict(attn_norm=t(b + "attn_norm.weight"), wq=t(b + "attn_q.weight"),
                     wk=t(b + "attn_k.weight"), wv=t(b + "attn_v.weight"), wo=t(b + "attn_output.weight"),
                     ffn_norm=t(b + "ffn_norm.weight"), router=t(b + "ffn_gate_inp.weight"))
            if self.c.qk_norm:
                L["q_norm"], L["k_norm"] = t(b + "attn_q_norm.weight"), t(b + "attn_k_norm.weight")
            if model.has(b + "ffn_gate_shexp.weight"):  # shared expert (qwen2moe style)
                L["sh_gate"], L["sh_up"] = t(b + "ffn_gate_shexp.weight"), t(b + "ffn_up_shexp.weight")
                L["sh_down"] = t(b + "ffn_down_shexp.weight")
                if model.has(b + "ffn_gate_inp_shexp.weight"):
                    L["sh_inp"] = t(b + "ffn_gate_inp_shexp.weight").reshape(1, -1)
            self.layers.append(L)
        self.out_norm = t("output_norm.weight")
        self.out = t("output.weight" if model.has("output.weight") else "token_embd.weight")  # [V, H]
        self._rope = None

    def nbytes_per_token(self) -> int:
        """Bytes of dense weights read per decode step (all dense tensors plus one embedding row)."""
        n = sum(v.numel() * v.element_size() for L in self.layers for v in L.values())
        n += self.out.numel() * self.out.element_size() + self.out_norm.numel() * self.out_norm.element_size()
        return n + self.c.hidden * 4

    def embed(self, ids: np.ndarray) -> torch.Tensor:
        """Embeddings of token ids [S, n] -> [S, n, H] (only those rows are read from the mmap)."""
        S, n = ids.shape
        rows = self.m.rows("token_embd.weight", ids.reshape(-1))
        return torch.from_numpy(rows).to(device=self.device, dtype=self.dtype).reshape(S, n, -1)

    def attention(self, i: int, x: torch.Tensor, kv: KVCache) -> torch.Tensor:
        """Attention block of layer i on x [S, n, H] (pre-norm inside), appending to kv -> [S, n, H]."""
        c, L = self.c, self.layers[i]
        S, n, _ = x.shape
        h = rms_norm(x, L["attn_norm"], c.eps)
        q = (h @ L["wq"].T).view(S, n, c.n_heads, c.head_dim).transpose(1, 2)  # [S, nh, n, hd]
        k = (h @ L["wk"].T).view(S, n, c.n_kv, c.head_dim).transpose(1, 2)  # [S, nkv, n, hd]
        v = (h @ L["wv"].T).view(S, n, c.n_kv, c.head_dim).transpose(1, 2)
        if c.qk_norm:
            q, k = rms_norm(q, L["q_norm"], c.eps), rms_norm(k, L["k_norm"], c.eps)
        p0 = kv.len
        if self._rope is None or self._rope[0].shape[0] < p0 + n:
            self._rope = rope_table(max(p0 + n, kv.k[i].shape[2]), c.head_dim, c.rope_base, x.device, x.dtype)
        cos, sin = self._rope[0][p0:p0 + n], self._rope[1][p0:p0 + n]
        q, k = rope(q, cos, sin, c.rope_style), rope(k, cos, sin, c.rope_style)
        kv.k[i][:, :, p0:p0 + n] = k
        kv.v[i][:, :, p0:p0 + n] = v
        K, V = kv.k[i][:, :, : p0 + n], kv.v[i][:, :, : p0 + n]  # [S, nkv, T, hd]
        mask = None
        if n > 1:  # causal over the new tokens: query j sees keys <= p0 + j
            mask = torch.arange(p0 + n, device=x.device)[None, :] <= torch.arange(p0, p0 + n, device=x.device)[:, None]
        o = _sdpa(q, K, V, mask, c.n_heads // c.n_kv)  # [S, nh, n, hd]
        o = o.transpose(1, 2).reshape(S, n, c.n_heads * c.head_dim)
        return o @ L["wo"].T

    def ffn_in(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Normed input of layer i's MoE block, x [..., H]."""
        return rms_norm(x, self.layers[i]["ffn_norm"], self.c.eps)

    def route(self, i: int, h: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k routing of h [T, H]: (expert ids [T, k] int64, weights [T, k] f32, softmax over the top-k)."""
        logits = (h @ self.layers[i]["router"].T).float()  # [T, E]
        top, idx = torch.topk(logits, k, dim=-1)
        w = torch.softmax(top, dim=-1)
        return idx.cpu().numpy(), w.cpu().numpy().astype(np.float32)

    def shared(self, i: int, h: torch.Tensor) -> torch.Tensor | None:
        """Shared expert output for h [T, H], or None when the layer has none."""
        L = self.layers[i]
        if "sh_gate" not in L:
            return None
        y = (Fn.silu(h @ L["sh_gate"].T) * (h @ L["sh_up"].T)) @ L["sh_down"].T
        if "sh_inp" in L:
            y = y * torch.sigmoid(h @ L["sh_inp"].T)
        return y

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [..., V] (float32) of the last hidden states x [..., H]."""
        return (rms_norm(x, self.out_norm, self.c.eps) @ self.out.T).float()
