"""The report's plots, as inline SVG: a per-rank timeline strip of the profiled window (drawn from
the analyze stage's timeline.json), time-breakdown bars, step time across trials. Every string
goes through `esc`."""
from __future__ import annotations

from moetune.report.gather import TrialView, is_baseline
from moetune.report.text import esc, fmt

CLASS_COLORS = {"gemm": "#4c72b0", "grouped_gemm": "#3a5a8c", "attention": "#8172b3",
                "te": "#64b5cd", "other": "#9fa8b3", "moe_permute": "#ccb974",
                "moe_router": "#b8860b", "fp8_cast": "#8c564b", "a2a": "#c44e52",
                "nccl_other": "#dd8452", "deepep": "#e377c2", "hybridep": "#d62728",
                "memcpy": "#55a868", "memset": "#2ca02c", "idle": "#ffffff"}


def svg_timeline(timeline: dict | None, width: int = 900) -> str:
    """Per-rank strip of the window (the analyze stage's timeline.json, analysis/timeline.py): each
    column's colour is the class that ran longest in it; "" without one."""
    if not timeline or not timeline.get("ranks"):
        return ""
    rows = timeline["ranks"]
    row_h, label_w = 16, 60
    classes = {c for r in rows for c in r["classes"]}
    legend_rows = 1 + (len(classes) + 1) * 110 // (width - label_w)
    y_legend = row_h * len(rows) + 34
    height = y_legend + 16 * legend_rows
    parts = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" role="img" aria-label="per-rank timeline of the profiled window">']
    scale = (width - label_w) / timeline["columns"]
    for i, r in enumerate(rows):
        y = 5 + i * row_h
        parts.append(f'<text x="0" y="{y + 12}" font-size="11">rank {esc(r["rank"])}</text>')
        for first, past, cls in r["runs"]:
            parts.append(f'<rect x="{label_w + first * scale:.1f}" y="{y}" '
                         f'width="{(past - first) * scale:.1f}" height="{row_h - 3}" '
                         f'fill="{CLASS_COLORS.get(cls, "#777")}"><title>{esc(cls)}</title></rect>')
    parts.append(f'<text x="{label_w}" y="{y_legend - 22}" font-size="11">window '
                 f'{esc(fmt((rows[0]["end"] - rows[0]["start"]) / 1e6))} ms, {esc(rows[0]["steps"])} '
                 f'steps; each column coloured by the kernel class that ran longest in it</text>')
    shown = sorted(classes, key=list(CLASS_COLORS).index)
    parts.append(legend([(c, CLASS_COLORS.get(c, "#777")) for c in shown] + [("idle", "#ffffff")],
                        label_w, y_legend, width))
    parts.append("</svg>")
    return "".join(parts)


def legend(items: list[tuple[str, str]], x0: int, y: int, width: int, step: int = 110) -> str:
    """A row of colour swatches with their names (wrapping at width)."""
    parts, x = ['<g class="legend">'], x0
    for name, color in items:
        if x + step > width:
            x, y = x0, y + 16
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{color}" stroke="#999" '
                     f'stroke-width="0.5"/><text x="{x + 14}" y="{y}" font-size="11">{esc(name)}</text>')
        x += step
    return "".join(parts) + "</g>"


BREAKDOWN = (("compute", "#4c72b0"), ("exposed comm", "#c44e52"), ("hidden comm", "#f2b5b7"),
             ("idle", "#d9d9d9"))


def breakdown(c: dict) -> dict | None:
    """Shares of the window: compute-only, exposed comm, hidden comm, idle."""
    if c.get("gpu_busy_share") is None:
        return None
    exposed = c.get("exposed_comm_share") or 0.0
    hidden = max(0.0, (c.get("comm_share") or 0.0) - exposed)
    idle = c.get("gpu_idle_share") or 0.0
    compute = max(0.0, 1.0 - exposed - idle)
    return {"compute": compute, "exposed comm": exposed, "hidden comm": hidden, "idle": idle}


def svg_breakdown(views: list[TrialView], width: int = 900) -> str:
    """Per trial, the profiled step's milliseconds split into compute, exposed comm and idle (hidden
    comm a band under compute), every bar on one scale, so a faster trial has a shorter bar."""
    found = [(v, breakdown(v.combined), v.combined.get("step_time_ms")) for v in views]
    rows = [(v, b, step) for v, b, step in found if b and step]
    if not rows:
        return ""
    row_h, label_w = 20, 190
    top = max(step for _, _, step in rows)
    height = row_h * len(rows) + 70
    parts = [f'<svg class="breakdown" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" role="img" aria-label="time per profiled step, per trial">']
    bar_w = width - label_w - 70
    scale = bar_w / top
    for i, (v, b, step) in enumerate(rows):
        y = 5 + i * row_h
        parts.append(f'<text x="0" y="{y + 13}" font-size="11">#{v.trial.number} '
                     f'{esc(v.trial.fix or "baseline")}</text>')
        x = label_w
        for name, color in BREAKDOWN:
            part = b[name] * step
            if name == "hidden comm":  # overlaps compute: a band inside the compute bar
                parts.append(f'<rect x="{label_w:.1f}" y="{y + 12}" width="{part * scale:.1f}" '
                             f'height="4" fill="{color}"><title>hidden comm {part:.1f} ms</title></rect>')
                continue
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{part * scale:.1f}" height="{row_h - 4}" '
                         f'fill="{color}"><title>{esc(name)} {part:.1f} ms</title></rect>')
            x += part * scale
        parts.append(f'<text x="{x + 4:.1f}" y="{y + 13}" font-size="11">{step:.1f} ms</text>')
    axis_y = 5 + len(rows) * row_h + 4
    parts.append(f'<line x1="{label_w}" y1="{axis_y}" x2="{label_w + bar_w}" y2="{axis_y}" stroke="#333"/>')
    for frac in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<text x="{label_w + frac * bar_w - 8:.1f}" y="{axis_y + 13}" font-size="10">'
                     f'{top * frac:.0f}</text>')
    parts.append(f'<text x="{label_w + bar_w / 2 - 50:.1f}" y="{axis_y + 27}" font-size="10">'
                 'ms per profiled step</text>')
    parts.append(legend(list(BREAKDOWN), label_w, height - 8, width, step=130))
    parts.append("</svg>")
    return "".join(parts)


STEP_COLORS = {"baseline": "#4c72b0", "keep": "#2a9d46", "revert": "#c44e52", "not_applied": "#999999"}


def svg_step_times(views: list[TrialView], width: int = 900, height: int = 240) -> str:
    """Judged step time of each trial that ran (x: those trials, in order), coloured by its verdict;
    dashed: the best kept so far."""
    pts = [(v.trial.number, step, "baseline" if is_baseline(v) else (v.verdict.kind if v.verdict else ""))
           for v in views if (step := v.judged_ms or v.trial.step_time_ms)]
    if not pts:
        return ""
    left, bottom, top = 60, 48, 15
    ymax = max(p[1] for p in pts) * 1.1

    def x(i: int) -> float:
        return left + (i + 0.5) * (width - left - 10) / len(pts)

    def y(t: float) -> float:
        return top + (1 - t / ymax) * (height - top - bottom)
    parts = [f'<svg class="steptimes" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" role="img" aria-label="judged step time of the trials that ran">',
             f'<line x1="{left}" y1="{y(0)}" x2="{width - 10}" y2="{y(0)}" stroke="#333"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y(0)}" stroke="#333"/>']
    for frac in (0.25, 0.5, 0.75, 1.0):
        parts.append(f'<text x="2" y="{y(ymax * frac) + 4:.1f}" font-size="10">{ymax * frac:.0f} ms</text>')
    best: float | None = None
    line = []
    for i, (n, t, kind) in enumerate(pts):
        if kind in ("keep", "baseline") and (best is None or t < best):
            best = t
        if best is not None:
            line.append(f"{x(i):.1f},{y(best):.1f}")
        parts.append(f'<circle cx="{x(i):.1f}" cy="{y(t):.1f}" r="5" fill="{STEP_COLORS.get(kind, "#777")}">'
                     f'<title>trial {n}: {t:.1f} ms ({esc(kind)})</title></circle>'
                     f'<text x="{x(i) - 4:.1f}" y="{y(0) + 14:.1f}" font-size="10">{n}</text>')
    if line:
        parts.append(f'<polyline points="{" ".join(line)}" fill="none" stroke="#2a9d46" '
                     f'stroke-dasharray="4 3"/>')
    parts.append(f'<text x="{left}" y="{y(0) + 28:.1f}" font-size="10">trial (those that ran)</text>')
    kinds = [k for k in STEP_COLORS if any(p[2] == k for p in pts)]
    parts.append(legend([(k, STEP_COLORS[k]) for k in kinds] + [("best kept so far (dashed)", "#2a9d46")],
                        left + 160, height - 6, width, step=130))
    parts.append("</svg>")
    return "".join(parts)
