"""The study's report as one self-contained HTML page with its SVG plots (no script, no outside
link). Every string from a trace, a log, a config or the store goes through `esc`."""
from __future__ import annotations

from moetune.report.gather import TrialView
from moetune.report.overview import EXPORT_NOTE, TRIALS_NOTE, StudyReport
from moetune.report.plots import svg_breakdown, svg_step_times, svg_timeline
from moetune.report.sections import TrialSection, trial_section
from moetune.report.text import esc

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
    """One trial's bottleneck section, with its timeline where the analyze stage drew one."""
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
    strip = svg_timeline(sec.timeline) if sec.facts else ""
    if strip:
        parts.append("<p>Timeline of the profiled window (per rank):</p>" + strip)
    parts.append("</section>")
    return "".join(parts)


def section_page(sec: TrialSection) -> str:
    """One trial's bottleneck report as a page of its own (the screenshot in docs/)."""
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{esc(sec.title)}</title>'
            f"<style>{CSS}</style></head><body>{section_html(sec)}</body></html>")


def trial_html(v: TrialView, parent_number: int | None) -> str:
    """One trial's bottleneck section, from its view."""
    return section_html(trial_section(v, parent_number))


def render_html(r: StudyReport) -> str:
    """The whole study's page."""
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
    if r.export_command:
        parts += ["<h2>Export</h2>", f"<p>{esc(EXPORT_NOTE)}</p><pre>{esc(r.export_command)}</pre>"]
        if r.export_files:
            parts.append("<ul>" + "".join(f'<li><a href="{esc(p)}">{esc(p)}</a></li>' for p in r.export_files)
                         + "</ul>")
    if r.skipped_rules:
        parts += ["<h2>Rules skipped</h2>", _table(r.skipped_rules.header, r.skipped_rules.rows)]
    parts.append("<h2>Bottleneck reports</h2>")
    parts += [section_html(s) for s in r.sections]
    parts.append("<h2>Appendix: configuration and command lines</h2>")
    parts += [f"<p>{esc(caption)}:</p><pre>{esc(text)}</pre>" for caption, text in r.appendix]
    parts.append("</body></html>")
    return "\n".join(parts)
