"""The fused attention block runs in a fresh process (torch loaded first) before any other parallel kernel."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import torch
torch.randn(1 << 20).sum()  # torch first, its thread pool started (as in the executor)
import numpy as np
from executor.dense_kernels import attention_step
rng = np.random.default_rng(0)
H, hd, nh, nkv = 2048, 128, 16, 4
def f16(r, c):
    a = (rng.standard_normal((r, c), dtype=np.float32) * 0.02).astype(np.float16).view(np.uint8).ravel()
    a.setflags(write=False)  # weights are read-only views of the model file's mmap
    return a
wq, wk, wv, wo = f16(nh * hd, H), f16(nkv * hd, H), f16(nkv * hd, H), f16(H, nh * hd)
x = rng.standard_normal((1, H)).astype(np.float32)
kc = np.zeros((1, nkv, 8, hd), np.float32); vc = np.zeros_like(kc); out = np.empty((1, H), np.float32)
one = np.ones(hd, np.float32)
attention_step(x, np.ones(H, np.float32), 1e-6, wq, 1, nh * hd, wk, 1, nkv * hd, wv, 1, nkv * hd, one, one,
               np.ones((1, hd // 2), np.float32), np.zeros((1, hd // 2), np.float32), nh, nkv, True, True,
               kc, vc, 0, 1, wo, 1, H, out, False)
print(float(np.abs(out).sum()) > 0)
"""


def test_attention_step_with_parallel_products_in_a_fresh_process():
    """Weights above the serial threshold make attention_step call the parallel product from compiled
    code: numba's threads must already run (a first call used to segfault)."""
    r = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "True"


def test_attention_step_residual_adds_its_output_to_the_input():
    """residual=True (the CPU step's call) leaves xs + out in xs, the bits numpy's add gives, and the same
    out as without it."""
    import numpy as np
    from executor.dense_kernels import attention_step
    rng = np.random.default_rng(1)
    H, hd, nh, nkv = 64, 16, 4, 2

    def f16(r, c):
        return (rng.standard_normal((r, c), dtype=np.float32) * 0.1).astype(np.float16).view(np.uint8).ravel()
    wq, wk, wv, wo = f16(nh * hd, H), f16(nkv * hd, H), f16(nkv * hd, H), f16(H, nh * hd)
    one = np.ones(hd, np.float32)
    cs = (np.ones((2, hd // 2), np.float32), np.zeros((2, hd // 2), np.float32))
    x0 = rng.standard_normal((2, H)).astype(np.float32)
    outs = []
    for residual in (False, True):
        x, out = x0.copy(), np.empty((2, H), np.float32)
        kc = np.zeros((1, nkv, 8, hd), np.float32)
        vc = np.zeros_like(kc)
        attention_step(x, np.ones(H, np.float32), 1e-6, wq, 1, nh * hd, wk, 1, nkv * hd, wv, 1, nkv * hd, one, one,
                       *cs, nh, nkv, True, True, kc, vc, 0, 2, wo, 1, H, out, residual)
        outs.append((x, out))
    (x_plain, out_plain), (x_res, out_res) = outs
    assert np.array_equal(out_res.view(np.uint32), out_plain.view(np.uint32))
    assert np.array_equal(x_plain, x0)
    assert np.array_equal(x_res.view(np.uint32), (x0 + out_plain).view(np.uint32))
