"""A study in one dict: budget used, baseline and best, how it stopped (what `moetune status`,
the reports and `moetune tune` print)."""
from __future__ import annotations

import json
from pathlib import Path

from moetune.job.paths import TrialPaths
from moetune.paths import trial_folder
from moetune.tune.predicted import study_correction
from moetune.tune.state import ran, spent


def summary(store, study_name: str, runs_root: Path | None = None) -> dict:
    """The study in one dict: budget used, baseline and best, how it stopped."""
    study = store.study(study_name)
    trials = store.trials(study.id)
    decisions = store.decisions(study.id)
    kept = [d.trial_id for d in decisions if d.kind == "keep"]
    by_id = {t.id: t for t in trials}
    best = by_id.get(kept[-1]) if kept else None
    base = trials[0] if trials else None
    stop = next((d.reason for d in reversed(decisions) if d.kind == "stop"), None)
    out = {"study": study_name, "state": study.state,
           "trials": sum(1 for t in trials if ran(t)),  # what the trial budget counts
           "unfit": sum(1 for t in trials if t.state == "no_fit"),
           "trials_total": len(trials),
           "skipped": sum(1 for t in trials if t.state == "skipped"),
           "baseline_step_time_ms": base.step_time_ms if base else None,
           "best_step_time_ms": best.step_time_ms if best else None,
           "best_trial": best.number if best else None,
           "best_config_hash": best.config_hash if best else None,
           "best_config": best.config if best else None,
           "kept_fixes": [by_id[i].fix for i in kept if i in by_id and by_id[i].fix],
           "stop_reason": stop}
    # what the budget counts: whole jobs, the trials' fits and the preflight included
    cost = spent(store, trials, decisions)
    out.update(gpu_hours=round(cost.total, 6), gpu_hours_trials=round(cost.trials, 6),
               gpu_hours_fits=round(cost.fits, 6), gpu_hours_preflight=round(cost.preflight, 6),
               gpu_hours_basis="; ".join(f"{basis} ({n} trial{'' if n == 1 else 's'})"
                                         for basis, n in cost.basis.items()) or None)

    def judged(t):
        return store.metrics(t.id).get("judged_step_time_ms") if t else None

    out["baseline_judged_step_time_ms"] = judged(base)
    out["best_judged_step_time_ms"] = judged(best)
    if best and base and base.step_time_ms and best.step_time_ms:
        out["speedup"] = round(base.step_time_ms / best.step_time_ms, 4)
    if out["baseline_judged_step_time_ms"] and out["best_judged_step_time_ms"]:
        out["judged_speedup"] = round(out["baseline_judged_step_time_ms"]
                                      / out["best_judged_step_time_ms"], 4)
    # the step-time model: the study's correction, and what the trials it kept back would have cost
    corr = study_correction(store, study.id)
    out["prediction_scale"], out["prediction_scale_from_trials"] = corr.scale, corr.scale_trials
    out["prediction_correction"] = corr.to_dict()
    forecasts = [(d.evidence or {}).get("prediction") for d in decisions if d.kind == "skip"]
    forecasts = [f for f in forecasts if f and f.get("slower")]
    out["skipped_by_prediction"] = len(forecasts)
    out["gpu_hours_saved"] = round(sum(f.get("gpu_hours") or 0.0 for f in forecasts), 6)
    out["gpu_hours_saved_basis"] = ("each skipped trial's GPUs x its corrected predicted step x its "
                                    "iterations, at most the job's time limit")
    if best and runs_root is not None:
        cmd = TrialPaths(trial_folder(runs_root, study_name, store.trial(best.id))).command
        out["best_command"] = cmd.read_text().strip() if cmd.exists() else None
    return out

def one_gpu_ranks(trials) -> list[tuple[dict, list[int]]]:
    """(the rank a one-GPU trial ran and why, the trials that ran it) of (number, folder) pairs,
    in trial order; trials that ran the same rank share the first one's why, its fit's figures."""
    out: dict[int, tuple[dict, list[int]]] = {}
    for number, folder in trials:
        path = TrialPaths(folder).one_gpu_rank if folder else None
        if path and path.exists():
            bound = json.loads(path.read_text())
            out.setdefault(bound["rank"], (bound, []))[1].append(number)
    return [({**b, "why": b["why"] + f", trial {n[0]}'s fit"} if len(n) > 1 else b, n)
            for b, n in out.values()]
