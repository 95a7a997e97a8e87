"""All-CPU decode with runs of layers in one numba call (executor/cpu_layers.py, CpuStep's default) against
the same step with each layer's kernels called from Python (`CpuStep(fused=False)`), two runners in one
process, alternating generate() calls:

    python benchmarks/bench_fused_layers.py [--preset tiny|small|... | --model FILE.gguf]
        [--dir /tmp/moe-offload-bench] [--rounds 10] [--tokens 64]

Prints each round's median inter-token latency for both and the median of the paired ratios (this VM's
spells move both by +-10-30% across minutes; a round runs the two within a few hundred ms).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import executor  # noqa: E402,F401  (first: sets the OpenMP spin before torch loads it)
from calibration.local import ensure_model  # noqa: E402
from executor.cpu_step import CpuStep  # noqa: E402
from executor.runner import Runner, default_prompts  # noqa: E402
from specs.plan import Placement, Plan  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--model", help="a GGUF instead of a preset (e.g. bench_vs_llamacpp's fixture-shape.gguf)")
    ap.add_argument("--dir", default="/tmp/moe-offload-bench")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=64, help="decode tokens per generate() call")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    model = Path(a.model) if a.model else ensure_model(a.preset, a.dir, engram=False)
    plan = Plan(placement=Placement(engram="none", dense="cpu"), cpu_threads=a.threads, streams=1)
    runners = {}
    for fused in (True, False):
        r = Runner(plan, model, 64 + a.tokens + 1)
        r.cpu = CpuStep(r, fused=fused)
        r.generate(default_prompts(1, 16, r.c.vocab), 8)  # compiled / loaded, pages mapped
        runners[fused] = r
    itl = {True: [], False: []}
    for k in range(a.rounds):
        for fused in ((True, False) if k % 2 == 0 else (False, True)):
            r = runners[fused]
            r.trace.clear()
            r.kv.len = 0
            _, times, _ = r.generate(default_prompts(1, 64, r.c.vocab, seed=k), a.tokens + 1)
            itl[fused].append(statistics.median(times["itl_s"]) * 1e6)
        print(f"round {k + 1}: fused {itl[True][-1]:.0f} us, per layer {itl[False][-1]:.0f} us a token", flush=True)
    ratios = [f / u for f, u in zip(itl[True], itl[False])]
    print(f"{model.name}, {a.threads} threads: median inter-token latency fused {statistics.median(itl[True]):.0f} us, "
          f"per layer {statistics.median(itl[False]):.0f} us; fused / per layer, paired: median "
          f"{statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}, {a.rounds} rounds)")
    for r in runners.values():
        r.experts.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
