"""The preflight job: one node, one task, the probe (workloads/preflight_probe.py) in the trials' own
image, mounts, environment and template (rendered by job/render.py like a trial, its command
swapped and nsys off), submitted and waited for like a trial; its record stored per cluster and
image with what it means (experiment/preflight.py).

    run(cluster, executor, runs_root, store)   -> Outcome (record, problems, capabilities)
    current(cluster, store, runs_root)         -> the stored Outcome still valid for this cluster, or None
"""
from __future__ import annotations

import dataclasses
import json
import secrets
import time
from datetime import UTC, datetime
from pathlib import Path

from moetune.experiment import preflight as spec
from moetune.experiment.schema import Cluster
from moetune.job import cost, render
from moetune.job import scheduler as jobs
from moetune.paths import WORKLOADS, write_whole
from moetune.workloads.preflight_probe import MARKER

PROBE = WORKLOADS / "preflight_probe.py"
FOLDER = "_preflight"  # under the runs folder, beside the studies
RECORD = "preflight.json"
TOKEN = "token"
# a passing record is reused this long for the same cluster keys (an image tag may move)
MAX_AGE_S = 24 * 3600


@dataclasses.dataclass
class Outcome:
    record: dict
    problems: list[spec.Problem]
    capabilities: dict
    folder: str | None = None
    job_id: str | None = None
    stored_at: str | None = None  # a record read back from the store, not measured now

    @property
    def blocking(self) -> list[spec.Problem]:
        return spec.blocking(self.problems)

    def to_dict(self) -> dict:
        return {"record": self.record, "problems": [p.to_dict() for p in self.problems],
                "capabilities": self.capabilities, "folder": self.folder, "job_id": self.job_id,
                "stored_at": self.stored_at, "blocking": [p.line for p in self.blocking]}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]


def job(cluster: Cluster, folder: Path, launcher: str) -> render.JobSpec:
    """The trials' job spec (same template, image, mounts, environment, python) with the probe as
    its one task on one node and nsys off; the token is written beside it."""
    base = render.job_spec(name=f"moetune.preflight.{_safe(cluster.name)}",
                           folder=folder, config={}, argv=[], cluster=cluster, launcher=launcher)
    folder = Path(base.folder)
    command = (base.command[0], "-u", str(PROBE), "--out", str(folder / RECORD),
               "--token-file", str(folder / TOKEN), "--nsys", cluster.nsys,
               "--workload-dir", base.workload_dir)
    return dataclasses.replace(base, command=command, nsys=None, nodes=1, ntasks_per_node=1)


def prepare(cluster: Cluster, runs_root, launcher: str) -> tuple[render.JobSpec, str]:
    """Render the job into a new folder under the runs folder and write the token the job reads
    back; (spec, token)."""
    name = _safe(cluster.name)
    folder = (Path(runs_root) / FOLDER / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    (folder / TOKEN).write_text(token + "\n")
    s = job(cluster, folder, launcher)
    render.write_job(s)
    return s, token


def read_record(s: render.JobSpec, record: str = RECORD, marker: str = MARKER) -> dict | None:
    """An in-job probe's record: its file `record` in the job's folder, else its line after
    `marker` in the job's log (a folder the job could not write back to)."""
    path = Path(s.folder) / record
    if path.exists():
        return json.loads(path.read_text())
    log = Path(s.log)
    if log.exists():
        for line in reversed(log.read_text(errors="replace").splitlines()):
            if line.startswith(marker):
                return json.loads(line[len(marker):])
    return None


def _last_lines(path: Path, n: int = 3) -> str:
    if not path.exists():
        return ""
    lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    return " | ".join(lines[-n:])[:400]


def finish(cluster: Cluster, s: render.JobSpec, token: str, kind: str, poll_s: float = 2.0,
           timeout_s: float | None = None, store=None, runs_root=None) -> Outcome:
    """Submit the prepared job, wait for it, read and judge its record, store it."""
    job_info: dict = {"kind": kind}
    error = None
    try:
        submitted = time.time()
        ref = jobs.submit(s, kind)
        job_info["job_id"] = ref.job_id
        st = jobs.wait(ref, poll_s=poll_s, timeout_s=timeout_s)
        seconds, _ = cost.job_seconds(st.to_dict(), submitted, time.time())
        # what the budget charges: the job holds the GPUs of the node it probes
        job_info.update(state=st.state, node=st.node, exit_code=st.exit_code, seconds=seconds,
                        gpus=s.nodes * s.gpus_per_node)
    except jobs.JobError as e:
        error = str(e)
    record = read_record(s) if error is None else None
    if record is None:
        log = Path(s.log)
        if error is None and not log.exists():  # Slurm wrote its output on the node, not here
            error = (f"job {job_info.get('job_id')} ended {job_info.get('state')} but its log {log} never "
                     "appeared on this node: the runs folder is not shared with the compute nodes")
        error = error or (f"job {job_info.get('job_id')} ended {job_info.get('state')} without a record; "
                          f"{log}: {_last_lines(log) or 'empty'}")
        record = {"job_error": error}
    record["job"] = job_info
    record.setdefault("runs_folder", {})["expected"] = token
    problems = spec.problems(record, cluster)
    outcome = Outcome(record, problems, spec.capabilities(record, cluster), folder=s.folder,
                      job_id=job_info.get("job_id"))
    write_whole(Path(s.folder) / "outcome.json", json.dumps(outcome.to_dict(), indent=1, sort_keys=True,
                                                           default=str) + "\n")
    if store is not None:
        store.add_preflight(cluster.name, spec.image_key(cluster),
                            spec.fingerprint(cluster, str(Path(runs_root or ".").resolve())), record,
                            [p.to_dict() for p in problems], job_id=outcome.job_id, folder=s.folder)
    return outcome


def run(cluster: Cluster, *, executor: str = "auto", runs_root="runs", store=None, poll_s: float = 2.0,
        timeout_s: float | None = None) -> Outcome:
    """The preflight of this cluster section, now: render, submit, wait, judge, store."""
    kind = jobs.resolve_kind(executor)
    s, token = prepare(cluster, runs_root, "srun" if kind == "slurm" else "local")
    return finish(cluster, s, token, kind, poll_s=poll_s, timeout_s=timeout_s, store=store,
                  runs_root=runs_root)


def _age_s(stamp: str) -> float:
    try:
        return (datetime.now(UTC) - datetime.fromisoformat(stamp)).total_seconds()
    except ValueError:
        return float("inf")


def current(cluster: Cluster, store, runs_root) -> Outcome | None:
    """The latest stored preflight of this cluster and image, where it passed, was taken with the
    same cluster keys and runs folder, and is younger than MAX_AGE_S; its problems judged again."""
    row = store.latest_preflight(cluster.name, spec.image_key(cluster))
    if row is None or row.blocking or _age_s(row.created_at) > MAX_AGE_S:
        return None
    if row.fingerprint != spec.fingerprint(cluster, str(Path(runs_root).resolve())):
        return None
    problems = spec.problems(row.record, cluster)
    if spec.blocking(problems):
        return None
    return Outcome(row.record, problems, spec.capabilities(row.record, cluster), folder=row.folder,
                   job_id=row.job_id, stored_at=row.created_at)
