"""Executor fixtures: the `tiny` model built once per session, and an independent fp32 reference."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from executor.make_model import engram_path, make_model


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Path of the `tiny` preset (with its Engram table), written once per session."""
    return make_model("tiny", tmp_path_factory.mktemp("models") / "tiny.gguf", seed=0, engram=True)


def _rms(x, w, eps):
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps).astype(np.float32) * w


def _rope(x, pos, base, neox):
    """x [N, h, d] at positions pos [N]."""
    d = x.shape[-1]
    ang = pos[:, None].astype(np.float64) * base ** (-np.arange(0, d, 2) / d)  # [N, d/2]
    cos, sin = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
    if neox:
        a, b = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    return out


def reference_logits(path, tokens, engram=None, k=None) -> np.ndarray:
    """Logits [N, V] at every position of `tokens`: plain fp32 numpy, weights via gguf.dequantize, no KV cache."""
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    meta = lambda key: r.fields[f"{arch}.{key}"].contents()  # noqa: E731
    W = {}
    for t in r.tensors:
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        W[t.name.removesuffix(".weight")] = gguf.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
    L, nh, nkv = meta("block_count"), meta("attention.head_count"), meta("attention.head_count_kv")
    hd, eps, base = meta("attention.key_length"), meta("attention.layer_norm_rms_epsilon"), meta("rope.freq_base")
    k = k or meta("expert_used_count")
    neox = arch != "llama"
    tokens = np.asarray(tokens)
    N = len(tokens)
    x = W["token_embd"][tokens]  # [N, H]
    pos = np.arange(N)
    for i in range(L):
        b = f"blk.{i}."
        if engram is not None and i in engram.layers:
            rows = [engram.row_ids(i, list(tokens[: j + 1])) for j in range(N)]
            tab = engram._reader.tensors[0]
            x = x + np.stack([gguf.dequantize(tab.data[rr], tab.tensor_type).reshape(len(rr), -1).mean(0)
                              for rr in rows])
        h = _rms(x, W[b + "attn_norm"], eps)
        q = (h @ W[b + "attn_q"].T).reshape(N, nh, hd)
        kk = (h @ W[b + "attn_k"].T).reshape(N, nkv, hd)
        v = (h @ W[b + "attn_v"].T).reshape(N, nkv, hd)
        if b + "attn_q_norm" in W:
            q, kk = _rms(q, W[b + "attn_q_norm"], eps), _rms(kk, W[b + "attn_k_norm"], eps)
        q, kk = _rope(q, pos, base, neox), _rope(kk, pos, base, neox)
        o = np.zeros((N, nh, hd), np.float32)
        for hh in range(nh):
            kv = hh // (nh // nkv)
            s = q[:, hh] @ kk[:, kv].T / np.sqrt(hd)  # [N, N]
            s = np.where(np.tril(np.ones((N, N), bool)), s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh] = (p / p.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + o.reshape(N, -1) @ W[b + "attn_output"].T
        h = _rms(x, W[b + "ffn_norm"], eps)
        logits = h @ W[b + "ffn_gate_inp"].T  # [N, E]
        y = np.zeros_like(x)
        for t in range(N):
            top = np.argsort(-logits[t], kind="stable")[:k]
            wts = np.exp(logits[t, top] - logits[t, top].max())
            wts /= wts.sum()
            for e, we in zip(top, wts):
                g = W[b + "ffn_gate_exps"][e] @ h[t]
                u = W[b + "ffn_up_exps"][e] @ h[t]
                y[t] += we * (W[b + "ffn_down_exps"][e] @ (g / (1 + np.exp(-g)) * u))
        x = x + y
    return _rms(x, W["output_norm"], eps) @ W["output"].T


@pytest.fixture(scope="session")
def reference():
    """The reference forward: reference(path, tokens, engram=None, k=None) -> logits [N, V]."""
    return reference_logits


@pytest.fixture(scope="session")
def engram_of():
    """engram_of(model_path) -> its Engram table path."""
    return engram_path


class QuantKit:
    """Random expert tensors in a GGUF type, their gguf dequantisation, and the kernels' tolerance check."""

    @staticmethod
    def tensor(rng, qt, E, rows, cols):
        """E random experts [rows, cols] of type qt as an ExpertTensor (bytes as the file holds them)."""
        from executor.gguf_model import EXPERT_TYPES, ExpertTensor
        from executor.make_model import _rand_tensor
        raw = _rand_tensor(rng, (E, rows, cols), qt, cols ** -0.5)
        data = np.ascontiguousarray(raw).view(np.uint8).reshape(E, rows, -1)
        return ExpertTensor(data=data, qtype=qt, code=EXPERT_TYPES[qt], rows=rows, cols=cols)

    @staticmethod
    def deq(w, e: int) -> np.ndarray:
        """Expert e of w dequantised by the gguf package -> [rows, cols] f32."""
        raw = w.data[e] if w.qtype != gguf.GGMLQuantizationType.F16 else w.data[e].view(np.float16)
        return gguf.dequantize(raw, w.qtype).astype(np.float32).reshape(w.rows, w.cols)

    @staticmethod
    def int8_activations(x):
        """vnni.lanes8's rows of the float tokens x [T, C] in a zeroed DX (an int8 build's _quant_rows writes them the
        same way behind quant16's scales) -> (x16 [T, C], unused by the int8 rows, DX)."""
        from executor import vnni
        return np.zeros(x.shape, np.int16), vnni.lanes8_rows(x)

    @staticmethod
    def int8_values(x, dx8):
        """The int8 activations' values x8 dx8 of the float tokens x [T, C] (llama.cpp's Q8_0: x8 = round-to-even(x 127
        / max|x|) per 32-block; dx8 [T, C / 32] as lanes8 wrote them), in float64 -> [T, C]."""
        T, C = x.shape
        a = np.abs(x.reshape(T, C // 32, 32)).max(axis=2, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            x8 = np.where(a > 0, np.rint(x.reshape(T, C // 32, 32) * (np.float32(127.0) / a)), 0.0)
        return (x8 * dx8[:, :, None].astype(np.float64)).reshape(T, C)

    @staticmethod
    def close(got, want, mag, tol=1e-4):
        """|got - want| <= tol * mag elementwise, mag = the sum of |terms| (the one-token Q8_0/Q4_0 path
        quantises activations to int16 per 32-block, <= 1.53e-5 of the block's largest value, so the
        error scales with the terms, not with a result that cancels)."""
        err = np.abs(got - want) / (mag + 1e-30)
        assert err.max() < tol, err.max()


@pytest.fixture(scope="session")
def qk():
    """QuantKit (session-scoped: hypothesis tests take it)."""
    return QuantKit
