"""The study's report as one model (`build` → `StudyReport`): the headline (judged baseline → best,
rank test, walls), the trial tree with kept and reverted changes, the rules skipped, a bottleneck
section per trial and the appendix of configs and command lines; markdown.py and html.py render it."""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from moetune.decide.judge import MIN_LOG_STEPS, faster_p, steady_iterations
from moetune.experiment.placement import Placement
from moetune.report.gather import TrialView, gather, is_baseline
from moetune.report.sections import (
    Table,
    TrialSection,
    change_text,
    decision_sentence,
    judged_source,
    proposed_by,
    trial_section,
    unstable,
)
from moetune.report.text import fmt, ms
from moetune.store import Store, Study
from moetune.tune.summary import one_gpu_ranks, summary


@dataclass
class StudyReport:
    """A study's report: one set of facts, rendered as Markdown and as HTML."""
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
    export_command: str | None = None  # how to export the best configuration (`moetune export`)
    export_files: list[str] = field(default_factory=list)  # the exports written beside the report, relative to it


TRIALS_NOTE = ("Judged ms: the median of the log's steady steps (the trace's steps where the log has too "
               "few), what keep or revert decided by; change and p: against the parent, by the rank test. "
               "Predicted ms: the step-time model's, corrected by the study's scale when the trial was "
               "proposed; measured/model: judged ms over the model's own, the residual the scale learns "
               "from. Profiled ms: the mean of the traced steps, for reference. TFLOP/s/GPU: at the judged "
               "step (Megatron's work a step over the judged ms).")

EXPORT_NOTE = ("The command lines in the appendix are the measurements' (mock data, a few steps, profiling). "
               "To launch the best configuration, export it: Megatron arguments without the measuring flags "
               "(placeholders for data, tokenizer and schedule), Megatron-Bridge overrides, or the diff "
               "against the baseline with each change's decision and evidence.")


def best_view(views: list[TrialView]) -> TrialView | None:
    """The kept trial with the shortest judged step time (a reverted trial is never best)."""
    kept = [v for v in views if v.verdict and v.verdict.kind == "keep" and v.judged_ms]
    return min(kept, key=lambda v: v.judged_ms or 0.0, default=None)  # kept holds judged trials only


def kept_path(views: list[TrialView], best: TrialView) -> list[TrialView]:
    """The kept trials from the baseline down to best, in order."""
    by_id: dict[int | None, TrialView] = {v.trial.id: v for v in views}
    out: list[TrialView] = []
    v: TrialView | None = best
    while v is not None and not is_baseline(v):
        out.append(v)
        v = by_id.get(v.trial.parent_id)
    return out[::-1]


def _throughput_sentence(base: TrialView, best: TrialView) -> list[str]:
    """Throughput at the judged steps (analysis/figures.py), so its ratio is the judged speed-up."""
    a, b = base.figures, best.figures
    parts = [f"{a[k]:{f}} → {b[k]:{f}} {unit}" for k, f, unit in
             (("tokens_per_s", ".0f", "tokens/s"), ("tflops_per_gpu", ".1f", "TFLOP/s/GPU")) if a[k] and b[k]]
    return [f"Throughput at the judged step: {', '.join(parts)}."] if parts else []


def headline(views: list[TrialView], stop_reason: str | None = None) -> tuple[list[str], list[str], TrialView | None]:
    """(sentences, warnings, best): the judged baseline → best with its rank test and walls; where
    no trial ran, why the study stopped (`stop_reason`, its stop decision's: the preflight's)."""
    if not views:
        return [f"No trial ran: the study stopped before its first: {stop_reason}." if stop_reason
                else "No trials ran."], [], None
    base, best = views[0], best_view(views)
    warnings = [w for w in map(unstable, views) if w]
    if base.judged_ms is None:
        return [f"The baseline has no judged step time (state {base.trial.state})."], warnings, best
    if best is None or best is base:
        return [f"Judged step time ({judged_source(base)}): baseline {ms(base.judged_ms)}; no fix was "
                f"kept, so the baseline stays best. Wall: {base.trial.wall}."], warnings, base
    assert best.judged_ms  # best_view picks judged trials only
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
           *_throughput_sentence(base, best),
           f"Wall: {base.trial.wall} → {best.trial.wall}.",
           "Kept fixes on the way: " + "; ".join(f"trial {v.trial.number} {v.trial.fix} ({change_text(v)})"
                                                 for v in kept_path(views, best)) + "."]
    b, p = base.trial.step_time_ms, best.trial.step_time_ms
    if b and p:
        out.append(f"Profiled step time (mean of the traced steps; a stall inflates it): {ms(b)} → {ms(p)}.")
    return out, warnings, best


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
                     fmt(t.step_time_ms), fmt(v.figures["tflops_per_gpu"]), t.wall or "", proposed_by(v)])
        depths.append(depth)
    return Table(["trial", "fix", "state", "decision", "judged ms", "predicted ms", "measured/model", "change",
                  "p", "profiled ms",
                  "TFLOP/s/GPU", "wall", "proposed by"], rows, depths)


def spent_sentence(s: dict) -> str:
    """The GPU-hours the study spent (what its budget counts: whole jobs), part by part, and how
    its trials' jobs were counted."""
    text = (f"GPU-hours spent: {s['gpu_hours']:.3f} (trials' jobs {s['gpu_hours_trials']:.3f}, "
            f"fits {s['gpu_hours_fits']:.3f}, preflight {s['gpu_hours_preflight']:.3f})")
    return text + (f"; trials' jobs counted by {s['gpu_hours_basis']}" if s.get("gpu_hours_basis") else "")


def prediction_sentence(s: dict) -> str:
    """The step-time model's part in the study: its correction and what its skips saved."""
    n = s.get("prediction_scale_from_trials") or 0
    # a scale of no trial is the model's default, not a measured residual
    text = (f"Step-time model: measured / model {s['prediction_scale']:.2f} (median of {n} completed "
            f"trial{'s' if n > 1 else ''})" if n else "Step-time model: no completed trial to set it against")
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


def one_gpu_sentence(study: Study, views: Sequence[TrialView] = ()) -> str | None:
    """What a one-GPU study's step times are (tuning.one_gpu; experiment/fit.py one_gpu_config), and
    which rank stood for each trial's layout, and why."""
    placement = Placement.of_study(study.experiment)
    if not placement.one_gpu:
        return None
    stood = one_gpu_ranks((v.trial.number, v.folder) for v in views)
    return ("One GPU: every trial ran one rank of its layout alone under Megatron's fake process group, "
            f"a step of {placement.samples} sequences per data-parallel rank with "
            "static routing; its step time is that rank's compute and host overhead at the "
            "production shapes, without communication, waiting or pipeline bubbles."
            + (" The rank that stood for the layout: " + "; ".join(
                f"{_trials_word(numbers)}: rank {b['rank']} ({b['why']})" for b, numbers in stood) + "."
               if stood else ""))


def _trials_word(numbers: list[int]) -> str:
    return ("trial " if len(numbers) == 1 else "trials ") + ", ".join(map(str, numbers))


def build(store: Store, study_name: str) -> StudyReport:
    """The report of a study, once; study_markdown and study_html render it."""
    study, views, decisions = gather(store, study_name)
    s = summary(store, study_name)
    intro = [f"Model {study.model}; {s['trials']} trials run ({s['skipped']} skipped); "
             f"stopped: {s.get('stop_reason')}.", spent_sentence(s) + "."]
    one_gpu = one_gpu_sentence(study, views)
    if one_gpu:
        intro.append(one_gpu)
    intro.append(prediction_sentence(s))
    head, warnings, best = headline(views, s.get("stop_reason"))
    changes = None
    if best:
        changes = ", ".join(f"`{k}` {a} → {b}" for k, (a, b) in _from_baseline(views, best).items()) or "none"
    refused = [d for d in decisions if d.kind == "skip" and not d.trial_id]
    number: dict[int | None, int] = {v.trial.id: v.trial.number for v in views}
    by_id: dict[int | None, TrialView] = {v.trial.id: v for v in views}
    cluster = (study.experiment or {}).get("cluster") or {}
    appendix = []
    if best:
        appendix.append((f"Best config (trial {best.trial.number}), in full",
                         json.dumps(best.trial.config, indent=1, sort_keys=True)))
    appendix += [(f"Trial {v.trial.number} command line", v.command) for v in views if v.command]
    # the measured command lines above are not launchable (mock data, a short run, profiling)
    export = (f"moetune export {study.name} --format megatron|bridge|diff [--trial N]"
              if best and best.judged_ms else None)
    return StudyReport(f"moetune study {study.name}", intro, head, warnings, trials_table(views), changes,
                       Table(["rule", "why"], [[d.rule, d.reason] for d in refused]) if refused else None,
                       [trial_section(v, number.get(v.trial.parent_id), cluster, by_id.get(v.trial.parent_id))
                        for v in views], appendix, views, export)
