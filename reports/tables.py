"""Human tables (rich) for the ceiling report and simulation results."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

GB, GIB = 1e9, 2**30


def _gib(x: float) -> str:
    return f"{x / GIB:,.2f} GiB"


def _memory_table(c: Console, tiers: dict) -> None:
    t = Table(title="Memory map")
    t.add_column("tier"); t.add_column("holds"); t.add_column("bytes", justify="right")
    for tier in ("vram", "ram", "nvme", "card"):
        for k, v in tiers.get(tier, {}).items():
            if v:
                t.add_row(tier.upper(), k, _gib(v))
    c.print(t)


def render_memory_map(mm, console: Console | None = None) -> None:
    """Print a specs.memory.MemoryMap as a table with the totals per tier."""
    c = console or Console()
    _memory_table(c, {"vram": mm.vram, "ram": mm.ram, "nvme": mm.nvme, "card": mm.card})
    c.print(f"VRAM {_gib(mm.vram_used)} of {_gib(mm.vram_capacity)}; RAM {_gib(mm.ram_used)} of {_gib(mm.ram_capacity)}")


def render_plan_report(s: dict, console: Console | None = None) -> None:
    """Print the ceiling report of `plan_summary` as tables."""
    c = console or Console()
    m = s["model"]
    c.print(f"[bold]{m['name']}[/] on [bold]{s['hardware']}[/]: {m['routed_experts']:,} routed experts, "
            f"{m['routed_params'] / 1e9:,.1f}B routed weights, {m['expert_format']} "
            f"({m['expert_bits']:.2f} bits) = {_gib(m['routed_bytes'])}; one expert {m['expert_bytes'] / 1e6:.2f} MB")

    t = Table(title="Bytes read per token")
    t.add_column("component"); t.add_column("bytes/token", justify="right"); t.add_column("note")
    t.add_row("routed experts", f"{m['routed_bytes_per_token'] / GB:.3f} GB", "MoE layers x top-k x expert bytes")
    t.add_row("dense path", f"{m['dense_bytes_per_token'] / GB:.3f} GB",
              f"{m['dense_ms_per_token']:.1f} ms at {'VRAM' if s.get('has_gpu', True) else 'DDR'} bandwidth "
              "(upper estimate)")
    if m["engram_rows_per_token"]:
        t.add_row("Engram (pages)", f"{m['engram_bytes_per_token'] / 1e3:.1f} KB",
                  f"{m['engram_rows_per_token']} rows, {m['engram_used_bytes_per_token']:,.0f} B used, "
                  f"{m['engram_page_crossing'] * 100:.1f}% cross a page")
    c.print(t)

    for key, title in (("ceilings", f"Expert ceilings on {s['hardware']}"),
                       ("standard_ceilings", "Expert ceilings on the standard buses")):
        t = Table(title=title)
        t.add_column("tier"); t.add_column("GB/s", justify="right"); t.add_column("tok/s", justify="right")
        t.add_column("source")
        for row in s[key]:
            t.add_row(row["tier"], f"{row['bandwidth_gbs']:.1f}", f"{row['tok_s']:.1f}", row["source"])
        c.print(t)

    mem = s["memory"]
    _memory_table(c, mem)
    if mem["vram_capacity"]:
        c.print(f"VRAM {_gib(mem['vram_capacity'] - mem['vram_free'])} of {_gib(mem['vram_capacity'])} used; "
                f"expert cache {mem['cache_slots']:,} slots ({_gib(mem['cache_bytes'])}); "
                f"KV fits {mem['kv_tokens_fit']:,} tokens")
    if mem.get("card_slots"):
        c.print(f"second card: {mem['card_slots']:,} expert slots ({_gib(mem['card']['expert slots'])}), a third engine "
                "beside the GPU and the CPU")
    p = s["predicted"]
    c.print(f"[bold]Predicted[/] ({p['method']}): decode {p['decode_tok_s']:.2f} tok/s, "
            f"TTFT {p['ttft_s']:.2f} s, bound by {p['bottleneck']}")
    if s.get("what_ifs"):
        t = Table(title="What if (same plan, cache re-sized)")
        for col in ("change", "decode tok/s", "gain", "TTFT s", "bound by"):
            t.add_column(col, justify="left" if col in ("change", "bound by") else "right")
        for w in s["what_ifs"]:
            t.add_row(w["what_if"], f"{w['decode_tok_s']:.2f}", f"{w['decode_gain'] * 100:+.0f}%",
                      f"{w['ttft_s']:.2f}", w["bottleneck"])
        c.print(t)
    if s.get("pareto"):
        t = Table(title="Pareto front (screen): no other plan beats these on both decode and TTFT")
        for col in ("engine", "misses", "cache slots", "device layers", "prefill", "decode tok/s", "TTFT s"):
            t.add_column(col, justify="right" if col[0].islower() and col not in ("engine", "misses", "prefill") else "left")
        for f in s["pareto"]:
            t.add_row(f["engine"], f["miss_policy"], str(f["cache_slots"]), str(f["gpu_expert_layers"]),
                      f"{f['prefill']} {f['chunk_tokens']}", f"{f['decode_tok_s']:.2f}", f"{f['ttft_s']:.2f}")
        c.print(t)
    if s.get("llamacpp"):
        L = s["llamacpp"]
        c.print(f"[bold]llama.cpp[/]: {L['command']}")
        for x in L["cannot_express"]:
            c.print(f"  cannot express: {x}")
        cp = L["closest_static_predicted"]
        c.print(f"  that static plan is predicted at {cp['decode_tok_s']:.2f} tok/s, TTFT {cp['ttft_s']:.2f} s")
    e = s["engram"]
    if e["reads_per_s"]:
        c.print(f"Engram at that speed: {e['reads_per_s']:,.0f} row reads/s, {e['bytes_per_s'] / 1e6:.2f} MB/s "
                f"({e['share_of_nvme'] * 100:.2f}% of the NVMe's sequential rate)")


def render_options(rows: list[dict], target: float, models: bool = False, console: Console | None = None) -> None:
    """Print optimize's ranked changes (or models) against the target tok/s."""
    c = console or Console()
    t = Table(title=f"{'Models' if models else 'Changes'} for {target:g} tok/s")
    first = "model" if models else "change"
    t.add_column(first)
    if not models:
        t.add_column("cost (USD, assumed)", justify="right")
    for col in ("decode tok/s", "TTFT s", "bound by", "meets"):
        t.add_column(col, justify="right" if "s" in col.split()[-1] else "left")
    for r in rows:
        cells = [r[first]] + ([] if models else [f"{r['cost_usd']:,.0f}"])
        if "decode_tok_s" in r:
            cells += [f"{r['decode_tok_s']:.2f}", f"{r['ttft_s']:.2f}", r["bottleneck"]]
        else:
            cells += ["-", "-", f"does not fit: {r.get('reason', '')}"]
        t.add_row(*cells, "yes" if r["meets"] else "no")
    c.print(t)


def render_sim_result(r: dict, title: str, console: Console | None = None) -> None:
    """Print a simulation result: headline metrics, then each resource's busy fraction and bytes."""
    c = console or Console()
    c.print(f"[bold]{title}[/]")
    c.print(f"decode {r['decode_tok_s']:.2f} tok/s (ITL p50 {r['itl_p50_ms']:.1f} ms, p95 {r['itl_p95_ms']:.1f} ms); "
            f"TTFT {r['ttft_s']:.2f} s (prefill {r['prefill_tok_s']:.0f} tok/s); "
            f"cache hit rate {r['cache_hit_rate']:.3f}; bound by {r['bottleneck']}")
    t = Table(title="Resources")
    t.add_column("resource"); t.add_column("busy", justify="right"); t.add_column("bytes", justify="right")
    for name, v in r["resources"].items():
        t.add_row(name, f"{v.get('busy_fraction', 0) * 100:.1f}%", f"{v.get('bytes', 0) / 1e9:,.2f} GB")
    c.print(t)


def render_regress(rows: list[dict], summary: dict, console: Console | None = None) -> None:
    """Print predicted against measured per case, in-sample first, with the error summary."""
    c = console or Console()
    t = Table(title="Predicted against measured")
    for col in ("case", "role", "metric", "measured", "predicted", "error", "ok"):
        t.add_column(col, justify="right" if col in ("measured", "predicted", "error") else "left")
    order = {"in-sample": 0, "out-of-sample": 1, "local": 2}
    for r in sorted(rows, key=lambda r: order.get(r["role"], 3)):
        t.add_row(r["case"], r["role"], r["metric"], f"{r['measured']:.2f}", f"{r['predicted']:.2f}",
                  f"{r['error'] * 100:+.1f}%", "yes" if r["ok"] else "[red]NO[/]")
    c.print(t)
    for role, s in summary.items():
        if isinstance(s, dict):
            c.print(f"{role}: {s['n']} cases, median |error| {s['median_abs_error'] * 100:.1f}%, "
                    f"max {s['max_abs_error'] * 100:.1f}%" + (f"; out of tolerance: {', '.join(s['failed'])}" if s["failed"] else ""))


def render_provenance(rows: list[tuple[str, str, str, str]], name: str, console: Console | None = None) -> None:
    """Print every figure of a profile with its source and reference."""
    c = console or Console()
    t = Table(title=f"Hardware profile {name}")
    for col in ("field", "value", "source", "reference"):
        t.add_column(col)
    for row in rows:
        t.add_row(*row)
    c.print(t)


def render_execution(r: dict, console: Console | None = None) -> None:
    """Print an executor run: speeds, then achieved bandwidth per tier next to the simulator's roof
    (when the run was given a profile) and the simulator's prediction of the run."""
    c = console or Console()
    warm = r.get("warmup_ttft_s")
    c.print(f"decode {r['decode_tok_s']:.2f} tok/s (ITL p50 {r['itl_p50_ms']:.2f} ms); TTFT {r['ttft_s']:.3f} s"
            + (f" (the warm-up's, a cold first prompt: {warm:.3f} s)" if warm is not None else " (a cold first prompt)")
            + f"; {r.get('streams', 1)} stream(s) on {r.get('device', '?')}"
            + (f" ({r['decode_path']})" if r.get("decode_path") else "") + f"; trace {r['trace']}")
    got, roofs, moved = r.get("bandwidth_gbs") or {}, r.get("roof_gbs") or {}, r.get("bytes") or {}
    t = Table(title="Expert tiers: bandwidth achieved (bytes read / time in the tier)")
    for col in ("tier", "bytes read", "achieved GB/s", "roof GB/s", "of the roof"):
        t.add_column(col, justify="left" if col == "tier" else "right")
    for name in ("cpu", "device"):
        a, roof = got.get(name), roofs.get(name)
        t.add_row(name, f"{moved.get(name, 0) / 1e9:.3f} GB", f"{a:.1f}" if a else "-", f"{roof:.1f}" if roof else "-",
                  f"{100 * a / roof:.0f}%" if a and roof else "-")
    c.print(t)
    if r.get("model_page_breaks") is not None:  # calibration.page_layout: what the in-place reads paid
        c.print(f"the model file's pages in the page cache: {100 * r['model_page_breaks']:.1f}% of their boundaries "
                f"physical breaks")
    pred = r.get("predicted")
    if pred:
        c.print(f"simulated on {pred['profile']} (the run's own routing): decode {pred['decode_tok_s']:.2f} tok/s "
                f"({100 * (pred['decode_tok_s'] / r['decode_tok_s'] - 1):+.1f}%), TTFT {pred['ttft_s']:.3f} s "
                f"({100 * (pred['ttft_s'] / r['ttft_s'] - 1):+.1f}%), bottleneck {pred['bottleneck']}")


def render_loo(rows: list[dict], unfitted: float, loo: float, values: dict, console: Console | None = None) -> None:
    """Print leave-one-out errors per run against the unfitted prediction."""
    c = console or Console()
    t = Table(title="Leave-one-out: each run predicted by a fit on the others")
    for col in ("case", "measured", "unfitted", "error", "fitted on others", "error"):
        t.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        t.add_row(r["case"], f"{r['measured']:.2f}", f"{r['unfitted']:.2f}", f"{r['unfitted_error'] * 100:+.1f}%",
                  f"{r['loo']:.2f}", f"{r['loo_error'] * 100:+.1f}%")
    c.print(t)
    c.print(f"median |error|: unfitted {unfitted * 100:.1f}%, leave-one-out {loo * 100:.1f}%; fitted on all: "
            + ", ".join(f"{k} = {v:.4g}" for k, v in values.items()))
