"""The physics of DESIGN.md, computed from the built-in presets (each figure is an expected value)."""
import pytest

from simulator.ceilings import STANDARD_BUSES, ceiling_tok_s
from specs.loaders import load_model

GIB = 2**30


@pytest.fixture(scope="module")
def dsv4():
    return load_model("deepseek-v4.1-flash")


def test_deepseek_has_15360_routed_experts(dsv4):
    assert dsv4.routed_experts == 40 * 384 == 15_360


def test_deepseek_expert_has_35389440_weights(dsv4):
    assert dsv4.params_per_expert == 35_389_440


def test_deepseek_routed_weights_543_6_billion(dsv4):
    assert round(dsv4.routed_params / 1e9, 1) == 543.6


def test_deepseek_expert_is_13_27_MB_at_3_bits(dsv4):
    assert round(dsv4.expert_bytes / 1e6, 2) == 13.27
    assert round(dsv4.expert_bytes / 2**20, 2) == 12.66


def test_deepseek_routed_bytes_189_8_GiB_at_3_0_and_191_1_at_3_02(dsv4):
    assert round(dsv4.routed_bytes / 1e9, 1) == 203.8
    assert round(dsv4.routed_bytes / GIB, 1) == 189.8
    assert round(load_model("deepseek-v4.1-flash-3.02").routed_bytes / GIB, 1) == 191.1


def test_709_slots_are_8_76_GiB(dsv4):
    assert round(709 * dsv4.expert_bytes / GIB, 2) == 8.76


def test_deepseek_routed_bytes_per_token_3_19_GB(dsv4):
    assert round(dsv4.routed_bytes_per_token() / 1e9, 2) == 3.19


def test_deepseek_routed_bytes_per_token_4_51_GB_at_native_fp4(dsv4):
    fp4 = dsv4.model_copy(update={"expert_format": "BPW:4.25"})
    assert round(fp4.routed_bytes_per_token() / 1e9, 2) == 4.51


def test_standard_bus_bandwidths_from_channels_and_rates():
    """51.2 / 83.2 / 102.4 / 204.8 GB/s (channels x MT/s x 8 B), PCIe ~25, RTX 3090 936."""
    assert [round(b.bandwidth_gbs, 1) for b in STANDARD_BUSES] == [51.2, 83.2, 102.4, 204.8, 25.0, 936.0]


def test_deepseek_ceilings_16_26_32_64_7_8_294(dsv4):
    tok = [ceiling_tok_s(dsv4.routed_bytes_per_token(), b.bandwidth_gbs) for b in STANDARD_BUSES]
    assert [round(t) for t in tok[:4]] + [round(tok[4], 1), round(tok[5])] == [16, 26, 32, 64, 7.8, 294]


def test_qwen_reads_2_36B_weights_1_03_GB_per_token():
    q = load_model("qwen3.8-flash-next-iq3_s")
    assert q.params_per_expert == 4_915_200
    assert round(q.n_moe_layers * q.top_k * q.params_per_expert / 1e9, 2) == 2.36
    assert round(q.routed_bytes_per_token() / 1e9, 2) == 1.03


def test_qwen_ceilings_50_81_99_198_24_907():
    q = load_model("qwen3.8-flash-next-iq3_s")
    tok = [ceiling_tok_s(q.routed_bytes_per_token(), b.bandwidth_gbs) for b in STANDARD_BUSES]
    assert [round(t) for t in tok] == [50, 81, 99, 198, 24, 907]


def test_dense_path_6_9_GB_and_7_4_ms_at_936(dsv4):
    """7.7 GiB resident minus the 1.32 GB embedding table plus one row (DESIGN.md)."""
    assert round(dsv4.dense_bytes_per_token / 1e9, 1) == 6.9
    assert round(dsv4.dense_bytes_per_token / 936e9 * 1e3, 1) == 7.4


def test_engram_144_byte_rows_3_1_percent_crossings_203_KB_per_token():
    m = load_model("deepseek-v4.1-flash-1017-gsq-2.00")
    e = m.engram
    assert e.row_bytes == 144
    assert round(e.table_bytes / 1e9, 1) == 110.6
    assert e.rows_per_token == 48
    assert e.page_crossing_fraction(4096) == 8 / 256
    assert round(m.engram_bytes_per_token(4096) / 1e3) == 203
    assert e.used_bytes_per_token() == 6_912
    assert round(m.engram_bytes_per_token(4096) / e.used_bytes_per_token()) == 29


def test_engram_bytes_grow_about_fourfold_on_16k_pages():
    m = load_model("deepseek-v4.1-flash-1017-gsq-2.00")
    ratio = m.engram_bytes_per_token(16384) / m.engram_bytes_per_token(4096)
    assert 3.8 < ratio < 4.0


def test_gsq_2_00_expert_is_8_6_MB_and_200_picks_are_1_72_GB():
    """Strata Faster mode runs 5 of 6 experts: 40 x 5 = 200 experts per token."""
    m = load_model("deepseek-v4.1-flash-1017-gsq-2.00")
    assert round(m.expert_bytes / 1e6, 1) == 8.6
    assert round(m.routed_bytes / 1e9, 2) == 132.07
    assert round(m.routed_bytes_per_token(5) / 1e9, 2) == 1.72


def test_rtx5070_even_spread_ceiling_3_8():
    """DESIGN.md (rtx5070-64g, 2.00 bpw GGUF, Faster mode 5 of 6): 3 GB of experts on the card and
    56 GB in RAM hold 44.7% of the experts; spread evenly, 55.3% of the 200 experts a token reads
    (1.72 GB) come from the 3.6 GB/s SSD: 0.95 GB per token = 3.8 tok/s."""
    from specs.loaders import load_hardware
    m, hw = load_model("deepseek-v4.1-flash-1017-gsq-2.00"), load_hardware("rtx5070-64g")
    held = (3.0e9 + 56e9) / m.routed_bytes
    per_token = m.routed_bytes_per_token(5)
    assert round(held, 3) == 0.447 and round(per_token / 1e9, 2) == 1.72
    ssd = (1 - held) * per_token
    assert round(ssd / 1e9, 2) == 0.95
    assert round(ceiling_tok_s(ssd, hw.nvme.seq_read_gbs), 1) == 3.8


def test_prefill_runs_the_output_head_for_its_outputs_only():
    """A prefill batch multiplies every dense weight for each of its n tokens but the output head only for
    the tokens whose logits are wanted (one: the batch's last). On the llama-bench fixture's shape (hidden
    512, vocabulary 32,000, 4 layers, Q8_0) the head is 84% of the dense bytes, so 512 tokens cost 5.8x
    less dense work than 512 decode tokens."""
    from specs.model import ModelSpec
    m = ModelSpec.model_validate(dict(name="fixture", arch="qwen3moe", n_layers=4, hidden=512, n_experts=32,
                                      top_k=4, expert_ffn=256, vocab=32000, expert_format="Q8_0",
                                      dense_format="Q8_0", attention=dict(n_heads=8, n_kv_heads=4, head_dim=64)))
    share = m.head_bytes / m.dense_bytes_per_token
    assert 0.8 < share < 0.9
    full = m.dense_flops_per_token
    assert m.prefill_dense_flops(1) == pytest.approx(full)
    assert m.prefill_dense_flops(512) == pytest.approx(full * (512 * (1 - share) + share))
    assert m.prefill_dense_flops(512, outputs=512) == pytest.approx(512 * full)
    assert m.prefill_dense_flops(512) < 512 * full / 5


def test_a_gguf_without_output_weight_reads_token_embd_as_its_head():
    """llama.cpp uses token_embd.weight as the head when a GGUF has no output.weight: the fixture's shape
    (both tables Q8_0, 512 x 32,000) without output.weight reads the same bytes per token, and holds
    one table fewer."""
    from pathlib import Path
    from specs.loaders import load_model
    src = Path(__file__).resolve().parents[1] / "calibration" / "data" / "epyc-2026-11-30" / "fixture-shape.yaml"
    m = load_model(str(src))
    tied = m.model_copy(update={"tensors": [t for t in m.tensors if t.name != "output.weight"]})
    assert not m.head_is_embedding and tied.head_is_embedding
    assert tied.head_bytes == m.head_bytes == m.embedding_bytes == 17408000
    assert tied.dense_bytes_per_token == pytest.approx(m.dense_bytes_per_token)
    assert tied.dense_resident_bytes == pytest.approx(m.dense_resident_bytes - 17408000)
