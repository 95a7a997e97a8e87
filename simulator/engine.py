"""A compact discrete-event kernel: a heap of timed callbacks, serial servers, k-server pools and
fluid (processor-sharing) links whose flows get weighted max-min fair rates, capped per flow,
re-solved whenever a flow starts or ends. Times are seconds, sizes bytes, rates bytes/s.

Why our own kernel and not SimPy (measured, `python benchmarks/bench_simulator.py`, 2 shared cores):
SimPy has no bandwidth sharing between concurrent transfers, so the fluid solver below would be
needed anyway, and its generator processes run 0.61 M timeout events/s (SimPy 4.1.2 measured here
in a side venv, one process yielding 200 k timeouts; DESIGN.md quotes ~0.45 M). This kernel runs 1.1-1.7 M callback events/s (a bare heapq loop 1.9-3.7 M/s) and 170-300 k
fluid events/s with re-solves; a decode layer is ~5 events, so 1,000 DeepSeek-V4.1-Flash tokens
(~192 k events) simulate in ~1.6 s. Numba would pay only for the heap, which is not the cost.
"""
from __future__ import annotations

import heapq
import math
from typing import Callable

INF = math.inf


class Sim:
    """The event loop: `at`/`after` schedule callbacks; `run` pops them in time order (FIFO ties)."""

    def __init__(self, trace: bool = False):
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self.events = 0
        self.log: list[tuple[float, str, str]] | None = [] if trace else None

    def at(self, t: float, fn: Callable, *args) -> None:
        """Run fn(*args) at time t (s)."""
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def after(self, dt: float, fn: Callable, *args) -> None:
        """Run fn(*args) dt seconds from now."""
        self._seq += 1
        heapq.heappush(self._heap, (self.now + dt, self._seq, fn, args))

    def note(self, what: str, name: str) -> None:
        """Append (now, what, name) to the event log when tracing."""
        if self.log is not None:
            self.log.append((self.now, what, name))

    def run(self, until: float = INF) -> float:
        """Process events up to `until` (s); returns the time of the last one."""
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= until:
            t, _, fn, args = pop(heap)
            self.now = t
            self.events += 1
            fn(*args)
        return self.now


class Serial:
    """A FIFO server (GPU stream, copy engine): one job at a time. `submit` takes a known service
    time; `acquire`/`release` hold it for work whose length is decided elsewhere (a flow)."""

    def __init__(self, sim: Sim, name: str):
        self.sim, self.name = sim, name
        self.busy_s = 0.0
        self._held = False
        self._free_at = 0.0
        self._queue: list[tuple[float | None, Callable]] = []
        self._since = 0.0

    def submit(self, service_s: float, done: Callable | None = None) -> None:
        """Queue a job of service_s seconds; done() runs when it completes."""
        if not self._held and not self._queue:
            start = max(self.sim.now, self._free_at)
            self._free_at = start + service_s
            self.busy_s += service_s
            self.sim.log is None or self.sim.note("start", self.name)
            if done is not None:
                self.sim.at(self._free_at, done)
        else:
            self._queue.append((service_s, done))

    def acquire(self, granted: Callable) -> None:
        """granted() runs once every earlier job is done; call release() when finished."""
        if not self._held and not self._queue and self._free_at <= self.sim.now:
            self._grant(granted)
        elif not self._held and not self._queue:
            self._held = True  # reserve now; grant when the last submitted job ends
            self.sim.at(self._free_at, self._grant_reserved, granted)
        else:
            self._queue.append((None, granted))

    def _grant_reserved(self, granted: Callable) -> None:
        self._held = False
        self._grant(granted)

    def _grant(self, granted: Callable) -> None:
        self._held = True
        self._since = self.sim.now
        self.sim.log is None or self.sim.note("acquire", self.name)
        granted()

    def release(self) -> None:
        """End the hold; start queued work."""
        self._held = False
        self.busy_s += self.sim.now - self._since
        self._free_at = self.sim.now
        self.sim.log is None or self.sim.note("release", self.name)
        queue, self._queue = self._queue, []
        for service, cb in queue:
            if service is None:
                self.acquire(cb)
            else:
                self.submit(service, cb)


class Pool:
    """k identical servers (CPU cores); FIFO grants of n units at a time."""

    def __init__(self, sim: Sim, name: str, k: int):
        self.sim, self.name, self.k = sim, name, k
        self.free = k
        self.busy_unit_s = 0.0
        self._last = 0.0
        self._queue: list[tuple[int, Callable]] = []

    def _account(self) -> None:
        self.busy_unit_s += (self.k - self.free) * (self.sim.now - self._last)
        self._last = self.sim.now

    def acquire(self, n: int, granted: Callable) -> None:
        """granted() runs when n servers are free (n is clipped to k)."""
        n = min(n, self.k)
        if not self._queue and self.free >= n:
            self._account()
            self.free -= n
            self.sim.log is None or self.sim.note("acquire", self.name)
            granted()
        else:
            self._queue.append((n, granted))

    def release(self, n: int) -> None:
        """Return n servers; grant waiting requests in order."""
        self._account()
        self.free += min(n, self.k)
        self.sim.log is None or self.sim.note("release", self.name)
        while self._queue and self._queue[0][0] <= self.free:
            m, cb = self._queue.pop(0)
            self.free -= m
            cb()

    @property
    def busy_s(self) -> float:
        """Server-seconds of work divided by k (the pool's busy time)."""
        self._account()
        return self.busy_unit_s / self.k


class Link:
    """A shared bandwidth (PCIe direction, DDR pool, NVMe): capacity bytes/s, bytes carried."""

    __slots__ = ("name", "capacity", "bytes", "busy_s", "load")

    def __init__(self, name: str, capacity: float):
        self.name, self.capacity = name, float(capacity)
        self.bytes = 0.0
        self.busy_s = 0.0  # integral of utilisation (sum of rates / capacity) over time
        self.load = 0.0  # scratch: sum of standalone rates while re-solving


class Flow:
    __slots__ = ("links", "remaining", "cap", "weight", "rate", "done", "name", "solo")

    def __init__(self, links, size, cap, weight, done, name):
        self.links, self.remaining, self.cap, self.weight = links, float(size), cap, weight
        self.rate, self.done, self.name = 0.0, done, name
        self.solo = min([cap] + [ln.capacity for ln in links])  # its rate when alone


class FluidNet:
    """Flows across one or more links share them by weighted max-min fairness (progressive
    filling), each flow also capped by its own rate (a core's compute speed)."""

    def __init__(self, sim: Sim):
        self.sim = sim
        self.links: dict[str, Link] = {}
        self.flows: list[Flow] = []
        self._last = 0.0
        self._version = 0
        self._links: list[Link] = []

    def link(self, name: str, capacity: float) -> Link:
        """Create a link of `capacity` bytes/s."""
        self.links[name] = Link(name, capacity)
        self._links = list(self.links.values())
        return self.links[name]

    def start(self, size: float, links: tuple, done: Callable | None = None, cap: float = INF,
              weight: float = 1.0, name: str = "") -> Flow:
        """Move `size` bytes across `links` (all at once), at most `cap` bytes/s; done() at the end."""
        self._advance()
        flow = Flow(links, size, cap, weight, done, name)
        self.flows.append(flow)
        self.sim.log is None or self.sim.note("flow+", name)
        self._resolve()
        return flow

    def _advance(self) -> None:
        now = self.sim.now
        dt = now - self._last
        if dt > 0:
            for f in self.flows:
                moved = f.rate * dt
                f.remaining -= moved
                for ln in f.links:
                    ln.bytes += moved
                    ln.busy_s += moved / ln.capacity
        self._last = now

    def _resolve(self) -> None:
        """Weighted max-min rates, then one event at the earliest completion."""
        active = self.flows
        if len(active) == 1:  # fast path: one flow alone gets its cap or its narrowest link
            f = active[0]
            f.rate = f.solo
            self._version += 1
            self.sim.at(self.sim.now + f.remaining / f.rate, self._complete, self._version)
            return
        links = self._links
        for ln in links:
            ln.load = 0.0
        for f in active:  # fast path: no link oversubscribed -> every flow runs at its own limit
            f.rate = f.solo
            for ln in f.links:
                ln.load += f.solo
        for ln in links:
            if ln.load > ln.capacity * (1 + 1e-12):
                break
        else:
            self._schedule()
            return
        for f in active:
            f.rate = -1.0
        left = {ln: ln.capacity for f in active for ln in f.links}
        unfrozen = list(active)
        while unfrozen:
            wsum: dict = {}
            for f in unfrozen:
                for ln in f.links:
                    wsum[ln] = wsum.get(ln, 0.0) + f.weight
            levels = []
            for f in unfrozen:
                lv = f.cap / f.weight
                for ln in f.links:
                    lv = min(lv, left[ln] / wsum[ln])
                levels.append(lv)
            level = min(levels)
            still = []
            for f, lv in zip(unfrozen, levels):
                if lv <= level * (1 + 1e-12):
                    f.rate = level * f.weight
                    for ln in f.links:
                        left[ln] = max(0.0, left[ln] - f.rate)
                else:
                    still.append(f)
            unfrozen = still
        self._schedule()

    def _schedule(self) -> None:
        active = self.flows
        self._version += 1
        nxt = INF
        for f in active:
            if f.rate > 0:
                nxt = min(nxt, f.remaining / f.rate)
        if nxt < INF:
            self.sim.at(self.sim.now + max(nxt, 0.0), self._complete, self._version)

    def _complete(self, version: int) -> None:
        if version != self._version:
            return  # superseded by a later re-solve
        self._advance()
        finished = [f for f in self.flows if f.remaining <= 1e-3 or f.remaining <= f.rate * 1e-12]
        if not finished:  # rounding: finish the nearest
            finished = [min(self.flows, key=lambda f: f.remaining / f.rate if f.rate > 0 else INF)]
        for f in finished:
            self.flows.remove(f)
            for ln in f.links:
                ln.bytes += max(f.remaining, 0.0)
            f.remaining = 0.0
            self.sim.log is None or self.sim.note("flow-", f.name)
        self._resolve()
        for f in finished:
            if f.done is not None:
                f.done()
