"""Engram rows on the critical path (page-cache state over requests, inline gather) and stream-all
staging (copies in batches through slots, with or without the next layer's prefetch)."""
import math

import pytest

from simulator.engram import EngramText, gather_s, pages_per_row
from simulator.policies import expected_touched
from simulator.resources import Constants
from simulator.run import simulate
from specs.plan import Prefill

from sim_fixtures import machine, tiered, tiny_model


def test_shared_text_is_cold_only_past_what_earlier_requests_read():
    """D119's scan reads one document and gives one answer: request 1 is all cold; request 2's
    32k prompt is cold past its first 8k tokens (0.75) and its 130-token answer is all cached."""
    t = EngramText("shared", room_bytes=math.inf, bytes_per_token=200e3)
    assert t.request(8192, 151) == (1.0, 1.0)
    assert t.request(32768, 130) == (0.75, 0.0)
    assert t.request(8192, 160) == (0.0, pytest.approx(9 / 160))


def test_new_text_is_always_cold_and_seen_text_is_cached_up_to_the_ram_left():
    """"new": every row cold. "seen": cached while the rows of the text fit in the RAM left; beyond
    it the part that does not fit is cold (1,000 tokens x 200 kB in 50 MB: 75% cold)."""
    assert EngramText("new", math.inf, 200e3).request(100, 10) == (1.0, 1.0)
    assert EngramText("seen", math.inf, 200e3).request(100, 10) == (0.0, 0.0)
    cold = EngramText("seen", 50e6, 200e3).request(900, 100)
    assert cold == (pytest.approx(0.75), pytest.approx(0.75))
    with pytest.raises(ValueError):
        EngramText("warm", 0, 1)


def test_small_gathers_fault_one_page_at_a_time_big_ones_on_every_thread():
    """engram_disk.cpp runs 256 rows or fewer on one thread: 24 cold rows of one page each at
    80 us = 1.92 ms; 512 rows on 16 threads = 2.56 ms, unless the drive's IOPS cap is lower."""
    assert gather_s(24, 1.0, 1.0, 0.0, 80e-6, 16, 1e9) == pytest.approx(24 * 80e-6)
    assert gather_s(512, 1.0, 1.0, 0.0, 80e-6, 16, 1e9) == pytest.approx(512 * 80e-6 / 16)
    assert gather_s(512, 1.0, 1.0, 0.0, 80e-6, 16, 100e3) == pytest.approx(512 / 100e3)
    assert gather_s(24, 0.0, 1.0, 2.0, 80e-6, 16, 1e9) == pytest.approx(24 * 2e-6)  # warm: host cost only


def _engram_plan(gather: str):
    p = tiered(0, "cpu")
    return p.model_copy(update={"placement": p.placement.model_copy(
        update={"engram": "nvme", "engram_gather": gather})})


def test_inline_gather_of_cold_rows_lengthens_each_step_by_its_faults():
    """With the gather inline, a step of new text waits for its Engram layer's 24 rows, one page
    fault after another: each step is longer than with cached text by exactly 24 x pages x 80 us."""
    model, hw = tiny_model(engram=True), machine()
    plan = _engram_plan("inline")
    new = simulate(model, hw, plan, gen_tokens=8, routing="uniform", warm_steps=0, engram_text="new")
    seen = simulate(model, hw, plan, gen_tokens=8, routing="uniform", warm_steps=0, engram_text="seen")
    faults_s = 24 * pages_per_row(model, hw.page_bytes) * hw.nvme.latency_us * 1e-6
    assert new.itl_p50_ms - seen.itl_p50_ms == pytest.approx(faults_s * 1e3, rel=1e-9)
    assert new.bottleneck_by_metric["decode_critical_s"]["nvme"] > 0


def test_prefetched_rows_of_cached_text_cost_nothing():
    """Prefetch (rows read before the pass) of cached text reads nothing from NVMe."""
    model, hw = tiny_model(engram=True), machine()
    r = simulate(model, hw, _engram_plan("prefetch"), gen_tokens=8, warm_steps=0, engram_text="seen")
    assert r.bytes_by_tier["nvme"] == 0.0


def _staged(prefetch: bool, slots: int, batch: int):
    return tiered(0).model_copy(update={"prefill": Prefill(
        strategy="stream-all", chunk_tokens=256, ubatch_tokens=256, dma_batch_experts=batch,
        dma_slots=slots, dma_prefetch=prefetch)})


def test_one_slot_without_prefetch_serialises_every_copy_and_gemm():
    """Stock staging with one slot: per layer the dense path, then each batch copied and computed
    in turn, nothing overlapping: the chunk takes the sum of every part (to 1e-9)."""
    model, hw = tiny_model(), machine()
    plan = _staged(False, 1, 1)
    c = Constants.from_hw(hw)
    r = simulate(model, hw, plan, prompt_tokens=256, gen_tokens=1, warm_steps=0, constants=c)
    from simulator.prefill import attention_flops
    flops = hw.gpu.fp16_tflops * 1e12 * c.gemm_efficiency
    n, k = 256, model.top_k
    touched = expected_touched(n, model.n_experts, k)
    dense = (model.prefill_dense_flops(n) + attention_flops(model, 0, n)) / flops  # the head for the last token only
    gemm = model.n_moe_layers * n * k * model.expert_flops / flops
    copy = model.n_moe_layers * touched * model.expert_bytes / (hw.pcie.h2d_gbs * 1e9)
    assert r.ttft_s - r.itl_p50_ms / 1e3 == pytest.approx(dense + gemm + copy, rel=1e-9)


def test_next_layer_prefetch_is_never_slower_and_hides_copies_under_attention():
    """Queuing the next layer's first batches as slots free (runtime/patch_dma_prefetch.py) lets
    them land during that layer's attention: never slower than the stock path, faster here."""
    model, hw = tiny_model(), machine()
    for slots, batch in ((1, 1), (2, 4), (4, 2)):
        stock = simulate(model, hw, _staged(False, slots, batch), prompt_tokens=256, gen_tokens=1, warm_steps=0)
        pre = simulate(model, hw, _staged(True, slots, batch), prompt_tokens=256, gen_tokens=1, warm_steps=0)
        assert pre.ttft_s < stock.ttft_s
