"""Reports of a study: Markdown for the terminal, one self-contained HTML page with SVG plots.

    write_reports(store, study_name, out_dir) -> (md_path, html_path)

Per trial, the bottleneck report: wall and confidence, the metrics that decided it, kernel time
by class and the top kernels, exposed vs hidden communication, idle gaps, memory, the fix chosen
and why, the command line. Per study: the trial tree with kept and reverted changes, step time
and TFLOP/s per GPU per trial, the best config with its full command line. Plots: a per-rank
timeline strip of the profiled window, time-breakdown bars, step time across trials.

This module is the front; the work is done apart: gather.py (the store and the trial files → one
view per trial; no trace is opened: the window's timeline and top kernels are the analyze stage's
files), sections.py (a trial's bottleneck section), overview.py (the study's model, `build`),
plots.py (SVG), markdown.py, html.py, text.py (escaping and figures), export.py (the best
configuration to paste: Megatron arguments, Megatron-Bridge overrides, the diff against the baseline).
"""
from __future__ import annotations

from pathlib import Path

from moetune.report.export import write_exports
from moetune.report.gather import TrialView, gather, is_baseline
from moetune.report.html import render_html, section_html, section_page, trial_html
from moetune.report.markdown import (
    recipes_markdown,
    render_markdown,
    section_markdown,
    trial_markdown,
)
from moetune.report.overview import (
    TRIALS_NOTE,
    StudyReport,
    build,
    headline,
    one_gpu_sentence,
)
from moetune.report.plots import (
    CLASS_COLORS,
    svg_breakdown,
    svg_step_times,
    svg_timeline,
)
from moetune.report.sections import (
    Table,
    TrialSection,
    a2a_split,
    decision_sentence,
    fix_reason,
    memory_fact,
    recipe_notes,
    trial_facts,
    trial_section,
)
from moetune.report.text import esc, fmt, md

__all__ = ["CLASS_COLORS", "TRIALS_NOTE", "StudyReport", "Table", "TrialSection", "TrialView",
           "a2a_split", "build", "decision_sentence", "esc", "fix_reason", "fmt", "gather", "headline",
           "is_baseline", "md", "memory_fact", "one_gpu_sentence", "recipe_notes", "recipes_markdown",
           "render_html", "render_markdown", "section_html", "section_markdown", "section_page",
           "study_html", "study_markdown", "svg_breakdown", "svg_step_times", "svg_timeline",
           "trial_facts", "trial_html", "trial_markdown", "trial_section", "write_reports"]


def study_markdown(store, study_name: str) -> str:
    """The study's report as Markdown."""
    return render_markdown(build(store, study_name))


def study_html(store, study_name: str) -> str:
    """The study's report as one HTML page."""
    return render_html(build(store, study_name))


def write_reports(store, study_name: str, out_dir) -> tuple[Path, Path]:
    """<out_dir>/<study>.md and .html, the report built once, and the best configuration's exports
    in <out_dir>/export/<study>/; the reports' paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in study_name)
    md_path, html_path = out / f"{safe}.md", out / f"{safe}.html"
    r = build(store, study_name)
    if r.export_command:  # the best configuration to paste, beside the report (report/export.py)
        written = write_exports(store, study_name, out / "export" / safe)
        r.export_files = [str(p.relative_to(out)) for p in written]
    md_path.write_text(render_markdown(r))
    html_path.write_text(render_html(r))
    return md_path, html_path
