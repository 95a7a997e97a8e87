"""Benchmark: a GGUF file's experts read in place through its mmap (the page cache) against copies of them in
anonymous memory (transparent huge pages, 4 KiB pages) and in files written so that their pages lie in physically
contiguous runs of 4 KiB, 64 KiB or whole 2 MiB folios, with llama.cpp's rebuilt vec_dot.

    python benchmarks/bench_weight_pages.py --model small.gguf [--threads 1] [--rounds 30] [--dir runs]

llama.cpp reads the weights it does not repack through its mmap of the file, as the executor reads its experts;
calibrate's decode jobs read synthetic pools in anonymous memory, which numpy puts on huge pages. This times a decode
token of the file's own experts (8 layers, top_k of each layer's experts drawn at random, gate, up and down, one
`bench_rowwise._ggml_matvec` each) from each place in alternating rounds, every page mapped first, and prints each
place's median rate, the median of the rounds' time ratios to the huge-page copies, and each file's page layout
(calibration.page_layout: the share of page boundaries that are physical breaks; needs root). The file's experts must
be of one type with a rebuilt ggml vec_dot. Zen 4 VM, `small.gguf` (Q8_0), one thread:
- 2026-12-06 22:5x, two runs: the page cache 1.100 / 1.112, 4 KiB anonymous pages 1.015 / 1.027; in the morning of
  the same day the page cache and the copies read alike;
- 2026-12-07 01:2x (the file's pages 20% breaks, none in 2 MiB folios), two runs: the page cache 1.347 / 1.273, 4 KiB
  anonymous pages 1.169 / 1.198 (memory as fragmented as the page cache had left it), files in shuffled 4 KiB runs
  1.484 / 1.464, in 64 KiB runs 1.164 / 1.194, in 2 MiB folios 0.972 / 0.996; on two threads 1.123, 1.070, 1.283,
  1.063, 1.001.
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import statistics
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.bench_rowwise import GGML_F16_FORMATS, GGML_INT8_FORMATS, GGML_K_FORMATS, _ggml_matvec  # noqa: E402
from calibration.page_layout import map_file, page_layout, write_in_runs  # noqa: E402
from executor import gemm  # noqa: E402
from specs.gguf_header import model_from_gguf, open_gguf  # noqa: E402

MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15
_libc = ctypes.CDLL(None)


def anonymous_copy(src: np.ndarray, huge: bool, keep: list) -> np.ndarray:
    """src copied into a fresh anonymous mapping, advised onto huge pages or kept off them before the first touch."""
    m = mmap.mmap(-1, src.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    keep.append(m)
    a = np.frombuffer(m, np.uint8)
    _libc.madvise(ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(src.nbytes), MADV_HUGEPAGE if huge else MADV_NOHUGEPAGE)
    out = a.reshape(src.shape)
    out[:] = src
    return out


def file_copy(src: np.ndarray, run_bytes: int | None, folder: Path, keep: list) -> np.ndarray:
    """src written to a file in `folder` in physically contiguous runs of run_bytes (None: 2 MiB folios), mapped back
    read-only; the file is unlinked once mapped (its pages stay while the map does)."""
    path = folder / f"bench-weight-pages-{len(keep)}.bin"
    write_in_runs(path, src, run_bytes, seed=len(keep))
    out = map_file(path).reshape(src.shape)
    keep.append(path)
    path.unlink()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--dir", default="runs", help="folder on the disk the files are written to (not a tmpfs)")
    a = ap.parse_args(argv)
    numba.set_num_threads(a.threads)
    model = model_from_gguf(a.model)
    types = set(model.expert_types())
    fmt = types.pop() if len(types) == 1 else None
    if fmt not in GGML_INT8_FORMATS + GGML_K_FORMATS + GGML_F16_FORMATS:
        print(f"{a.model}: experts of types {sorted(model.expert_types())}: one type with a rebuilt vec_dot needed",
              file=sys.stderr)
        return 2
    tensors = {t.name: t for t in open_gguf(a.model).tensors}
    n, k = model.n_experts, model.top_k
    mapped = [[np.asarray(tensors[f"blk.{i}.ffn_{p}_exps.weight"].data).reshape(n, -1) for p in ("gate", "up", "down")]
              for i in model.layers_moe]
    keep: list = []
    places = {"page cache": mapped,
              "huge pages": [[anonymous_copy(m, True, keep) for m in row] for row in mapped],
              "4 KiB pages": [[anonymous_copy(m, False, keep) for m in row] for row in mapped]}
    folder = Path(a.dir)
    folder.mkdir(parents=True, exist_ok=True)
    for name, run in (("4 KiB runs", 4096), ("64 KiB runs", 65536), ("2 MiB folios", None)):
        places[name] = [[file_copy(m, run, folder, keep) for m in row] for row in mapped]
    code = getattr(gemm, fmt)
    rows = (model.expert_ffn, model.expert_ffn, model.hidden)
    rng = np.random.default_rng(0)
    x = {model.hidden: rng.standard_normal((1, model.hidden)).astype(np.float32),
         model.expert_ffn: rng.standard_normal((1, model.expert_ffn)).astype(np.float32)}
    out = {r: np.empty((k, r), np.float32) for r in set(rows)}

    def token(src, routes):
        for layer, es in zip(src, routes):
            for m, r, cols in zip(layer, rows, (model.hidden, model.hidden, model.expert_ffn)):
                _ggml_matvec(m, es, code, r, x[cols], out[r], a.threads)
    for src in places.values():  # every expert once, so that every page is mapped before the timing
        for g in range(0, n - k + 1, k):
            token(src, [np.arange(g, g + k)] * len(mapped))
    times: dict[str, list[float]] = {p: [] for p in places}
    for i in range(a.rounds):
        routes = [np.sort(rng.permutation(n)[:k]).astype(np.int64) for _ in mapped]
        for p in (list(places) if i % 2 else list(places)[::-1]):
            t0 = time.perf_counter()
            token(places[p], routes)
            times[p].append(time.perf_counter() - t0)
    nbytes = sum(m[0].nbytes for row in mapped for m in row) * k
    rates = "  ".join(f"{p} {nbytes / statistics.median(v) / 1e9:.1f} GB/s" for p, v in times.items())
    ratios = ", ".join(f"{p} {statistics.median(t / h for t, h in zip(times[p], times['huge pages'])):.3f}"
                       for p in places if p != "huge pages")
    print(f"{Path(a.model).name} ({fmt}, {a.threads} thread(s)): {rates} | time against huge pages: {ratios}")
    lay = page_layout(a.model)
    if lay is not None:
        print(f"{Path(a.model).name}'s pages: {100 * lay.breaks:.1f}% of boundaries physical breaks, "
              f"{100 * lay.pmd_share:.0f}% in 2 MiB folios")
    return 0


if __name__ == "__main__":
    sys.exit(main())
