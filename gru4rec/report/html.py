"""The report as one self-contained HTML file: every figure is embedded as a base64 PNG, the
style is inline, nothing is fetched when it opens, so it can be mailed or archived as it is.

Tables carry every number twice: rounded as the cell's text, and exactly (Python's ``repr`` of
the float, which reads back to the same value) in the cell's ``data-value`` attribute, so that a
program can read the numbers back out of the report.
"""
from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["GENERATOR", "document", "figure_html", "is_report_page", "table_html"]

#: The page's ``<meta name="generator">`` (and its PNGs' ``Software``): how ``gru4rec report``
#: knows the files it may replace without ``--force``.
GENERATOR = "gru4rec report"

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ddd; } h3 { font-size: 1.05em; }
img { max-width: 100%; border: 1px solid #eee; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th { background: #f4f4f4; } td.text { text-align: left; font-family: monospace; }
p.note { color: #666; } code { background: #f4f4f4; padding: 0 0.2em; overflow-wrap: anywhere; }
div.table { overflow-x: auto; max-width: 100%; margin: 0.5em 0 1.5em; } div.table table { margin: 0; }
"""


def _cell(value: Any) -> str:
    if value is None:
        return '<td data-value="">–</td>'
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f'<td class="text">{html.escape(str(value))}</td>'
    if isinstance(value, int):
        return f'<td data-value="{value}">{value:,}</td>'
    if not math.isfinite(value):
        return f'<td data-value="{value!r}">{value}</td>'
    shown = f"{value:,.1f}" if abs(value) >= 100 else f"{value:.6f}".rstrip("0").rstrip(".") if value else "0"
    return f'<td data-value="{value!r}">{shown}</td>'


def table_html(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, css_class: str, data: dict[str, str] | None = None) -> str:
    """A table; ``css_class`` and ``data`` (``data-*`` attributes) identify it for a reader."""
    attrs = "".join(f' data-{k}="{html.escape(v, quote=True)}"' for k, v in (data or {}).items())
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    # In a scrolling box: a wide table (a dozen validation metrics) scrolls instead of running off the page.
    return f'<div class="table"><table class="{css_class}"{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def figure_html(png: bytes, alt: str) -> str:
    """An image element with the PNG embedded."""
    encoded = base64.b64encode(png).decode("ascii")
    return f'<p><img alt="{html.escape(alt, quote=True)}" src="data:image/png;base64,{encoded}"></p>'


def document(title: str, body: Sequence[str]) -> str:
    """The whole HTML page (titled ``gru4rec report: ...`` by :func:`~gru4rec.report.build.write_report`)."""
    return (
        f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"generator\" content=\"{GENERATOR}\">"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        f"<h1>{html.escape(title)}</h1>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def is_report_page(head: str) -> bool:
    """Whether ``head``, the start of an HTML file, is a page that ``gru4rec report`` wrote: its
    generator mark, or (a report of an earlier version, which had none) its title."""
    return f'<meta name="generator" content="{GENERATOR}">' in head or (
        head.startswith("<!DOCTYPE html>") and f"<title>{GENERATOR}: " in head)
