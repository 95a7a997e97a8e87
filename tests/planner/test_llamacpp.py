"""llama.cpp flags: emit a plan, parse it back to the same placement; -ot matches exactly the CPU tensors."""
import re

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.llamacpp import closest_static, emit, parse
from specs.errors import SpecError
from specs.loaders import load_model
from specs.plan import KVCache, Placement, Plan, Prefill, plan_template

QWEN = load_model("qwen3.8-flash-next-iq3_s")


@st.composite
def static_plans(draw):
    dense = draw(st.sampled_from(["gpu", "cpu"]))
    layers = draw(st.lists(st.sampled_from(QWEN.layers_moe), unique=True)) if dense == "gpu" else []
    ub = draw(st.sampled_from([32, 64, 128, 256, 512, 1024]))
    b = draw(st.sampled_from([ub, 2 * ub, 2048, 4096]))
    return Plan(engine="llamacpp",
                placement=Placement(dense=dense, kv=dense, gpu_expert_layers=sorted(layers)),
                prefill=Prefill(strategy=draw(st.sampled_from(["op-offload", "cpu"])) if dense == "gpu" else "cpu",
                                chunk_tokens=max(b, ub), ubatch_tokens=ub),
                kv=KVCache(context=draw(st.integers(1, 262144)),
                           dtype=draw(st.sampled_from(["f16", "q8_0", "q4_0"])) if dense == "gpu" else "f16"),
                cpu_threads=draw(st.none() | st.integers(1, 64)),
                streams=draw(st.integers(1, 8)), cpu_repack=draw(st.booleans()), cpu_mmap=draw(st.booleans()))


@settings(max_examples=200, deadline=None)
@given(static_plans())
def test_emitted_command_parses_back_to_the_same_plan(plan):
    back = parse(emit(plan, QWEN).argv, QWEN)
    assert back.model_dump() == plan.model_dump()


def test_cpu_moe_keeps_every_expert_in_ram():
    plan = parse("llama-server -m m.gguf -ngl 999 --cpu-moe", QWEN)
    assert plan.placement.gpu_expert_layers == [] and plan.placement.dense == "gpu"


def test_n_cpu_moe_keeps_the_first_n_layers_in_ram():
    plan = parse("llama-server -m m.gguf -ngl 999 --n-cpu-moe 40", QWEN)
    assert plan.placement.gpu_expert_layers == list(range(40, 48))
    assert "--n-cpu-moe 40" in emit(plan, QWEN).command


def test_ot_patterns_match_exactly_the_cpu_tensors_of_a_gguf(moe_gguf):
    """Against the tensor names the GGUF really holds, not names we made up."""
    path, _ = moe_gguf
    model = load_model(str(path))
    names = [t.name for t in gguf.GGUFReader(str(path)).tensors]
    plan = Plan(placement=Placement(gpu_expert_layers=[1]))  # layers 0 and 2 stay on the CPU
    argv = emit(plan, model).argv
    rx, dev = argv[argv.index("-ot") + 1].rsplit("=", 1)
    matched = {n for n in names if re.search(rx, n)}
    assert dev == "CPU"
    assert matched == {f"blk.{i}.ffn_{p}_exps.weight" for i in (0, 2) for p in ("gate", "up", "down")}
    assert parse(argv, model).placement.gpu_expert_layers == [1]


def test_dynamic_cache_is_stated_as_lost_with_the_closest_static_plan():
    plan = plan_template("tiered-cache").model_copy(update={"expert_cache": plan_template("tiered-cache")
                                                            .expert_cache.model_copy(update={"slots": 1100})})
    static, lost = closest_static(plan, QWEN)
    assert static.placement.gpu_expert_layers == [46, 47]  # 1,100 slots hold 2 whole layers of 512
    assert any("no expert cache" in x for x in lost) and any("auction" in x for x in lost)
    assert any("stream-all" in x for x in lost)


@pytest.mark.parametrize("argv, flag", [
    ("llama-server --frobnicate", "--frobnicate"),
    ("llama-server -ngl abc", "-ngl"),
    ("llama-server --n-cpu-moe -3", "--n-cpu-moe"),
    ("llama-server -ub", "-ub"),
    ("llama-server -ot blk.0.ffn_gate_exps.weight=CPU", "-ot"),
    ("llama-server -ctk q5_9", "-ctk"),
])
def test_a_flag_set_llamacpp_would_reject_names_the_flag(argv, flag):
    with pytest.raises(SpecError) as e:
        parse(argv, QWEN)
    assert e.value.field == flag


def test_repacking_is_on_unless_no_repack_is_given():
    """llama.cpp copies repackable CPU weights at load by default; -nr / --no-repack leaves them in the mmap."""
    assert parse("llama-server -m M.gguf --cpu-moe", QWEN).cpu_repack
    assert not parse("llama-server -m M.gguf --cpu-moe -nr", QWEN).cpu_repack
    assert not parse("llama-server -m M.gguf --cpu-moe --no-repack", QWEN).cpu_repack


def test_experts_streamed_from_nvme_get_no_repack_in_the_command():
    """DeepSeek-V4.1-Flash in Q4_K (a type ggml repacks on AVX2) overflows rtx5070-64g's RAM: the
    llama.cpp plan reads experts from NVMe through the mmap, which needs --no-repack (without it llama.cpp
    allocates the whole copy and fails to load: llama.cpp issue #23603)."""
    from planner.search import base_plan
    from specs.loaders import load_hardware
    m, hw = load_model("deepseek-v4.1-flash").model_copy(update={"expert_format": "Q4_K"}), load_hardware("rtx5070-64g")
    plan = base_plan(m, hw, engine="llamacpp")
    assert plan.placement.expert_ram_bytes is not None and not plan.cpu_repack
    assert "--no-repack" in emit(plan, m).argv
    # a custom plan streaming from NVMe says the same when written as llama.cpp flags
    custom = base_plan(m, hw, engine="custom", host_only=True)
    assert "--no-repack" in emit(custom, m).argv


def test_a_plan_whose_experts_fit_in_ram_keeps_llamacpps_default():
    from planner.search import base_plan
    from specs.loaders import load_hardware
    plan = base_plan(QWEN, load_hardware("epyc8ch-3090"), engine="llamacpp")
    assert plan.cpu_repack and "--no-repack" not in emit(plan, QWEN).argv


def test_no_mmap_reads_every_cpu_weight_into_ram():
    assert parse("llama-server -m M.gguf --cpu-moe", QWEN).cpu_mmap
    assert not parse("llama-server -m M.gguf --cpu-moe --no-mmap", QWEN).cpu_mmap
