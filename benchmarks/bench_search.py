"""Issue 6: the placement search for DeepSeek-V4.1-Flash 3.02 on epyc8ch-3090 (262k context)
finishes within 30 s, and its best plan is predicted at least as fast as the D141 default.

    python -m pytest benchmarks/bench_search.py --benchmark-enable -p no:cacheprovider
"""
from calibration.cases import get_case
from planner.predict import simulate_plan
from planner.search import search
from specs.loaders import load_hardware, load_model
from specs.memory import size_cache


def test_search_wall_time_and_best_against_d141(benchmark):
    m, hw = load_model("deepseek-v4.1-flash-3.02"), load_hardware("epyc8ch-3090")
    best, pred, rows, front = benchmark.pedantic(search, args=(m, hw, "decode"), kwargs={"context": 262144, "top": 4},
                                                 rounds=3, iterations=1)
    # the D141 default simulated as the search simulates its candidates (512-token prompt, 128 tokens)
    d141 = simulate_plan(m, hw, size_cache(m, hw, get_case("D141-1stream").plan)).decode_tok_s
    print(f"\nbest: {best.engine}, {pred.decode_tok_s:.2f} tok/s simulated; D141 default {d141:.2f} tok/s")
    assert benchmark.stats.stats.median < 30.0
    assert pred.decode_tok_s >= d141
