"""One trial's bottleneck report as plain text, what both renderers show: wall and confidence, the
metrics that decided it, kernel time by class and the top kernels, exposed vs hidden
communication, idle gaps, memory, the fix chosen and why, the decision."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from moetune import settings
from moetune.analysis import figures
from moetune.decide import rules as rules_mod
from moetune.decide.judge import judged_step
from moetune.errors import MoetuneError
from moetune.experiment import gpus
from moetune.report.gather import TrialView, is_baseline
from moetune.report.text import count, fmt, ms, pct

UNSTABLE_SPREAD = figures.UNSTABLE_SPREAD


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
    timeline: dict | None = None  # the analyze stage's per-rank strips (plots.svg_timeline)


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


def decision_sentence(v: TrialView) -> tuple[str, str] | None:
    """(kind shown, why) of a trial's verdict; the baseline is the reference, not a keep."""
    if not v.verdict:
        return None
    if is_baseline(v) and v.verdict.kind == "keep":
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


def change_text(v: TrialView) -> str:
    """The fix's change of the config, `key` old → new."""
    ch = ((v.apply.evidence or {}).get("change") or {}) if v.apply else {}
    return ", ".join(f"`{k}` {a} → {b}" for k, (a, b) in ch.items())


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


def proposed_by(v: TrialView) -> str:
    """What proposed the trial's fix: the parent's wall (with the analysis' confidence) when the
    rule answers it, else the rule's own wall and conditions."""
    ev = (v.apply.evidence or {}) if v.apply else {}
    if not ev.get("wall"):
        return ""
    rule = _rule(v.trial.fix)
    if rule is not None and rule.wall != ev["wall"]:
        return f"{rule.wall} condition" if rule.when else f"{rule.wall} preconditions"
    return ev["wall"] + (f" ({fmt(ev['confidence'], 2)})" if ev.get("confidence") else "")


def memory_fact(peak_gb, device_gb, gpu_type: str | None, source: str | None = "trace") -> str:
    """The peak (GiB, from the trace or the log: `source`) against the GPU's memory, each figure
    with its unit and source: what the device reported to CUDA in the trace (GiB), and the GPU
    table's (experiment/gpus.py) where the GPU type is known."""
    sheet_text = gpus.memory_text(gpu_type)
    peak = figures.memory_text(peak_gb, source) if peak_gb is not None else "-"
    if device_gb is None:
        return f"Memory: peak {peak}" + (f" ({sheet_text})" if sheet_text else "")
    return (f"Memory: peak {peak} of {fmt(device_gb, 1)} GiB the device reports to CUDA"
            + (f" ({sheet_text})" if sheet_text else ""))


def trial_facts(v: TrialView, cluster: dict | None = None) -> list[str]:
    """The evidence rows of a trial's analysis, each 'Label: value'; `cluster`: the study's section."""
    c, an = v.combined, v.analysis or {}
    cluster = cluster or {}
    hidden = max(0.0, (c.get("comm_share") or 0) - (c.get("exposed_comm_share") or 0))
    split = a2a_split(c, cluster.get("profile_ranks"))
    return [f"Wall: {an.get('wall')} (confidence {fmt(an.get('confidence'), 2)})",
            f"Step time, judged: {ms(v.judged_ms)} ({judged_source(v)})"
            + (f"; {rate}" if (rate := figures.throughput_text(v.figures)) else ""),
            f"Step time, profiled: {ms(c.get('step_time_ms'))} ± {ms(c.get('step_time_std_ms'))}, mean of "
            f"{count(c.get('steps'))} traced steps",
            f"Communication: {pct(c.get('comm_share'))} of the window, exposed "
            f"{pct(c.get('exposed_comm_share'))} (all-to-all exposed {ms(c.get('exposed_a2a_ms'))}/step), "
            f"hidden {pct(hidden)}",
            *([split] if split else []),
            f"GPU idle: {pct(c.get('gpu_idle_share'))} of the window; {count(c.get('gaps_over_100us'))} gaps "
            f"over 100 us ({ms(c.get('gaps_over_100us_ms'))})",
            f"Idle causes: launch-starved {ms(c.get('launch_starved_ms'))}, sync-blocked "
            f"{ms(c.get('sync_blocked_ms'))}",
            memory_fact(c.get("peak_memory_gb"), an.get("gpu_memory_gb"), cluster.get("gpu_type"),
                        c.get("peak_memory_source")),
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
    tops = v.top_kernels  # the analyze stage's, from the traces: the report opens none
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
                         f"{(v.apply.evidence or {}).get('source')}); change: {change_text(v)}")
    shown = decision_sentence(v)
    if shown:
        sentences.append(f"Decision: {shown[0]} — {shown[1]}")
    fit = v.fit_sentence()
    if fit:
        sentences.append(fit)
    an = v.analysis or {}
    last = ((v.verdict.evidence or {}).get("last_lines") if v.verdict else None) or []
    return TrialSection(t.number, f"Trial {t.number}: {t.fix or 'baseline'} — {t.state}", sentences,
                        trial_facts(v, cluster) if an else [], [str(w) for w in an.get("warnings") or []],
                        trial_tables(v) if an else [], recipe_notes(an.get("recipes") or {}),
                        [str(x) for x in last], v.folder, v.timeline)
