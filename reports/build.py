"""Assemble the report page from plain data: the plan summary, sweeps and measured rows."""
from __future__ import annotations

from . import figures
from .page import Page

GIB = 2**30
TITLES = {
    "cache_slots": ("Decode speed against expert cache size",
                    "Predicted decode tok/s as the VRAM expert cache grows; colour marks the resource "
                    "that bounds each point, the dotted line is the plan's cache."),
    "ddr_bandwidth": ("Decode speed against DDR bandwidth",
                      "Predicted decode tok/s with 1 to 16 DDR channels at this machine's transfer rate; "
                      "the dotted line is this machine."),
    "cpu_cores": ("Decode speed against CPU cores",
                  "Predicted decode tok/s as the CPU expert tier gets more or fewer cores (rate scaled "
                  "per core, capped by DDR); the dotted line is this machine."),
    "ttft": ("Time to first token against prompt length",
             "Predicted TTFT for prompts of 512 tokens up to the context; the dotted line is the "
             "prompt length the plan was chosen for."),
}


def plan_report(summary: dict, series: dict, measured: list[dict] | None = None) -> Page:
    """A Page: memory map, ceilings, sweeps and predicted-vs-measured (when there are runs)."""
    m, p = summary["model"], summary["predicted"]
    page = Page(f"{m['name']} on {summary['hardware']}")
    page.add("Prediction", text=(
        f"Decode {p['decode_tok_s']:.2f} tok/s, TTFT {p['ttft_s']:.2f} s ({p.get('method', 'model')}); "
        f"bound by {p['bottleneck']}. Routed experts read {m['routed_bytes_per_token'] / 1e9:.3f} GB per "
        f"token, the dense path {m['dense_bytes_per_token'] / 1e9:.3f} GB."))
    mem = summary["memory"]
    rows = [["tier", "holds", "GiB"]] + [[t.upper(), k, f"{v / GIB:.2f}"]
                                         for t in ("vram", "ram", "nvme") for k, v in mem[t].items() if v]
    page.add("Memory map", table=rows, figure=figures.memory_map(mem, "Memory map of the plan"),
             caption="Bytes each tier holds under the plan, stacked by tensor group; dashed lines mark "
                     "VRAM and RAM capacity.")
    page.add("Ceilings per tier",
             table=[["tier", "GB/s", "tok/s", "source"]] + [[c["tier"], f"{c['bandwidth_gbs']:.1f}",
                                                           f"{c['tok_s']:.1f}", c.get("source", "")]
                                                          for c in summary["ceilings"]],
             figure=figures.ceilings(summary["ceilings"], "Decode ceiling of the routed experts per tier"),
             caption="tok/s if the routed experts streamed from each tier at its bandwidth and nothing "
                     "else cost time (tok/s <= GB/s / GB per token).")
    for key, s in series.items():
        title, caption = TITLES[key]
        page.add(title, figure=figures.sweep(s["x"], s["y"], s["bound"], s["xlabel"], s["ylabel"], title,
                                             marker_x=s["marker"]), caption=caption)
    if measured:
        page.add("Predicted against measured",
                 table=[["case", "measured", "predicted", "error"]] + [
                     [r["case"], f"{r['measured']:.2f}", f"{r['predicted']:.2f}",
                      f"{(r['predicted'] / r['measured'] - 1) * 100:+.1f}%"] for r in measured],
                 figure=figures.predicted_vs_measured(measured, "Predicted against measured decode"),
                 caption="Each point is a measured run from the results store against the simulator's "
                         "prediction for it; on the dashed line they agree.")
    return page
