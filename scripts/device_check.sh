#!/usr/bin/env bash
# CUDA check of the executor (< 5 minutes): builds `tiny` and `small`, runs the CUDA path (dense,
# KV and the expert cache on the GPU; misses on the CPU or over PCIe by the auction) and the CPU
# path on the same prompts, and prints logits agreement and speed for each.
#   usage: scripts/device_check.sh [WORKDIR]     (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
WORK=${1:-/tmp/moe-offload-devcheck}
mkdir -p "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout 285 "$PY" - "$WORK" <<'EOF'
import json, os, platform, sys, time
from pathlib import Path
import numba
import numpy as np
import torch
from calibration.local import device_check_plans
from executor.gguf_model import GGUFModel
from executor.make_model import make_model
from executor.runner import execute

work = Path(sys.argv[1])
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-", "| numba", numba.__version__,
      "threads", numba.get_num_threads(), "|", os.cpu_count(), "CPUs:", cpu, flush=True)
t = time.time()
tiny = make_model("tiny", work / "tiny.gguf")
small = make_model("small", work / "small.gguf")
print(f"built tiny + small in {time.time() - t:.1f} s", flush=True)

out = {}
for name, path, gen in (("tiny", tiny, 16), ("small", small, 24)):
    base = None
    c = GGUFModel(path).cfg
    for pname, plan in device_check_plans(c.n_layers, c.n_experts).items():
        r = execute(plan, path, 16, gen, trace_path=work / f"{name}-{pname}.jsonl", keep_logits=True)
        lg = np.stack([l[0] for l in r["logits"]])
        if base is None:
            base = (lg, r["tokens"])
        n = min(len(lg), len(base[0]))
        rel = float((np.abs(lg[:n] - base[0][:n]).max(1) / np.abs(base[0][:n]).max(1)).max())
        same = sum(a == b for a, b in zip(r["tokens"][0], base[1][0])) / gen
        row = dict(device=r["device"], path=r["decode_path"], decode_tok_s=round(r["decode_tok_s"], 2), ttft_s=round(r["ttft_s"], 3),
                   itl_p50_ms=round(r["itl_p50_ms"], 2), hit_rate=r["cache_hit_rate"], logits_rel_vs_cpu=rel,
                   same_tokens=same, bw_gbs={k: (round(v, 1) if v else v) for k, v in r["bandwidth_gbs"].items()})
        out[f"{name}/{pname}"] = row
        print(f"{name:5s} {pname:24s} {json.dumps(row)}", flush=True)
for name in ("tiny", "small"):  # decode speed of each plan against the CPU-only path
    cpu = out[f"{name}/cpu-only"]["decode_tok_s"]
    print(name, " ".join(f"{k.split('/')[1]} {v['decode_tok_s'] / cpu:.2f}x" for k, v in out.items()
                         if k.startswith(name + "/")), flush=True)
(work / "device_check.json").write_text(json.dumps(out, indent=1))
bad = [k for k, v in out.items() if v["logits_rel_vs_cpu"] > 1e-2]
print("logits agree (rel <= 1e-2) for all plans" if not bad else f"logits disagree: {bad}")
sys.exit(1 if bad else 0)
EOF
