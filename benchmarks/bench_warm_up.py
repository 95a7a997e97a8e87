"""The executor's TTFT with and without its warm-up run, each predicted by the simulator on given profiles.

    python benchmarks/bench_warm_up.py --models small.gguf small-q4k.gguf --profiles HW1.yaml HW2.yaml
        [--rounds 3] [--prompt 512] [--gen 32] [--plan PLAN.json]

Each round runs `moe-offload execute` on every model twice in fresh processes, `--no-warmup` (the cold first prompt:
the allocator's arenas grow and their pages are touched in it) and the default (timed after a throwaway run of the
same shape, as llama-bench times its runs), and simulates each run on its own routing on every profile
(calibration.regress.run_against_model). Prints, per model and mode, the measured TTFTs and decode rates and the mean
error of the predictions over the rounds and profiles. The plan defaults to an all-CPU one with CPU prefill.
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

from calibration.regress import run_against_model  # noqa: E402
from specs.loaders import load_hardware, load_plan  # noqa: E402

MODES = (("cold", ["--no-warmup"]), ("warm", []))


def one_run(plan: str, model: str, prompt: int, gen: int, extra: list[str], trace: Path) -> dict:
    """One `execute --json` in its own process -> its result."""
    out = subprocess.run([sys.executable, "-m", "moe_offload", "execute", "--plan", plan, "--model", model,
                          "--prompt-tokens", str(prompt), "--gen-tokens", str(gen), "--trace", str(trace), "--json",
                          *extra], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--profiles", nargs="+", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--plan", help="plan JSON (default: all-CPU, CPU prefill)")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="warm-up-"))
    plan_path = a.plan or str(work / "plan.json")
    if not a.plan:
        Path(plan_path).write_text(json.dumps({"prefill": {"strategy": "cpu"}}))
    plan, hws = load_plan(plan_path), [load_hardware(p) for p in a.profiles]
    runs: dict[tuple[str, str], list[tuple[dict, list[dict]]]] = {}
    for i in range(a.rounds):
        for model in a.models:
            for mode, extra in MODES:
                r = one_run(plan_path, model, a.prompt, a.gen, extra, work / f"trace-{i}-{mode}-{Path(model).stem}.jsonl")
                preds = [run_against_model(r, plan, model, hw)["predicted"] for hw in hws]
                runs.setdefault((model, mode), []).append((r, preds))
                print(f"round {i + 1} {Path(model).name} {mode}: TTFT {r['ttft_s']:.3f} s, decode "
                      f"{r['decode_tok_s']:.1f} tok/s", flush=True)
    for (model, mode), rs in runs.items():
        err = lambda k: statistics.mean(p[k] / r[k] - 1 for r, ps in rs for p in ps)  # noqa: E731
        print(f"{Path(model).name} {mode}: TTFT median {statistics.median(r['ttft_s'] for r, _ in rs):.3f} s "
              f"(predicted {100 * err('ttft_s'):+.1f}%), decode median "
              f"{statistics.median(r['decode_tok_s'] for r, _ in rs):.1f} tok/s (predicted {100 * err('decode_tok_s'):+.1f}%)"
              f"; {len(rs)} runs x {len(hws)} profiles")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
