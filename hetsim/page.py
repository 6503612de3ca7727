"""One self-contained HTML page of figures and tables (``hetsim report`` / ``compare``).

Figures are matplotlib ``Figure`` objects drawn with the Agg canvas (no pyplot, no display);
each is written as a PNG into a folder beside the page and embedded in the page as base64, so
the page opens anywhere without the folder and without network access. Every figure and table
carries a stable HTML id (``fig-...`` / ``table-...``); a panel whose data is missing is left out
with a note (``<p class="omitted" data-figure="ID">``) instead.
"""
from __future__ import annotations

import base64
import html
import io
import math
import sys
from pathlib import Path
from typing import Any

STYLE = """
body { font-family: -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif;
       margin: 0 auto; max-width: 1280px; padding: 12px 28px 40px; color: #222; }
h1 { font-size: 1.5em; margin: 12px 0 4px; }
h2 { font-size: 1.2em; margin: 28px 0 6px; border-bottom: 1px solid #ddd; padding-bottom: 3px; }
p.sub { color: #555; margin: 0 0 10px; }
figure { margin: 10px 0 18px; }
div.row { display: grid; grid-template-columns: 1fr 1fr; gap: 18px; align-items: start; }
figure img { max-width: 100%; height: auto; display: block; }
figcaption { color: #555; font-size: 0.9em; margin-top: 2px; }
p.omitted { color: #8a6d3b; background: #fcf8e3; border-left: 3px solid #e0c36b;
            padding: 6px 10px; font-size: 0.92em; }
table { border-collapse: collapse; font-size: 0.9em; margin: 6px 0 14px; }
div.wide { overflow-x: auto; margin: 6px 0 14px; }
div.wide table { font-size: 0.8em; margin: 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
div.wide th, div.wide td { padding: 3px 5px; }
th { background: #f4f4f4; }
td.text, th.text { text-align: left; }
table.kv td:first-child { text-align: left; color: #555; }
div.warnings { background: #fdecea; border: 2px solid #c62828; border-radius: 4px; padding: 6px 14px;
               margin: 10px 0 16px; }
div.warnings p { color: #8e1c1c; margin: 6px 0; font-weight: 600; }
td pre { margin: 0; font-size: 0.82em; text-align: left; white-space: pre; }
details pre { background: #f7f7f7; padding: 8px; font-size: 0.85em; overflow-x: auto; }
"""


WIDE_COLUMNS = 10  # a table with more columns is set smaller, in a box that scrolls sideways


class Page:
    """Accumulates sections, figures and tables; :meth:`write` saves the page and the PNGs."""

    def __init__(self, title: str, subtitle: str = ""):
        self.title = title
        self.parts: list[str] = [f"<h1>{html.escape(title)}</h1>"]
        if subtitle:
            self.parts.append(f'<p class="sub">{html.escape(subtitle)}</p>')
        self.figures: dict[str, bytes] = {}  # id -> PNG
        self.omitted: dict[str, str] = {}  # id -> why
        self.open_rows = 0

    def warnings(self, items: list[str], block_id: str = "warnings") -> None:
        """A red banner of warnings (nothing when there are none): what makes the page's numbers mean little."""
        if items:
            body = "".join(f'<p class="warning">Warning: {html.escape(w)}</p>' for w in items)
            self.parts.append(f'<div class="warnings" id="{block_id}">{body}</div>')

    def section(self, title: str) -> None:
        self.parts.append(f"<h2>{html.escape(title)}</h2>")

    def row(self, start: bool = True) -> None:
        """Start (or end) a row of two figures side by side."""
        self.parts.append('<div class="row">' if start else "</div>")
        self.open_rows += 1 if start else -1

    def text(self, text: str) -> None:
        self.parts.append(f"<p>{html.escape(text)}</p>")

    def figure(self, fig_id: str, fig, caption: str = "") -> None:
        """Add a matplotlib Figure under ``fig_id`` (its PNG is kept for the folder beside)."""
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight", facecolor="white")
        png = buf.getvalue()
        self.figures[fig_id] = png
        data = base64.b64encode(png).decode("ascii")
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self.parts.append(
            f'<figure id="{fig_id}"><img alt="{html.escape(fig_id)}" '
            f'src="data:image/png;base64,{data}">{cap}</figure>')

    def guarded(self, fig_ids, draw, *args) -> None:
        """``draw(self, *args)``; if it fails on unexpected data, the figures it did not draw
        become notes naming the error and the rest of the page goes on."""
        rows = self.open_rows
        try:
            draw(self, *args)
        except Exception as err:  # noqa: BLE001 - a report shows what it can; the error is named on the page
            while self.open_rows > rows:
                self.row(False)
            for fig_id in fig_ids:
                if fig_id not in self.figures and fig_id not in self.omitted:
                    self.omit(fig_id, f"{fig_id}: could not be drawn from this data "
                              f"({type(err).__name__}: {err})")
            print(f"hetsim: {', '.join(fig_ids)}: {type(err).__name__}: {err}", file=sys.stderr)

    def omit(self, fig_id: str, why: str) -> None:
        """A panel that cannot be drawn from this data: a note instead of the figure."""
        self.omitted[fig_id] = why
        self.parts.append(f'<p class="omitted" data-figure="{fig_id}">{html.escape(why)}</p>')

    def table(self, table_id: str, df, formats: dict[str, Any] | None = None,
              caption: str = "", text_columns: set[str] | None = None) -> None:
        """A DataFrame as an HTML table; ``formats``: column -> callable(value) -> str;
        ``text_columns``: the left-aligned ones (default: those of text dtype)."""
        formats = formats or {}
        cols = list(df.columns)
        text_cols = text_columns if text_columns is not None else {
            c for c in cols if df[c].dtype == object or str(df[c].dtype).startswith(("str", "string"))}
        # long snake_case headers may break after an underscore: wide tables fit the page
        head = "".join(f'<th class="{"text" if c in text_cols else ""}">'
                       f'{html.escape(str(c)).replace("_", "_<wbr>")}</th>' for c in cols)
        rows = []
        for _, row in df.iterrows():
            cells = []
            for c in cols:
                v = row[c]
                s = formats[c](v) if c in formats else format_value(v)
                cells.append(f'<td class="{"text" if c in text_cols else ""}">{html.escape(s)}</td>')
            rows.append("<tr>" + "".join(cells) + "</tr>")
        cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
        table = f'<table id="{table_id}">{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'
        # many columns (the compare table has 17): smaller, and scrolled rather than cut at the page's edge
        self.parts.append(f'<div class="wide">{table}</div>' if len(cols) > WIDE_COLUMNS else table)

    def key_values(self, table_id: str, items: list[tuple[str, str]]) -> None:
        rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in items)
        self.parts.append(f'<table class="kv" id="{table_id}"><tbody>{rows}</tbody></table>')

    def side_by_side(self, table_id: str, texts: dict[str, str], caption: str = "") -> None:
        """Preformatted texts in one row, a column each (e.g. every run's fleet definition)."""
        head = "".join(f'<th class="text">{html.escape(k)}</th>' for k in texts)
        cells = "".join(f"<td><pre>{html.escape(v)}</pre></td>" for v in texts.values())
        cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
        self.parts.append(f'<table id="{table_id}">{cap}<thead><tr>{head}</tr></thead>'
                          f"<tbody><tr>{cells}</tr></tbody></table>")

    def preformatted(self, summary: str, text: str) -> None:
        self.parts.append(f"<details><summary>{html.escape(summary)}</summary>"
                          f"<pre>{html.escape(text)}</pre></details>")

    def html(self) -> str:
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                f"<title>{html.escape(self.title)}</title><style>{STYLE}</style></head>"
                "<body>\n" + "\n".join(self.parts) + "\n</body></html>\n")

    def write(self, out: str | Path) -> Path:
        """Write ``out`` (the page) and ``<out stem>_figures/<id>.png``; returns the page's path."""
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig_dir = figures_dir(out)
        fig_dir.mkdir(exist_ok=True)
        for old in fig_dir.glob("*.png"):  # a rewritten report keeps no stale figures
            old.unlink()
        for fig_id, png in self.figures.items():
            (fig_dir / f"{fig_id}.png").write_bytes(png)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(self.html(), encoding="utf-8")
        tmp.replace(out)
        return out


def figures_dir(page: Path) -> Path:
    return page.with_name(page.stem + "_figures")


def format_value(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "–"
        return f"{v:.4g}"
    return str(v)
