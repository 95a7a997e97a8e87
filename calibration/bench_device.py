"""Torch device: a resident expert's SwiGLU on one token (the time per hit), the dense path's
matrix-vector bandwidth; on CUDA, pinned and pageable H2D bandwidth and the miss path (copy one
expert from pinned RAM, then compute it). torch is imported inside the functions.

`tick` arguments are progress callbacks (one call per unit of work); sizes are arguments so tests
run the same code on tiny inputs.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from .sampling import Noise, Tick, _tick, low_quantile, sample_clean


def torch_device():
    """The torch device the executor uses: CUDA when present, else CPU."""
    import torch
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(dev) -> None:
    import torch
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@dataclass
class HitResult:
    """A resident expert's SwiGLU for one token on the torch device."""

    device: str
    dtype: str
    hidden: int
    ffn: int
    expert_bytes: int
    pool: int
    t_hit_ms: float  # per expert, lower quintile of batch means
    gbs: float  # expert bytes / t_hit
    noise: Noise = field(default_factory=Noise)

    def method(self) -> str:
        return (f"torch {self.device} {self.dtype} SwiGLU expert {self.hidden}x{self.ffn} "
                f"({self.expert_bytes / 1e6:.2f} MB), 1 token, {self.pool} resident experts rotated, "
                f"lower quintile of batch means, {self.noise.describe()}")


def bench_hit(hidden: int = 2048, ffn: int = 768, pool_bytes: int = 256 << 20, calls: int = 200,
              repeats: int = 5, tick: Tick = None, budget_s: float = 5.0) -> HitResult:
    """Median time of one resident expert's SwiGLU (gate, up, down matvecs) for one token.

    A pool of experts larger than the last-level cache is rotated so each call reads its weights
    from device memory. One tick per repeat."""
    import torch
    dev = torch_device()
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    esize = torch.tensor([], dtype=dtype).element_size()
    ebytes = 3 * hidden * ffn * esize
    pool = max(2, int(pool_bytes // ebytes))
    g = torch.randn(pool, ffn, hidden, dtype=dtype, device=dev) * 0.02
    u = torch.randn(pool, ffn, hidden, dtype=dtype, device=dev) * 0.02
    d = torch.randn(pool, hidden, ffn, dtype=dtype, device=dev) * 0.02
    x = torch.randn(hidden, dtype=dtype, device=dev)

    def one(i):
        h = torch.nn.functional.silu(torch.mv(g[i], x)) * torch.mv(u[i], x)
        return torch.mv(d[i], h)

    def batch(_i):
        t0 = time.perf_counter()
        for c in range(calls):
            one(c % pool)
        _sync(dev)
        return [("hit", (time.perf_counter() - t0) / calls)]

    with torch.inference_mode():
        for i in range(min(pool, 4)):
            one(i)
        _sync(dev)
        per, noise = sample_clean(batch, repeats, budget_s, tick=tick)
    t = low_quantile(per["hit"])
    return HitResult(noise=noise, device=dev.type, dtype=str(dtype).replace("torch.", ""), hidden=hidden, ffn=ffn,
                     expert_bytes=ebytes, pool=pool, t_hit_ms=t * 1e3, gbs=ebytes / t / 1e9)


@dataclass
class DenseResult:
    """Dense-path matrix-vector bandwidth on the torch device."""

    device: str
    dtype: str
    matrix_bytes: int
    gbs: float  # best
    median_gbs: float
    repeats: int
    noise: Noise = field(default_factory=Noise)

    def method(self) -> str:
        return (f"torch {self.device} {self.dtype} matrix-vector over {self.matrix_bytes / 2**20:.0f} MiB, "
                f"best of {self.repeats}, {self.noise.describe()}")


def bench_dense(matrix_bytes: int = 1 << 30, hidden: int = 4096, repeats: int = 10,
                tick: Tick = None, budget_s: float = 5.0) -> DenseResult:
    """y = W x with W of `matrix_bytes` on the device (the dense path reads every weight once)."""
    import torch
    dev = torch_device()
    dtype = torch.float16 if dev.type == "cuda" else torch.float32
    esize = torch.tensor([], dtype=dtype).element_size()
    rows = max(16, int(matrix_bytes // (hidden * esize)))
    w = torch.randn(rows, hidden, dtype=dtype, device=dev)
    x = torch.randn(hidden, dtype=dtype, device=dev)
    nbytes = rows * hidden * esize
    def one(_i):
        t0 = time.perf_counter()
        torch.mv(w, x)
        _sync(dev)
        return [("mv", time.perf_counter() - t0)]

    with torch.inference_mode():
        torch.mv(w, x)
        _sync(dev)
        got, noise = sample_clean(one, repeats, budget_s, min_window_s=0.1, tick=tick)
    times = got["mv"]
    return DenseResult(noise=noise, device=dev.type, dtype=str(dtype).replace("torch.", ""), matrix_bytes=nbytes,
                       gbs=nbytes / min(times) / 1e9, median_gbs=nbytes / statistics.median(times) / 1e9,
                       repeats=repeats)


@dataclass
class H2DResult:
    """Host-to-device copy bandwidth (CUDA only) and the miss path for one expert."""

    nbytes: int
    pinned_gbs: float
    pageable_gbs: float
    repeats: int
    expert_bytes: int = 0
    t_miss_ms: float = 0.0  # copy one expert from pinned RAM + its SwiGLU on the device

    def method(self, kind: str) -> str:
        return f"torch.cuda {kind} H2D copy of {self.nbytes / 2**20:.0f} MiB, best of {self.repeats}"


def bench_h2d(nbytes: int = 1 << 30, repeats: int = 5, hidden: int = 2048, ffn: int = 768,
              miss_calls: int = 50, tick: Tick = None) -> H2DResult | None:
    """Pinned and pageable H2D GB/s, and the miss path (H2D of one fp16 expert, then compute).

    None without CUDA. One tick per repeat of each kind, plus one for the miss path."""
    import torch
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    out = {}
    for kind in ("pinned", "pageable"):
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=(kind == "pinned"))
        src.fill_(1)
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            _tick(tick)
        out[kind] = nbytes / min(times) / 1e9
        del src
    # miss path: a pinned home copy of several experts, copied over and computed one at a time
    n = 8
    host = torch.randn(n, 3, ffn * hidden, dtype=torch.float16).pin_memory()
    slot = torch.empty(3, ffn * hidden, dtype=torch.float16, device=dev)
    x = torch.randn(hidden, dtype=torch.float16, device=dev)
    with torch.inference_mode():
        def miss(i):
            slot.copy_(host[i % n], non_blocking=True)
            g, u, d = slot[0].view(ffn, hidden), slot[1].view(ffn, hidden), slot[2].view(hidden, ffn)
            return torch.mv(d, torch.nn.functional.silu(torch.mv(g, x)) * torch.mv(u, x))
        miss(0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(miss_calls):
            miss(i)
        torch.cuda.synchronize()
        t_miss = (time.perf_counter() - t0) / miss_calls
    _tick(tick)
    return H2DResult(nbytes=nbytes, pinned_gbs=out["pinned"], pageable_gbs=out["pageable"], repeats=repeats,
                     expert_bytes=3 * ffn * hidden * 2, t_miss_ms=t_miss * 1e3)
