"""The executor on the shape of the llama-bench fixture (tests/fixtures/llama-bench: qwen3moe,
hidden 512, 4 layers, 32 experts of width 256, top-4, Q8_0), 2 threads, pp64 / tg32 as llama-bench
ran it. llama.cpp's figures there (same kind of machine, another day): tg32 at 2 threads
944.75-1201.94 tok/s, pp64 2977-3596 tok/s. The vocabulary of that file is not recorded, so ours
(32,000) makes a larger file; decode at this size is overhead bound, not byte bound.

    python benchmarks/bench_vs_llamacpp_fixture.py
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from calibration.ingest import read_llama_bench
    from executor.make_model import Preset, write_model
    from executor.runner import execute
    from specs.plan import Placement, Plan, Prefill

    shape = Preset(n_layers=4, hidden=512, n_heads=8, n_kv=4, head_dim=64, n_experts=32, top_k=4, expert_ff=256,
                   vocab=32000, dense_type="Q8_0", embd_type="Q8_0", expert_types=("Q8_0",))
    fix = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "llama-bench" / "tiny-t12.json"
    ref = {(r.test, r.flags[r.flags.index("-t") + 1]): r.tok_s
           for r in read_llama_bench(fix)}
    with tempfile.TemporaryDirectory() as d:
        path = write_model(shape, Path(d) / "moe-tiny.gguf", 0, False, name="moe-tiny")
        plan = Plan(placement=Placement(dense="cpu", kv="cpu", engram="none"), cpu_threads=2,
                    prefill=Prefill(strategy="cpu", chunk_tokens=64, ubatch_tokens=64))
        runs = [execute(plan, path, prompt_tokens=64, gen_tokens=32, trace_path=Path(d) / "t.jsonl") for _ in range(5)]
    tg = statistics.median(r["decode_tok_s"] for r in runs[1:])
    pp = statistics.median(64 / r["ttft_s"] for r in runs[1:])
    print(f"executor, 2 threads: tg32 {tg:.0f} tok/s, pp64 {pp:.0f} tok/s (median of 4 after a warm-up run)")
    print(f"llama.cpp fixture, 2 threads: tg32 {ref[('tg32', '2')]:.0f} tok/s, pp64 {ref[('pp64', '2')]:.0f} tok/s")
    print(f"ratio executor / llama.cpp: tg {tg / ref[('tg32', '2')]:.2f}, pp {pp / ref[('pp64', '2')]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
