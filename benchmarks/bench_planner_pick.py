"""Issue 6: with a VRAM budget set, is the planner's pick for `small`, measured by the executor,
within 5% of the best of six other candidate plans measured the same way?

    python benchmarks/bench_planner_pick.py [--hw runs/host-fitted.yaml] [--budget-gb 4] [--rounds 3]

The profile is this machine's, fitted from executor traces (`python benchmarks/bench_fidelity.py`
writes runs/host-fitted.yaml); on a CPU-only host its `gpu` is the torch device sharing the cores.
The planner searches under the budget; the pick and the candidates run round-robin, `rounds`
times each, medians of the quietest runs (calibration/local.py), side by side in one run.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from calibration.local import LocalCase, _cache, _plan, ensure_model, measure
    from planner.search import search
    from specs.loaders import load_hardware, load_model
    from specs.plan import Placement

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hw", default="runs/host-fitted.yaml")
    ap.add_argument("--budget-gb", type=float, default=4.0, help="VRAM budget of the device (GB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=48)
    a = ap.parse_args(argv)

    path = ensure_model("small")
    model, hw = load_model(str(path)), load_hardware(a.hw)
    hw = hw.model_copy(update={"gpu": hw.gpu.model_copy(update={"vram_bytes": hw.gpu.vram_bytes.with_value(a.budget_gb * 1e9)})})
    pick, pred, rows, _ = search(model, hw, "decode", context=4096, top=4)
    print(f"planner pick: {pick.engine}, dense on {pick.placement.dense}, miss {pick.miss_policy.kind}, cache {pick.expert_cache.policy} "
          f"{pick.expert_cache.slots} slots, device layers {pick.placement.gpu_expert_layers}; "
          f"predicted {pred.decode_tok_s:.1f} tok/s")
    n, L, E = 16, model.n_layers, model.n_experts
    picked = _plan(n, placement=Placement(dense=pick.placement.dense, kv=pick.placement.kv, engram="none",
                                          gpu_expert_layers=pick.placement.gpu_expert_layers),
                   expert_cache=pick.expert_cache.model_copy(update={"release_during_prefill": False}),
                   miss_policy=pick.miss_policy)
    cands = [LocalCase("planner-pick", picked, n, a.gen, "decode_tok_s"),
             LocalCase("all-cpu", _plan(n), n, a.gen, "decode_tok_s"),
             LocalCase("cache-10pct", _plan(n, expert_cache=_cache(round(0.1 * L * E))), n, a.gen, "decode_tok_s"),
             LocalCase("cache-30pct", _plan(n, expert_cache=_cache(round(0.3 * L * E))), n, a.gen, "decode_tok_s"),
             LocalCase("cache-30pct-auction", _plan(n, expert_cache=_cache(round(0.3 * L * E)),
                                                    miss_policy={"kind": "auction"}), n, a.gen, "decode_tok_s"),
             LocalCase("static-2-layers", _plan(n, placement=Placement(engram="none", gpu_expert_layers=[L - 2, L - 1])),
                       n, a.gen, "decode_tok_s"),
             LocalCase("static-half", _plan(n, placement=Placement(engram="none", gpu_expert_layers=list(range(L // 2, L)))),
                       n, a.gen, "decode_tok_s")]
    got = measure(path, cands, store_path=None, rounds=a.rounds)
    by = {r["case"]: float(r["value"]) for r in got}
    best = max((v, k) for k, v in by.items() if k != "planner-pick")
    for k, v in by.items():
        print(f"  {k:22s} {v:7.2f} tok/s")
    ratio = by["planner-pick"] / best[0]
    print(f"planner pick {by['planner-pick']:.2f} tok/s = {ratio * 100:.1f}% of the best other candidate "
          f"({best[1]}, {best[0]:.2f} tok/s); bar: >= 95%")
    return 0 if ratio >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
