"""The dense path in torch (CUDA when present, else CPU; same code): norms, RoPE, GQA attention with
Q/K norm and a KV cache, the router, the output head. Streams decode in lock-step: tensors are
[S, n, ...] (S streams, n new tokens each)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as Fn

from . import dense_kernels as dk
from . import kernels as kern
from .attention import attn_cached
from .gemm import deq_rows
from .gguf_model import EXPERT_TYPES, GGUFModel


def pick_device(want_gpu: bool = True) -> torch.device:
    """CUDA when present and wanted, else the CPU."""
    return torch.device("cuda") if want_gpu and torch.cuda.is_available() else torch.device("cpu")


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, fast: bool = False) -> torch.Tensor:
    """RMSNorm over the last dim, times weight w (fast: numba on CPU float32, no per-op overhead)."""
    if fast and x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous():
        out = torch.empty_like(x)
        dk.rms_rows(x.view(-1, x.shape[-1]).numpy(), w.numpy(), eps, out.view(-1, x.shape[-1]).numpy())
        return out
    if hasattr(Fn, "rms_norm"):  # torch >= 2.4: one op
        return Fn.rms_norm(x, w.shape, w, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_table(ctx: int, d: int, base: float, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [ctx, d/2] of the rotary angles (computed in float64)."""
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # [d/2]
    ang = torch.arange(ctx, dtype=torch.float64)[:, None] * inv[None, :]  # [ctx, d/2]
    return ang.cos().to(device, dtype), ang.sin().to(device, dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """Rotary embedding of x [..., d] with cos/sin broadcastable to [..., d/2]; 'neox' (halves) or 'norm' (pairs)."""
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


class Linear:
    """y = x W^T for weights stacked from GGUF tensors `names`: on the CPU read in place by the numba
    kernels (F16 / Q8_0 / Q4_0), elsewhere (or for other types) dequantised once to a torch tensor."""

    def __init__(self, model: GGUFModel, names: list[str], device, dtype, inplace: bool):
        parts = [model.inplace(n) for n in names] if inplace else [None]
        self.parts = parts if all(p is not None for p in parts) else None
        self.w = None
        if self.parts is None:
            ws = [torch.from_numpy(model.dense(n)).to(device=device, dtype=dtype) for n in names]
            self.w = ws[0] if len(ws) == 1 else torch.cat(ws)
        self.rows = sum(p[2] for p in self.parts) if self.parts else self.w.shape[0]
        self._stack = None  # kernels._parts' weight arguments (absent parts padded), bytes: bound once
        if self.parts and len(self.parts) <= 3:
            ps = list(self.parts) + [(self.parts[0][0][:0], self.parts[0][1], 0, None)] * (3 - len(self.parts))
            self._stack = (tuple(v for p in ps for v in p[:3]), sum(p[0].nbytes for p in self.parts))

    def nbytes(self) -> int:
        """Bytes read per token."""
        return sum(p[0].nbytes for p in self.parts) if self.parts else self.w.numel() * self.w.element_size()

    def np(self, x2: np.ndarray, serial_bytes: int = kern._SERIAL_BYTES) -> np.ndarray:
        """CPU: x2 [T, cols] float32 -> [T, rows] float32 numpy (stacked parts in one kernel call; weight
        bytes x tokens under serial_bytes on the calling thread)."""
        if self.w is not None:
            return Fn.linear(torch.from_numpy(x2), self.w).numpy()
        if self._stack is not None:  # kernels.linear_parts without its per-call argument building
            x2 = np.ascontiguousarray(x2, dtype=np.float32)
            out = np.empty((x2.shape[0], self.rows), np.float32)
            args, nbytes = self._stack
            (kern._parts_serial if nbytes * x2.shape[0] < serial_bytes else kern._parts)(*args, x2, out)
            return out
        return np.concatenate([kern.linear(flat, code, rows, x2) for flat, code, rows, _ in self.parts], axis=1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., cols] -> [..., rows]."""
        if self.w is not None:
            return Fn.linear(x, self.w)
        y = self.np(x.reshape(-1, x.shape[-1]).float().contiguous().numpy())
        return torch.from_numpy(y).to(x.dtype).view(*x.shape[:-1], self.rows)


class Dense:
    """Dense weights on `device`: read in place on the CPU (numba kernels), else dequantised once to
    `dtype` tensors; norms and routers as tensors; the embedding is read by rows."""

    def __init__(self, model: GGUFModel, device: torch.device, dtype=torch.float32, inplace: bool | None = None):
        self.m, self.c, self.device, self.dtype = model, model.cfg, device, dtype
        inplace = device.type == "cpu" and inplace is not False  # the kernels read host memory only
        self.fast = inplace and device.type == "cpu" and dtype == torch.float32  # numba small ops too
        t = lambda name: torch.from_numpy(model.dense(name)).to(device=device, dtype=dtype)  # noqa: E731
        lin = lambda *names: Linear(model, list(names), device, dtype, inplace)  # noqa: E731
        self.layers = []
        for i in range(self.c.n_layers):
            b = f"blk.{i}."
            wqkv = lin(b + "attn_q.weight", b + "attn_k.weight", b + "attn_v.weight")
            L = dict(attn_norm=t(b + "attn_norm.weight"), wqkv=wqkv, wo=lin(b + "attn_output.weight"),
                     ffn_norm=t(b + "ffn_norm.weight"), router=t(b + "ffn_gate_inp.weight"))
            if self.c.qk_norm:
                L["q_norm"], L["k_norm"] = t(b + "attn_q_norm.weight"), t(b + "attn_k_norm.weight")
            if model.has(b + "ffn_gate_shexp.weight"):  # shared expert (qwen2moe style)
                L["sh_gate"], L["sh_up"] = t(b + "ffn_gate_shexp.weight"), t(b + "ffn_up_shexp.weight")
                L["sh_down"] = t(b + "ffn_down_shexp.weight")
                if model.has(b + "ffn_gate_inp_shexp.weight"):
                    L["sh_inp"] = t(b + "ffn_gate_inp_shexp.weight").reshape(1, -1)
            self.layers.append(L)
        # numpy views of the small tensors, for the CPU path
        self.np_layers = [{k: v.numpy() for k, v in L.items() if isinstance(v, torch.Tensor)} for L in self.layers] \
            if self.fast else None
        self.out_norm = t("output_norm.weight")
        self.out = lin("output.weight" if model.has("output.weight") else "token_embd.weight")  # [V, H]
        self._rope = None
        self._out_norm_np = self.out_norm.numpy() if self.fast else None
        self._embd = None  # (token_embd bytes [V, row bytes], type code) for embed_np, once

    def nbytes_per_token(self) -> int:
        """Bytes of dense weights read per decode step (all dense tensors plus one embedding row)."""
        size = lambda v: v.nbytes() if isinstance(v, Linear) else v.numel() * v.element_size()  # noqa: E731
        n = sum(size(v) for L in self.layers for v in L.values())
        return n + size(self.out) + size(self.out_norm) + self.c.hidden * 4

    def embed(self, ids: np.ndarray) -> torch.Tensor:
        """Embeddings of token ids [S, n] -> [S, n, H] (only those rows are read from the mmap)."""
        S, n = ids.shape
        rows = self.m.rows("token_embd.weight", ids.reshape(-1))
        return torch.from_numpy(rows).to(device=self.device, dtype=self.dtype).reshape(S, n, -1)

    def embed_np(self, ids: np.ndarray) -> np.ndarray:
        """embed() for the CPU path: token ids [S, n] -> f32 numpy [S * n, H]."""
        if self._embd is None:
            t = self.m.tensors["token_embd.weight"]
            code = EXPERT_TYPES.get(t.tensor_type)
            self._embd = (np.asarray(t.data).view(np.uint8).reshape(int(t.shape[1]), -1), code) if code else ()
        if not self._embd:  # a type the numba dequantiser does not read
            return self.m.rows("token_embd.weight", ids.reshape(-1)).astype(np.float32, copy=False)
        tab, code = self._embd
        out = np.empty((ids.size, self.c.hidden), np.float32)
        deq_rows(code, tab[ids.reshape(-1)], out)  # the rows GGUFModel.rows reads, without its per-call lookups
        return out

    def head_np(self, x: np.ndarray) -> np.ndarray:
        """head() for the CPU path: last hidden states x [S, H] f32 numpy -> logits [S, V] f32 numpy (nothing
        else computes on the cores here: products above SERIAL_BYTES_HOT across threads, same bits)."""
        xs = np.ascontiguousarray(x)
        h = np.empty_like(xs)
        dk.rms_rows(xs, self._out_norm_np, self.c.eps, h)
        return self.out.np(h, kern.SERIAL_BYTES_HOT)

    def _rope_np(self, need: int, ctx: int) -> tuple[np.ndarray, np.ndarray]:
        """numpy views of the rotary cos / sin table covering `need` positions (at least ctx)."""
        if self._rope is None or self._rope[0].shape[0] < need:
            self._rope = rope_table(max(need, ctx), self.c.head_dim, self.c.rope_base, self.device, self.dtype)
        return self._rope[0].numpy(), self._rope[1].numpy()

    def _attention_cpu(self, i: int, x: torch.Tensor, kv: KVCache) -> torch.Tensor:
        """attention() on the CPU in numpy / numba: one kernel call per step (norm, fused QKV, Q/K norm and
        RoPE, cached attention, output projection), no torch ops."""
        c, L = self.c, self.layers[i]
        Ln = self.np_layers[i]
        S, n, H = x.shape
        T, p0 = S * n, kv.len
        kc, vc = kv.k[i].numpy(), kv.v[i].numpy()
        if p0 + n > kc.shape[2]:
            raise ValueError(f"KV cache of {kc.shape[2]} tokens cannot take {p0 + n}")
        xs = x.reshape(T, H).numpy()
        cos, sin = self._rope_np(p0 + n, kc.shape[2])
        qn, kn = (Ln["q_norm"], Ln["k_norm"]) if c.qk_norm else (self._out_norm_np, self._out_norm_np)
        pq, po = L["wqkv"].parts, L["wo"].parts
        if pq is not None and len(pq) == 3 and po is not None and len(po) == 1:  # one kernel call
            out = np.empty((T, H), np.float32)
            dk.attention_step(xs, Ln["attn_norm"], c.eps, pq[0][0], pq[0][1], pq[0][2], pq[1][0], pq[1][1],
                              pq[1][2], pq[2][0], pq[2][1], pq[2][2], qn, kn, cos[p0:p0 + n], sin[p0:p0 + n],
                              c.n_heads, c.n_kv, c.rope_style == "neox", c.qk_norm, kc, vc, p0, n,
                              po[0][0], po[0][1], po[0][2], out, False)  # the caller adds the residual
            return torch.from_numpy(out).view(S, n, H)
        h = np.empty_like(xs)
        dk.rms_rows(xs, Ln["attn_norm"], c.eps, h)
        qkv = L["wqkv"].np(h).reshape(T, c.n_heads + 2 * c.n_kv, c.head_dim)
        dk.qk_post(qkv, qn, kn, c.eps, cos[p0:p0 + n], sin[p0:p0 + n], c.n_heads, c.n_kv,
                     c.rope_style == "neox", c.qk_norm)
        o = np.empty((T, c.n_heads * c.head_dim), np.float32)
        attn_cached(qkv, kc, vc, p0, n, c.n_heads, c.n_kv, o)
        return torch.from_numpy(L["wo"].np(o)).view(S, n, H)

    def attention(self, i: int, x: torch.Tensor, kv: KVCache) -> torch.Tensor:
        """Attention block of layer i on x [S, n, H] (pre-norm inside), appending to kv -> [S, n, H]."""
        c, L = self.c, self.layers[i]
        S, n, _ = x.shape
        if self.fast and x.is_contiguous() and x.dtype == torch.float32 and kv.k[i].dtype == torch.float32:
            return self._attention_cpu(i, x, kv)
        h = rms_norm(x, L["attn_norm"], c.eps, self.fast)
        qkv = L["wqkv"](h).view(S, n, c.n_heads + 2 * c.n_kv, c.head_dim)  # [S, n, nh + 2 nkv, hd]
        nq = c.n_heads + c.n_kv
        p0 = kv.len
        if self._rope is None or self._rope[0].shape[0] < p0 + n:
            self._rope = rope_table(max(p0 + n, kv.k[i].shape[2]), c.head_dim, c.rope_base, x.device, x.dtype)
        cos, sin = self._rope[0][p0:p0 + n], self._rope[1][p0:p0 + n]  # [n, hd/2]
        if self.fast and qkv.is_contiguous():  # numba, in place
            qn, kn = (L["q_norm"], L["k_norm"]) if c.qk_norm else (self.out_norm, self.out_norm)
            dk.qk_post(qkv.view(S * n, -1, c.head_dim).numpy(), qn.numpy(), kn.numpy(), c.eps, cos.numpy(),
                      sin.numpy(), c.n_heads, c.n_kv, c.rope_style == "neox", c.qk_norm)
            qk = qkv[:, :, :nq].transpose(1, 2)
            q, k, v = qk[:, :c.n_heads], qk[:, c.n_heads:], qkv[:, :, nq:].transpose(1, 2)
        else:
            q, k, v = self.qkv_heads(i, qkv, cos[:, None], sin[:, None])
        kv.k[i][:, :, p0:p0 + n] = k
        kv.v[i][:, :, p0:p0 + n] = v
        K, V = kv.k[i][:, :, : p0 + n], kv.v[i][:, :, : p0 + n]  # [S, nkv, T, hd]
        mask = None
        if n > 1:  # causal over the new tokens: query j sees keys <= p0 + j
            mask = torch.arange(p0 + n, device=x.device)[None, :] <= torch.arange(p0, p0 + n, device=x.device)[:, None]
        o = _sdpa(q, K, V, mask, c.n_heads // c.n_kv)  # [S, nh, n, hd]
        o = o.transpose(1, 2).reshape(S, n, c.n_heads * c.head_dim)
        return L["wo"](o)

    def qkv_heads(self, i: int, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Layer i's fused projection qkv [S, n, nh + 2 nkv, hd] -> q [S, nh, n, hd] and k [S, nkv, n, hd]
        (Q/K norm, then RoPE with cos / sin [n or 1, 1, hd/2]), and v [S, nkv, n, hd]."""
        c, L = self.c, self.layers[i]
        nh, nq = c.n_heads, c.n_heads + c.n_kv
        q, k = qkv[:, :, :nh], qkv[:, :, nh:nq]
        if c.qk_norm:
            q, k = rms_norm(q, L["q_norm"], c.eps), rms_norm(k, L["k_norm"], c.eps)
        q, k = (rope(t, cos, sin, c.rope_style).transpose(1, 2) for t in (q, k))
        return q, k, qkv[:, :, nq:].transpose(1, 2)

    def top_k(self, i: int, h: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's router on h [T, H] -> (softmax over the top-k [T, k] f32, expert ids [T, k] int64), on
        h's device."""
        top, idx = torch.topk(Fn.linear(h, self.layers[i]["router"]).float(), k, dim=-1)  # [T, k]
        return torch.softmax(top, dim=-1), idx

    def ffn_in(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """Normed input of layer i's MoE block, x [..., H]."""
        return rms_norm(x, self.layers[i]["ffn_norm"], self.c.eps, self.fast)

    def route(self, i: int, h: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k routing of h [T, H]: (expert ids [T, k] int64, weights [T, k] f32, softmax over the top-k)."""
        w, idx = self.top_k(i, h, k)
        both = torch.cat([w, idx.float()], dim=-1).cpu().numpy()  # one device-to-host copy (ids < 2^24: exact)
        return both[:, k:].astype(np.int64), np.ascontiguousarray(both[:, :k], dtype=np.float32)

    def ffn_route(self, i: int, x: torch.Tensor, k: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
        """ffn_in then route of x [S, n, H] -> (h [T, H], expert ids [T, k] int64, weights [T, k] f32);
        on the CPU fast path one numba call."""
        if self.fast and x.is_contiguous() and x.dtype == torch.float32:
            Ln = self.np_layers[i]
            xs = x.reshape(-1, x.shape[-1]).numpy()
            h = np.empty_like(xs)
            ids = np.empty((xs.shape[0], k), np.int64)
            w = np.empty((xs.shape[0], k), np.float32)
            dk.norm_route(xs, Ln["ffn_norm"], self.c.eps, Ln["router"], k, h, ids, w)
            return torch.from_numpy(h), ids, w
        h = self.ffn_in(i, x).reshape(-1, x.shape[-1])
        ids, w = self.route(i, h, k)
        return h, ids, w

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
        return self.out(rms_norm(x.contiguous(), self.out_norm, self.c.eps, self.fast)).float()
