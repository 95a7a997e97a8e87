"""The memory map: bytes per tier, cache slots and KV tokens (DESIGN.md, run D107)."""
import re
from pathlib import Path

import pytest

from specs.errors import SpecError
from specs.loaders import load_hardware, load_model
from specs.memory import LOADED, REPACKED, memory_map, repacked_bytes, size_cache
from specs.model import AttentionSpec, ModelSpec
from specs.plan import KVCache, Placement, Plan, plan_template

GIB = 2**30
LLAMA_BENCH = Path(__file__).parent.parent / "fixtures" / "llama-bench"


def _small(expert_format: str) -> ModelSpec:
    """moe-offload's `small` / `small-q4` make-model presets (executor/make_model.py PRESETS)."""
    return ModelSpec(name=f"small {expert_format}", arch="qwen3moe", n_layers=8, hidden=2048, n_experts=32, top_k=8,
                     expert_ffn=768, vocab=8192, attention=AttentionSpec(n_heads=8, n_kv_heads=4, head_dim=64),
                     expert_format=expert_format)


def _repack_mib(log: str) -> float | None:
    """The CPU_REPACK buffer llama.cpp's load log reports, MiB (None: none)."""
    m = re.search(r"CPU_REPACK model buffer size =\s+([\d.]+) MiB", (LLAMA_BENCH / log).read_text())
    return float(m[1]) if m else None


def _cpu_only(hw):
    return hw.model_copy(update={"gpu": None, "pcie": None})


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


def test_llamacpp_repacks_small_q4s_experts_into_the_648_MiB_its_load_log_reports():
    """llama-bench -v on small-q4.gguf, this EPYC (AVX2), 2026-11-30: `CPU_REPACK model buffer size =
    648.00 MiB` (tests/fixtures/llama-bench/small-q4-load.log) = every Q4_0 expert, in anonymous RAM."""
    hw = _cpu_only(load_hardware("epyc8ch-3090"))
    plan = plan_template("llamacpp").model_copy(update={"placement": Placement(dense="cpu", kv="cpu")})
    mm = memory_map(_small("Q4_0"), hw, plan)
    assert mm.ram[REPACKED] / 2**20 == pytest.approx(_repack_mib("small-q4-load.log"), abs=0.005)
    assert mm.ram.get("experts", 0.0) == 0.0


def test_q8_0_experts_stay_in_the_mmap_on_x86_as_llamacpp_loads_them():
    """small.gguf (Q8_0 experts): no CPU_REPACK buffer in its load log; the map keeps them as mapped experts."""
    hw = _cpu_only(load_hardware("epyc8ch-3090"))
    plan = plan_template("llamacpp").model_copy(update={"placement": Placement(dense="cpu", kv="cpu")})
    mm = memory_map(_small("Q8_0"), hw, plan)
    assert _repack_mib("small-load.log") is None
    assert REPACKED not in mm.ram and mm.ram["experts"] == pytest.approx(_small("Q8_0").routed_bytes)


def test_repacked_experts_cannot_be_read_from_nvme():
    """A copy made at load must fit in RAM whole: DeepSeek-V4.1-Flash in Q4_K on rtx5070-64g (64 GB) does
    not fit repacked, and the error names --no-repack; without repacking the same plan streams from NVMe."""
    m, hw = load_model("deepseek-v4.1-flash").model_copy(update={"expert_format": "Q4_K"}), load_hardware("rtx5070-64g")
    streaming = plan_template("llamacpp").model_copy(update={
        "placement": Placement(expert_ram_bytes=40 * GIB), "kv": KVCache(context=4096)})
    with pytest.raises(SpecError, match="--no-repack"):
        memory_map(m, hw, streaming).check_fits()
    mm = memory_map(m, hw, streaming.model_copy(update={"cpu_repack": False}))
    mm.check_fits()
    assert mm.nvme["experts"] == pytest.approx(m.routed_bytes - 40 * GIB)


def test_no_repack_on_a_cpu_without_the_instruction_set():
    """Q4_0 is repacked with AVX2 only (on x86): a CPU without it keeps the experts in the mmap."""
    hw = _cpu_only(load_hardware("epyc8ch-3090"))
    hw = hw.model_copy(update={"cpu": hw.cpu.model_copy(update={"isa": ["sse4_2"]})})
    plan = plan_template("llamacpp").model_copy(update={"placement": Placement(dense="cpu", kv="cpu")})
    assert REPACKED not in memory_map(_small("Q4_0"), hw, plan).ram


def test_repacked_bytes_of_a_q4_k_m_file_match_llamacpps_load_log():
    """llama-quantize's Q4_K_M of `small` (its header: small-q4km-model.json): llama.cpp's load log
    reports a 552.38 MiB CPU_REPACK buffer = the Q4_K expert tensors (540.00) + the Q4_K dense ones
    (12.38); the Q6_K down projections and the Q4_K token_embd (read by row, not multiplied) stay in
    the mmap. The map's repacked experts are that 540 MiB, the Q6_K ones stay as mapped experts."""
    m = ModelSpec.model_validate_json((LLAMA_BENCH / "small-q4km-model.json").read_text())
    isa = load_hardware("epyc8ch-3090").cpu.isa
    both = repacked_bytes(m, isa, "experts") + repacked_bytes(m, isa, "dense")
    assert both / 2**20 == pytest.approx(_repack_mib("small-q4km-load.log"), abs=0.005)
    plan = plan_template("llamacpp").model_copy(update={"placement": Placement(dense="cpu", kv="cpu")})
    mm = memory_map(m, _cpu_only(load_hardware("epyc8ch-3090")), plan)
    assert mm.ram[REPACKED] == repacked_bytes(m, isa) and mm.ram[REPACKED] / 2**20 == pytest.approx(540.0)
    assert mm.ram["experts"] + mm.ram[REPACKED] == pytest.approx(m.routed_bytes)


def test_no_mmap_experts_cannot_be_read_from_nvme_either():
    """llama.cpp's --no-mmap reads every CPU weight into anonymous buffers at load, whatever the format:
    Qwen3.8's IQ3_S experts (never repacked) then need RAM for all of them; with the mmap they stream."""
    m, hw = load_model("qwen3.8-flash-next-iq3_s"), load_hardware("i5-13600k-ddr5-3090")
    small_ram = hw.model_copy(update={"memory": hw.memory.model_copy(update={"capacity_bytes": 32 * GIB})})
    plan = plan_template("llamacpp").model_copy(update={
        "placement": Placement(expert_ram_bytes=16 * GIB), "kv": KVCache(context=4096), "cpu_mmap": False})
    mm = memory_map(m, small_ram, plan)
    assert mm.ram[LOADED] == pytest.approx(m.routed_bytes) and REPACKED not in mm.ram
    with pytest.raises(SpecError, match="--no-mmap"):
        mm.check_fits()
    memory_map(m, small_ram, plan.model_copy(update={"cpu_mmap": True})).check_fits()


def test_the_second_card_holds_its_slots_and_the_planner_fills_it():
    """The Arc Pro B70's 32 GiB less 2 GiB reserved holds 2,411 experts of DeepSeek-V4.1-Flash 3.02 (13.36 MB);
    the tiered-cache base plan fills them, the memory map shows them, and VRAM is unchanged."""
    from planner.search import base_plan
    from specs.loaders import load_hardware, load_model
    from specs.memory import memory_map
    model = load_model("deepseek-v4.1-flash-3.02")
    hw, base = load_hardware("epyc8ch-3090+arc-pro-b70"), load_hardware("epyc8ch-3090")
    p, q = base_plan(model, hw), base_plan(model, base)
    free = 34359738368 - 2147483648
    assert p.device_tier.slots == int(free // model.expert_bytes) == 2411 and q.device_tier.slots == 0
    mm = memory_map(model, hw, p)
    assert mm.card["expert slots"] == 2411 * model.expert_bytes and mm.vram == memory_map(model, base, q).vram
