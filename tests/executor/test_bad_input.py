"""Bad input raises SpecError (one line: file, field, reason)."""
from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from executor.gguf_model import GGUFModel
from executor.make_model import PRESETS, write_model
from executor.runner import execute
from specs.errors import SpecError
from specs.plan import DeviceTier, ExpertCache, Placement, Plan, KVCache


def test_truncated_file(tiny, tmp_path):
    bad = tmp_path / "trunc.gguf"
    data = tiny.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(SpecError, match="trunc"):
        GGUFModel(bad)
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:100])
    with pytest.raises(SpecError):
        GGUFModel(head)


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(SpecError, match="GGUF"):
        GGUFModel(p)
    with pytest.raises(SpecError, match="not found"):
        GGUFModel(tmp_path / "missing.gguf")


def test_unsupported_architecture(tmp_path):
    p = write_model(replace(PRESETS["tiny"], arch="gpt2", n_layers=1), tmp_path / "gpt2.gguf")
    with pytest.raises(SpecError, match="unsupported architecture") as e:
        GGUFModel(p)
    assert e.value.field == "general.architecture"


def test_unsupported_expert_type(tmp_path):
    p = write_model(replace(PRESETS["tiny"], expert_types=("Q5_0",), n_layers=1), tmp_path / "q5.gguf")
    with pytest.raises(SpecError, match="Q5_0") as e:
        GGUFModel(p)
    assert "ffn_gate_exps" in e.value.field


@pytest.mark.parametrize("plan,field", [
    (Plan(placement=Placement(gpu_expert_layers=[1, 9])), "placement.gpu_expert_layers"),
    (Plan(expert_cache=ExpertCache(slots=129, policy="lru")), "expert_cache.slots"),
    (Plan(experts_per_token=5), "experts_per_token"),
    (Plan(kv=KVCache(context=8)), "kv.context"),
    (Plan(device_tier=DeviceTier(slots=4)), "device_tier.slots"),  # a second card's tier is simulated only
])
def test_plan_the_model_lacks(tiny, plan, field):
    with pytest.raises(SpecError) as e:
        execute(plan, tiny, 6, 4)
    assert e.value.field == field
    assert "\n" not in e.value.line()


def test_engram_table_truncated(tiny, tmp_path, engram_of):
    from executor.engram import Engram
    p = tmp_path / "m.gguf"
    shutil.copy(tiny, p)
    data = engram_of(tiny).read_bytes()
    engram_of(p).write_bytes(data[: len(data) - 1000])
    with pytest.raises(SpecError):
        Engram(engram_of(p), 256)
