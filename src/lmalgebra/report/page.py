"""The page toolkit of every HTML report: one style sheet, number formatting, tables, embedded
figures, sections and writing one self-contained page.

A page makes no request and runs no script: figures are base64 PNG data URIs, the style sheet is
inline, and the icon is an empty data URI.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.storage.atomic import write_text_atomic

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222;
       padding: 0 1em; }
nav a { margin-right: 1em; }
h1, h2, h3, th, td.text { overflow-wrap: anywhere; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
pre { background: #f5f5f5; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
code { background: #f3f3f3; padding: 0 3px; }
.note { color: #555; font-size: 0.9em; }
.yes { color: #176917; font-weight: bold; } .no { color: #a31515; font-weight: bold; }
"""

Section = tuple[str, str, str]  # anchor, heading, HTML body
Cell = Callable[[Any], str]


def fmt(value: Any, decimals: int = 3) -> str:
    """A table cell: floats to ``decimals`` (blank for NaN), anything else as escaped text."""
    if isinstance(value, float | np.floating):
        return "" if math.isnan(value) else f"{value:.{decimals}f}"
    return html.escape(str(value))


def table(header: Sequence[str], rows: Iterable[Sequence[Any]], cell: Cell = fmt) -> str:
    """A table: escaped header, one row per sequence, each value through ``cell``; numbers are
    right-aligned, text left."""

    def td(value: Any) -> str:
        number = isinstance(value, int | float | np.number) or str(value).lstrip("-").isdigit()
        kind = "" if number else ' class="text"'
        return f"<td{kind}>{cell(value)}</td>"

    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(td(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _blank(value: Any) -> bool:
    return (
        value is None
        or value == ""
        or (isinstance(value, float | np.floating) and math.isnan(value))
    )


def without_empty_columns(
    header: Sequence[str], rows: Sequence[Sequence[Any]], keep: int = 1
) -> tuple[list[str], list[list[Any]]]:
    """``header`` and ``rows`` less every column after the first ``keep`` whose cells are all
    blank (NaN, None or empty): a table shows no column of nothing, such as intervals of a run
    that computed none."""
    used = [i for i in range(len(header)) if i < keep or not all(_blank(row[i]) for row in rows)]
    return [header[i] for i in used], [[row[i] for i in used] for row in rows]


def facts(rows: Iterable[tuple[str, Any]]) -> str:
    """A two-column table of labelled values (a heading cell, then the value as text)."""
    body = "".join(
        f'<tr><th>{html.escape(k)}</th><td class="text">{html.escape(str(v))}</td></tr>'
        for k, v in rows
    )
    return f"<table>{body}</table>"


def image(path: Path | None, alt: str) -> str:
    """``path`` embedded as a PNG data URI; nothing for None, a note when the file is missing."""
    if path is None:
        return ""
    if not path.is_file():
        return f'<p class="note">(figure {html.escape(str(path))} missing)</p>'
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def note(text: str) -> str:
    """A paragraph of explanatory text (``text`` is HTML, already escaped)."""
    return f'<p class="note">{text}</p>'


def section(anchor: str, title: str, *parts: str) -> Section:
    """A page section: its anchor, its heading and its HTML body."""
    return anchor, title, "".join(parts)


def write_page(target: Path, title: str, sections: Sequence[Section], intro: str = "") -> Path:
    """Write one self-contained page: heading ``title``, ``intro`` (HTML), a navigation bar and
    the sections in order; return ``target``."""
    nav = " ".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t, _ in sections)
    body = "".join(
        f'<section id="{a}"><h2>{html.escape(t)}</h2>{part}</section>' for a, t, part in sections
    )
    heading = html.escape(title)
    # the empty data: icon keeps the browser from asking for /favicon.ico
    page = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{heading}</title>'
        f'<link rel="icon" href="data:,"><style>{STYLE}</style></head><body>'
        f"<h1>{heading}</h1>{intro}<nav>{nav}</nav>{body}</body></html>\n"
    )
    write_text_atomic(target, page)
    return target
