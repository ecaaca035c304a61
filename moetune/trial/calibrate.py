"""The calibration job: the probe (workloads/link_probe.py) on every rank of a short job of the trials'
own template, image, mounts and environment (rendered by job/render.py like a trial, its command
swapped and nsys off), submitted and waited for like a trial; its rows stored per cluster (what
predictions make of them: estimate/measured.py).

    run(exp, gpus, nodes, executor, runs_root, store)  -> Outcome (record, job id, folder, stored id)
"""
from __future__ import annotations

import dataclasses
import re
import secrets
import time
from pathlib import Path

from moetune.errors import MoetuneError
from moetune.estimate.measured import probe_sizes
from moetune.estimate.memory import TooFewGPUs, plan
from moetune.job import render
from moetune.job import scheduler as jobs
from moetune.paths import WORKLOADS
from moetune.trial import preflight
from moetune.workloads.link_probe import MARKER

PROBE = WORKLOADS / "link_probe.py"
FOLDER = "_calibrate"  # under the runs folder, beside the studies and _preflight
RECORD = "calibration.json"
# the largest message each workload measures: the CPU stand-in's gloo over loopback is slow, and a
# test waits on it
MAX_BYTES = {"megatron": 256 << 20, "cpu_stand_in": 1 << 20}
ITERS = {"megatron": 20, "cpu_stand_in": 3}
DEFAULT_NODES = 2  # inside a node and across one boundary: what the rates need


class CalibrationError(MoetuneError):
    """The job could not measure (one line: the job, its state, its log's last lines)."""


@dataclasses.dataclass
class Outcome:
    record: dict
    job_id: str | None
    folder: str
    stored_id: int | None = None


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:60]


def shape(cluster, gpus: int | None, nodes: int | None) -> tuple[int, int]:
    """(nodes, ranks a node) of the job: --nodes (default: two, or the cluster's fewer), --gpus in
    all (default: a node's GPUs, or ranks for the CPU stand-in, on each)."""
    per_node_default = cluster.ntasks_per_node or cluster.gpus_per_node or 1
    n = nodes or min(DEFAULT_NODES, cluster.nodes)
    if n < 1 or n > cluster.nodes:
        raise CalibrationError(f"--nodes {n}: give 1..{cluster.nodes} (cluster.nodes of {cluster.name})")
    total = gpus or n * per_node_default
    if total < 1 or total % n:
        raise CalibrationError(f"--gpus {total}: give a multiple of --nodes {n} "
                               "(the GPUs in all, as many on each node)")
    return n, total // n


def sizes(exp, cluster) -> list[int]:
    """The messages of the experiment's baseline and the layouts its plan finds feasible."""
    configs = [exp.baseline]
    try:
        configs += [lay.config for lay in plan(exp, limit=50, virtual=True)]
    except (TooFewGPUs, ValueError):
        pass
    return probe_sizes(exp.model, configs, MAX_BYTES[cluster.workload])


def job(exp, folder: Path, launcher: str, nodes: int, per_node: int) -> render.JobSpec:
    """The trials' job spec with the probe as each rank's command, `nodes` x `per_node` ranks, nsys off."""
    cluster = exp.cluster.model_copy(update={"nodes": nodes, "ntasks_per_node": per_node})
    base = render.job_spec(name=f"moetune.calibrate.{_safe(cluster.name)}", folder=folder, config={}, argv=[],
                           cluster=cluster, launcher=launcher)
    command = (base.command[0], "-u", str(PROBE), "--out", f"{base.folder}/{RECORD}",
               "--sizes", ",".join(map(str, sizes(exp, exp.cluster))), "--iters", str(ITERS[cluster.workload]),
               "--backend", "gloo" if cluster.workload == "cpu_stand_in" else "auto")
    return dataclasses.replace(base, command=command, nsys=None)


def _why(path: Path) -> str:
    """The log's last Python error line (srun's own lines come after it), else its last line."""
    if not path.exists():
        return "no log: is the runs folder shared with the compute nodes?"
    lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    errors = [x for x in lines if re.match(r"^[\w.]*(Error|Exception)\b", x)]
    return ((errors or lines)[-1:] or ["empty log"])[0][:300]


def run(exp, *, gpus: int | None = None, nodes: int | None = None, executor: str = "auto", runs_root="runs",
        store=None, poll_s: float = 2.0, timeout_s: float | None = None) -> Outcome:
    """The calibration of the experiment's cluster, now: render, submit, wait, read, store."""
    n, per_node = shape(exp.cluster, gpus, nodes)
    kind = jobs.resolve_kind(executor)
    folder = (Path(runs_root) / FOLDER / f"{_safe(exp.cluster.name)}-{time.strftime('%Y%m%d-%H%M%S')}-"
              f"{secrets.token_hex(2)}").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    s = job(exp, folder, "srun" if kind == "slurm" else "local", n, per_node)
    render.write_job(s)
    try:
        ref = jobs.submit(s, kind)
        st = jobs.wait(ref, poll_s=poll_s, timeout_s=timeout_s)
    except jobs.JobError as e:
        raise CalibrationError(f"calibration job in {folder}: {e}") from None
    record = preflight.read_record(s, RECORD, MARKER)
    if record is None or st.state != "COMPLETED":
        raise CalibrationError(f"calibration job {ref.job_id} ended {st.state} without its record; "
                               f"{s.log}: {_why(Path(s.log))}")
    record["job"] = {"kind": kind, "job_id": ref.job_id, "state": st.state, "node": st.node,
                     "nodes": n, "ranks_per_node": per_node}
    out = Outcome(record, ref.job_id, str(folder))
    if store is not None:
        out.stored_id = store.add_calibration(exp.cluster.name, exp.cluster.gpu_type, record, job_id=ref.job_id,
                                              folder=str(folder)).id
    return out
