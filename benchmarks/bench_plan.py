"""Benchmark: `moe-offload plan --hw epyc8ch-3090.yaml --model deepseek-v4.1-flash` end to end.

Bar (issue 2): under 2 s on this machine, a fresh process each round (start-up included).
Run: python -m pytest benchmarks/bench_plan.py --benchmark-enable -p no:cacheprovider
"""
import shutil
import subprocess
import sys

CMD = ["plan", "--hw", "epyc8ch-3090.yaml", "--model", "deepseek-v4.1-flash"]


def _run():
    exe = shutil.which("moe-offload")
    argv = [exe, *CMD] if exe else [sys.executable, "-m", "moe_offload", *CMD]
    subprocess.run(argv, check=True, capture_output=True)


def test_plan_report_wall_time(benchmark):
    benchmark.pedantic(_run, rounds=7, iterations=1, warmup_rounds=1)
    assert benchmark.stats.stats.median < 2.0
