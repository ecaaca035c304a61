"""Reports of a study: Markdown for the terminal, one self-contained HTML page with SVG plots.

    write_reports(store, study_name, out_dir) -> (md_path, html_path)

Per trial, the bottleneck report: wall and confidence, the metrics that decided it, kernel time
by class and the top kernels, exposed vs hidden communication, idle gaps, memory, the fix chosen
and why, the command line. Per study: the trial tree with kept and reverted changes, step time
and TFLOP/s per GPU per trial, the best config with its full command line. Plots: a per-rank
timeline strip of the profiled window, time-breakdown bars, step time across trials.

Every string that comes from a trace, a log, a config or the store goes through `esc`.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from moetune.analysis.metrics import in_window
from moetune.analysis.ranks import rank_frames
from moetune.analysis.window import find_window
from moetune.decide import rules as rules_mod
from moetune.errors import MoetuneError
from moetune import settings
from moetune.experiment import gpus
from moetune.experiment.schema import Tuning
from moetune.job.paths import TrialPaths
from moetune.decide.judge import MIN_LOG_STEPS, faster_p, judged_step, steady_iterations
from moetune.tune.state import JUDGED
from moetune.tune.summary import one_gpu_ranks, summary

CLASS_COLORS = {"gemm": "#4c72b0", "grouped_gemm": "#3a5a8c", "attention": "#8172b3",
                "te": "#64b5cd", "other": "#9fa8b3", "moe_permute": "#ccb974",
                "moe_router": "#b8860b", "fp8_cast": "#8c564b", "a2a": "#c44e52",
                "nccl_other": "#dd8452", "deepep": "#e377c2", "hybridep": "#d62728",
                "memcpy": "#55a868", "memset": "#2ca02c", "idle": "#ffffff"}
TIMELINE_COLUMNS = 600


def esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def md(value) -> str:
    """A value inside a Markdown table cell."""
    return str("" if value is None else value).replace("|", "\\|").replace("\n", " ")


def fmt(v, digits=1) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


# -- gathering ---------------------------------------------------------------------------------
@dataclass
class TrialView:
    trial: object
    analysis: dict | None
    apply: object | None  # the decision that chose its fix
    verdict: object | None  # the decision that closed it: a tune/state.py JUDGED kind
    command: str | None
    folder: Path | None
    judged_ms: float | None = None  # the step time the tuner judged by (log median or trace)
    fit: dict | None = None  # fit/fit.json: the layout measured on one GPU first
    predicted_ms: float | None = None  # the step-time model's, corrected by the study's scale then
    model_ms: float | None = None  # the model's own (tune/predicted.py)

    def fit_sentence(self) -> str | None:
        """The fit's verdict and, beside the trial's step time, its compute floor."""
        if not self.fit:
            return None
        text = f"Fit on one GPU first: {self.fit.get('reason')}."
        alone = [r.get("step_time_ms") for r in (self.fit.get("ranks") or {}).values() if r.get("step_time_ms")]
        step = self.judged_ms or self.combined.get("step_time_ms")
        if alone and step:
            text += (f" Of {step:.1f} ms per step, {max(alone):.1f} ms is this rank's compute measured "
                     "alone on one GPU; the rest is communication, waiting and pipeline bubbles.")
        return text

    @property
    def combined(self) -> dict:
        return ((self.analysis or {}).get("metrics") or {}).get("combined") or {}


def gather(store, study_name: str) -> tuple[object, list[TrialView], list]:
    study = store.study(study_name)
    decisions = store.decisions(study.id)
    views = []
    for t in store.trials(study.id):
        folder = Path(t.folder) if t.folder else None
        paths = TrialPaths(folder) if folder else None
        an = cmd = None
        if paths and paths.analysis.exists():
            an = json.loads(paths.analysis.read_text())
        if paths and paths.command.exists():
            cmd = paths.command.read_text().strip()
        fitted = paths.fit.fit_result if paths else None
        mine = [d for d in decisions if d.trial_id == t.id]
        metrics = store.metrics(t.id)
        views.append(TrialView(t, an, next((d for d in mine if d.kind == "apply"), None),
                               next((d for d in mine if d.kind in JUDGED), None), cmd, folder,
                               metrics.get("judged_step_time_ms"),
                               json.loads(fitted.read_text()) if fitted and fitted.exists() else None,
                               metrics.get("predicted_step_time_ms"), metrics.get("predicted_model_ms")))
    return study, views, decisions


def top_kernels(folder: Path | None, n: int = 10) -> list[tuple[str, str, float, int]]:
    """(name, class, ms per rank, count) of the window's longest kernels; [] without a trace."""
    rows = _window_kernels(folder)
    if not rows:
        return []
    k = pd.concat([r[1] for r in rows])
    if k.empty:
        return []
    k = k.assign(ms=(k["end"] - k["start"]) / 1e6)
    g = k.groupby(["name", "cls"]).agg(ms=("ms", "sum"), n=("ms", "size")).reset_index()
    g = g.sort_values("ms", ascending=False).head(n)
    return [(r.name, r.cls, round(r.ms / len(rows), 3), int(r.n)) for r in g.itertuples()]


_WINDOW_CACHE: dict = {}


def _window_kernels(folder: Path | None) -> list:
    """[(rank, kernels clipped to the window, window)] of a trial's traces."""
    if folder is None:
        return []
    paths = TrialPaths(folder)
    traces = paths.each(paths.sqlite)
    if not traces:
        return []
    key = tuple((str(p), p.stat().st_mtime) for p in traces)
    if key in _WINDOW_CACHE:
        return _WINDOW_CACHE[key]
    out = []
    try:
        for rank, k, _c, rt, nvtx, _m, _g in rank_frames([str(p) for p in traces]):
            w = find_window(k, rt, nvtx)
            if w.ns > 0 and not k.empty:
                out.append((rank, in_window(k, w), w))
    except Exception:  # a report never fails on a trace it cannot read; it leaves the plot out
        out = []
    _WINDOW_CACHE[key] = out
    return out


# -- SVG plots ---------------------------------------------------------------------------------
def svg_timeline(folder: Path | None, width: int = 900) -> str:
    """Per-rank strip of the window: each column's colour is the class that ran longest in it."""
    rows = _window_kernels(folder)
    if not rows:
        return ""
    row_h, label_w = 16, 60
    classes = {c for _, k, _ in rows for c in k["cls"].unique()}
    legend_rows = 1 + (len(classes) + 1) * 110 // (width - label_w)
    y_legend = row_h * len(rows) + 34
    height = y_legend + 16 * legend_rows
    cols = TIMELINE_COLUMNS
    parts = [f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" role="img" aria-label="per-rank timeline of the profiled window">']
    scale = (width - label_w) / cols
    for i, (rank, k, w) in enumerate(rows):
        y = 5 + i * row_h
        parts.append(f'<text x="0" y="{y + 12}" font-size="11">rank {esc(rank)}</text>')
        edges = np.linspace(w.start, w.end, cols + 1)
        best = np.full(cols, "idle", dtype=object)
        cover = np.zeros(cols)
        for cls, sel in k.groupby("cls"):
            s, e = sel["start"].to_numpy(), sel["end"].to_numpy()
            tot = np.zeros(cols)
            lo = np.clip(np.searchsorted(edges, s, "right") - 1, 0, cols - 1)
            hi = np.clip(np.searchsorted(edges, e, "left"), 1, cols)
            one = hi - lo <= 1  # most kernels sit inside one column
            np.add.at(tot, lo[one], (e - s)[one])
            for a, b, l0, h0 in zip(s[~one], e[~one], lo[~one], hi[~one]):
                for c in range(l0, h0):
                    tot[c] += min(b, edges[c + 1]) - max(a, edges[c])
            more = tot > cover
            best[more], cover[more] = cls, tot[more]
        run_start = 0
        for c in range(1, cols + 1):
            if c == cols or best[c] != best[run_start]:
                cls = best[run_start]
                if cls != "idle":
                    parts.append(f'<rect x="{label_w + run_start * scale:.1f}" y="{y}" '
                                 f'width="{(c - run_start) * scale:.1f}" height="{row_h - 3}" '
                                 f'fill="{CLASS_COLORS.get(cls, "#777")}"><title>{esc(cls)}</title></rect>')
                run_start = c
    parts.append(f'<text x="{label_w}" y="{y_legend - 22}" font-size="11">window '
                 f'{esc(fmt((rows[0][2].end - rows[0][2].start) / 1e6))} ms, {esc(rows[0][2].steps)} '
                 f'steps; each column coloured by the kernel class that ran longest in it</text>')
    shown = sorted({c for _, k, _ in rows for c in k["cls"].unique()}, key=list(CLASS_COLORS).index)
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
    rows = [(v, breakdown(v.combined), v.combined.get("step_time_ms")) for v in views]
    rows = [(v, b, step) for v, b, step in rows if b and step]
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
    parts.append(f'<text x="{label_w + bar_w / 2 - 50:.1f}" y="{axis_y + 27}" font-size="10">ms per profiled step</text>')
    parts.append(legend(list(BREAKDOWN), label_w, height - 8, width, step=130))
    parts.append("</svg>")
    return "".join(parts)


STEP_COLORS = {"baseline": "#4c72b0", "keep": "#2a9d46", "revert": "#c44e52", "not_applied": "#999999"}


def svg_step_times(views: list[TrialView], width: int = 900, height: int = 240) -> str:
    """Judged step time of each trial that ran (x: those trials, in order), coloured by its verdict;
    dashed: the best kept so far."""
    pts = [(v.trial.number, v.judged_ms or v.trial.step_time_ms,
            "baseline" if _is_baseline(v) else (v.verdict.kind if v.verdict else ""))
           for v in views if v.judged_ms or v.trial.step_time_ms]
    if not pts:
        return ""
    left, bottom, top = 60, 48, 15
    ymax = max(p[1] for p in pts) * 1.1
    x = lambda i: left + (i + 0.5) * (width - left - 10) / len(pts)
    y = lambda t: top + (1 - t / ymax) * (height - top - bottom)
    parts = [f'<svg class="steptimes" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" role="img" aria-label="judged step time of the trials that ran">',
             f'<line x1="{left}" y1="{y(0)}" x2="{width - 10}" y2="{y(0)}" stroke="#333"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y(0)}" stroke="#333"/>']
    for frac in (0.25, 0.5, 0.75, 1.0):
        parts.append(f'<text x="2" y="{y(ymax * frac) + 4:.1f}" font-size="10">{ymax * frac:.0f} ms</text>')
    best, line = None, []
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


# -- the report's model: one set of facts, rendered as Markdown and as HTML -------------------------
UNSTABLE_SPREAD = 0.25  # steps whose spread exceeds this share of their centre are not a fair speed


def ms(v, digits=1) -> str:
    return "–" if v is None else f"{v:.{digits}f} ms"


def count(v) -> str:
    return "–" if v is None else f"{round(v)}"


def pct(share) -> str:
    return f"{100 * (share or 0):.1f}%"


@dataclass
class Table:
    header: list[str]
    rows: list[list]
    depths: list[int] | None = None  # tree depth of each row (the trials table)


@dataclass
class TrialSection:
    """One trial's bottleneck report: what both renderers show, as plain text."""
    number: int
    title: str
    sentences: list[str]
    facts: list[str]  # "Label: value" lines, the evidence rows
    warnings: list[str]
    tables: list[Table]
    recipe_notes: list[tuple[int, str]]  # (depth, text)
    last_lines: list[str]
    folder: Path | None


@dataclass
class StudyReport:
    title: str
    intro: list[str]
    headline: list[str]
    warnings: list[str]
    trials: Table
    best_changes: str | None
    skipped_rules: Table | None
    sections: list[TrialSection]
    appendix: list[tuple[str, str]]  # (caption, preformatted text)
    views: list[TrialView]


def a2a_split(c: dict, profile_ranks: list | None = None) -> str | None:
    """The all-to-all per step, split into waiting for a late peer and transfer (moetune/analysis/skew.py).
    With one rank's trace, why: the study asked for one rank, or asked for more and one came back."""
    a2a = c.get("a2a_ms") or 0.0
    if a2a <= 0:
        return None
    if (c.get("ranks") or 0) < 2:
        asked = list(profile_ranks or [])
        why = ("one rank traced: set cluster.profile_ranks to two ranks or more" if len(asked) < 2 else
               f"one rank's trace was read though cluster.profile_ranks names {asked}: the other "
               "ranks' traces are missing from the trial folder")
        return f"All-to-all: {fmt(a2a, 2)} ms/step; not split into transfer and waiting ({why})"
    return (f"All-to-all: {fmt(a2a, 2)} ms/step, of which {fmt(c.get('a2a_wait_ms'), 2)} ms waiting "
            f"for a late peer and {fmt(c.get('a2a_transfer_ms'), 2)} ms transfer "
            f"({count(c.get('ranks'))} ranks traced)")


def recipe_notes(beside: dict) -> list[tuple[int, str]]:
    """moetune's figures beside NVIDIA's recipes on the same report, disagreements flagged."""
    out = []
    for report, c in sorted(beside.items()):
        if c.get("skipped"):
            out.append((0, f"Not checked against Nsight's recipes ({report}): {c.get('nsys')}: {c['skipped']}"))
            continue
        kern = c.get("kernels") or []
        worst = max((k["rel_diff"] for k in kern), default=None)
        busy = "; ".join(f"GPU {b['device']} busy: moetune {100 * b['moetune']:.1f}%, gpu_time_util "
                         f"{100 * b['recipe']:.1f}%" for b in c.get("busy") or [])
        nccl = "; ".join(f"GPU {n['device']} NCCL time under compute: moetune {100 * n['moetune']:.1f}%, "
                         f"nccl_gpu_overlap_trace {100 * n['recipe']:.1f}%" for n in c.get("nccl_overlap") or [])
        out.append((0, f"Beside Nsight's recipes ({report}): {len(kern)} kernel names, time per name "
                       f"at most {fmt(100 * worst, 2) if worst is not None else '-'}% apart from "
                       f"cuda_gpu_kern_sum; {busy or 'no gpu_time_util output'}" + (f"; {nccl}" if nccl else "")))
        out += [(1, f"**disagrees**: {d}") for d in c.get("disagreements") or []]
        out += [(1, f"note: {n}") for n in c.get("notes") or []]
    return out


def recipes_markdown(beside: dict) -> list[str]:
    out = [f"{'  ' * d}- {md(text) if d == 0 else _md_note(text)}" for d, text in recipe_notes(beside)]
    return out + ([""] if out else [])


def _md_note(text: str) -> str:
    head, _, rest = text.partition(": ")
    return f"{head}: {md(rest)}"


def _is_baseline(v: TrialView) -> bool:
    return v.trial.parent_id is None and not v.trial.fix


def decision_sentence(v: TrialView) -> tuple[str, str] | None:
    """(kind shown, why) of a trial's verdict; the baseline is the reference, not a keep."""
    if not v.verdict:
        return None
    if _is_baseline(v) and v.verdict.kind == "keep":
        return "baseline", "the reference the first fixes are judged against"
    return v.verdict.kind, v.verdict.reason


def judged_source(v: TrialView) -> str:
    j = judged_step(v.analysis)
    if j["source"] == "log median":
        return f"median of {j['steps']} steady log steps, ± {fmt(j['step_time_std_ms'])} ms"
    return f"mean of {count(j['steps'])} traced steps (too few log steps for a median)"


def unstable(v: TrialView) -> str | None:
    """Why a trial's steps are not a fair speed, or None."""
    c = v.combined
    mean, std = c.get("step_time_ms"), c.get("step_time_std_ms")
    if mean and std and std > UNSTABLE_SPREAD * mean:
        return (f"trial {v.trial.number}'s profiled steps are unstable: {ms(mean)} ± {ms(std)} over "
                f"{count(c.get('steps'))} steps (judged median {ms(v.judged_ms)}); compare trials by the "
                f"judged figure")
    j = judged_step(v.analysis)
    if j["source"] == "log median" and j["step_time_std_ms"] > UNSTABLE_SPREAD * j["step_time_ms"]:
        return (f"trial {v.trial.number}'s steady log steps are unstable: median {ms(j['step_time_ms'])} "
                f"± {ms(j['step_time_std_ms'])}; its gains are uncertain")
    return None


def best_view(views: list[TrialView]) -> TrialView | None:
    """The kept trial with the shortest judged step time (a reverted trial is never best)."""
    kept = [v for v in views if v.verdict and v.verdict.kind == "keep" and v.judged_ms]
    return min(kept, key=lambda v: v.judged_ms, default=None)


def kept_path(views: list[TrialView], best: TrialView) -> list[TrialView]:
    """The kept trials from the baseline down to best, in order."""
    by_id = {v.trial.id: v for v in views}
    out, v = [], best
    while v is not None and not _is_baseline(v):
        out.append(v)
        v = by_id.get(v.trial.parent_id)
    return out[::-1]


def _change(v: TrialView) -> str:
    ch = ((v.apply.evidence or {}).get("change") or {}) if v.apply else {}
    return ", ".join(f"`{k}` {a} → {b}" for k, (a, b) in ch.items())


def headline(views: list[TrialView]) -> tuple[list[str], list[str], TrialView | None]:
    """(sentences, warnings, best): the judged baseline → best with its rank test and walls."""
    if not views:
        return ["No trials ran."], [], None
    base, best = views[0], best_view(views)
    warnings = [w for w in map(unstable, views) if w]
    if base.judged_ms is None:
        return [f"The baseline has no judged step time (state {base.trial.state})."], warnings, best
    if best is None or best is base:
        return [f"Judged step time ({judged_source(base)}): baseline {ms(base.judged_ms)}; no fix was "
                f"kept, so the baseline stays best. Wall: {base.trial.wall}."], warnings, base
    speed = base.judged_ms / best.judged_ms
    steady_a, steady_b = steady_iterations(base.analysis), steady_iterations(best.analysis)
    if min(steady_a.size, steady_b.size) >= MIN_LOG_STEPS:
        test = (f"rank test p={faster_p(steady_a, steady_b):.3g} over {steady_a.size} and "
                f"{steady_b.size} steady steps")
    else:
        test = "no rank test: too few steady log steps"
    out = [f"Judged step time (median of the log's steady steps; what keep or revert decided by): "
           f"baseline {ms(base.judged_ms)} → best {ms(best.judged_ms)} (trial {best.trial.number}), "
           f"{speed:.2f}x faster ({test}).",
           f"Wall: {base.trial.wall} → {best.trial.wall}.",
           "Kept fixes on the way: " + "; ".join(f"trial {v.trial.number} {v.trial.fix} ({_change(v)})"
                                                 for v in kept_path(views, best)) + "."]
    b, p = base.trial.step_time_ms, best.trial.step_time_ms
    if b and p:
        out.append(f"Profiled step time (mean of the traced steps; a stall inflates it): {ms(b)} → {ms(p)}.")
    return out, warnings, best


@lru_cache(maxsize=4)
def _rule_table(path: str) -> dict:
    try:
        return {r.id: r for r in rules_mod.load_rules(path)}
    except MoetuneError:  # a malformed team table: the report still renders, from the store alone
        return {}


def _rule(rule_id: str | None):
    """The fix's row of the rule table, or None (a rule since removed, a baseline)."""
    return _rule_table(str(settings.rules_file())).get(rule_id) if rule_id else None


def _conditions(rule, parent: TrialView | None) -> str:
    """The rule's metric conditions with the parent's values: what proposed it beside the wall."""
    metrics = parent.combined if parent else {}
    out = []
    for metric, op, limit in getattr(rule, "when", ()) or ():
        value = metrics.get(metric)
        shown = fmt(value, 3) if isinstance(value, float) else ("–" if value is None else value)
        out.append(f"{metric} {shown} ({op} {limit})")
    return ", ".join(out)


def fix_reason(v: TrialView, parent: TrialView | None) -> str:
    """Why the trial's fix was tried, from what its parent had: the wall it answers when that is the
    parent's wall; else the rule's own metric conditions (or its preconditions alone), not the
    parent's wall, which it does not address."""
    ev = (v.apply.evidence or {}) if v.apply else {}
    rule, top = _rule(v.trial.fix), ev.get("wall")
    if rule is None:
        return v.apply.reason if v.apply else ""
    who = f"trial {parent.trial.number}'s" if parent else "the parent's"
    if rule.wall == top:
        conf = f", confidence {fmt(ev['confidence'], 2)}" if ev.get("confidence") else ""
        return f"answers {who} {top} wall{conf}: {rule.rationale}"
    conds = _conditions(rule, parent)
    basis = f"its own condition {conds}" if conds else "its preconditions alone"
    return (f"a {rule.wall} fix, proposed on {basis}, not on {who} wall ({top}): it came after "
            f"that wall's fixes were tried or passed over; {rule.rationale}")


def _proposed_by(v: TrialView) -> str:
    """What proposed the trial's fix: the parent's wall (with the analysis' confidence) when the
    rule answers it, else the rule's own wall and conditions."""
    ev = (v.apply.evidence or {}) if v.apply else {}
    if not ev.get("wall"):
        return ""
    rule = _rule(v.trial.fix)
    if rule is not None and rule.wall != ev["wall"]:
        return f"{rule.wall} condition" if rule.when else f"{rule.wall} preconditions"
    return ev["wall"] + (f" ({fmt(ev['confidence'], 2)})" if ev.get("confidence") else "")


def trials_table(views: list[TrialView]) -> Table:
    rows, depths = [], []
    for depth, v in tree_lines(views):
        t = v.trial
        ev = (v.verdict.evidence or {}) if v.verdict else {}
        shown = decision_sentence(v)
        gain = ev.get("gain_share")
        ratio = v.judged_ms / v.model_ms if v.judged_ms and v.model_ms else None
        rows.append([str(t.number), t.fix or "baseline", t.state, shown[0] if shown else "",
                     fmt(v.judged_ms), fmt(v.predicted_ms), fmt(ratio, 2),
                     "" if gain is None else f"{-100 * gain:+.1f}%",
                     "" if ev.get("p_faster") is None else f"{ev['p_faster']:.3g}",
                     fmt(t.step_time_ms), fmt(t.tflops_per_gpu), t.wall or "", _proposed_by(v)])
        depths.append(depth)
    return Table(["trial", "fix", "state", "decision", "judged ms", "predicted ms", "measured/model", "change",
                  "p", "profiled ms",
                  "TFLOP/s/GPU", "wall", "proposed by"], rows, depths)


def memory_fact(peak_gb, device_gb, gpu_type: str | None) -> str:
    """The peak against the GPU's memory, each figure with its source: what the device reported to
    CUDA in the trace (GiB), and the data sheet's (experiment/gpus.py) where the GPU type is known."""
    sheet = gpus.memory_gb(gpu_type)
    sheet_text = f"{gpu_type} data sheet: {fmt(sheet, 0)} GB" if sheet else None
    if device_gb is None:
        return f"Memory: peak {fmt(peak_gb, 2)} GB" + (f" ({sheet_text})" if sheet_text else "")
    return (f"Memory: peak {fmt(peak_gb, 2)} GB of {fmt(device_gb, 1)} GB the device reports to CUDA"
            + (f" ({sheet_text})" if sheet_text else ""))


def trial_facts(v: TrialView, cluster: dict | None = None) -> list[str]:
    """The evidence rows of a trial's analysis, each 'Label: value'; `cluster`: the study's section."""
    t, c, an = v.trial, v.combined, v.analysis or {}
    cluster = cluster or {}
    hidden = max(0.0, (c.get("comm_share") or 0) - (c.get("exposed_comm_share") or 0))
    split = a2a_split(c, cluster.get("profile_ranks"))
    return [f"Wall: {an.get('wall')} (confidence {fmt(an.get('confidence'), 2)})",
            f"Step time, judged: {ms(v.judged_ms)} ({judged_source(v)})",
            f"Step time, profiled: {ms(c.get('step_time_ms'))} ± {ms(c.get('step_time_std_ms'))}, mean of "
            f"{count(c.get('steps'))} traced steps; TFLOP/s per GPU {fmt(t.tflops_per_gpu)}",
            f"Communication: {pct(c.get('comm_share'))} of the window, exposed "
            f"{pct(c.get('exposed_comm_share'))} (all-to-all exposed {ms(c.get('exposed_a2a_ms'))}/step), "
            f"hidden {pct(hidden)}",
            *([split] if split else []),
            f"GPU idle: {pct(c.get('gpu_idle_share'))} of the window; {count(c.get('gaps_over_100us'))} gaps "
            f"over 100 us ({ms(c.get('gaps_over_100us_ms'))})",
            f"Idle causes: launch-starved {ms(c.get('launch_starved_ms'))}, sync-blocked "
            f"{ms(c.get('sync_blocked_ms'))}",
            memory_fact(c.get("peak_memory_gb"), an.get("gpu_memory_gb"), cluster.get("gpu_type")),
            f"Kernels: {count(c.get('kernels_per_step'))} per step, median kernel "
            f"{fmt(c.get('median_kernel_us'))} us; CUDA graph launches {count(c.get('cuda_graph_launches'))}"]


def trial_tables(v: TrialView) -> list[Table]:
    c, an = v.combined, v.analysis or {}
    out = []
    ev = an.get("evidence") or []
    if ev:
        out.append(Table(["deciding rule", "wall", "metric", "value", "threshold"],
                         [[e.get("rule"), e.get("wall"), e.get("metric"), e.get("value"), e.get("threshold")]
                          for e in ev]))
    cls, counts = c.get("kernel_class_ms") or {}, c.get("kernel_class_count") or {}
    rows = [[k, fmt(t, 2), count(counts.get(k))] for k, t in sorted(cls.items(), key=lambda kv: -kv[1])
            if t or counts.get(k)]
    if rows:
        out.append(Table(["kernel class", "ms (per rank, window)", "count"], rows))
    tops = top_kernels(v.folder)
    if tops:
        out.append(Table(["top kernel", "class", "ms per rank", "count"],
                         [[n[:120], k, fmt(t, 2), count(cnt)] for n, k, t, cnt in tops]))
    return out


def trial_section(v: TrialView, parent_number: int | None, cluster: dict | None = None,
                  parent: TrialView | None = None) -> TrialSection:
    t = v.trial
    sentences = []
    if parent_number:
        sentences.append(f"Parent: trial {parent_number}. Config hash {t.config_hash}.")
    if v.apply:
        sentences.append(f"Fix: {t.fix} — {fix_reason(v, parent)} (source: "
                         f"{(v.apply.evidence or {}).get('source')}); change: {_change(v)}")
    shown = decision_sentence(v)
    if shown:
        sentences.append(f"Decision: {shown[0]} — {shown[1]}")
    if v.fit_sentence():
        sentences.append(v.fit_sentence())
    an = v.analysis or {}
    last = ((v.verdict.evidence or {}).get("last_lines") if v.verdict else None) or []
    return TrialSection(t.number, f"Trial {t.number}: {t.fix or 'baseline'} — {t.state}", sentences,
                        trial_facts(v, cluster) if an else [], [str(w) for w in an.get("warnings") or []],
                        trial_tables(v) if an else [], recipe_notes(an.get("recipes") or {}),
                        [str(x) for x in last], v.folder)


def build(store, study_name: str) -> StudyReport:
    """The report of a study, once; study_markdown and study_html render it."""
    study, views, decisions = gather(store, study_name)
    s = summary(store, study_name)
    intro = [f"Model {study.model}; {s['trials']} trials run ({s['skipped']} skipped); "
             f"stopped: {s.get('stop_reason')}."]
    one_gpu = one_gpu_sentence(study, views)
    if one_gpu:
        intro.append(one_gpu)
    intro.append(prediction_sentence(s))
    head, warnings, best = headline(views)
    changes = None
    if best:
        changes = ", ".join(f"`{k}` {a} → {b}" for k, (a, b) in _from_baseline(views, best).items()) or "none"
    refused = [d for d in decisions if d.kind == "skip" and not d.trial_id]
    number = {v.trial.id: v.trial.number for v in views}
    by_id = {v.trial.id: v for v in views}
    cluster = (study.experiment or {}).get("cluster") or {}
    appendix = []
    if best:
        appendix.append((f"Best config (trial {best.trial.number}), in full",
                         json.dumps(best.trial.config, indent=1, sort_keys=True)))
    appendix += [(f"Trial {v.trial.number} command line", v.command) for v in views if v.command]
    return StudyReport(f"moetune study {study.name}", intro, head, warnings, trials_table(views), changes,
                       Table(["rule", "why"], [[d.rule, d.reason] for d in refused]) if refused else None,
                       [trial_section(v, number.get(v.trial.parent_id), cluster, by_id.get(v.trial.parent_id))
                        for v in views], appendix, views)


def prediction_sentence(s: dict) -> str:
    """The step-time model's part in the study: its correction and what its skips saved."""
    text = (f"Step-time model: measured / model {s['prediction_scale']:.2f} (median of "
            f"{s['prediction_scale_from_trials']} completed trials)")
    corr = s.get("prediction_correction") or {}
    parts = [f"{g} x{v:.2f}" for g, v in (corr.get("scales") or {}).items()]
    parts += [f"{g} {v:+.1f} ms" for g, v in (corr.get("offsets_ms") or {}).items()]
    if parts:
        text += f"; each later prediction corrected by part ({', '.join(parts)}, from {corr['trials']} trials)"
    if s.get("skipped_by_prediction"):
        text += (f"; {s['skipped_by_prediction']} trials predicted slower than the incumbent were not "
                 f"submitted, saving {s['gpu_hours_saved']:.2f} GPU-hours ({s['gpu_hours_saved_basis']})")
    return text + "."


def _from_baseline(views: list[TrialView], best: TrialView) -> dict:
    base = views[0].trial.config if views else {}
    return {k: (base.get(k), v) for k, v in best.trial.config.items() if base.get(k) != v}


def tree_lines(views: list[TrialView]) -> list[tuple[int, TrialView]]:
    """(depth, view) in tree order: each trial under its parent."""
    by_parent: dict = {}
    for v in views:
        by_parent.setdefault(v.trial.parent_id, []).append(v)
    out = []

    def walk(pid, depth):
        for v in by_parent.get(pid, []):
            out.append((depth, v))
            walk(v.trial.id, depth + 1)
    walk(None, 0)
    return out


def one_gpu_sentence(study, views: list[TrialView] = ()) -> str | None:
    """What a one-GPU study's step times are (tuning.one_gpu; experiment/fit.py one_gpu_config), and
    which rank stood for each trial's layout, and why."""
    tuning = Tuning.from_stored((study.experiment or {}).get("tuning"))
    if not tuning.one_gpu:
        return None
    stood = one_gpu_ranks((v.trial.number, v.folder) for v in views)
    return ("One GPU: every trial ran one rank of its layout alone under Megatron's fake process group, "
            f"a step of {tuning.one_gpu_samples} sequences per data-parallel rank with "
            "static routing; its step time is that rank's compute and host overhead at the "
            "production shapes, without communication, waiting or pipeline bubbles."
            + (" The rank that stood for the layout: " + "; ".join(
                f"{_trials_word(numbers)}: rank {b['rank']} ({b['why']})" for b, numbers in stood) + "."
               if stood else ""))




def _trials_word(numbers: list[int]) -> str:
    return ("trial " if len(numbers) == 1 else "trials ") + ", ".join(map(str, numbers))


TRIALS_NOTE = ("Judged ms: the median of the log's steady steps (the trace's steps where the log has too "
               "few), what keep or revert decided by; change and p: against the parent, by the rank test. "
               "Predicted ms: the step-time model's, corrected by the study's scale when the trial was "
               "proposed; measured/model: judged ms over the model's own, the residual the scale learns "
               "from. Profiled ms: the mean of the traced steps, for reference.")


# -- Markdown ----------------------------------------------------------------------------------
def _md_table(t: Table, code_first: bool = False) -> list[str]:
    out = ["| " + " | ".join(t.header) + " |", "|" + "---|" * len(t.header)]
    for i, row in enumerate(t.rows):
        cells = [md(c) for c in row]
        if t.depths and t.depths[i]:
            cells[0] = "  " * t.depths[i] + "└ " + cells[0]
        if code_first:
            cells[0] = f"`{cells[0]}`"
        out.append("| " + " | ".join(cells) + " |")
    return out + [""]


def section_markdown(sec: TrialSection) -> str:
    out = [f"### {md(sec.title)}", ""]
    for line in sec.sentences:
        if line.startswith("Decision: "):
            kind, _, why = line[len("Decision: "):].partition(" — ")
            out.append(f"Decision: **{md(kind)}** — {md(why)}")
        else:
            out.append(md(line))
    if sec.last_lines:
        out += ["", "Last log lines:", "```", *sec.last_lines, "```"]
    out.append("")
    if not sec.facts:
        return "\n".join(out + ["(no analysis)", ""])
    out += [f"- {md(f)}" for f in sec.facts] + [f"- **Warning**: {md(w)}" for w in sec.warnings] + [""]
    for t in sec.tables:
        out += _md_table(t, code_first=t.header[0] == "top kernel")
    notes = [f"{'  ' * d}- {md(text) if d == 0 else _md_note(text)}" for d, text in sec.recipe_notes]
    return "\n".join(out + notes + ([""] if notes else []))


def trial_markdown(v: TrialView, parent_number: int | None) -> str:
    return section_markdown(trial_section(v, parent_number))


def render_markdown(r: StudyReport) -> str:
    out = [f"# {md(r.title)}", "", *[md(x) + "\n" for x in r.intro], "## Headline", ""]
    out += [f"- {md(x)}" for x in r.headline] + [f"- **Warning**: {md(w)}" for w in r.warnings] + [""]
    out += ["## Trials", "", TRIALS_NOTE, "", *_md_table(r.trials)]
    if r.best_changes is not None:
        out += ["Best config: changes from the baseline: " + r.best_changes + " (in full in the appendix).", ""]
    if r.skipped_rules:
        out += ["## Rules skipped", "", *_md_table(r.skipped_rules)]
    out += ["## Bottleneck reports", ""] + [section_markdown(s) for s in r.sections]
    out += ["## Appendix: configuration and command lines", ""]
    for caption, text in r.appendix:
        out += [f"{md(caption)}:", "```", text, "```", ""]
    return "\n".join(out)


def study_markdown(store, study_name: str) -> str:
    return render_markdown(build(store, study_name))


# -- HTML --------------------------------------------------------------------------------------
CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:2px 8px;
font-size:13px;text-align:left}pre{background:#f5f5f5;padding:.6em;white-space:pre-wrap;
word-break:break-all;font-size:12px}.keep{color:#2a9d46}.revert{color:#c44e52}
.warning{color:#a33}ul.headline li{font-size:15px;margin:.2em 0}
section.trial{border-top:1px solid #ddd;margin-top:1.5em}td:first-child{white-space:nowrap}"""


def _code(text: str) -> str:
    """esc, with Markdown's `code` spans as <code>."""
    parts = str(text).split("`")
    return "".join(f"<code>{esc(p)}</code>" if i % 2 else esc(p) for i, p in enumerate(parts))


def _table(header: list[str], rows: list[list], depths: list[int] | None = None) -> str:
    h = "".join(f"<th>{esc(x)}</th>" for x in header)
    body = []
    for i, r in enumerate(rows):
        cells = [esc(c) for c in r]
        if depths and depths[i]:
            cells[0] = "&nbsp;&nbsp;" * depths[i] + "└ " + cells[0]
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<table><tr>{h}</tr>{''.join(body)}</table>"


def section_html(sec: TrialSection) -> str:
    parts = [f'<section class="trial" id="trial-{sec.number}"><h3>{esc(sec.title)}</h3>']
    for line in sec.sentences:
        if line.startswith("Decision: "):
            kind, _, why = line[len("Decision: "):].partition(" — ")
            parts.append(f'<p>Decision: <b class="{esc(kind)}">{esc(kind)}</b> — {esc(why)}</p>')
        else:
            parts.append(f"<p>{_code(line)}</p>")
    if sec.last_lines:
        parts.append("<p>Last log lines:</p><pre>" + esc("\n".join(sec.last_lines)) + "</pre>")
    if sec.facts:
        parts.append('<ul class="facts">' + "".join(f"<li>{esc(f)}</li>" for f in sec.facts)
                     + "".join(f'<li class="warning">Warning: {esc(w)}</li>' for w in sec.warnings) + "</ul>")
    parts += [_table(t.header, t.rows) for t in sec.tables]
    if sec.recipe_notes:
        parts.append("<ul>" + "".join(f'<li style="margin-left:{2 * d}em">{esc(text)}</li>'
                                      for d, text in sec.recipe_notes) + "</ul>")
    strip = svg_timeline(sec.folder) if sec.facts else ""
    if strip:
        parts.append("<p>Timeline of the profiled window (per rank):</p>" + strip)
    parts.append("</section>")
    return "".join(parts)


def section_page(sec: TrialSection) -> str:
    """One trial's bottleneck report as a page of its own (the screenshot in docs/)."""
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{esc(sec.title)}</title>'
            f"<style>{CSS}</style></head><body>{section_html(sec)}</body></html>")


def trial_html(v: TrialView, parent_number: int | None) -> str:
    return section_html(trial_section(v, parent_number))


def render_html(r: StudyReport) -> str:
    parts = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
             f"<title>{esc(r.title)}</title><style>{CSS}</style></head><body>",
             f"<h1>{esc(r.title)}</h1>", *[f"<p>{esc(x)}</p>" for x in r.intro],
             "<h2>Headline</h2>", '<ul class="headline">' + "".join(f"<li>{_code(x)}</li>" for x in r.headline)
             + "".join(f'<li class="warning">Warning: {esc(w)}</li>' for w in r.warnings) + "</ul>",
             "<h2>Step time across trials</h2>", svg_step_times(r.views),
             "<h2>Trials</h2>", f"<p>{esc(TRIALS_NOTE)} The plot shows judged ms.</p>",
             _table(r.trials.header, r.trials.rows, r.trials.depths),
             "<h2>Time breakdown</h2>", svg_breakdown(r.views)]
    if r.best_changes is not None:
        parts.append(f"<p>Best config: changes from the baseline: {_code(r.best_changes)} "
                     "(in full in the appendix).</p>")
    if r.skipped_rules:
        parts += ["<h2>Rules skipped</h2>", _table(r.skipped_rules.header, r.skipped_rules.rows)]
    parts.append("<h2>Bottleneck reports</h2>")
    parts += [section_html(s) for s in r.sections]
    parts.append("<h2>Appendix: configuration and command lines</h2>")
    parts += [f"<p>{esc(caption)}:</p><pre>{esc(text)}</pre>" for caption, text in r.appendix]
    parts.append("</body></html>")
    return "\n".join(parts)


def study_html(store, study_name: str) -> str:
    return render_html(build(store, study_name))


def write_reports(store, study_name: str, out_dir) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in study_name)
    md_path, html_path = out / f"{safe}.md", out / f"{safe}.html"
    r = build(store, study_name)
    md_path.write_text(render_markdown(r))
    html_path.write_text(render_html(r))
    return md_path, html_path
