"""What a job cost: its whole time on its GPUs, start-up, profiling and a crash or hang included.

Slurm's accounting (`ElapsedRaw`, else `Elapsed`) where Slurm ran the job: the time it held its
allocation; else the job's wall time, from its submission to its end as its files record them.

    elapsed_seconds(text)            -> seconds of Slurm's [D-]HH:MM:SS
    job_seconds(state, submitted, ended) -> (seconds or None, basis)
    trial_job_seconds(paths)         -> (seconds or None, basis) of a trial's job, every attempt
    gpu_hours(seconds, gpus)         -> GPU-hours
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from moetune.job.paths import TrialPaths
from moetune.job.scheduler import JobRef

SLURM = "Slurm's elapsed time x GPUs"
WALL = "the job's wall time (submitted to ended) x GPUs"
ELAPSED = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")


def elapsed_seconds(text: str | None) -> float | None:
    """Seconds of Slurm's elapsed time ("1-02:03:04", "02:03:04", "03:04.5"); None where unset."""
    m = ELAPSED.match((text or "").strip())
    if not m:
        return None
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _epoch(stamp) -> float | None:
    """An ISO time (the store's, Slurm's) or epoch seconds as epoch seconds; None where unreadable."""
    if stamp is None or isinstance(stamp, (int, float)):
        return stamp
    try:
        return datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError:
        return None


def job_seconds(state: dict, submitted=None, ended=None) -> tuple[float | None, str]:
    """A job's seconds on its GPUs and how they were counted: Slurm's elapsed time where the
    job's state (scheduler.JobState.to_dict) has one, else `ended` - `submitted` (ISO or epoch)."""
    raw = state.get("elapsed_s")
    if raw is None:
        raw = elapsed_seconds(state.get("elapsed"))
    if raw is not None:
        return float(raw), SLURM
    start, end = _epoch(submitted), _epoch(state.get("end") or ended)
    if start is None or end is None:
        return None, WALL
    return max(0.0, end - start), WALL


def _attempt_seconds(folder: Path) -> tuple[float | None, str]:
    attempt = TrialPaths(folder)  # the trial's folder, or an earlier attempt's set aside
    job_file, state_file = attempt.job, attempt.state
    if not job_file.exists() or not state_file.exists():
        return None, WALL
    job, state = json.loads(job_file.read_text()), json.loads(state_file.read_text())
    # a local job ends when submitit writes its result; one cancelled (hung) when it was collected
    ref = JobRef(**{k: str(job.get(k) or "") for k in ("job_id", "kind", "folder", "name")})
    result = ref.paths.result_pickle if job.get("folder") else state_file
    ended = (result if result.exists() else state_file).stat().st_mtime
    return job_seconds(state, job.get("submitted_at"), ended)


def trial_job_seconds(paths: TrialPaths) -> tuple[float | None, str]:
    """A trial's job seconds, every attempt (a re-submit's earlier ones under previous/) summed;
    None where no attempt was collected."""
    folders = [paths.folder] + sorted(p for p in paths.previous("*").parent.glob("*") if p.is_dir())
    found = [_attempt_seconds(f) for f in folders]
    seconds = [s for s, _ in found if s is not None]
    basis = next((b for s, b in found if s is not None), WALL)
    return (sum(seconds) if seconds else None), basis


def gpu_hours(seconds: float | None, gpus: int) -> float:
    """GPU-hours of `seconds` on `gpus` GPUs (0 where the time is unknown)."""
    return (seconds or 0.0) * gpus / 3600.0
