"""Inverse planning: the cheapest change that meets a target, re-planned from scratch (issue 7)."""
from planner.optimize import compare_models, optimize
from planner.predict import predict
from planner.search import base_plan
from specs.loaders import load_hardware, load_model


def test_first_option_for_10_tok_s_on_rtx5070_meets_the_target_when_applied():
    m, hw = load_model("deepseek-v4.1-flash-1017-gsq-2.00"), load_hardware("rtx5070-64g")
    assert predict(m, hw, base_plan(m, hw)).decode_tok_s < 10  # the machine as it is does not
    best = optimize(m, hw, 10, predict)[0]
    assert best.meets
    again = predict(best.model, best.hw, base_plan(best.model, best.hw))
    assert again.decode_tok_s >= 10


def test_options_that_meet_come_cheapest_first():
    m, hw = load_model("deepseek-v4.1-flash-1017-gsq-2.00"), load_hardware("rtx5070-64g")
    opts = optimize(m, hw, 10, predict)
    meeting = [o.cost_usd for o in opts if o.meets]
    assert meeting == sorted(meeting) and opts[: len(meeting)] == [o for o in opts if o.meets]


def test_compare_models_says_which_meets_the_target():
    hw = load_hardware("i5-13600k-ddr5-3090")
    rows = compare_models([load_model("qwen3.8-flash-next-iq3_s"), load_model("deepseek-v4.1-flash")], hw, 20, predict)
    by = {r["model"]: r for r in rows}
    assert by["qwen3.8-flash-next-iq3_s"]["meets"] and not by["deepseek-v4.1-flash"]["meets"]
