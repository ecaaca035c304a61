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
from pathlib import Path

from moetune import analysis
from moetune.analysis.metrics import in_window
from moetune.analysis.window import find_window
from moetune.pipeline.spec.experiment import tuning_value
from moetune.pipeline.tune.state import JUDGED
from moetune.pipeline.tune.summary import summary

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
    verdict: object | None  # keep / revert / skip / not_applied
    command: str | None
    folder: Path | None
    judged_ms: float | None = None  # the step time the tuner judged by (log median or trace)
    fit: dict | None = None  # fit/fit.json: the layout measured on one GPU first

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
        an = cmd = None
        if folder and (folder / "analysis.json").exists():
            an = json.loads((folder / "analysis.json").read_text())
        if folder and (folder / "command.txt").exists():
            cmd = (folder / "command.txt").read_text().strip()
        fitted = folder / "fit" / "fit.json" if folder else None
        mine = [d for d in decisions if d.trial_id == t.id]
        views.append(TrialView(t, an, next((d for d in mine if d.kind == "apply"), None),
                               next((d for d in mine if d.kind in JUDGED), None), cmd, folder,
                               store.metrics(t.id).get("judged_step_time_ms"),
                               json.loads(fitted.read_text()) if fitted and fitted.exists() else None))
    return study, views, decisions


def top_kernels(folder: Path | None, n: int = 10) -> list[tuple[str, str, float, int]]:
    """(name, class, ms per rank, count) of the window's longest kernels; [] without a trace."""
    rows = _window_kernels(folder)
    if not rows:
        return []
    import pandas as pd
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
    traces = sorted(folder.glob("trace_*.sqlite"))
    if not traces:
        return []
    key = tuple((str(p), p.stat().st_mtime) for p in traces)
    if key in _WINDOW_CACHE:
        return _WINDOW_CACHE[key]
    out = []
    try:
        for rank, k, _c, rt, nvtx, _m, _g in analysis.rank_frames([str(p) for p in traces]):
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
    import numpy as np
    rows = _window_kernels(folder)
    if not rows:
        return ""
    row_h, label_w = 16, 60
    height = row_h * len(rows) + 30
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
    parts.append(f'<text x="{label_w}" y="{height - 5}" font-size="11">window '
                 f'{esc(fmt((rows[0][2].end - rows[0][2].start) / 1e6))} ms, {esc(rows[0][2].steps)} '
                 f'steps; white = idle</text></svg>')
    return "".join(parts)


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
    rows = [(v, breakdown(v.combined)) for v in views]
    rows = [(v, b) for v, b in rows if b]
    if not rows:
        return ""
    row_h, label_w = 20, 190
    height = row_h * len(rows) + 40
    parts = [f'<svg class="breakdown" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" role="img" aria-label="time breakdown per trial">']
    bar_w = width - label_w - 10
    for i, (v, b) in enumerate(rows):
        y = 5 + i * row_h
        parts.append(f'<text x="0" y="{y + 13}" font-size="11">#{v.trial.number} '
                     f'{esc(v.trial.fix or "baseline")}</text>')
        x = label_w
        # hidden comm overlaps compute: draw it as a band inside the compute bar
        for name, color in BREAKDOWN:
            share = b[name]
            if name == "hidden comm":
                parts.append(f'<rect x="{label_w:.1f}" y="{y + 12}" width="{share * bar_w:.1f}" '
                             f'height="4" fill="{color}"><title>hidden comm {share:.1%}</title></rect>')
                continue
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{share * bar_w:.1f}" height="{row_h - 4}" '
                         f'fill="{color}"><title>{esc(name)} {share:.1%}</title></rect>')
            x += share * bar_w
    ly = height - 12
    for j, (name, color) in enumerate(BREAKDOWN):
        parts.append(f'<rect x="{label_w + j * 130}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{label_w + j * 130 + 14}" y="{ly}" font-size="11">{esc(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def svg_step_times(views: list[TrialView], width: int = 900, height: int = 220) -> str:
    pts = [(v.trial.number, v.judged_ms or v.trial.step_time_ms, v.verdict.kind if v.verdict else "")
           for v in views if v.judged_ms or v.trial.step_time_ms]
    if not pts:
        return ""
    left, bottom, top = 60, 30, 15
    ymax = max(p[1] for p in pts) * 1.1
    nmax = max(v.trial.number for v in views)
    x = lambda n: left + (n - 0.5) * (width - left - 10) / max(nmax, 1)
    y = lambda ms: top + (1 - ms / ymax) * (height - top - bottom)
    colors = {"keep": "#2a9d46", "revert": "#c44e52", "not_applied": "#999999"}
    parts = [f'<svg class="steptimes" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" role="img" aria-label="step time across trials">',
             f'<line x1="{left}" y1="{y(0)}" x2="{width - 10}" y2="{y(0)}" stroke="#333"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y(0)}" stroke="#333"/>']
    for frac in (0.25, 0.5, 0.75, 1.0):
        ms = ymax * frac
        parts.append(f'<text x="2" y="{y(ms) + 4:.1f}" font-size="10">{ms:.0f} ms</text>')
    best = None
    line = []
    for n, ms, kind in pts:
        if kind == "keep":
            best = ms
        if best is not None:
            line.append(f"{x(n):.1f},{y(best):.1f}")
        parts.append(f'<circle cx="{x(n):.1f}" cy="{y(ms):.1f}" r="5" fill="{colors.get(kind, "#4c72b0")}">'
                     f'<title>trial {n}: {ms:.1f} ms ({esc(kind)})</title></circle>'
                     f'<text x="{x(n) - 4:.1f}" y="{height - 10}" font-size="10">{n}</text>')
    if line:
        parts.append(f'<polyline points="{" ".join(line)}" fill="none" stroke="#2a9d46" '
                     f'stroke-dasharray="4 3"/>')
    parts.append("</svg>")
    return "".join(parts)


# -- Markdown ----------------------------------------------------------------------------------
def a2a_split(c: dict) -> str | None:
    """The all-to-all per step, split into waiting for a late peer and transfer (analysis/skew.py)."""
    a2a = c.get("a2a_ms") or 0.0
    if a2a <= 0:
        return None
    if (c.get("ranks") or 0) < 2:
        return (f"All-to-all: {fmt(a2a, 2)} ms/step; not split into transfer and waiting "
                f"(one rank traced: set cluster.profile_ranks to two ranks or more)")
    return (f"All-to-all: {fmt(a2a, 2)} ms/step, of which {fmt(c.get('a2a_wait_ms'), 2)} ms waiting "
            f"for a late peer and {fmt(c.get('a2a_transfer_ms'), 2)} ms transfer "
            f"({fmt(c.get('ranks'))} ranks traced)")


def recipes_markdown(beside: dict) -> list[str]:
    """moetune's figures beside NVIDIA's recipes on the same report, disagreements flagged."""
    out = []
    for report, c in sorted(beside.items()):
        if c.get("skipped"):
            out.append(f"- Not checked against Nsight's recipes ({md(report)}): {md(c.get('nsys'))}: "
                       f"{md(c['skipped'])}")
            continue
        kern = c.get("kernels") or []
        worst = max((k["rel_diff"] for k in kern), default=None)
        busy = "; ".join(f"GPU {b['device']} busy: moetune {100 * b['moetune']:.1f}%, gpu_time_util "
                         f"{100 * b['recipe']:.1f}%" for b in c.get("busy") or [])
        nccl = "; ".join(f"GPU {n['device']} NCCL time under compute: moetune {100 * n['moetune']:.1f}%, "
                         f"nccl_gpu_overlap_trace {100 * n['recipe']:.1f}%" for n in c.get("nccl_overlap") or [])
        out.append(f"- Beside Nsight's recipes ({md(report)}): {len(kern)} kernel names, time per name "
                   f"at most {fmt(100 * worst, 2) if worst is not None else '-'}% apart from "
                   f"cuda_gpu_kern_sum; {busy or 'no gpu_time_util output'}" + (f"; {nccl}" if nccl else ""))
        out += [f"  - **disagrees**: {md(d)}" for d in c.get("disagreements") or []]
        out += [f"  - note: {md(n)}" for n in c.get("notes") or []]
    return out + ([""] if out else [])


def trial_markdown(v: TrialView, parent_number: int | None) -> str:
    t, c, an = v.trial, v.combined, v.analysis or {}
    out = [f"### Trial {t.number}: {md(t.fix or 'baseline')} — {md(t.state)}", ""]
    if parent_number:
        out.append(f"Parent: trial {parent_number}. Config hash `{t.config_hash}`.")
    if v.apply:
        ch = (v.apply.evidence or {}).get("change", {})
        out.append(f"Fix: **{md(t.fix)}** — {md(v.apply.reason)} (source: "
                   f"{md((v.apply.evidence or {}).get('source'))}); change: "
                   + ", ".join(f"`{md(k)}` {md(a)} → {md(b)}" for k, (a, b) in ch.items()))
    if v.verdict:
        out.append(f"Decision: **{md(v.verdict.kind)}** — {md(v.verdict.reason)}")
        last = (v.verdict.evidence or {}).get("last_lines")
        if last:
            out += ["", "Last log lines:", "```", *[str(x) for x in last], "```"]
    if v.fit_sentence():
        out.append(md(v.fit_sentence()))
    out.append("")
    if not an:
        return "\n".join(out + ["(no analysis)", ""])
    split = a2a_split(c)
    out += [f"- Wall: **{md(an.get('wall'))}** (confidence {fmt(an.get('confidence'), 2)})",
            f"- Step time: {fmt(c.get('step_time_ms'))} ms ± {fmt(c.get('step_time_std_ms'))} "
            f"over {fmt(c.get('steps'))} profiled steps; TFLOP/s per GPU {fmt(t.tflops_per_gpu)}",
            f"- Communication: {fmt(100 * (c.get('comm_share') or 0))}% of the window, exposed "
            f"{fmt(100 * (c.get('exposed_comm_share') or 0))}% (all-to-all exposed "
            f"{fmt(c.get('exposed_a2a_ms'), 2)} ms/step), hidden "
            f"{fmt(100 * max(0.0, (c.get('comm_share') or 0) - (c.get('exposed_comm_share') or 0)))}%",
            *([f"- {split}"] if split else []),
            f"- GPU idle: {fmt(100 * (c.get('gpu_idle_share') or 0))}%; gaps over 100 us: "
            f"{fmt(c.get('gaps_over_100us'))} ({fmt(c.get('gaps_over_100us_ms'), 2)} ms); launch-starved "
            f"{fmt(c.get('launch_starved_ms'), 2)} ms, sync-blocked {fmt(c.get('sync_blocked_ms'), 2)} ms",
            f"- Memory: peak {fmt(c.get('peak_memory_gb'), 2)} GB of "
            f"{fmt(an.get('gpu_memory_gb'), 0)} GB",
            f"- CUDA graph launches: {fmt(c.get('cuda_graph_launches'))}; kernels per step "
            f"{fmt(c.get('kernels_per_step'))}, median kernel {fmt(c.get('median_kernel_us'))} us",
            *[f"- **Warning**: {md(w)}" for w in an.get("warnings") or []], ""]
    ev = an.get("evidence") or []
    if ev:
        out += ["| deciding rule | wall | metric | value | threshold |", "|---|---|---|---|---|"]
        out += [f"| {md(e.get('rule'))} | {md(e.get('wall'))} | {md(e.get('metric'))} | "
                f"{md(e.get('value'))} | {md(e.get('threshold'))} |" for e in ev]
        out.append("")
    cls = c.get("kernel_class_ms") or {}
    if cls:
        out += ["| kernel class | ms (per rank, window) | count |", "|---|---|---|"]
        counts = c.get("kernel_class_count") or {}
        out += [f"| {md(k)} | {fmt(ms, 2)} | {md(counts.get(k))} |"
                for k, ms in sorted(cls.items(), key=lambda kv: -kv[1])]
        out.append("")
    out += recipes_markdown(an.get("recipes") or {})
    tops = top_kernels(v.folder)
    if tops:
        out += ["| top kernel | class | ms per rank | count |", "|---|---|---|---|"]
        out += [f"| `{md(n[:90])}` | {md(k)} | {fmt(ms, 2)} | {cnt} |" for n, k, ms, cnt in tops]
        out.append("")
    if v.command:
        out += ["Command:", "```", v.command, "```", ""]
    return "\n".join(out)


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


def one_gpu_sentence(study) -> str | None:
    """What a one-GPU study's step times are (tuning.one_gpu; spec/fit.py one_gpu_config)."""
    tuning = (study.experiment or {}).get("tuning") or {}
    if not tuning_value(tuning, "one_gpu"):
        return None
    return ("One GPU: every trial ran its layout's rank 0 alone under Megatron's fake process group, "
            f"a step of {tuning_value(tuning, 'one_gpu_samples')} sequences per data-parallel rank with "
            "static routing; its step time is that rank's compute and host overhead at the "
            "production shapes, without communication, waiting or pipeline bubbles.")


def study_markdown(store, study_name: str) -> str:
    study, views, decisions = gather(store, study_name)
    s = summary(store, study_name)
    best = next((v for v in views if v.trial.number == s.get("best_trial")), None)
    out = [f"# moetune study {md(study.name)}", "",
           f"Model {md(study.model)}; {s['trials']} trials run ({s['skipped']} skipped); "
           f"stopped: {md(s.get('stop_reason'))}.", ""]
    one_gpu = one_gpu_sentence(study)
    if one_gpu:
        out += [md(one_gpu), ""]
    out += [
           f"Baseline {fmt(s.get('baseline_step_time_ms'))} ms/step → best "
           f"{fmt(s.get('best_step_time_ms'))} ms/step (trial {fmt(s.get('best_trial'))}, "
           f"speed-up {fmt(s.get('speedup'), 3)}x; judged: {fmt(s.get('baseline_judged_step_time_ms'))} → "
           f"{fmt(s.get('best_judged_step_time_ms'))} ms, {fmt(s.get('judged_speedup'), 3)}x); kept fixes: "
           f"{md(', '.join(s.get('kept_fixes') or []) or 'none')}.", "",
           "## Trials", "", "Step ms: mean of the profiled steps in the trace; judged ms: what keep or "
           "revert compared (the median of the log's steady iterations where there are enough).", "",
           "| trial | fix | state | decision | step ms | judged ms | TFLOP/s/GPU | wall |",
           "|---|---|---|---|---|---|---|---|"]
    for depth, v in tree_lines(views):
        t = v.trial
        out.append(f"| {'  ' * depth}{'└ ' if depth else ''}{t.number} | {md(t.fix or 'baseline')} | "
                   f"{md(t.state)} | {md(v.verdict.kind if v.verdict else '')} | "
                   f"{fmt(t.step_time_ms)} | {fmt(v.judged_ms)} | {fmt(t.tflops_per_gpu)} | {md(t.wall)} |")
    out += ["", "## Best config", ""]
    if best:
        out += ["Changes from the baseline: " + (", ".join(
            f"`{md(k)}` {md(a)} → {md(b)}" for k, (a, b) in _from_baseline(views, best).items())
            or "none"), "", "```json", json.dumps(best.trial.config, indent=1, sort_keys=True), "```", "",
                "Full command line:", "```", best.command or "(not rendered)", "```", ""]
    refused = [d for d in decisions if d.kind == "skip" and not d.trial_id]
    if refused:
        out += ["## Rules skipped", ""] + [f"- {md(d.rule)}: {md(d.reason)}" for d in refused] + [""]
    out += ["## Bottleneck reports", ""]
    number = {v.trial.id: v.trial.number for v in views}
    out += [trial_markdown(v, number.get(v.trial.parent_id)) for v in views]
    return "\n".join(out)


# -- HTML --------------------------------------------------------------------------------------
CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1000px;color:#222}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ccc;padding:2px 8px;
font-size:13px;text-align:left}pre{background:#f5f5f5;padding:.6em;white-space:pre-wrap;
word-break:break-all;font-size:12px}.keep{color:#2a9d46}.revert{color:#c44e52}
section.trial{border-top:1px solid #ddd;margin-top:1.5em}"""


def _table(header: list[str], rows: list[list]) -> str:
    h = "".join(f"<th>{esc(x)}</th>" for x in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def trial_html(v: TrialView, parent_number: int | None) -> str:
    t, c, an = v.trial, v.combined, v.analysis or {}
    parts = [f'<section class="trial" id="trial-{t.number}"><h3>Trial {t.number}: '
             f'{esc(t.fix or "baseline")} — {esc(t.state)}</h3>']
    if parent_number:
        parts.append(f"<p>Parent: trial {parent_number}; config <code>{esc(t.config_hash)}</code></p>")
    if v.apply:
        ev = v.apply.evidence or {}
        ch = ev.get("change", {})
        parts.append(f"<p>Fix <b>{esc(t.fix)}</b>: {esc(v.apply.reason)} (source "
                     f"{esc(ev.get('source'))}); change: "
                     + ", ".join(f"<code>{esc(k)}</code> {esc(a)} → {esc(b)}" for k, (a, b) in ch.items())
                     + "</p>")
    if v.verdict:
        parts.append(f'<p>Decision: <b class="{esc(v.verdict.kind)}">{esc(v.verdict.kind)}</b> — '
                     f"{esc(v.verdict.reason)}</p>")
        last = (v.verdict.evidence or {}).get("last_lines")
        if last:
            parts.append("<p>Last log lines:</p><pre>" + esc("\n".join(map(str, last))) + "</pre>")
    if v.fit_sentence():
        parts.append(f"<p>{esc(v.fit_sentence())}</p>")
    if an:
        hidden = max(0.0, (c.get("comm_share") or 0) - (c.get("exposed_comm_share") or 0))
        parts.append(_table(["wall", "confidence", "step ms", "± ms", "TFLOP/s/GPU", "exposed comm",
                             "hidden comm", "idle", "gaps >100us", "peak GB", "graph launches"],
                            [[an.get("wall"), fmt(an.get("confidence"), 2), fmt(c.get("step_time_ms")),
                              fmt(c.get("step_time_std_ms")), fmt(t.tflops_per_gpu),
                              f"{100 * (c.get('exposed_comm_share') or 0):.1f}%", f"{100 * hidden:.1f}%",
                              f"{100 * (c.get('gpu_idle_share') or 0):.1f}%", fmt(c.get("gaps_over_100us")),
                              fmt(c.get("peak_memory_gb"), 2), fmt(c.get("cuda_graph_launches"))]]))
        split = a2a_split(c)
        if split:
            parts.append(f"<p>{esc(split)}</p>")
        ev = an.get("evidence") or []
        if ev:
            parts.append(_table(["deciding rule", "wall", "metric", "value", "threshold"],
                                [[e.get("rule"), e.get("wall"), e.get("metric"), e.get("value"),
                                  e.get("threshold")] for e in ev]))
        cls = c.get("kernel_class_ms") or {}
        if cls:
            counts = c.get("kernel_class_count") or {}
            parts.append(_table(["kernel class", "ms per rank", "count"],
                                [[k, fmt(ms, 2), counts.get(k)] for k, ms in
                                 sorted(cls.items(), key=lambda kv: -kv[1])]))
        tops = top_kernels(v.folder)
        if tops:
            parts.append(_table(["top kernel", "class", "ms per rank", "count"],
                                [[n[:120], k, fmt(ms, 2), cnt] for n, k, ms, cnt in tops]))
        strip = svg_timeline(v.folder)
        if strip:
            parts.append("<p>Timeline of the profiled window (per rank):</p>" + strip)
    if v.command:
        parts.append("<p>Command:</p><pre>" + esc(v.command) + "</pre>")
    parts.append("</section>")
    return "".join(parts)


def study_html(store, study_name: str) -> str:
    study, views, decisions = gather(store, study_name)
    s = summary(store, study_name)
    one_gpu = one_gpu_sentence(study)
    best = next((v for v in views if v.trial.number == s.get("best_trial")), None)
    number = {v.trial.id: v.trial.number for v in views}
    rows = [["\u00a0\u00a0" * d + ("└ " if d else "") + str(v.trial.number), v.trial.fix or "baseline",
             v.trial.state, v.verdict.kind if v.verdict else "", fmt(v.trial.step_time_ms),
             fmt(v.judged_ms), fmt(v.trial.tflops_per_gpu), v.trial.wall or ""] for d, v in tree_lines(views)]
    parts = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\">",
             f"<title>moetune study {esc(study.name)}</title><style>{CSS}</style></head><body>",
             f"<h1>moetune study {esc(study.name)}</h1>",
             f"<p>Model {esc(study.model)}; {s['trials']} trials run ({s['skipped']} skipped); "
             f"stopped: {esc(s.get('stop_reason'))}.</p>",
             f"<p>{esc(one_gpu)}</p>" if one_gpu else "",
             f"<p>Baseline {esc(fmt(s.get('baseline_step_time_ms')))} ms/step → best "
             f"<b>{esc(fmt(s.get('best_step_time_ms')))} ms/step</b> (trial {esc(s.get('best_trial'))}, "
             f"speed-up {esc(fmt(s.get('speedup'), 3))}x; judged: "
             f"{esc(fmt(s.get('baseline_judged_step_time_ms')))} → {esc(fmt(s.get('best_judged_step_time_ms')))} ms, "
             f"{esc(fmt(s.get('judged_speedup'), 3))}x). Kept fixes: "
             f"{esc(', '.join(s.get('kept_fixes') or []) or 'none')}.</p>",
             "<h2>Step time across trials</h2>", svg_step_times(views),
             "<h2>Trials</h2>", "<p>Step ms: mean of the profiled steps in the trace; judged ms: what "
             "keep or revert compared (the median of the log's steady iterations where there are "
             "enough). The plot shows judged ms.</p>",
             _table(["trial", "fix", "state", "decision", "step ms", "judged ms", "TFLOP/s/GPU", "wall"], rows),
             "<h2>Time breakdown</h2>", svg_breakdown(views)]
    if best:
        changes = ", ".join(f"<code>{esc(k)}</code> {esc(a)} → {esc(b)}"
                            for k, (a, b) in _from_baseline(views, best).items()) or "none"
        parts += ["<h2>Best config</h2>", f"<p>Changes from the baseline: {changes}</p>", "<pre>" + esc(json.dumps(best.trial.config, indent=1,
                                                                  sort_keys=True)) + "</pre>",
                  "<p>Full command line:</p><pre>" + esc(best.command or "(not rendered)") + "</pre>"]
    refused = [d for d in decisions if d.kind == "skip" and not d.trial_id]
    if refused:
        parts += ["<h2>Rules skipped</h2>", _table(["rule", "why"], [[d.rule, d.reason] for d in refused])]
    parts.append("<h2>Bottleneck reports</h2>")
    parts += [trial_html(v, number.get(v.trial.parent_id)) for v in views]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_reports(store, study_name: str, out_dir) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in study_name)
    md_path, html_path = out / f"{safe}.md", out / f"{safe}.html"
    md_path.write_text(study_markdown(store, study_name))
    html_path.write_text(study_html(store, study_name))
    return md_path, html_path
