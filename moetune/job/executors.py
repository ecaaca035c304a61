"""Executors as plug-ins: one registry (`KINDS`) of the ways a rendered trial job is run, each an
object that submits a job spec (job/render.py JobSpec) and returns its JobRef.

    slurm   the job script through submitit's Slurm executor (job/scheduler.py)
    local   the job script through submitit's local executor, on this machine
    replay  the demo: a recorded GPU trial of the trial bank played back (job/replay.py) through
            submitit's local executor instead of the job script; a config the bank does not hold
            is not submitted (`refuses`)

    resolve(kind)             -> a kind of KINDS (auto: slurm where Slurm is here, else local)
    get(kind, bank_dir=None)  -> the executor
This module imports submitit only when a job is submitted: `moetune --help` lists KINDS.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from moetune.job import slurm
from moetune.job.slurm import JobError

if TYPE_CHECKING:
    from moetune.experiment.config import TrainingConfig
    from moetune.job.render import JobSpec
    from moetune.job.scheduler import JobRef


class Executor:
    """How one kind of executor runs a rendered job."""
    kind = ""
    # False where a trial's job never runs here or on a cluster (it is played back): there is
    # then no machine to probe before the study and no fit to measure first
    runs_jobs = True

    def __init__(self, bank_dir: str | Path | None = None):
        self.bank_dir = bank_dir

    def not_proposed(self, config: TrainingConfig) -> str | None:
        """Why the tuner does not propose a trial of this config at all (the skip decision's
        reason); None where it may."""
        return None

    def refuses(self, config: TrainingConfig) -> str | None:
        """Why this executor cannot run a trial of this config (nothing is submitted: the trial is
        skipped); None where it can."""
        return None

    def find(self, spec: JobSpec, earlier: set[str]) -> JobRef | None:
        """This spec's job where one was submitted whose id never reached the trial's files (a
        tuner killed right after the submit), other than the `earlier` attempts; else None."""
        return None

    def submit(self, spec: JobSpec) -> JobRef:
        """Submit the rendered job; its reference (job id, kind, submitit folder, name)."""
        from moetune.job import scheduler
        return scheduler.submit(spec, self.kind)


class SlurmExecutor(Executor):
    kind = "slurm"

    def find(self, spec: JobSpec, earlier: set[str]) -> JobRef | None:
        from moetune.job import scheduler
        found = slurm.find_job(spec.name)
        if not found or found in earlier:
            return None
        return scheduler.JobRef(job_id=found, kind="slurm", folder=str(spec.paths.submitit), name=spec.name)


class LocalExecutor(Executor):
    kind = "local"


class ReplayExecutor(Executor):
    kind = "replay"
    runs_jobs = False
    TIMEOUT_MIN = 30

    def not_proposed(self, config: TrainingConfig) -> str | None:
        """The demo proposes only what the trial bank recorded on the GPU machine."""
        from moetune.job import replay
        if replay.find(config, self.bank_dir) is not None:
            return None
        return (f"the trial bank holds no recorded run of its config {config.config_hash()}; the demo "
                "proposes only what it can replay")

    def refuses(self, config: TrainingConfig) -> str | None:
        from moetune.job import replay
        return replay.not_in_bank(config, self.bank_dir)

    def submit(self, spec: JobSpec) -> JobRef:
        """replay.replay_job of the trial's config (config.json beside the job) as a local job:
        its reference reads as a local job's, so collecting it is no different."""
        import submitit

        from moetune.job import scheduler
        from moetune.job.replay import replay_job
        folder = spec.paths.submitit
        ex = submitit.LocalExecutor(folder=folder)
        ex.update_parameters(timeout_min=self.TIMEOUT_MIN)
        config = json.loads(spec.paths.config.read_text())
        with scheduler.child_stderr(spec.paths.local_controller_log):
            job = ex.submit(replay_job, config, str(spec.folder),
                            str(self.bank_dir) if self.bank_dir else None)
        return scheduler.JobRef(job_id=str(job.job_id), kind="local", folder=str(folder), name=spec.name)


KINDS: dict[str, type[Executor]] = {e.kind: e for e in (SlurmExecutor, LocalExecutor, ReplayExecutor)}


def of_kind(kind: str, bank_dir: str | Path | None = None) -> Executor:
    """The executor of a kind already resolved (no check that Slurm is here: `get` does that);
    the plain one for a kind not of KINDS, whose jobs go as the scheduler is told."""
    return KINDS.get(kind, Executor)(bank_dir=bank_dir)


def resolve(kind: str) -> str:
    """`kind` where it is one of KINDS, `auto` as slurm where Slurm is here (slurm.available) else
    local; JobError in one line naming the valid kinds otherwise, or where Slurm is not here."""
    if kind == "auto":
        return "slurm" if slurm.available() else "local"
    if kind not in KINDS:
        raise JobError(f"executor {kind!r}: use one of auto, {', '.join(KINDS)}")
    if kind == "slurm" and not slurm.available():
        raise JobError("executor slurm: sbatch/sacct not on PATH (run scripts/slurm-up, or use "
                       "--executor local)")
    return kind


def get(kind: str, bank_dir: str | Path | None = None) -> Executor:
    """The executor of this kind (resolve); `bank_dir`: the trial bank a replay plays back."""
    return KINDS[resolve(kind)](bank_dir=bank_dir)
