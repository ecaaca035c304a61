"""The preflight gate before a study's first trial: probe what the trials will meet (or reuse the
stored record), and record its verdict in the study, which stops it or lets it go on."""
from __future__ import annotations

from pathlib import Path

from moetune.experiment import preflight as preflight_spec
from moetune.job import cost, executors
from moetune.trial import preflight


def preflight_gate(exp, store, executor: str, runs_root: Path) -> tuple[str, str, dict]:
    """Before the first trial: what the trials will meet (trial/preflight.py), probed in a job of
    the trials' own image, or the stored record still valid for this cluster and image. The
    experiment's cluster takes the probed capabilities where its YAML leaves them unset; the
    rules and constraints decide with it. (decision kind, reason, evidence) for the study: `stop`
    with each blocking problem and its fix, else `preflight` with the notes."""
    if not executors.of_kind(executor).runs_jobs:  # the bank's trials carry their own image
        return "preflight", f"not run: the {executor} submits no job to probe", {}
    cluster = exp.cluster
    if exp.tuning.one_gpu:  # every trial is one rank on one GPU: probe what those jobs get
        cluster = cluster.with_gpus(1)
    out = preflight.current(cluster, store, runs_root) or \
        preflight.run(cluster, executor=executor, runs_root=runs_root, store=store)
    exp.cluster = preflight_spec.resolve(exp.cluster, out.capabilities)
    job = out.record.get("job") or {}
    # the budget charges a probe run now; a stored record reused costs nothing
    charged = 0.0 if out.stored_at else cost.gpu_hours(job.get("seconds"), job.get("gpus") or 0)
    notes = [p.line for p in out.problems if not p.blocking]
    ev = {"preflight": out.folder, "job_id": out.job_id, "stored_at": out.stored_at,
          "charged_gpu_hours": round(charged, 6), "capabilities": out.capabilities, "notes": notes}
    where = f"preflight of cluster {exp.cluster.name} (job {out.job_id}, {out.folder})"
    if out.blocking:
        return "stop", f"{where}: " + " | ".join(p.line for p in out.blocking), \
            {**ev, "blocking": [p.to_dict() for p in out.blocking]}
    return "preflight", f"{where}: nothing blocks" + (f"; {len(notes)} notes" if notes else ""), ev


def record_preflight(tuner, kind: str, reason: str, evidence: dict) -> None:
    """The preflight's verdict in the tuner's study: a blocking one stops it before any trial; a
    passing one after an earlier blocked run resumes it."""
    if kind == "stop":
        tuner.stop(reason, **evidence)
        return
    tuner.decide(kind, reason, **evidence)
    store, study = tuner.store, tuner.study
    last_stop = next((d for d in reversed(store.decisions(study.id)) if d.kind in ("stop", "resume")), None)
    if last_stop is not None and last_stop.kind == "stop" and (last_stop.evidence or {}).get("blocking"):
        tuner.decide("resume", "the preflight that stopped the study passes now")
        store.set_study_state(study.id, "running")
        # its trials run on the cluster as the experiment says now, the cause fixed
        store.set_study_experiment(study.id, {**(study.experiment or {}),
                                              "cluster": tuner.exp.cluster.model_dump()})
