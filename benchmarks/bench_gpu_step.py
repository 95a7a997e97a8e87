"""Where a decode step's time goes on the executor's torch path (CUDA when present), plan by plan.

For each of scripts/device_check.sh's plans on `small` (or --model) and each decode mode (the eager
per-op step, device_step's static calls run eagerly, and as CUDA graphs), in one process: prefill, a
few warm steps, --tokens timed decode steps (tok/s), then --tokens more under torch.profiler: the
per-layer split the trace records (dense, experts), and per step the torch ops dispatched, CUDA kernel
launches, host<->device copies and synchronisations, and the ops that cost the host most (README,
"A CUDA host").

    python benchmarks/bench_gpu_step.py [--model small.gguf] [--plans gpu-cache-100% ...] [--tokens 12]
        [--modes eager static graphs]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from calibration.local import device_check_plans  # noqa: E402
from executor import device_step as DS  # noqa: E402
from executor.make_model import make_model  # noqa: E402
from executor.runner import Runner, _argmax, default_prompts  # noqa: E402

HOST_EVENTS = ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize",
               "cudaLaunchKernelExC", "cuLaunchKernel", "cudaHostAlloc", "cudaEventSynchronize")
MODES = ("eager", "static", "graphs")  # per-op torch step; device_step's calls eagerly; as CUDA graphs


def profile_plan(plan, path: Path, prompt: int, warm: int, tokens: int, top: int, mode: str = "graphs",
                 torch_dense: bool = False) -> dict:
    """Decode `tokens` steps of `plan` untimed by the profiler (tok/s), then `tokens` under it -> step
    times, trace split, per-step op counts. torch_dense: the torch dense path on the CPU too."""
    DS.GRAPHS = mode == "graphs"
    r = Runner(plan, path, prompt + warm + 2 * tokens + 1, dense_inplace=False if torch_dense else None,
               static_decode=mode != "eager")
    try:
        c = r.c
        tok = _argmax(r._run(default_prompts(plan.streams, prompt, c.vocab), "prefill", 0))
        r.experts.end_step()
        g, warm_ms = 1, []
        for _ in range(warm):  # the first decode step captures the graphs
            t = time.perf_counter()
            tok = _argmax(r._run(tok[:, None], "decode", g))
            warm_ms.append((time.perf_counter() - t) * 1e3)
            r.experts.end_step()
            g += 1
        t = time.perf_counter()
        for _ in range(tokens):
            tok = _argmax(r._run(tok[:, None], "decode", g))
            r.experts.end_step()
            g += 1
        tok_s = plan.streams * tokens / (time.perf_counter() - t)
        n0 = len(r.trace)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        steps = []
        with profile(activities=acts) as prof:
            for _ in range(tokens):
                t = time.perf_counter()
                tok = _argmax(r._run(tok[:, None], "decode", g))
                steps.append(time.perf_counter() - t)
                r.experts.end_step()
                g += 1
        if r.cpu is not None:
            r.cpu.flush()
        recs = r.trace[n0:]
        ka = prof.key_averages()
        per = lambda n: n / tokens  # noqa: E731
        aten = sum(e.count for e in ka if e.key.startswith("aten::"))
        host = {k: per(sum(e.count for e in ka if e.key == k)) for k in HOST_EVENTS}
        rows = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
        return dict(
            device=str(r.device), mode="cpu-step" if r.static is None and mode != "eager" else
            "static" if mode == "graphs" and r.device.type != "cuda" else mode,  # graphs need CUDA
            tok_s=tok_s, first_step_ms=warm_ms[0] if warm_ms else None,
            step_ms_p50_profiled=float(np.median(steps) * 1e3),
            layer_dense_ms=float(np.median([x["t_dense_ms"] for x in recs])),
            layer_experts_ms=float(np.median([x["t_experts_ms"] for x in recs])),
            layer_dev_ms=float(np.median([x["t_dev_ms"] for x in recs])),
            hits_per_layer=float(np.mean([len(x["hits"]) for x in recs])),
            aten_ops_per_step=per(aten), aten_ops_per_layer=per(aten) / c.n_layers,
            host_calls_per_step={k: v for k, v in host.items() if v},
            top_self_cpu_us_per_step=[(e.key, round(per(e.self_cpu_time_total), 1), round(per(e.count), 1))
                                      for e in rows])
    finally:
        r.experts.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a GGUF MoE model (default: make-model's `small`, built in /tmp)")
    ap.add_argument("--plans", nargs="*", help="device_check plan names (default: all of them)")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES,
                    help="eager: torch op by op; static: device_step's calls eagerly; graphs: as CUDA graphs")
    ap.add_argument("--torch-dense", action="store_true", help="the torch dense path (CUDA's) on the CPU too")
    ap.add_argument("--json", type=Path, help="write the results here too")
    a = ap.parse_args(argv)
    path = a.model or Path("/tmp/moe-offload-bench/small.gguf")
    if not path.exists():
        make_model("small", path)
    from executor.gguf_model import GGUFModel
    c = GGUFModel(path).cfg
    plans = device_check_plans(c.n_layers, c.n_experts)
    out = {}
    for name in a.plans or list(plans):
        for mode in a.modes if name != "cpu-only" else ["eager"]:
            res = profile_plan(plans[name], path, a.prompt, a.warm, a.tokens, a.top, mode, a.torch_dense)
            out[f"{name}/{mode}"] = res
            _show(f"{name}/{res['mode']}", res)
    for name in a.plans or list(plans):  # the modes side by side
        row = {m: out[f"{name}/{m}"]["tok_s"] for m in a.modes if f"{name}/{m}" in out}
        print(f"{name:24s}", "  ".join(f"{m} {v:7.1f}" for m, v in row.items()), "tok/s",
              f"(x{row['graphs'] / row['eager']:.2f} graphs / eager)" if "graphs" in row and "eager" in row else "")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


def _show(name: str, res: dict) -> None:
    print(f"== {name}: {res['device']}  {res['tok_s']:.1f} tok/s (first step {res['first_step_ms'] or 0:.1f} ms, "
          f"profiled step {res['step_ms_p50_profiled']:.2f} ms)"
          f"  per layer: dense {res['layer_dense_ms']:.3f} ms, experts {res['layer_experts_ms']:.3f} ms "
          f"(device {res['layer_dev_ms']:.3f}, {res['hits_per_layer']:.1f} hits)  "
          f"aten ops {res['aten_ops_per_layer']:.1f}/layer", flush=True)
    print("   host calls per step:", json.dumps({k: round(v, 1) for k, v in res["host_calls_per_step"].items()}))
    for k, us, n in res["top_self_cpu_us_per_step"]:
        print(f"   {k:45s} {us:9.1f} us/step  x{n:.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
