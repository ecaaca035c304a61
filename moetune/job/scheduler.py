"""Trial jobs through submitit: Slurm's executor on a cluster, submitit's local executor as the
embedded default on one machine. States come from Slurm itself (job/slurm.py: accounting, the
queue while accounting has not seen a new job yet) and map to trial outcomes through `OUTCOMES`.

    make_executor(kind, folder, spec)   -> submitit executor
    submit(spec, kind)                  -> JobRef (job id, kind, folder, name)
    slurm_state(job_id)                 -> JobState
    job_state(ref)                      -> JobState (Slurm or local)
    find_slurm_job(name)                -> job id of a job of that name, if Slurm has one
    wait(ref, poll_s, timeout_s)        -> terminal JobState
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import submitit
from submitit.core.utils import JobPaths

from moetune import settings
from moetune.job import slurm
from moetune.job.render import JobSpec
from moetune.job.slurm import ACTIVE, JobError  # JobError: the job layer's one error


@dataclass(frozen=True)
class JobOutcome:
    trial_state: str  # the trial's state in the store
    retry: bool  # not the config's fault: the same trial may run again
    measured: bool  # the job ran to its end: a measurement to analyze
    advice: str | None = None  # what the engineer can do about it, where the state says


# Slurm's OUT_OF_MEMORY is its cgroup's word for the node's memory: the GPUs' is the log's "oom"
HOST_OOM_ADVICE = ("out of host memory (the node's, not the GPU's: no GPU memory fix answers it): "
                   "ask for more with cluster.mem (\"0\" = all of the node's), or hold less on the "
                   "host: fewer data-loader workers, less CPU offloading (optimizer, activations)")

# Slurm job state → trial outcome. CANCELLED is someone's decision: never retried.
OUTCOMES: dict[str, JobOutcome] = {
    "COMPLETED": JobOutcome("completed", retry=False, measured=True),
    "FAILED": JobOutcome("failed", retry=False, measured=False),
    "OUT_OF_MEMORY": JobOutcome("host_oom", retry=False, measured=False, advice=HOST_OOM_ADVICE),
    "TIMEOUT": JobOutcome("timeout", retry=False, measured=False),
    "DEADLINE": JobOutcome("timeout", retry=False, measured=False),
    "CANCELLED": JobOutcome("cancelled", retry=False, measured=False),
    "NODE_FAIL": JobOutcome("node_fail", retry=True, measured=False),
    "BOOT_FAIL": JobOutcome("node_fail", retry=True, measured=False),
    "PREEMPTED": JobOutcome("preempted", retry=True, measured=False),  # requeue
    "REVOKED": JobOutcome("preempted", retry=True, measured=False),
}
# submitit's local job states → Slurm's words.
LOCAL_STATES = {"RUNNING": "RUNNING", "FINISHED": "COMPLETED", "FAILED": "FAILED",
                "INTERRUPTED": "CANCELLED", "QUEUED": "PENDING"}
# Reasons a pending job keeps until someone changes the job or the cluster (Slurm's squeue(1),
# JOB REASON CODES): the request is outside what the partition, account or QOS allows, or waits on
# a dependency that cannot happen. Waiting on them is waiting forever.
NEVER_STARTS = {
    "PartitionConfig": "the request (nodes, GPUs, CPUs or memory a node) is more than the partition "
                       "has: see `sinfo -o '%P %D %c %m %G'` and the cluster section",
    "PartitionNodeLimit": "the node count is outside the partition's limits (or its nodes are down "
                          "or drained): see `sinfo` and cluster.nodes",
    "PartitionTimeLimit": "the time limit is more than the partition's: see `sinfo -o '%P %l'` and "
                          "cluster.time_limit",
    "BadConstraints": "the job's constraints cannot be met by any node",
    "InvalidAccount": "the account is not valid here: cluster.account",
    "InvalidQOS": "the QOS is not valid for this account",
    "AccountNotAllowed": "the account may not use this partition: cluster.account, cluster.partition",
    "DependencyNeverSatisfied": "a job it depends on failed",
    "QOSMaxWallDurationPerJobLimit": "the time limit is more than the QOS allows: cluster.time_limit",
    "QOSMaxNodePerJobLimit": "more nodes than the QOS allows a job",
    "QOSMaxGRESPerJob": "more GPUs than the QOS allows a job",
    "AssocMaxWallDurationPerJobLimit": "the time limit is more than the account allows: cluster.time_limit",
    "AssocMaxNodesPerJobLimit": "more nodes than the account allows a job",
}
NEVER_STARTS_AFTER_S = 20.0  # seen this long: a reason the scheduler sets while it decides is not one


def never_starts(state: JobState) -> str | None:
    """Why a pending job will never start, and what to change; None where it may yet start."""
    if state.state != "PENDING" or not state.reason:
        return None
    code = state.reason.strip("() ").split(",")[0].split()[0] if state.reason.strip("() ") else ""
    advice = NEVER_STARTS.get(code)
    return f"Slurm keeps it pending ({code}): {advice}" if advice else None


@dataclass(frozen=True)
class JobRef:
    job_id: str
    kind: str  # slurm | local
    folder: str  # submitit's folder
    name: str

    @property
    def paths(self) -> JobPaths:
        """submitit's names for the job's files (result pickle, stdout, stderr): theirs, not ours.
        Task 0: the job runs its function once (use_srun=False; the local executor, one task)."""
        return JobPaths(self.folder, job_id=self.job_id, task_id=0)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class JobState:
    state: str  # Slurm's word: COMPLETED, RUNNING, OUT_OF_MEMORY, ...
    exit_code: str = ""
    submit: str | None = None
    start: str | None = None
    end: str | None = None
    elapsed: str | None = None
    elapsed_s: float | None = None  # Slurm's ElapsedRaw: the seconds it held the allocation
    node: str | None = None
    reason: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state not in ACTIVE

    @property
    def outcome(self) -> JobOutcome:
        return OUTCOMES.get(self.state, JobOutcome(self.state.lower(), retry=False, measured=False))

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(outcome=self.outcome.trial_state, retry=self.outcome.retry,
                 measured=self.outcome.measured)
        if self.outcome.advice:
            d["advice"] = self.outcome.advice
        return d


class RunScript:
    """What the submitted job runs: `bash job.sh`, its output appended to the trial's log.
    Slurm's own time limit ends a trial (TIMEOUT), so submitit's pre-timeout signal is ignored."""

    def __init__(self, script: str, log: str):
        self.script, self.log = script, log

    def __call__(self) -> int:
        signal.signal(signal.SIGUSR2, lambda *_: None)
        with open(self.log, "ab") as out:
            rc = subprocess.run(["bash", self.script], stdout=out, stderr=subprocess.STDOUT).returncode
        if rc:
            raise JobError(f"{self.script} exited with status {rc}; see {self.log}")
        return rc


def resolve_kind(kind: str) -> str:
    if kind == "auto":
        return "slurm" if slurm.available() else "local"
    if kind not in ("slurm", "local"):
        raise JobError(f"executor {kind!r}: use slurm, local or auto")
    if kind == "slurm" and not slurm.available():
        raise JobError("executor slurm: sbatch/sacct not on PATH (run scripts/slurm-up, or use "
                       "--executor local)")
    return kind


def local_gpus(gpus: int, visible: str | None = None) -> dict:
    """submitit's local executor sets the job's CUDA_VISIBLE_DEVICES to its first `gpus_per_node`
    GPUs, and to nothing when it is not given: pass the job's GPU count, and the GPUs this process
    may use where CUDA_VISIBLE_DEVICES already narrows them."""
    if not gpus:
        return {"gpus_per_node": 0}
    visible = settings.visible_gpus() if visible is None else visible
    if not visible:
        return {"gpus_per_node": gpus}
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if not all(v.isdigit() for v in ids):
        raise JobError(f"CUDA_VISIBLE_DEVICES={visible!r}: the local executor needs GPU indices, "
                       "not UUIDs; set indices or unset it")
    if len(ids) < gpus:
        raise JobError(f"the job needs {gpus} GPUs but CUDA_VISIBLE_DEVICES={visible!r} shows "
                       f"{len(ids)}; lower cluster.gpus_per_node or widen CUDA_VISIBLE_DEVICES")
    return {"gpus_per_node": gpus, "visible_gpus": tuple(int(v) for v in ids)}


def make_executor(kind: str, folder: str | Path, spec: JobSpec | None = None):
    """A submitit executor for one trial's job (parameters from the job spec)."""
    kind = resolve_kind(kind)
    if kind == "local":
        ex = submitit.LocalExecutor(folder=str(folder))
        if spec:
            ex.update_parameters(timeout_min=spec.time_min, **local_gpus(spec.gpus_per_node))
        return ex
    ex = submitit.SlurmExecutor(folder=str(folder), max_num_timeout=0)
    if spec:
        params = dict(job_name=spec.name, time=spec.time_min, nodes=spec.nodes,
                      ntasks_per_node=spec.ntasks_per_node, cpus_per_task=spec.cpus_per_task,
                      use_srun=False, stderr_to_stdout=True,
                      # submitit asks Slurm for USR2 before the time limit (up to 60 s early, at
                      # Slurm's resolution). Sent to the training step it would kill it early and
                      # the trial would read FAILED, not TIMEOUT: send it to the batch shell
                      # only, which ignores it. Slurm's own limit ends the job.
                      # moetune decides retries (OUTCOMES): Slurm must not requeue a job by
                      # itself after a node failure (JobRequeue=1 is Slurm's default)
                      additional_parameters={"signal": "B:USR2@1", "no_requeue": True},
                      setup=["trap '' USR2"])
        # submitit sends --wckey=submitit unless told otherwise: clusters that enforce wckeys
        # refuse that one, so none is sent unless the cluster names its own
        params["wckey"] = spec.wckey or None  # None: submitit writes no --wckey line
        for key, value in (("gpus_per_node", spec.gpus_per_node), ("partition", spec.partition),
                           ("account", spec.account), ("gres", spec.gres),
                           ("exclusive", spec.exclusive)):
            if value:
                params[key] = value
        if spec.mem is not None:  # "0": all of the node's memory
            params["mem"] = spec.mem
        ex.update_parameters(**params)
    return ex


@contextmanager
def child_stderr(path: Path | None):
    """Children started inside write their stderr to `path` (None: unchanged). submitit's local
    controller inherits this process's stderr and, on the terminal's Ctrl-C, prints its own
    KeyboardInterrupt traceback there, between the tuner's lines; the tuner says the one line."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved, fd = os.dup(2), os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def submit(spec: JobSpec, kind: str = "auto") -> JobRef:
    kind = resolve_kind(kind)
    folder = spec.paths.submitit
    ex = make_executor(kind, folder, spec)
    try:
        with child_stderr(spec.paths.local_controller_log if kind == "local" else None):
            job = ex.submit(RunScript(str(spec.paths.job_script), spec.log))
    except Exception as e:  # submitit wraps sbatch's message
        raise JobError(f"submitting {spec.name} failed: {str(e).strip().splitlines()[-1]}") from None
    return JobRef(job_id=str(job.job_id), kind=kind, folder=str(folder), name=spec.name)


def _clean(value: str) -> str | None:
    return None if value in ("", "Unknown", "None", "N/A") else value


def _seconds(value: str | None) -> float | None:
    return float(value) if value and value.strip().isdigit() else None


def slurm_state(job_id: str) -> JobState:
    """The job's state from accounting (`sacct`); from `squeue` while sacct has no record yet.
    A job whose batch script failed because a step was killed for memory reads OUT_OF_MEMORY
    (Slurm marks the step, and the batch shell only sees a failed command)."""
    rows = slurm.WATCHER.rows(job_id)
    job = [r for r in rows if r["JobID"] == str(job_id)]
    if job:
        r = job[-1]
        state = r["State"].split()[0]
        steps = {s["State"].split()[0] for s in rows if s["JobID"].startswith(f"{job_id}.")}
        if state == "FAILED" and "OUT_OF_MEMORY" in steps:
            state = "OUT_OF_MEMORY"
        reason = _clean(r["Reason"])
        if state == "PENDING":  # accounting keeps a pending job's reason as None: the queue's is live
            queued = _queued(job_id)
            reason = queued.reason if queued else reason
        return JobState(state=state, exit_code=r["ExitCode"],
                        submit=_clean(r["Submit"]), start=_clean(r["Start"]), end=_clean(r["End"]),
                        elapsed=_clean(r["Elapsed"]), elapsed_s=_seconds(r.get("ElapsedRaw")),
                        node=slurm.job_nodes(rows, job_id), reason=reason)
    return _queued(job_id) or JobState(state="UNKNOWN", reason="neither sacct nor squeue knows this job yet")


def _queued(job_id: str) -> JobState | None:
    """The job's state and reason as the queue has them now; None where it has none."""
    found = slurm.queue(job_id)
    if not found:
        return None
    state, reason = found[0]
    if state in ("RUNNING", "COMPLETING"):  # squeue's %R is the job's nodes once it runs
        return JobState(state=state, node=_clean(reason))
    return JobState(state=state, reason=_clean(reason.strip("()")))


def find_slurm_job(name: str) -> str | None:
    """Id of the newest job of this name that Slurm knows (a submit whose id was never stored)."""
    return slurm.find_job(name)


def local_state(ref: JobRef) -> JobState:
    """A local job (id = process id): its result pickle says how it ended; else alive or lost."""
    result = ref.paths.result_pickle
    if result.exists():
        try:
            with open(result, "rb") as f:
                kind, _ = pickle.load(f)
        except Exception:
            kind = "error"
        return JobState(state="COMPLETED" if kind == "success" else "FAILED")
    try:
        os.kill(int(ref.job_id), 0)
        return JobState(state="RUNNING")
    except (ProcessLookupError, ValueError):
        return JobState(state="FAILED", reason="process gone without a result")
    except PermissionError:
        return JobState(state="RUNNING")


def job_state(ref: JobRef) -> JobState:
    return slurm_state(ref.job_id) if ref.kind == "slurm" else local_state(ref)


def cancel(ref: JobRef) -> None:
    if ref.kind == "slurm":
        slurm.cancel(ref.job_id)
    else:
        try:
            os.kill(int(ref.job_id), signal.SIGTERM)
        except ProcessLookupError:
            pass


def wait(ref: JobRef, poll_s: float = 2.0, timeout_s: float | None = None) -> JobState:
    """Poll until the job leaves the scheduler's hands; survives slurmctld restarts (a failed
    query is retried until timeout_s)."""
    t0 = time.monotonic()
    last_error = None
    while True:
        try:
            st = job_state(ref)
            if st.terminal:
                return st
        except JobError as e:
            last_error = e
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            raise JobError(f"job {ref.job_id} not finished after {timeout_s:.0f} s"
                           + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(poll_s)
