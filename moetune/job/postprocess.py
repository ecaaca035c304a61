"""A trial's post-processing as a CPU job of its own, so that the heavy export runs on a compute
node: each profiled rank's report is imported (QdstrmImporter, where a bare .qdstrm came back),
exported to SQLite (`nsys export`) and reduced to its per-rank summary
(analysis.summary.rank_summary), written beside the report as trace_R.metrics.json. The login node
then reads only those small files and combines them.

    submit(folder, ranks, cluster, after=job_id, python=...) -> job id   (sbatch, an array: one
                                                                          element per rank)
    state(job_id) -> Slurm state of the whole array (COMPLETED when every element is)
    process_report(folder, rank, for_job) -> [paths written]            (what one task does)
    python -m moetune.job.postprocess FOLDER --ranks 0,2 --task I --for-job ID   (the job's command)

The job asks Slurm for `--dependency=afterany:<trial job>`: it starts when the trial's job ends,
however it ended (a timed-out run still has reports to read). Its partition, account, time, memory
and CPUs come from the cluster section's `postprocess` keys, else the cluster's own partition and
account. It runs the Python that runs moetune (the login node's install, on a shared filesystem).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from moetune.analysis import recipes
from moetune.analysis.nsys import nsys_binary, qdstrm_importer, version as nsys_version
from moetune.analysis.summary import rank_summary, summary_path
from moetune.errors import MoetuneError
from moetune.job.paths import TrialPaths
from moetune.job.render import shell_word, time_minutes
from moetune.job.scheduler import ACTIVE
from moetune.experiment.schema import Cluster



class PostprocessError(MoetuneError):
    """The post-processing job could not be submitted or one rank's report could not be processed."""



def settings(cluster: Cluster) -> dict:
    """The job's resources (per rank, one array element): the cluster section's `postprocess`
    keys validated by its schema (experiment/schema.py Postprocess, which holds the defaults), the
    partition and account else the cluster's own."""
    pp = cluster.postprocess
    return {**pp.model_dump(), "partition": pp.partition or cluster.partition,
            "account": pp.account or cluster.account}


def sbatch_argv(folder: str | Path, ranks: list[int], cluster, after: str, name: str,
                python: str = sys.executable) -> list[str]:
    """The sbatch command line of the post-processing of `ranks`' reports in `folder`, after job
    `after` ends (whatever way it ends: a timed-out run still has reports to read)."""
    folder = Path(folder).resolve()
    s = settings(cluster)
    # a job array, one element per profiled rank: elements start as CPUs free up, so 8 ranks
    # need not find 8 CPUs at once; each picks its rank by its index (--task)
    cmd = ["sbatch", "--parsable", "--no-requeue", f"--job-name={name}",
           f"--dependency=afterany:{after}", f"--array=0-{max(1, len(ranks)) - 1}", "--ntasks=1",
           f"--cpus-per-task={int(s['cpus_per_task'])}", f"--mem={s['mem']}",
           f"--time={time_minutes(s['time_limit'])}",
           "--output=" + "%a".join(p.replace("%", "%%") for p in TrialPaths.around_rank(TrialPaths(folder).postprocess_out)),
           f"--chdir={folder}"]
    cmd += [f"--partition={s['partition']}"] if s["partition"] else []
    cmd += [f"--account={s['account']}"] if s["account"] else []
    # the words go to sbatch as argv (no shell on this side); --wrap's shell sees them quoted,
    # and expands only the element's index, which Slurm sets in each element's environment
    head = [python, "-m", "moetune.job.postprocess", str(folder), "--ranks", ",".join(map(str, ranks))]
    task = " ".join(map(shell_word, head)) + ' --task "$SLURM_ARRAY_TASK_ID" --for-job ' + shell_word(str(after))
    return cmd + ["--wrap", task]


def submit(folder: str | Path, ranks: list[int], cluster, after: str, name: str,
           python: str = sys.executable) -> str:
    """sbatch the post-processing of `ranks`' reports in `folder`, after job `after` ends."""
    folder = Path(folder).resolve()
    cmd = sbatch_argv(folder, ranks, cluster, after, name, python)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if r.returncode and "dependency" in (r.stderr or "").lower():
            # the trial's job ended so long ago that slurmctld forgot it: nothing to wait for
            r = subprocess.run([c for c in cmd if not c.startswith("--dependency=")],
                               capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        raise PostprocessError(f"sbatch of the post-processing of {folder} failed: {e}") from None
    if r.returncode:
        raise PostprocessError(f"sbatch of the post-processing of {folder} failed: "
                               f"{(r.stderr or r.stdout).strip()[:200]}")
    job_id = r.stdout.strip().split(";")[0]
    TrialPaths(folder).postprocess.write_text(json.dumps({"job_id": job_id, "for_job": str(after),
                                                 "ranks": list(ranks), "submitted": time.time()},
                                                indent=1) + "\n")
    return job_id


def cancel(job_id: str) -> None:
    """Best effort: a post-processing job for a job that is being replaced (a forced re-submit)."""
    subprocess.run(["scancel", str(job_id)], capture_output=True, timeout=60)


def state(job_id: str, elements: int) -> str:
    """The array's state: active while any element is (or is not in accounting yet), else
    COMPLETED when every element completed, else the first other state (FAILED, TIMEOUT, ...)."""
    r = subprocess.run(["sacct", "-X", "-n", "-P", "-j", str(job_id), "-o", "JobID,State"],
                       capture_output=True, text=True, timeout=60)
    rows = dict(line.split("|", 1) for line in r.stdout.splitlines() if "|" in line)
    states = {jid: st.split()[0] if st.split() else "UNKNOWN" for jid, st in rows.items()}
    active = [st for jid, st in states.items() if st in ACTIVE or "[" in jid]
    if r.returncode or active or len(states) < elements:
        q = subprocess.run(["squeue", "-h", "-r", "-j", str(job_id), "-o", "%T"], capture_output=True,
                           text=True, timeout=60)
        # an element that ended may reach accounting a moment after squeue forgets it
        return (q.stdout.split() or active or ["UNKNOWN"])[0]
    return next((st for st in states.values() if st != "COMPLETED"), "COMPLETED")


def wait(job_id: str, elements: int, timeout_s: float, poll_s: float = 1.0) -> str:
    """Poll until the array has ended; its state ('UNKNOWN' after timeout_s)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            st = state(job_id, elements)
        except subprocess.TimeoutExpired:  # slurmctld busy: ask again
            st = "UNKNOWN"
        if st not in ACTIVE:  # UNKNOWN (not in accounting yet) is among them
            return st
        time.sleep(poll_s)
    return "UNKNOWN"


def _tool(cmd: list[str], what: str) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except subprocess.TimeoutExpired:
        raise PostprocessError(f"{what} did not finish in an hour") from None
    if r.returncode:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PostprocessError(f"{what} failed: {tail[0][:200]}")


def rank_report(folder: Path, rank: int | str) -> Path | None:
    """The rank's report to read: the SQLite the job exported where it is newer than the report
    (exported by the nsys that recorded it), else the report itself (exported again, fresh)."""
    paths = TrialPaths(folder)
    found = [p if p.exists() else None for p in (paths.report(rank), paths.qdstrm(rank), paths.sqlite(rank))]
    rep, sqlite = found[0] or found[1], found[2]
    if sqlite and (rep is None or sqlite.stat().st_mtime >= rep.stat().st_mtime):
        return sqlite
    return rep


def nsys_release(text: str) -> tuple[int, ...]:
    """'NVIDIA Nsight Systems version 2025.3.2.474-...' -> (2025, 3, 2, 474)."""
    m = re.search(r"(\d{4})\.(\d+)(?:\.(\d+))?(?:\.(\d+))?", text or "")
    return tuple(int(x) for x in m.groups() if x is not None) if m else ()


def check_recorder(report: Path, nsys: str) -> None:
    """An older nsys cannot open a newer report, and may write a corrupt export where it tries:
    refuse, in one line, a report recorded by a newer nsys than this one."""
    recorded = TrialPaths(report.parent).nsys_version(TrialPaths.rank_of(report))
    if not recorded.exists():
        return
    theirs, ours = nsys_release(recorded.read_text(errors="replace")), nsys_release(nsys_version(nsys))
    if theirs and ours and theirs > ours:
        raise PostprocessError(
            f"{report.name} was recorded by nsys {'.'.join(map(str, theirs))}; this nsys ({nsys}) "
            f"is {'.'.join(map(str, ours))} and cannot open it: export in the job (nsys in the "
            "image, cluster.nsys) or set MOETUNE_NSYS to an nsys at least as new")


def export(report: Path) -> Path:
    """A rank's report (its .qdstrm, .nsys-rep or .sqlite: TrialPaths) -> its SQLite export, beside it."""
    paths, rank = TrialPaths(report.parent), TrialPaths.rank_of(report)
    if report in (paths.qdstrm(rank), paths.report(rank)):
        check_recorder(report, nsys_binary())
    if report == paths.qdstrm(rank):
        rep = paths.report(rank)
        if not rep.exists():
            importer = qdstrm_importer()
            if not importer:
                raise PostprocessError(f"{report.name} needs nsys's QdstrmImporter; set MOETUNE_QDSTRM_IMPORTER")
            _tool([importer, "-i", str(report)], f"QdstrmImporter on {report.name}")
        report = rep
    if report == paths.report(rank):
        sqlite = paths.sqlite(rank)
        _tool([nsys_binary(), "export", "--type", "sqlite", "--force-overwrite", "true",
               "-o", str(sqlite), str(report)], f"nsys export of {report.name}")
        return sqlite
    return report


def _plain(o):  # numpy scalars as numbers, not strings
    return o.item() if hasattr(o, "item") else str(o)


def write_summary(sqlite: Path, for_job: str | None = None) -> Path:
    summary = rank_summary(sqlite)
    summary["for_job"] = for_job
    out = summary_path(sqlite)
    tmp = out.with_name(out.name + ".tmp")
    # sorted keys: `for_job` comes first, read from the file's head (trial/stages.py _for_job)
    tmp.write_text(json.dumps(summary, sort_keys=True, separators=(",", ":"), default=_plain) + "\n")
    os.replace(tmp, out)  # the reader never sees half a file
    return out


def write_recipes(nsys: str, report: Path, sqlite: Path) -> Path:
    """<report>.recipes.json: NVIDIA's recipes beside moetune's figures of this report, or why not
    (analysis.recipes.check_report); small, so the login node reads it instead of the report."""
    path = TrialPaths(report.parent).recipes(TrialPaths.rank_of(report))
    path.write_text(json.dumps(recipes.check_report(nsys, report, sqlite), indent=1, sort_keys=True) + "\n")
    return path


def process_report(folder: str | Path, rank: int, for_job: str | None = None) -> list[Path]:
    paths = TrialPaths(folder)
    report = rank_report(paths.folder, rank)
    if report is None:
        return []  # the rank wrote no report (the job died before it); the reader says so
    sqlite = export(report)
    rep = paths.report(rank)
    checked = [write_recipes(nsys_binary(), rep, sqlite)] if rep.exists() else []
    return [sqlite, write_summary(sqlite, for_job), *checked]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moetune.job.postprocess",
                                 description="export and summarise profiled ranks' reports")
    ap.add_argument("folder")
    ap.add_argument("--ranks", required=True, help="comma-separated profiled ranks")
    ap.add_argument("--for-job", default=None, help="the trial job whose reports these are")
    ap.add_argument("--task", type=int, default=None,
                    help="which of --ranks this task does (the job passes its array index; all without it)")
    a = ap.parse_args(argv)
    ranks = [int(r) for r in a.ranks.split(",") if r.strip()]
    task = a.task
    mine = [ranks[task]] if task is not None and task < len(ranks) else ([] if task is not None else ranks)
    t0 = time.monotonic()
    for rank in mine:
        try:
            written = process_report(a.folder, rank, a.for_job)
        except Exception as e:  # one line per failed rank, in postprocess.out
            print(f"rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return 1
        print(f"rank {rank}: {', '.join(p.name for p in written) or 'no report'} "
              f"in {time.monotonic() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
