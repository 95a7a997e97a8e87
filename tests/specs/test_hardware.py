"""CPU expert rates by thread count: a measured rate at that count wins, else linear scaling."""
import pytest

from specs.figure import Figure
from specs.formats import parse_format
from specs.loaders import load_hardware


def _cpu(**rates):
    hw = load_hardware("epyc8ch-3090")
    gbs = {k: Figure(v, "measured", "test") for k, v in rates.items()}
    return hw.cpu.model_copy(update={"expert_gbs": gbs, "threads_used": 2})


def test_measured_one_thread_rate_is_used_for_one_thread():
    """calibrate's 'Q8_0@1t' (one core reads more than half of a bus-bound two-core rate) is what
    one thread gets; two threads get the all-core figure."""
    cpu = _cpu(Q8_0=30.0, **{"Q8_0@1t": 17.0}, default=20.0)
    q8 = parse_format("Q8_0")
    assert cpu.expert_gbs_for(q8, 1) == 17.0
    assert cpu.expert_gbs_for(q8, 2) == cpu.expert_gbs_for(q8) == 30.0


def test_without_a_measurement_the_rate_scales_with_threads():
    """No rate at that thread count: the threads_used rate times threads / threads_used."""
    cpu = _cpu(default=20.0)
    assert cpu.expert_gbs_for(parse_format("Q4_0"), 1) == pytest.approx(10.0)
    assert cpu.expert_gbs_for(parse_format("Q4_0"), 4) == pytest.approx(40.0)
