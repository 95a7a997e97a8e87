"""Prefill strategies (exact byte accounting) and every engine template on every profile."""
import math

import numpy as np

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
    flops = model.prefill_dense_flops(n) + attention_flops(model, 0, n) + n * model.top_k * model.expert_flops * 4
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


def _copies_run(copies: str):
    """tiny model, CPU misses, 8-slot cache replanning every 2 steps; step i routes experts 2i and
    2i+1 in every layer, so admitted experts are never routed again (no hits in any mode)."""
    model = tiny_model()
    plan = tiered(slots=8, kind="cpu")
    plan = plan.model_copy(update={"expert_cache": plan.expert_cache.model_copy(update=dict(
        swap_every=2, swap_max=8, fill="at-replan", copies=copies))})
    routes = [np.full((model.n_moe_layers, 2), [2 * i, 2 * i + 1]) for i in range(8)]
    r = simulate(model, machine(), plan, gen_tokens=8, warm_steps=0, routing=routes)
    return model, r


def test_sync_copies_stall_decode_by_the_copy_time():
    """Copies on the compute stream (DSV41_EC_ASYNC=0): the next step waits for them, so decode
    takes longer than with background copies by exactly their bytes / H2D rate (no hits in either).
    Replans at steps 2, 4, 6, 8 admit 8 experts each; the fourth's copies follow the last step."""
    model, sync = _copies_run("sync")
    _, bg = _copies_run("background")
    assert sync.cache_hit_rate == bg.cache_hit_rate == 0.0
    fills = sync.bytes_by_tier["fills"]
    assert fills == bg.bytes_by_tier["fills"] > 0
    stall = fills * 3 / 4 / (machine().pcie.h2d_gbs * 1e9)
    t_sync, t_bg = 8 / sync.decode_tok_s, 8 / bg.decode_tok_s
    assert t_sync - t_bg == pytest.approx(stall, rel=1e-6)


def test_async_copies_go_live_at_the_next_replan():
    """Side-stream copies (DSV41_EC_ASYNC=1) are used only from the next replan: routing experts
    0 and 1 every step with a replan every 4 steps, the admissions of step 4 serve from step 9, so
    12 steps hit 4/12 of reads; background copies serve as soon as they land (sooner)."""
    model = tiny_model()

    def run(copies):
        plan = tiered(slots=8, kind="cpu")
        plan = plan.model_copy(update={"expert_cache": plan.expert_cache.model_copy(update=dict(
            swap_every=4, swap_max=8, fill="at-replan", copies=copies))})
        routes = [np.tile([0, 1], (model.n_moe_layers, 1))] * 12
        return simulate(model, machine(), plan, gen_tokens=12, warm_steps=0, routing=routes)

    assert run("async").cache_hit_rate == pytest.approx(4 / 12)
    assert run("background").cache_hit_rate > 4 / 12


def test_history_carries_the_cache_between_requests():
    """`history` runs earlier requests on the same server: with the engine's schedule (pool after
    8 steps, 4 admissions per 4-step replan) a first request of 8 steps never hits; after one of 40
    steps the kept set is back 4 steps after the prefill."""
    model = tiny_model()
    plan = tiered(slots=8, kind="cpu")
    plan = plan.model_copy(update={"expert_cache": plan.expert_cache.model_copy(update=dict(
        fill="at-replan", warmup_steps=8, copies="sync"))})
    first = simulate(model, machine(), plan, prompt_tokens=32, gen_tokens=8, warm_steps=0, routing="fitted")
    later = simulate(model, machine(), plan, prompt_tokens=32, gen_tokens=8, warm_steps=0, routing="fitted",
                     history=[(32, 40)])
    assert first.cache_hit_rate == 0.0
    assert later.cache_hit_rate > 0.2


def test_device_layer_ms_charges_only_layers_with_device_work():
    """`device_layer_ms` (fitted from executor traces) delays a layer's device side: a plan whose
    layers hit the cache decodes slower with it, an all-CPU plan (no device work) exactly as fast."""
    from simulator.resources import Constants
    model, hw = tiny_model(), machine()
    base, extra = Constants(), Constants(device_layer_ms=0.5)
    cached, cpu_only = tiered(slots=16, kind="cpu"), tiered(slots=0, kind="cpu")
    run = lambda plan, c: simulate(model, hw, plan, gen_tokens=10, warm_steps=20, constants=c)  # noqa: E731
    assert run(cpu_only, extra).decode_tok_s == run(cpu_only, base).decode_tok_s
    assert run(cached, extra).decode_tok_s < run(cached, base).decode_tok_s


def test_layer_overhead_lengthens_each_step_by_its_layers_on_a_discrete_gpu():
    """An engine's fitted host time per layer (`layer_overhead_ms`, the executor's eager dispatch on a
    CUDA host) comes before the GPU's kernels: with no other device work, each decode step is longer by
    exactly n_layers x the constant (here 4 x 0.5 ms)."""
    from simulator.resources import Constants
    model, hw, plan = tiny_model(), machine(), tiered(slots=0, kind="cpu")
    run = lambda c: simulate(model, hw, plan, gen_tokens=10, warm_steps=20, constants=c)  # noqa: E731
    base, slow = run(Constants()), run(Constants(layer_overhead_ms=0.5))
    assert 1e3 / slow.decode_tok_s - 1e3 / base.decode_tok_s == pytest.approx(model.n_layers * 0.5, rel=1e-9)


def test_fitted_per_hit_rate_prices_resident_experts_on_a_discrete_gpu():
    """`dev_expert_gbs` (bytes of a hit's device copy / its fitted time) replaces the VRAM roof for
    resident experts on a discrete GPU too: a slower fitted rate decodes a cached plan slower, an all-CPU
    plan exactly as fast."""
    from simulator.resources import Constants
    model, hw = tiny_model(), machine()
    roof = hw.gpu.bw_gbs * Constants().gpu_expert_efficiency
    slow = Constants(dev_expert_gbs=roof / 10, dev_bytes_per_param=4.0)
    cached, cpu_only = tiered(slots=64, kind="cpu"), tiered(slots=0, kind="cpu")
    run = lambda plan, c: simulate(model, hw, plan, gen_tokens=10, warm_steps=20, constants=c)  # noqa: E731
    assert run(cpu_only, slow).decode_tok_s == run(cpu_only, Constants()).decode_tok_s
    assert run(cached, slow).decode_tok_s < run(cached, Constants()).decode_tok_s


def test_copied_misses_run_at_the_engines_copy_rate():
    """`copy_h2d_gbs` (an engine copying misses from pageable memory) replaces the pinned H2D rate: a
    plan whose misses all cross PCIe decodes slower at a tenth of the rate, an all-CPU plan exactly as
    fast; `copy_miss_ms` adds host time per copied expert."""
    from simulator.resources import Constants
    model, hw = tiny_model(), machine()
    copy, cpu_only = tiered(slots=0, kind="copy", policy="none"), tiered(slots=0, kind="cpu")
    slow = Constants(copy_h2d_gbs=hw.pcie.h2d_gbs / 10)
    run = lambda plan, c: simulate(model, hw, plan, gen_tokens=10, warm_steps=20, constants=c)  # noqa: E731
    assert run(cpu_only, slow).decode_tok_s == run(cpu_only, Constants()).decode_tok_s
    assert run(copy, slow).decode_tok_s < run(copy, Constants()).decode_tok_s
    assert run(copy, Constants(copy_miss_ms=0.5)).decode_tok_s < run(copy, Constants()).decode_tok_s


def test_the_prompt_warms_a_cache_that_keeps_its_residents_through_prefill():
    """The prompt's routing reaches the cache as the engine's prefill ran it, and the prefill's step end
    admits experts: with release_during_prefill off and no warm-up, the first decode step already hits
    (a 32-token prompt), where without a prompt nothing was seen and it cannot."""
    model, hw = tiny_model(), machine()
    plan = tiered(slots=32, kind="cpu", policy="lru")
    plan = plan.model_copy(update={"expert_cache": plan.expert_cache.model_copy(
        update={"release_during_prefill": False, "copies": "sync"})})
    run = lambda p: simulate(model, hw, plan, prompt_tokens=p, gen_tokens=1, warm_steps=0, routing="fitted")  # noqa: E731
    assert run(0).cache_hit_rate == 0.0
    warm = run(32)
    assert warm.cache_hit_rate > 0.0
    assert warm.bytes_by_tier["fills"] > 0


def test_an_auction_that_copies_pays_the_copy_not_a_zero_copy_read():
    """MissPolicy.gpu_path: the executor's auction copies the misses it keeps on the device into a
    staging slot (gpu_path="copy"); dsv41's reads them zero-copy. With CPU experts priced high
    (c_b 5 ms) the auction keeps misses on the device: their bytes cross as copies or as zero-copy
    reads, and only the copying auction slows when copies do."""
    from simulator.resources import Constants
    model, hw = tiny_model(), machine()
    zc = tiered(slots=8, kind="auction")
    zc = zc.model_copy(update={"miss_policy": zc.miss_policy.model_copy(update={"c_b_ms": 5.0})})
    cp = zc.model_copy(update={"miss_policy": zc.miss_policy.model_copy(update={"gpu_path": "copy"})})
    run = lambda plan, c=Constants(): simulate(model, hw, plan, gen_tokens=10, warm_steps=20, constants=c)  # noqa: E731
    a, b = run(zc), run(cp)
    assert a.bytes_by_tier["zero_copy"] > 0 and a.bytes_by_tier["copy"] == 0
    assert b.bytes_by_tier["copy"] == a.bytes_by_tier["zero_copy"] and b.bytes_by_tier["zero_copy"] == 0
    assert run(cp, Constants(copy_h2d_gbs=hw.pcie.h2d_gbs / 10)).decode_tok_s < b.decode_tok_s


def test_sync_copies_of_misses_hold_the_compute_stream():
    """With copies on the compute stream (expert_cache.copies="sync", as the executor's blocking
    copies), a copied miss and the layer's hits no longer overlap: never faster than copies on the
    copy engine beside the hits, and slower when a layer has both."""
    model, hw = tiny_model(), machine()
    bg = tiered(slots=8, kind="copy")
    sync = bg.model_copy(update={"expert_cache": bg.expert_cache.model_copy(update={"copies": "sync"})})
    run = lambda plan: simulate(model, hw, plan, gen_tokens=10, warm_steps=20)  # noqa: E731
    assert run(sync).decode_tok_s < run(bg).decode_tok_s
