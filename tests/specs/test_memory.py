"""The memory map: bytes per tier, cache slots and KV tokens (DESIGN.md, run D107)."""
import pytest

from specs.errors import SpecError
from specs.loaders import load_hardware, load_model
from specs.memory import memory_map, size_cache
from specs.plan import KVCache, Placement, Plan, plan_template

GIB = 2**30


def test_tiered_cache_at_64k_context_leaves_709_slots_8_76_GiB():
    """24 GiB - 7.7 dense - 64k fp8 KV - ~5 workspace - context and pools = 709 slots (D107)."""
    m, hw = load_model("deepseek-v4.1-flash"), load_hardware("epyc8ch-3090")
    plan = plan_template("tiered-cache").model_copy(update={"kv": KVCache(context=65_536, dtype="fp8")})
    plan = size_cache(m, hw, plan)
    assert plan.expert_cache.slots == 709
    assert round(plan.expert_cache.slots * m.expert_bytes / GIB, 2) == 8.76
    mm = memory_map(m, hw, plan)
    assert round(mm.ram["experts"] / GIB, 1) == 189.8
    assert mm.vram_free >= 0


def test_the_262k_default_has_a_smaller_cache_than_the_64k_runs():
    """KV competes with the cache: 297,224 fp8 tokens (1.5 GiB, README tier table) cost ~95 slots
    against a 64k context (seed article big-moe-one-3090)."""
    m, hw = load_model("deepseek-v4.1-flash"), load_hardware("epyc8ch-3090")
    long = plan_template("tiered-cache").model_copy(update={"kv": KVCache(context=297_224, dtype="fp8")})
    mm = memory_map(m, hw, size_cache(m, hw, long))
    assert round(mm.vram["kv cache"] / GIB, 2) == 1.5
    lost = (297_224 - 65_536) * m.kv_bytes_per_token("fp8") / m.expert_bytes  # 94.6 slots of KV
    assert 709 - size_cache(m, hw, long).expert_cache.slots == pytest.approx(lost, abs=1)


def test_static_split_moves_whole_layers_to_vram():
    m, hw = load_model("qwen3.8-flash-next-iq3_s"), load_hardware("i5-13600k-ddr5-3090")
    plan = Plan(placement=Placement(gpu_expert_layers=[46, 47]), kv=KVCache(context=4096))
    mm = memory_map(m, hw, plan)
    assert mm.vram["static experts"] == pytest.approx(m.routed_bytes * 2 / 48)
    assert mm.ram["experts"] + mm.vram["static experts"] == pytest.approx(m.routed_bytes)


def test_plan_over_vram_names_the_byte_accounting():
    m, hw = load_model("deepseek-v4.1-flash"), load_hardware("epyc8ch-3090")
    plan = Plan(expert_cache={"slots": 5000, "policy": "lru"}, kv=KVCache(context=4096))
    with pytest.raises(SpecError) as e:
        memory_map(m, hw, plan).check_fits("p.json")
    assert "does not fit in VRAM" in e.value.line() and f"expert cache {5000 * m.expert_bytes / GIB:.2f}" in e.value.line()
    assert e.value.line().startswith("p.json: vram:")


def test_plan_over_ram_is_rejected():
    m, hw = load_model("deepseek-v4.1-flash"), load_hardware("rtx5070-64g")
    with pytest.raises(SpecError, match="does not fit in RAM"):
        memory_map(m, hw, Plan(kv=KVCache(context=4096))).check_fits()


def test_experts_beyond_ram_go_to_nvme():
    m, hw = load_model("deepseek-v4.1-flash-1017-gsq-2.00"), load_hardware("rtx5070-64g")
    plan = Plan(placement=Placement(expert_ram_bytes=56_000_000_000), kv=KVCache(context=4096))
    mm = memory_map(m, hw, plan)
    assert mm.ram["experts"] == 56e9
    assert mm.nvme["experts"] == pytest.approx(m.routed_bytes - 56e9)


def test_plan_over_the_drive_is_rejected():
    """DeepSeek's 183 GiB fp8 Engram tables plus experts beyond RAM on a 100 GB drive."""
    m, hw = load_model("deepseek-v4.1-flash"), load_hardware("rtx5070-64g")
    small_drive = hw.model_copy(update={"nvme": hw.nvme.model_copy(update={
        "capacity_bytes": hw.nvme.capacity_bytes.with_value(100e9)})})
    plan = Plan(placement=Placement(expert_ram_bytes=50_000_000_000), kv=KVCache(context=4096))
    with pytest.raises(SpecError, match="does not fit in NVMe: experts"):
        memory_map(m, small_drive, plan).check_fits()
