"""A study's budget: what a trial is charged (its whole job, its fit), which budget a stop spent,
and whether a study stopped on its budget goes on when the budget is raised."""
from __future__ import annotations

from pathlib import Path

from moetune.job import cost
from moetune.job.paths import TrialPaths

REPLAYED = "the replayed bank entry's recorded job time x GPUs"
REPLAYED_ITERATIONS = "the replayed log's iteration times x GPUs (the bank records no job time)"
# a stop's reason as the loop words it (Tuner.stop_reason) -> the budget it spent
SPENT = {"trial budget spent": "trials", "GPU-hour budget spent": "gpu_hours"}
RAISE = {"trials": "--max-trials or tuning.budget_trials",
         "gpu_hours": "--max-gpu-hours or tuning.budget_gpu_hours"}


def spent_line(runs: int, gpu_hours: float, max_trials: int, max_gpu_hours: float) -> tuple[str, str] | None:
    """(the budget spent, the stop's reason), or None while both last."""
    if runs >= max_trials:
        return "trials", f"trial budget spent ({runs} of {max_trials})"
    if gpu_hours >= max_gpu_hours:
        return "gpu_hours", f"GPU-hour budget spent ({gpu_hours:.2f} of {max_gpu_hours})"
    return None


def stopped_on(stop) -> str | None:
    """The budget a stop decision spent ("trials" or "gpu_hours"); None: it stopped for another
    reason (no rule left, patience, a preflight, a baseline that did not run)."""
    named = (stop.evidence or {}).get("budget")
    if named in RAISE:
        return named
    return next((b for prefix, b in SPENT.items() if (stop.reason or "").startswith(prefix)), None)


def stays_stopped(study: str, reason: str, budget: str | None) -> str:
    """The one line a study stopped before this run says when it does not go on."""
    if budget:
        return f"study {study} stopped earlier: {reason}; raise {RAISE[budget]} to go on"
    return (f"study {study} stopped earlier: {reason}; a larger budget resumes only a study its "
            "budget stopped (a new study needs another experiment name)")


def trial_charge(folder: Path | None, out, gpus: int, replay_entry: dict | None = None,
                 iteration_ms: list | None = None) -> tuple[dict, str | None]:
    """A judged trial's GPU-hours, whole jobs: its job's (every attempt: Slurm's elapsed time,
    else its wall time; a replay: the bank's recorded job, else the log's iteration times) and its
    fit's. ({job_gpu_hours, fit_gpu_hours, gpu_hours, job_seconds}, how the job was counted)."""
    job_s, basis = None, None
    if replay_entry is not None:
        if replay_entry.get("wall_s"):
            job_s, basis = float(replay_entry["wall_s"]), REPLAYED
            gpus = int(replay_entry.get("gpus") or gpus)
        elif iteration_ms:
            job_s, basis = sum(iteration_ms) / 1e3, REPLAYED_ITERATIONS
    elif folder is not None:
        job_s, basis = cost.trial_job_seconds(TrialPaths(folder))
    fit_job = (getattr(out, "fit", None) or {}).get("job") or {}
    job_h = cost.gpu_hours(job_s, gpus)
    fit_h = cost.gpu_hours(fit_job.get("seconds"), fit_job.get("gpus") or 1)
    charged = {"job_gpu_hours": job_h, "fit_gpu_hours": fit_h, "gpu_hours": job_h + fit_h}
    if job_s is not None:
        charged["job_seconds"] = job_s
    return charged, (basis if job_s is not None else None)
