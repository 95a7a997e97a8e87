"""Benchmark: llama.cpp's weight kernels in situ, against the rates a profile gives them.

    python benchmarks/bench_llamacpp_in_situ.py --llama-bench PATH/llama-bench --model FILE.gguf [--threads 1]
        [--repack 1] [--gen 64] [--reps 3] [--hw HW.yaml] [--freq 2000]

Runs `llama-bench -p 0 -n GEN -r REPS -t THREADS --repack REPACK` once as it is, then under `perf record -e
cpu-clock -F FREQ`, and prints, for each of ggml's weight kernels the decode ran (calibration.in_situ): its bytes a
token, its time a token, the rate that is, and, with --hw, the rate the profile gives llama.cpp's plans for that weight
type (the rowwise or repacked one at that thread count) and their ratio; then how much of a token fell outside the
weight kernels. The tokens are llama-bench's warm-up token and its GEN x REPS. perf's sampling slows the run (5-12%
at 2 kHz on the Zen 4 VM); each kernel's time is scaled by the plain run's token time over the perf run's, as if the
slowdown were spread evenly. Needs `perf` (linux-tools) with permission to sample.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.detect import cpu_info  # noqa: E402
from calibration.in_situ import bytes_per_token, in_situ_rates, perf_samples  # noqa: E402
from specs.formats import parse_format  # noqa: E402
from specs.gguf_header import model_from_gguf  # noqa: E402
from specs.loaders import load_hardware  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repack", type=int, default=1, choices=(0, 1))
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--freq", type=int, default=2000, help="perf samples a second on each running thread")
    ap.add_argument("--hw", help="a calibrate profile whose llama.cpp rates to set beside")
    a = ap.parse_args(argv)
    model = model_from_gguf(a.model)
    hw = load_hardware(a.hw) if a.hw else None
    isa = hw.cpu.isa if hw else cpu_info()["isa"]
    bench_args = [a.llama_bench, "-m", a.model, "-p", "0", "-n", str(a.gen), "-r", str(a.reps), "-t", str(a.threads),
                  "--repack", str(a.repack), "-o", "json"]
    plain = json.loads(subprocess.run(bench_args, capture_output=True, text=True, check=True).stdout)[0]
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        run = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", str(a.freq), "-o", str(data),
                              *bench_args], capture_output=True, text=True, check=True)
        report = subprocess.run(["perf", "report", "-i", str(data), "-n", "--no-children", "--sort", "sym",
                                 "--stdio"], capture_output=True, text=True, check=True).stdout
    bench = json.loads(run.stdout)[0]
    tokens = 1 + a.gen * a.reps
    samples = perf_samples(report)

    def profile(fmt: str, repacked: bool):
        return hw.cpu.expert_gbs_for(parse_format(fmt), a.threads, rowwise=True, repacked=repacked) if hw else None
    scale = bench["avg_ts"] / plain["avg_ts"]
    rows = in_situ_rates(samples, 1.0 / a.freq, tokens, a.threads, bytes_per_token(model, isa, bool(a.repack)),
                         profile, scale)
    token_ms = 1e3 / plain["avg_ts"]
    print(f"{Path(a.model).name}: tg{a.gen} x {a.reps}, {a.threads} thread(s), repack {a.repack}: "
          f"{plain['avg_ts']:.1f} tok/s ({token_ms:.2f} ms a token), {bench['avg_ts']:.1f} under perf "
          f"({sum(samples.values())} samples; kernel times x {scale:.3f})")
    print(f"{'kernel':16s} {'MB/token':>9s} {'ms/token':>9s} {'GB/s':>7s} {'profile':>8s} {'ratio':>6s}")
    for r in rows:
        name = f"{r.fmt}{' repacked' if r.repacked else ''}"
        prof = f"{r.profile_gbs:8.1f} {r.profile_over:5.2f}x" if r.profile_gbs else f"{'-':>8s} {'-':>6s}"
        print(f"{name:16s} {r.mb_per_token:9.1f} {r.ms_per_token:9.3f} {r.gbs:7.1f} {prof}")
    kernels_ms = sum(r.ms_per_token for r in rows)
    print(f"weight kernels {kernels_ms:.2f} ms of {token_ms:.2f} a token ({100 * kernels_ms / token_ms:.1f}%); "
          f"the rest, {token_ms - kernels_ms:.2f} ms, is small ops, the graph loop and the host outside ggml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
