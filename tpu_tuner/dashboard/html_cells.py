"""The page's HTML cells: escaped text, percentages, sortable number cells, embedded figures."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import Any

from tpu_tuner.dashboard.folder_files import finite


def esc(value: Any) -> str:
    """`value` as HTML text (None and NaN empty)."""
    return html.escape("" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value))


def pct(value: Any) -> str:
    """A share as a percentage ("–" when not a number)."""
    return f"{value:.1%}" if finite(value) else "–"


def num_cell(value: Any, text: str) -> str:
    """A right-aligned cell showing `text` that sorts by `value` (last when not a number)."""
    sort = repr(float(value)) if finite(value) else ""
    return f'<td class="num" data-v="{sort}">{esc(text)}</td>'


def sortable_table(headers: Iterable[str], attributes: str = 'class="sortable"') -> str:
    """A table sorted by clicking its headers, opened up to its body's first row."""
    head = "".join(f'<th class="sortable">{esc(h)}</th>' for h in headers)
    return f"<table {attributes}><thead><tr>{head}</tr></thead><tbody>"


def note(text: str, classes: str = "note") -> str:
    """A notice paragraph; `text` is plain text whose `backticked` spans are code (as in the CLI's
    messages), shown as code rather than as raw backticks."""
    parts = esc(text).split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick is no code span: keep the text as written
        return f'<p class="{classes}">{esc(text)}</p>'
    html_text = "".join(f"<code>{part}</code>" if index % 2 else part for index, part in enumerate(parts))
    return f'<p class="{classes}">{html_text}</p>'


def figure_html(uri: str | None, alt: str, missing: str) -> str:
    """An embedded plot with its caption, or a note saying `missing` (nothing when that is "")."""
    if uri is None:
        return note(missing) if missing else ""
    return f'<figure><img src="{uri}" alt="{esc(alt)}"><figcaption class="muted">{esc(alt)}</figcaption></figure>'
