"""The study's report as Markdown, for the terminal (tables, the trial tree, the bottleneck
sections; the plots are the HTML page's)."""
from __future__ import annotations

from moetune.report.gather import TrialView
from moetune.report.overview import EXPORT_NOTE, TRIALS_NOTE, StudyReport
from moetune.report.sections import Table, TrialSection, recipe_notes, trial_section
from moetune.report.text import md


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
    """One trial's bottleneck section."""
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
    """One trial's bottleneck section, from its view."""
    return section_markdown(trial_section(v, parent_number))


def render_markdown(r: StudyReport) -> str:
    """The whole study's report."""
    out = [f"# {md(r.title)}", "", *[md(x) + "\n" for x in r.intro], "## Headline", ""]
    out += [f"- {md(x)}" for x in r.headline] + [f"- **Warning**: {md(w)}" for w in r.warnings] + [""]
    out += ["## Trials", "", TRIALS_NOTE, "", *_md_table(r.trials)]
    if r.best_changes is not None:
        out += ["Best config: changes from the baseline: " + r.best_changes + " (in full in the appendix).", ""]
    if r.export_command:
        out += ["## Export", "", EXPORT_NOTE, "", f"    {r.export_command}", ""]
        out += [f"- [{path}]({path})" for path in r.export_files] + ([""] if r.export_files else [])
    if r.skipped_rules:
        out += ["## Rules skipped", "", *_md_table(r.skipped_rules)]
    out += ["## Bottleneck reports", ""] + [section_markdown(s) for s in r.sections]
    out += ["## Appendix: configuration and command lines", ""]
    for caption, text in r.appendix:
        out += [f"{md(caption)}:", "```", text, "```", ""]
    return "\n".join(out)


def recipes_markdown(beside: dict) -> list[str]:
    """recipe_notes as Markdown list lines."""
    out = [f"{'  ' * d}- {md(text) if d == 0 else _md_note(text)}" for d, text in recipe_notes(beside)]
    return out + ([""] if out else [])


def _md_note(text: str) -> str:
    head, _, rest = text.partition(": ")
    return f"{head}: {md(rest)}"
