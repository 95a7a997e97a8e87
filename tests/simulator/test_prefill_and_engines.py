"""Prefill strategies (exact byte accounting) and every engine template on every profile."""
import math

import pytest

from simulator.run import simulate
from specs.loaders import load_hardware, load_model
from specs.memory import size_cache
from specs.plan import Prefill, plan_template

from sim_fixtures import machine, tiered, tiny_model


def _with_prefill(plan, **kw):
    return plan.model_copy(update={"prefill": Prefill(**kw)})


def test_op_offload_copies_every_ram_layer_per_big_ubatch():
    """llama.cpp op offload: each micro-batch >= 32 tokens copies every RAM-resident layer's whole
    expert tensor over PCIe (and the copy is dropped): 3 ubatches x 4 layers x 16 experts."""
    model = tiny_model()
    plan = _with_prefill(tiered(0, "cpu"), strategy="op-offload", chunk_tokens=256, ubatch_tokens=128)
    r = simulate(model, machine(), plan, prompt_tokens=384, gen_tokens=1, warm_steps=0)
    expect = 3 * 4 * 16 * model.expert_bytes
    assert r.resources["copy_engine"]["bytes"] == pytest.approx(expect, rel=1e-9)
    assert r.resources["pcie_h2d"]["bytes"] == pytest.approx(expect, rel=1e-6)


def test_small_ubatches_stay_on_the_cpu():
    """Micro-batches under op_offload_min_batch compute experts on the CPU: nothing crosses PCIe,
    and GPU-resident layers (gpu_expert_layers) never copy."""
    model = tiny_model()
    plan = _with_prefill(tiered(0, "cpu"), strategy="op-offload", chunk_tokens=64, ubatch_tokens=16)
    r = simulate(model, machine(), plan, prompt_tokens=64, gen_tokens=1, warm_steps=0)
    assert r.resources["copy_engine"]["bytes"] == 0.0 and r.resources["cpu"]["bytes"] > 0
    plan2 = _with_prefill(tiered(0, "cpu"), strategy="op-offload", chunk_tokens=128, ubatch_tokens=128)
    plan2 = plan2.model_copy(update={"placement": plan2.placement.model_copy(
        update={"gpu_expert_layers": [0, 1, 2, 3]})})
    r2 = simulate(model, machine(), plan2, prompt_tokens=128, gen_tokens=1, warm_steps=0)
    assert r2.resources["copy_engine"]["bytes"] == 0.0


def test_stream_all_copies_touched_experts_once_per_chunk():
    """Stream-all copies each layer's expected touched experts once per chunk, E(1-(1-k/E)^T)."""
    model = tiny_model()
    plan = _with_prefill(tiered(0), strategy="stream-all", chunk_tokens=100, ubatch_tokens=100)
    r = simulate(model, machine(), plan, prompt_tokens=200, gen_tokens=1, warm_steps=0)
    touched = 16 * (1 - (1 - 2 / 16) ** 100)
    assert r.resources["copy_engine"]["bytes"] == pytest.approx(2 * 4 * touched * model.expert_bytes, rel=1e-9)


def test_bigger_stream_all_chunks_prefill_faster_on_dsv4():
    """DeepSeek-V4.1-Flash: 16,384-token stream-all chunks beat 1,024-token per-chunk streaming."""
    model, hw = load_model("deepseek-v4.1-flash-3.02"), load_hardware("epyc8ch-3090")
    base = size_cache(model, hw, plan_template("tiered-cache"))
    small = _with_prefill(base, strategy="op-offload", chunk_tokens=1024, ubatch_tokens=1024)
    big = simulate(model, hw, base, prompt_tokens=16384, gen_tokens=1)
    slow = simulate(model, hw, small, prompt_tokens=16384, gen_tokens=1)
    assert big.prefill_tok_s > 4 * slow.prefill_tok_s
    assert big.bottleneck_by_metric["ttft_s"] in ("gpu", "copy_engine")


def test_cache_release_during_prefill_costs_decode_speed():
    """After a prefill the cache is released and refilled after rewarm_steps: the first decode steps
    of a short answer are slower than the same steps without a prompt."""
    model, hw = load_model("deepseek-v4.1-flash-3.02"), load_hardware("epyc8ch-3090")
    plan = size_cache(model, hw, plan_template("tiered-cache"))
    after = simulate(model, hw, plan, prompt_tokens=2048, gen_tokens=8)
    steady = simulate(model, hw, plan, prompt_tokens=0, gen_tokens=8)
    assert after.cache_hit_rate < steady.cache_hit_rate
    assert after.itl_p50_ms > steady.itl_p50_ms


@pytest.mark.parametrize("engine", ["llamacpp", "tiered-cache", "strata"])
@pytest.mark.parametrize("hw_name,model_name", [
    ("epyc8ch-3090", "deepseek-v4.1-flash"),
    ("i5-13600k-ddr5-3090", "qwen3.8-flash-next-iq3_s"),
    ("rtx5070-64g", "deepseek-v4.1-flash-1017-gsq-2.00"),
])
def test_every_engine_on_every_profile(engine, hw_name, model_name):
    """Each engine template, sized to each machine, simulates with finite, contract-shaped results."""
    model, hw = load_model(model_name), load_hardware(hw_name)
    plan = size_cache(model, hw, plan_template(engine))
    r = simulate(model, hw, plan, prompt_tokens=512, gen_tokens=16).to_dict()
    for key in ("decode_tok_s", "ttft_s", "prefill_tok_s", "itl_p50_ms", "itl_p95_ms", "cache_hit_rate"):
        assert math.isfinite(r[key]) and r[key] >= 0, key
    assert r["decode_tok_s"] > 0 and r["bottleneck"]
    assert set(r["resources"]) >= {"gpu", "copy_engine", "pcie_h2d", "ddr", "cpu", "nvme"}
    assert all(0 <= v["busy_fraction"] <= 1 for v in r["resources"].values())


def test_cpu_only_machine():
    """No GPU (`--device none`): dense path and experts on the CPU."""
    model = tiny_model()
    hw = machine().model_copy(update={"gpu": None, "pcie": None})
    plan = tiered(0, "cpu")
    plan = plan.model_copy(update={"placement": plan.placement.model_copy(update={"dense": "cpu", "kv": "cpu"}),
                                   "prefill": Prefill(strategy="cpu")})
    r = simulate(model, hw, plan, prompt_tokens=64, gen_tokens=8)
    assert r.decode_tok_s > 0 and r.cache_hit_rate == 0.0 and r.bottleneck == "cpu"


def test_prefill_without_a_device_runs_every_flop_on_the_host_cores():
    """No GPU: dense path, attention and routed experts of the prompt all take host-core time, so
    TTFT is at least their FLOPs over the cores' prefill rate, and the closed-form screen agrees."""
    from simulator.resources import Constants
    from simulator.screen import screen
    from simulator.prefill import attention_flops
    model = tiny_model()
    hw = machine().model_copy(update={"gpu": None, "pcie": None})
    plan = _with_prefill(tiered(0, "cpu"), strategy="cpu", chunk_tokens=64, ubatch_tokens=64)
    plan = plan.model_copy(update={"placement": plan.placement.model_copy(update={"dense": "cpu", "kv": "cpu"})})
    c = Constants.from_hw(hw)
    n = 64
    flops = model.dense_flops_per_token * n + attention_flops(model, 0, n) + n * model.top_k * model.expert_flops * 4
    floor_s = flops / (c.cpu_prefill_gflops_per_core * 1e9 * hw.cpu.threads_used)
    r = simulate(model, hw, plan, prompt_tokens=n, gen_tokens=1, warm_steps=0)
    assert r.ttft_s >= floor_s
    assert screen(model, hw, plan, prompt_tokens=n).ttft_s == pytest.approx(r.ttft_s, rel=0.05)


def test_stream_all_without_a_device_prefills_on_the_cores():
    """A stream-all plan on a machine with no device has nothing to stream to: the prompt runs on the
    host cores, as long as a CPU prefill of it (and as the closed-form screen says)."""
    from simulator.screen import screen
    model = tiny_model()
    hw = machine().model_copy(update={"gpu": None, "pcie": None})
    stream = _with_prefill(tiered(0, "cpu"), strategy="stream-all", chunk_tokens=256, ubatch_tokens=256)
    cpu = _with_prefill(tiered(0, "cpu"), strategy="cpu", chunk_tokens=256, ubatch_tokens=256)
    r1 = simulate(model, hw, stream, prompt_tokens=256, gen_tokens=1, warm_steps=0)
    r2 = simulate(model, hw, cpu, prompt_tokens=256, gen_tokens=1, warm_steps=0)
    assert r1.ttft_s == pytest.approx(r2.ttft_s, rel=1e-9)
    assert screen(model, hw, stream, prompt_tokens=256).ttft_s == pytest.approx(r1.ttft_s, rel=0.05)
