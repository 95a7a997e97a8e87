"""The report opens as a page: every figure has a title, axes with units and a caption."""
import re

from moe_offload.cli import main
from planner.predict import predict
from planner.search import base_plan
from planner.summary import plan_summary
from planner.whatif import sweeps
from reports.build import plan_report
from specs.loaders import load_hardware, load_model

UNITS = re.compile(r"\((GiB|GB/s|tok/s|s|tokens|experts|cores)\)")


def _page():
    hw, model = load_hardware("epyc8ch-3090"), load_model("deepseek-v4.1-flash")
    plan = base_plan(model, hw)
    summary = plan_summary(model, hw, plan, predict(model, hw, plan))
    measured = [{"case": "D107", "measured": 21.34, "predicted": summary["predicted"]["decode_tok_s"]}]
    return plan_report(summary, sweeps(model, hw, plan, predict), measured)


def test_every_figure_has_title_axes_with_units_and_caption():
    page = _page()
    figs = [s for s in page.sections if s.figure is not None]
    assert len(figs) == 7  # memory map, ceilings, 3 decode sweeps, TTFT, predicted-vs-measured
    for s in figs:
        ax = s.figure.axes[0]
        assert ax.get_title()
        x, y = ax.get_xlabel(), ax.get_ylabel()
        assert x and y, s.title
        # numeric axes carry units; the categorical one (tiers, bus names) names what it lists
        assert UNITS.search(x) or UNITS.search(y), (x, y)
        assert len(s.caption) > 40


def test_report_command_writes_markdown_html_and_pngs(tmp_path, capsys):
    assert main(["report", "--hw", "i5-13600k-ddr5-3090", "--model", "qwen3.8-flash-next-iq3_s",
                 "--out", str(tmp_path)]) == 0
    html = (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(pngs) >= 5
    for name in pngs:
        assert f'src="{name}"' in html and f"]({name})" in md
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert html.count("<figcaption>") == len(pngs)
