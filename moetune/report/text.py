"""How the report writes a value: escaped for HTML (`esc`: every string from a trace, a log, a config
or the store goes through it), inside a Markdown table cell (`md`), and its figures."""
from __future__ import annotations

import html


def esc(value) -> str:
    """A value as HTML text, quotes escaped."""
    return html.escape("" if value is None else str(value), quote=True)


def md(value) -> str:
    """A value inside a Markdown table cell."""
    return str("" if value is None else value).replace("|", "\\|").replace("\n", " ")


def fmt(v, digits=1) -> str:
    """A figure with `digits` decimals, "–" for none."""
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def ms(v, digits=1) -> str:
    """Milliseconds with their unit, "–" for none."""
    return "–" if v is None else f"{v:.{digits}f} ms"


def count(v) -> str:
    """A count, rounded."""
    return "–" if v is None else f"{round(v)}"


def pct(share) -> str:
    """A share as a percentage."""
    return f"{100 * (share or 0):.1f}%"
