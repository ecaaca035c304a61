"""What the render and submit stages left in a trial folder, read back by the later stages: the
launcher a trial's job runs under, its spec (spec.json) and the submitted job (job.json)."""
from __future__ import annotations

import json

from moetune.job import render, slurm
from moetune.job import scheduler as jobs
from moetune.trial.framework import TrialContext


def launcher(t: TrialContext) -> str:
    """`srun` where the trial runs on Slurm, else `local`."""
    on_slurm = t.executor == "slurm" or (t.executor == "auto" and slurm.available())
    return "srun" if on_slurm else "local"


def load_spec(t: TrialContext) -> render.JobSpec:
    """The job spec the render stage wrote (spec.json)."""
    d = json.loads(t.need(t.paths.spec, "render").read_text())
    nsys = render.NsysSpec(**{**d["nsys"], "options": tuple(d["nsys"]["options"]),
                              "ranks": tuple(d["nsys"]["ranks"])}) if d.get("nsys") else None
    tuples = {k: tuple(tuple(x) if isinstance(x, list) else x for x in d[k])
              for k in ("command", "env", "container_mounts", "modules", "fit_ranks")
              if k in d}
    return render.JobSpec(**{**d, **tuples, "nsys": nsys})


def load_ref(t: TrialContext) -> jobs.JobRef:
    """The job the submit stage submitted (job.json)."""
    d = json.loads(t.need(t.paths.job, "submit").read_text())
    return jobs.JobRef(job_id=d["job_id"], kind=d["kind"], folder=d["folder"], name=d["name"])
