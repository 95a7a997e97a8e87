"""What touching memory the first time costs here: why a benchmark's pools cost calibrate more than their work.

Fills a fresh 1 GiB array `--fresh` times (each held, so every one takes frames the process never had), then frees
them all and fills 1 GiB again right away, after 5 s and after 20 s. On the Firecracker VM of session 52 (kernel
6.18, virtio_balloon with free page reporting, its feature bit 5) a fresh GiB took 4.8-6.0 s, one right after a free
0.13 s, 5 s after 0.14 s, 20 s after 5.0 s: the guest reports the frames it has freed to the host within seconds,
and the host's faults back them again at ~0.2 GB/s. On bare metal each fill is ~0.1-0.3 s. calibrate therefore times
a format's page-run jobs together and frees their pools before the next format's are written
(calibrate._time_page_runs).

    python benchmarks/bench_first_touch.py [--fresh 3] [--gib 1]
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def fill_s(nbytes: int) -> tuple[float, np.ndarray]:
    """Seconds to allocate and fill `nbytes` (bytes) with ones, and the array."""
    t0 = time.perf_counter()
    a = np.ones(nbytes, np.uint8)
    return time.perf_counter() - t0, a


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fresh", type=int, default=3, help="fresh fills, each held (default 3)")
    ap.add_argument("--gib", type=float, default=1.0, help="GiB a fill (default 1)")
    a = ap.parse_args(argv)
    n = int(a.gib * (1 << 30))
    held = []
    for i in range(a.fresh):
        s, arr = fill_s(n)
        held.append(arr)
        print(f"fresh {a.gib:g} GiB ({i + 1}/{a.fresh}): {s:.2f} s ({n / s / 1e9:.2f} GB/s)", flush=True)
    held.clear()
    for wait in (0, 5, 20):
        time.sleep(wait)
        s, arr = fill_s(n)
        del arr
        print(f"{wait:2d} s after a free: {s:.2f} s ({n / s / 1e9:.2f} GB/s)", flush=True)


if __name__ == "__main__":
    main()
