"""Device / CPU handover: a device sync plus a thread hand-off to a CPU worker and back.

`tick` arguments are progress callbacks (one call per unit of work); sizes are arguments so tests
run the same code on tiny inputs.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .bench_device import _sync, torch_device
from .sampling import Noise, Tick, low_quantile, sample_clean


@dataclass
class HandoverResult:
    """Round trip: device sync, hand the layer to a CPU worker thread, and back (lower quintile)."""

    device: str
    sync_ms: float  # device op + sync + thread hand-off there and back
    thread_ms: float  # the thread hand-off alone
    iters: int
    noise: Noise = field(default_factory=Noise)
    same_core: bool = False

    def method(self) -> str:
        where = "on one core" if self.same_core else "across cores"
        return (f"torch {self.device} op + sync, queue hand-off to a worker thread and back {where}, "
                f"lower quintile of block medians, {self.iters} round trips, {self.noise.describe()}")


def bench_handover(iters: int = 2000, tick: Tick = None, budget_s: float = 5.0, block: int = 50,
                   same_core: bool = True) -> HandoverResult:
    """The cost of handing a layer from the device to the CPU tier and back.

    `same_core`: run the caller and the worker thread on one core, as a decode loop whose cores
    are awake would see it; across idle cores of a VM the wake-up of a halted vCPU dominates and
    swings 3x with other processes' load (both are in the results store).

    Blocks of `block` round trips, thread-only then with the device op and sync; a block's figure
    is its median, the result the lower quintile of the clean blocks. iters // block ticks."""
    import torch
    dev = torch_device()
    to_w: queue.SimpleQueue = queue.SimpleQueue()
    to_m: queue.SimpleQueue = queue.SimpleQueue()

    pin = None
    if same_core and hasattr(os, "sched_setaffinity"):
        prev_aff = os.sched_getaffinity(0)
        pin = {min(prev_aff)}

    def worker():
        if pin:
            os.sched_setaffinity(0, pin)  # this thread only (Linux: 0 is the calling thread)
        while True:
            item = to_w.get()
            if item is None:
                return
            to_m.put(item)

    if pin:
        os.sched_setaffinity(0, pin)
    th = threading.Thread(target=worker, daemon=True)
    th.start()
    x = torch.ones(16, device=dev)
    lat_t = np.empty(block)
    lat_s = np.empty(block)

    def one(_i):
        for i in range(block):
            t0 = time.perf_counter()
            to_w.put(i)
            to_m.get()
            lat_t[i] = time.perf_counter() - t0
        for i in range(block):
            t0 = time.perf_counter()
            y = x * 2.0
            _sync(dev)
            to_w.put(i)
            to_m.get()
            y.add_(1.0)
            lat_s[i] = time.perf_counter() - t0
        _sync(dev)
        return [("thread", float(np.median(lat_t))), ("sync", float(np.median(lat_s)))]

    try:
        with torch.inference_mode():
            one(0)
            got, noise = sample_clean(one, max(1, iters // block), budget_s, tick=tick, keys=2)
    finally:
        to_w.put(None)
        th.join(5)
        if pin:
            os.sched_setaffinity(0, prev_aff)
    return HandoverResult(device=dev.type, sync_ms=low_quantile(got["sync"]) * 1e3,
                          thread_ms=low_quantile(got["thread"]) * 1e3, iters=iters, noise=noise,
                          same_core=bool(pin))
