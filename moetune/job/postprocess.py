"""A trial's post-processing as a CPU job of its own, so that the heavy export runs on a compute
node: the login side. The job's body is workloads/postprocess.py (each profiled rank's report
exported to SQLite and reduced to its per-rank summary, trace_R.metrics.json), run by its path; the
login node then reads only those small files and combines them.

    submit(folder, ranks, cluster, after=job_id, python=...) -> job id   (sbatch, an array: one
                                                                          element per rank)
    state(job_id, elements) -> Slurm state of the whole array (COMPLETED when every element is)
    wait(job_id, elements, timeout_s) -> its state once it has ended

The job asks Slurm for `--dependency=afterany:<trial job>`: it starts when the trial's job ends,
however it ended (a timed-out run still has reports to read). Its partition, account, time, memory
and CPUs come from the cluster section's `postprocess` keys, else the cluster's own partition and
account. It runs the Python that runs moetune (the login node's install, on a shared filesystem).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from moetune.experiment.schema import Cluster
from moetune.job import slurm
from moetune.job.paths import TrialPaths
from moetune.job.render import shell_word, time_minutes
from moetune.job.slurm import ACTIVE
from moetune.paths import WORKLOADS, write_whole
from moetune.workloads.postprocess import PostprocessError  # the login side raises it too

BODY = WORKLOADS / "postprocess.py"  # what each array element runs, by its path


def settings(cluster: Cluster) -> dict:
    """The job's resources (per rank, one array element): the cluster section's `postprocess`
    keys validated by its schema (experiment/schema.py Postprocess, which holds the defaults), the
    partition and account else the cluster's own."""
    pp = cluster.postprocess
    return {**pp.model_dump(), "partition": pp.partition or cluster.partition,
            "account": pp.account or cluster.account}


def sbatch_options(folder: str | Path, ranks: list[int], cluster, after: str, name: str,
                   python: str = sys.executable) -> list[str]:
    """sbatch's options for the post-processing of `ranks`' reports in `folder`, after job
    `after` ends (whatever way it ends: a timed-out run still has reports to read)."""
    folder = Path(folder).resolve()
    s = settings(cluster)
    # a job array, one element per profiled rank: elements start as CPUs free up, so 8 ranks
    # need not find 8 CPUs at once; each picks its rank by its index (--task)
    cmd = ["--no-requeue", f"--job-name={name}",
           f"--dependency=afterany:{after}", f"--array=0-{max(1, len(ranks)) - 1}", "--ntasks=1",
           f"--cpus-per-task={int(s['cpus_per_task'])}", f"--mem={s['mem']}",
           f"--time={time_minutes(s['time_limit'])}",
           "--output=" + "%a".join(p.replace("%", "%%")
                                   for p in TrialPaths.around_rank(TrialPaths(folder).postprocess_out)),
           f"--chdir={folder}"]
    cmd += [f"--partition={s['partition']}"] if s["partition"] else []
    cmd += [f"--account={s['account']}"] if s["account"] else []
    # the words go to sbatch as argv (no shell on this side); --wrap's shell sees them quoted,
    # and expands only the element's index, which Slurm sets in each element's environment
    head = [python, str(BODY), str(folder), "--ranks", ",".join(map(str, ranks))]
    task = " ".join(map(shell_word, head)) + ' --task "$SLURM_ARRAY_TASK_ID" --for-job ' + shell_word(str(after))
    return cmd + ["--wrap", task]


def sbatch_argv(folder: str | Path, ranks: list[int], cluster, after: str, name: str,
                python: str = sys.executable) -> list[str]:
    """The whole sbatch command line of the post-processing (what `moetune render` writes)."""
    return slurm.sbatch_command(sbatch_options(folder, ranks, cluster, after, name, python))


def submit(folder: str | Path, ranks: list[int], cluster, after: str, name: str,
           python: str = sys.executable) -> str:
    """sbatch the post-processing of `ranks`' reports in `folder`, after job `after` ends."""
    folder = Path(folder).resolve()
    try:
        # the trial's job may have ended so long ago that slurmctld forgot it: nothing to wait for
        job_id = slurm.sbatch(sbatch_options(folder, ranks, cluster, after, name, python),
                              retry_without_dependency=True)
    except slurm.JobError as e:
        raise PostprocessError(f"sbatch of the post-processing of {folder} failed: {e}") from None
    write_whole(TrialPaths(folder).postprocess, json.dumps({"job_id": job_id, "for_job": str(after),
                                                           "ranks": list(ranks), "submitted": time.time()},
                                                          indent=1) + "\n")
    return job_id


def cancel(job_id: str) -> None:
    """Best effort: a post-processing job for a job that is being replaced (a forced re-submit)."""
    slurm.cancel(job_id, quiet=True)


def state(job_id: str, elements: int) -> str:
    """The array's state: active while any element is (or is not in accounting yet), else
    COMPLETED when every element completed, else the first other state (FAILED, TIMEOUT, ...)."""
    try:
        rows, failed = slurm.allocations(slurm.WATCHER.rows(job_id)), False
    except slurm.JobError:
        rows, failed = [], True
    states = {r["JobID"]: r["State"].split()[0] if r["State"].split() else "UNKNOWN" for r in rows}
    active = [st for jid, st in states.items() if st in ACTIVE or "[" in jid]
    if failed or active or len(states) < elements:
        queued = [st for st, _ in slurm.queue(job_id, array=True)]
        # an element that ended may reach accounting a moment after squeue forgets it
        return (queued or active or ["UNKNOWN"])[0]
    return next((st for st in states.values() if st != "COMPLETED"), "COMPLETED")


def wait(job_id: str, elements: int, timeout_s: float, poll_s: float = 1.0) -> str:
    """Poll until the array has ended; its state ('UNKNOWN' after timeout_s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        st = state(job_id, elements)
        if st not in ACTIVE:  # UNKNOWN (not in accounting yet) is among them
            return st
        time.sleep(poll_s)
    return "UNKNOWN"
