"""The report as a page: Markdown and HTML side by side, figures as PNGs with captions."""
from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Section:
    title: str
    text: str = ""
    table: list[list[str]] | None = None  # first row is the header
    figure: object | None = None  # a matplotlib Figure
    caption: str = ""
    image: str = ""  # set when written


@dataclass
class Page:
    title: str
    sections: list[Section] = field(default_factory=list)

    def add(self, *args, **kw) -> Section:
        s = Section(*args, **kw)
        self.sections.append(s)
        return s


def _md_table(rows: list[list[str]]) -> str:
    head, *body = rows
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def _html_table(rows: list[list[str]]) -> str:
    head, *body = rows
    th = "".join(f"<th>{html.escape(c)}</th>" for c in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in body)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def write_page(page: Page, out_dir: str | Path) -> tuple[Path, Path]:
    """Write report.md, report.html and one PNG per figure into `out_dir` (each atomically)."""
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(page.sections):
        if s.figure is not None:
            s.image = f"fig{i + 1:02d}.png"
            tmp = out / f".{s.image}.tmp.png"
            s.figure.savefig(tmp, dpi=110)
            os.replace(tmp, out / s.image)
            plt.close(s.figure)
    md = [f"# {page.title}", ""]
    body = []
    for s in page.sections:
        md += [f"## {s.title}", ""]
        body.append(f"<h2>{html.escape(s.title)}</h2>")
        if s.text:
            md += [s.text, ""]
            body.append(f"<p>{html.escape(s.text)}</p>")
        if s.table:
            md += [_md_table(s.table), ""]
            body.append(_html_table(s.table))
        if s.image:
            md += [f"![{s.caption}]({s.image})", "", f"*{s.caption}*", ""]
            body.append(f'<figure><img src="{s.image}" alt="{html.escape(s.caption)}">'
                        f"<figcaption>{html.escape(s.caption)}</figcaption></figure>")
    style = ("body{font-family:sans-serif;max-width:60em;margin:auto;padding:1em}"
             "table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 6px}"
             "figure img{max-width:100%}figcaption{font-style:italic;color:#444}")
    doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(page.title)}</title>"
           f"<style>{style}</style></head><body><h1>{html.escape(page.title)}</h1>{''.join(body)}</body></html>\n")
    from specs.loaders import write_atomic
    md_path, html_path = out / "report.md", out / "report.html"
    write_atomic(md_path, "\n".join(md) + "\n")
    write_atomic(html_path, doc)
    return md_path, html_path
