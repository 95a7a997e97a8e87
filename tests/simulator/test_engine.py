"""The event kernel: exact event logs for each resource kind; each test states the semantics."""
import math

import pytest

from simulator.engine import FluidNet, Pool, Serial, Sim


def test_events_fire_in_time_order_fifo_on_ties():
    """Callbacks run in time order; equal times run in scheduling order."""
    sim, seen = Sim(), []
    sim.at(2.0, seen.append, "c")
    sim.at(1.0, seen.append, "a")
    sim.at(1.0, seen.append, "b")
    assert sim.run() == 2.0 and seen == ["a", "b", "c"] and sim.events == 3


def test_serial_server_queues_fifo():
    """Jobs of 1 s and 2 s submitted at t=0 on one server finish at 1 s and 3 s; busy 3 s."""
    sim, done = Sim(trace=True), []
    gpu = Serial(sim, "gpu")
    gpu.submit(1.0, lambda: done.append(("a", sim.now)))
    gpu.submit(2.0, lambda: done.append(("b", sim.now)))
    sim.run()
    assert done == [("a", 1.0), ("b", 3.0)] and gpu.busy_s == 3.0


def test_serial_acquire_waits_for_submitted_work():
    """A hold requested while a 1 s job runs is granted at 1 s; a job queued behind the hold starts
    at its release (t=1.5) and ends at 2.0."""
    sim, log = Sim(trace=True), []
    gpu = Serial(sim, "gpu")
    gpu.submit(1.0)
    gpu.acquire(lambda: (log.append(("held", sim.now)), sim.after(0.5, gpu.release)))
    gpu.submit(0.5, lambda: log.append(("job", sim.now)))
    sim.run()
    assert log == [("held", 1.0), ("job", 2.0)]
    assert [e[1] for e in sim.log] == ["start", "acquire", "release", "start"]
    assert [e[0] for e in sim.log] == [0.0, 1.0, 1.5, 1.5]
    assert gpu.busy_s == pytest.approx(2.0)


def test_pool_grants_k_servers():
    """A 2-core pool: requests of 2, 1 and 1 cores; the second waits until the first releases."""
    sim, log = Sim(), []
    cpu = Pool(sim, "cpu", 2)
    cpu.acquire(2, lambda: (log.append(("a", sim.now)), sim.after(1.0, cpu.release, 2)))
    cpu.acquire(1, lambda: (log.append(("b", sim.now)), sim.after(1.0, cpu.release, 1)))
    cpu.acquire(1, lambda: (log.append(("c", sim.now)), sim.after(3.0, cpu.release, 1)))
    sim.run()
    assert log == [("a", 0.0), ("b", 1.0), ("c", 1.0)]
    assert cpu.busy_s == pytest.approx((2 * 1 + 1 * 1 + 1 * 3) / 2)


def test_fluid_link_processor_sharing():
    """Two equal flows of 10 and 20 bytes on a 10 B/s link: both at 5 B/s, the first ends at 2 s,
    then the second runs alone at 10 B/s and ends at 3 s."""
    sim, log = Sim(trace=True), []
    net = FluidNet(sim)
    link = net.link("ddr", 10.0)
    net.start(10, (link,), lambda: log.append(("a", sim.now)), name="a")
    net.start(20, (link,), lambda: log.append(("b", sim.now)), name="b")
    sim.run()
    assert log == [("a", pytest.approx(2.0)), ("b", pytest.approx(3.0))]
    assert link.bytes == pytest.approx(30.0) and link.busy_s == pytest.approx(3.0)
    assert [e[1:] for e in sim.log] == [("flow+", "a"), ("flow+", "b"), ("flow-", "a"), ("flow-", "b")]


def test_fluid_per_flow_cap_leaves_bandwidth_to_others():
    """Flow a is capped at 2 B/s on a 10 B/s link; b gets the other 8 B/s (max-min fairness)."""
    sim, log = Sim(), []
    net = FluidNet(sim)
    link = net.link("ddr", 10.0)
    net.start(4, (link,), lambda: log.append(("a", sim.now)), cap=2.0)
    net.start(16, (link,), lambda: log.append(("b", sim.now)))
    sim.run()
    assert log == [("a", pytest.approx(2.0)), ("b", pytest.approx(2.0))]


def test_fluid_multi_link_bottleneck():
    """A zero-copy flow crosses PCIe (4 B/s) and DDR (10 B/s); a CPU flow uses DDR only. The
    zero-copy flow is held to 4 by PCIe, so the CPU flow gets the 6 B/s left of DDR."""
    sim, log = Sim(), []
    net = FluidNet(sim)
    pcie, ddr = net.link("pcie", 4.0), net.link("ddr", 10.0)
    net.start(8, (pcie, ddr), lambda: log.append(("zc", sim.now)))
    net.start(12, (ddr,), lambda: log.append(("cpu", sim.now)))
    sim.run()
    assert log == [("zc", pytest.approx(2.0)), ("cpu", pytest.approx(2.0))]
    assert ddr.bytes == pytest.approx(20.0) and pcie.bytes == pytest.approx(8.0)


def test_fluid_weight_counts_as_that_many_flows():
    """A flow of weight 3 gets 3/4 of the link against one flow of weight 1."""
    sim, log = Sim(), []
    net = FluidNet(sim)
    link = net.link("ddr", 8.0)
    net.start(12, (link,), lambda: log.append(("w3", sim.now)), weight=3.0)
    net.start(4, (link,), lambda: log.append(("w1", sim.now)))
    sim.run()
    assert log == [("w3", pytest.approx(2.0)), ("w1", pytest.approx(2.0))]


def test_flow_started_mid_transfer_resolves_rates():
    """A 10 B flow alone at 10 B/s; at t=0.5 a second 10 B flow joins: both at 5 B/s, the first
    ends at 1.5 s, the second at 2.0 s."""
    sim, log = Sim(), []
    net = FluidNet(sim)
    link = net.link("pcie", 10.0)
    net.start(10, (link,), lambda: log.append(("a", sim.now)))
    sim.at(0.5, lambda: net.start(10, (link,), lambda: log.append(("b", sim.now))))
    sim.run()
    assert log == [("a", pytest.approx(1.5)), ("b", pytest.approx(2.0))]
    assert math.isclose(link.bytes, 20.0)
