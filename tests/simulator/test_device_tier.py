"""A second card as a third expert engine (simulator/device_tier.py): dsv41-flash-offload's experimental Arc B70
tier, its split (ct/ft_tier_cu_v.cu ft_split_k) and its worker's write-through LRU (worker/bt_worker.py)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simulator.device_tier import ExpertDeviceTier, device_split
from specs.plan import DeviceTier, MissPolicy, plan_template

D141 = MissPolicy(kind="auction", c_tok=0.35, max_cpu=384)  # docker/entrypoint.sh: c_b 0.20, TOK 0.35, MAXN 384
CARD = DeviceTier(slots=2200)  # DSV41_BT_A 0.15, _HIT 0.04, _STAGE 0.50, _MAXSTAGE 8


def _ft_split_k(n_hit, n_held, tokens, mp, tier):
    """ft_split_k's loops as written (experimental ct/ft_tier_cu_v.cu L60-72): z outer, k inner, strict <."""
    nm = len(tokens)
    maxc = nm if mp.max_cpu is None else min(mp.max_cpu, nm)
    best, bk, bz = float("inf"), 0, 0
    for z in range(min(tier.max_stage, nm) + 1):
        card = tier.job_ms + tier.hit_ms * n_held + tier.stage_ms * z if (n_held + z) else 0.0
        c = 0.0
        for k in range(min(maxc, nm - z) + 1):
            if k:
                c += mp.c_b_ms * (1 + mp.c_tok * (tokens[k - 1] - 1))
            zg = nm - z - k
            gpu = mp.t_hit_ms * (n_hit + zg) + mp.t_zc_ms * zg
            tt = max(gpu, mp.c_a_ms + c if k else 0.0, card)
            if tt < best:
                best, bk, bz = tt, k, z
    return bk, bz, best


def test_split_worked_example():
    """2 hits, 1 expert on the card, 4 misses of one token: 2 to the CPU (0.51 ms), 1 staged on the card
    (0.15 + 0.04 + 0.50 = 0.69 ms), 1 zero-copy (GPU 0.03 x 3 + 0.58 = 0.67 ms): 0.69 ms, where no staging
    takes 0.71 ms (3 to the CPU)."""
    k, z, t = device_split(2, 1, [1, 1, 1, 1], D141, CARD)
    assert (k, z) == (2, 1) and t == pytest.approx(0.69)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 8), st.integers(0, 8), st.lists(st.integers(1, 4), max_size=14),
       st.floats(0.01, 1), st.floats(0.01, 1), st.integers(0, 9), st.sampled_from([None, 0, 3, 384]))
def test_split_is_ft_split_k_for_any_layer(n_hit, n_held, tokens, c_b, stage, max_stage, max_cpu):
    """The vectorised search picks the engine's (k, z) and cost for any hits, held experts, misses and constants."""
    mp = D141.model_copy(update={"c_b_ms": c_b, "max_cpu": max_cpu})
    tier = CARD.model_copy(update={"stage_ms": stage, "max_stage": max_stage})
    k, z, t = device_split(n_hit, n_held, tokens, mp, tier)
    bk, bz, bt = _ft_split_k(n_hit, n_held, tokens, mp, tier)
    assert (k, z) == (bk, bz) and t == pytest.approx(bt, abs=1e-12)


def test_worker_admits_every_expert_it_is_sent_and_evicts_the_least_recent():
    """Write-through LRU over all layers: a job's experts it lacks are loaded (staged), the oldest goes."""
    dev = ExpertDeviceTier(DeviceTier(slots=3), 2, 8)
    assert dev._run(0, np.array([1, 2])) == (0, 2)
    assert dev._run(1, np.array([5])) == (0, 1)
    assert dev._run(0, np.array([1])) == (1, 0)  # (0, 1) is now the most recent
    assert dev._run(1, np.array([6])) == (0, 1)  # evicts (0, 2), the least recent
    assert list(dev.lru) == [(1, 5), (0, 1), (1, 6)]
    assert sorted(zip(*np.nonzero(dev.res))) == [(0, 1), (1, 5), (1, 6)]


def test_the_split_sees_the_cards_slots_as_of_the_last_step():
    """The server mirrors the worker's residency once a step: an expert loaded this step is still a miss to
    the split; one evicted since the last mirror is sent as held and loaded again (staged)."""
    dev = ExpertDeviceTier(DeviceTier(slots=1, max_stage=1, stage_ms=0.0, job_ms=0.0), 1, 8)
    rest, _, k, held, staged = dev.route(0, 0, np.array([3]), None, D141, 1)
    assert (held, staged) == (0, 1) and rest.size == 0 and dev.res[0, 3] and not dev.hint[0, 3]
    dev.end_step()
    dev._run(0, np.array([4]))  # another job this step takes the one slot: 3 is gone, the hint still has it
    rest, _, k, held, staged = dev.route(0, 0, np.array([3]), None, D141, 1)
    assert (held, staged) == (0, 1) and rest.size == 0


def test_a_step_over_the_token_limit_leaves_the_card_out():
    """More than max_batch_tokens tokens a step: no card work; the held experts are ordinary misses."""
    dev = ExpertDeviceTier(DeviceTier(slots=8, max_batch_tokens=4), 1, 8)
    dev._run(0, np.array([1]))
    dev.end_step()
    misses = np.array([1, 2])
    rest, tok, k, held, staged = dev.route(0, 0, misses, np.array([2, 3]), D141, 5)
    assert k == -1 and (held, staged) == (0, 0) and list(rest) == [1, 2]


def _sim(hw_name, plan, streams=1):
    from simulator.run import simulate
    from specs.loaders import load_hardware, load_model
    from specs.memory import size_cache
    model, hw = load_model("deepseek-v4.1-flash-3.02"), load_hardware(hw_name)
    return simulate(model, hw, size_cache(model, hw, plan), streams=streams, gen_tokens=24, warm_steps=40)


def test_a_card_without_slots_changes_nothing():
    """The same host with the card but no slots in the plan decodes exactly as without the card."""
    a = _sim("epyc8ch-3090", plan_template("tiered-cache"))
    b = _sim("epyc8ch-3090+arc-pro-b70", plan_template("tiered-cache"))
    assert a.decode_tok_s == b.decode_tok_s and "expert_device" not in b.resources


def test_every_routed_expert_is_served_once_by_one_engine():
    """Bytes served by VRAM, zero-copy, the CPU and the card add up to the distinct experts routed; the card
    reports its busy time and the bytes of its products."""
    r = _sim("epyc8ch-3090+arc-pro-b70", plan_template("tiered-cache").model_copy(
        update={"device_tier": DeviceTier(slots=2200)}), streams=2)
    b = r.bytes_by_tier
    from specs.loaders import load_model
    eb = load_model("deepseek-v4.1-flash-3.02").expert_bytes
    assert b["vram"] + b["zero_copy"] + b["cpu"] + b["device"] == pytest.approx(r.reads * eb, rel=1e-9)
    assert b["device"] > b["device_staged"] > 0
    assert r.resources["expert_device"]["bytes"] == pytest.approx(b["device"]) and r.resources["expert_device"][
        "busy_fraction"] > 0


def test_a_step_runs_as_the_next_captured_graph_size():
    """vLLM's FULL_DECODE_ONLY graphs (dsv41-flash-offload: --cudagraph-capture-sizes 1 2 4 6 8 12 16 24): 3 tokens run
    as 4, 5 as 6, 24 as 24; beyond the largest size, or without sizes, as themselves."""
    p = plan_template("tiered-cache")
    assert [p.padded_tokens(n) for n in (1, 2, 3, 5, 7, 24, 25)] == [1, 2, 4, 6, 8, 24, 25]
    assert plan_template("llamacpp").padded_tokens(3) == 3


def test_three_streams_padded_to_four_read_four_streams_experts():
    """The padding row routes and reads experts as a token does: 3 streams take about 4 streams' step (the
    dense path and KV reads stay 3 tokens'), so they decode at ~3/4 of 4 streams' rate, below 3 unpadded."""
    plan = plan_template("tiered-cache")
    three, four = _sim("epyc8ch-3090", plan, streams=3), _sim("epyc8ch-3090", plan, streams=4)
    plain = _sim("epyc8ch-3090", plan.model_copy(update={"graph_batch_sizes": []}), streams=3)
    assert three.decode_tok_s == pytest.approx(0.75 * four.decode_tok_s, rel=0.02)
    assert three.decode_tok_s < plain.decode_tok_s and three.reads == four.reads
