"""The report's gathering: from the store and each trial folder's small files (analysis.json,
command.txt, fit/fit.json, and what the analyze stage drew of the window: timeline.json,
top_kernels.json) to one `TrialView` per trial. The report never opens a trace."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from moetune.analysis import figures
from moetune.job.paths import TrialPaths
from moetune.store import Decision, Store, Study, Trial
from moetune.tune.state import JUDGED


@dataclass
class TrialView:
    """One trial as the report sees it: its store row and decisions, and the files of its folder."""
    trial: Trial
    analysis: dict | None
    apply: Decision | None  # the decision that chose its fix
    verdict: Decision | None  # the decision that closed it: a tune/state.py JUDGED kind
    command: str | None
    folder: Path | None
    judged_ms: float | None = None  # the step time the tuner judged by (log median or trace)
    fit: dict | None = None  # fit/fit.json: the layout measured on one GPU first
    predicted_ms: float | None = None  # the step-time model's, corrected by the study's scale then
    model_ms: float | None = None  # the model's own (tune/predicted.py)
    timeline: dict | None = None  # timeline.json: the analyze stage's per-rank strips of the window
    top_kernels: list | None = None  # top_kernels.json: [name, class, ms per rank, count]

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
    def figures(self) -> dict:
        """The trial's step time, throughput and memory as printed everywhere (analysis/figures.py);
        without an analysis file, the throughput its store row holds."""
        f = figures.run_figures(self.analysis)
        if self.analysis is None:
            f["tflops_per_gpu"] = self.trial.tflops_per_gpu
        return f

    @property
    def combined(self) -> dict:
        return ((self.analysis or {}).get("metrics") or {}).get("combined") or {}


def gather(store: Store, study_name: str) -> tuple[Study, list[TrialView], list[Decision]]:
    """(study, a view of each trial, the study's decisions), from the store and the trial folders'
    small files; no trace is opened."""
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
                               metrics.get("predicted_step_time_ms"), metrics.get("predicted_model_ms"),
                               timeline=_json(paths.timeline) if paths else None,
                               top_kernels=_json(paths.top_kernels) if paths else None))
    return study, views, decisions


def _json(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def is_baseline(v: TrialView) -> bool:
    """The study's first trial: no parent, no fix."""
    return v.trial.parent_id is None and not v.trial.fix
