"""The executor against llama.cpp's CPU decode on the same GGUF with the same threads, side by side.

    python benchmarks/bench_vs_llamacpp.py --llama-bench PATH/llama-bench [--model FILE.gguf | --shape fixture]
        [--threads 2] [--rounds 5] [--repack 1 0] [--prompt 64] [--gemm-int8] [--store runs/results-llamacpp.csv]

--shape fixture writes the shape of the llama-bench fixture (tests/fixtures/llama-bench: qwen3moe,
hidden 512, 4 layers, 32 experts of width 256, top-4, Q8_0), where per-token overheads, not bytes,
decide the speed; the default is the `small` preset (1.37 GB, memory-bound decode).

Rounds alternate: llama-bench (pp64 and tg32, one repetition after its own warm-up; with
`--repack 1 0` once with its load-time repacking and once reading in place), then `execute` on an
all-CPU plan (64-token prompt, 32 generated; `--prompt 512`: pp512 both sides, the prefill GEMM's regime).
Prints each engine's median tok/s
and the ratio; with --store the llama-bench records are appended to a results store, so that
`moe-offload regress --store STORE --hw PROFILE --local-only` predicts llama.cpp's runs on this
machine with the simulator. llama.cpp is not a dependency: build `llama-bench` yourself (e.g.
from the llama-cpp-python sdist's vendor/llama.cpp with cmake, CPU only).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def llama_bench(exe: str, model: Path, threads: int, out: Path, repack: int | None = None,
                prompt: int = 64) -> dict[str, float]:
    """One llama-bench run (pp`prompt` + tg32, -r 1) as {test: tok/s}; its JSON is kept at `out`. repack: its
    `--repack` (1, its default: Q4_0 / Q4_K / IQ4_NL / MXFP4 weights copied at load into an interleaved
    layout; 0: read in place from the mmap, as the executor reads them)."""
    extra = ["--repack", str(repack)] if repack is not None else []
    res = subprocess.run([exe, "-m", str(model), "-t", str(threads), "-p", str(prompt), "-n", "32", "-r", "1",
                          "-o", "json", *extra], capture_output=True, text=True, check=True)
    out.write_text(res.stdout)
    return {("pp" if r["n_prompt"] else "tg"): float(r["avg_ts"]) for r in json.loads(res.stdout)}


def ours(model: Path, threads: int, trace: Path, prompt: int = 64) -> dict[str, float]:
    """One `execute` of an all-CPU plan: {'pp': prompt / TTFT, 'tg': decode tok/s}."""
    from executor.runner import execute
    from specs.plan import Placement, Plan, Prefill

    plan = Plan(placement=Placement(dense="cpu", kv="cpu", engram="none"), cpu_threads=threads,
                prefill=Prefill(strategy="cpu", chunk_tokens=prompt, ubatch_tokens=prompt))
    r = execute(plan, model, prompt_tokens=prompt, gen_tokens=32, trace_path=trace)
    return {"pp": prompt / r["ttft_s"], "tg": r["decode_tok_s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--model", help="GGUF (default: the `small` preset, written once under --dir)")
    ap.add_argument("--shape", choices=("small", "fixture"), default="small")
    ap.add_argument("--dir", default="/tmp/moe-offload-bench")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens, both engines (pp64 by default)")
    ap.add_argument("--store", help="append llama-bench's records to this results store")
    ap.add_argument("--repack", type=int, choices=(0, 1), nargs="+", default=[1],
                    help="llama-bench --repack values to run each round (e.g. 1 0: both, side by side)")
    ap.add_argument("--gemm-int8", action="store_true", help="the executor's prefill GEMM on int8 activations "
                    "(`execute --gemm-int8`: llama.cpp's precision)")
    a = ap.parse_args(argv)
    if a.gemm_int8:  # read as the kernels load
        import os
        os.environ["MOE_OFFLOAD_GEMM_INT8"] = "1"
    import executor  # noqa: F401  (sets OMP_WAIT_POLICY before torch loads OpenMP)
    from executor.make_model import make_model

    model = Path(a.model) if a.model else Path(a.dir) / f"{'moe-fixture' if a.shape == 'fixture' else 'small'}.gguf"
    if not model.exists() and a.shape == "fixture":
        from executor.make_model import Preset, write_model
        shape = Preset(n_layers=4, hidden=512, n_heads=8, n_kv=4, head_dim=64, n_experts=32, top_k=4, expert_ff=256,
                       vocab=32000, dense_type="Q8_0", embd_type="Q8_0", expert_types=("Q8_0",))
        model.parent.mkdir(parents=True, exist_ok=True)
        write_model(shape, model, 0, False, name="moe-fixture")
    elif not model.exists():
        make_model("small", model)
    work = Path(tempfile.mkdtemp(prefix="vs-llamacpp-"))
    ours(model, a.threads, work / "warm.jsonl", a.prompt)  # kernel compile and page cache, not counted
    ll: dict[int, list[dict]] = {rp: [] for rp in a.repack}
    me, files = [], []
    for i in range(a.rounds):
        for rp in a.repack:
            files.append(work / f"llama-bench-{i}-repack{rp}.json")
            # the default alone passes no --repack, so that builds from before the flag still run
            ll[rp].append(llama_bench(a.llama_bench, model, a.threads, files[-1], rp if a.repack != [1] else None,
                                      a.prompt))
        me.append(ours(model, a.threads, work / f"trace-{i}.jsonl", a.prompt))
        pp = f"pp{a.prompt}"
        print(f"round {i + 1}: " + " | ".join(f"llama.cpp repack {rp} {pp} {ll[rp][-1]['pp']:.1f} tg32 {ll[rp][-1]['tg']:.1f}"
                                              for rp in a.repack)
              + f" | executor {pp} {me[-1]['pp']:.1f} tg32 {me[-1]['tg']:.1f} tok/s", flush=True)
    for t, name in (("tg", "decode tg32"), ("pp", f"prefill pp{a.prompt}")):
        em = statistics.median(r[t] for r in me)
        for rp in a.repack:
            lm = statistics.median(r[t] for r in ll[rp])
            print(f"{name}: llama.cpp (repack {rp}) {lm:.1f} tok/s, executor {em:.1f} tok/s, executor / llama.cpp "
                  f"{em / lm:.2f} (medians of {a.rounds}, {a.threads} threads, {model.name})")
    if a.store:
        from calibration.ingest import ingest_runs
        rows = ingest_runs([str(f) for f in files], str(model), "", a.store)
        print(f"{len(rows)} llama.cpp runs appended to {a.store}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
