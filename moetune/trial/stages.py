"""A trial's stages, each a function from files in the trial folder to files out:

    render  : config (+ experiment, templates) → job.sbatch, job.sh, spec.json, config.json, command.txt
    submit  : job.sh, spec.json                → job.json (job id; submitit, Slurm or local)
    collect : job.json                         → state.json, log.txt, trace_*.nsys-rep
    export  : trace_*.nsys-rep                 → trace_*.sqlite, or trace_*.metrics.json from a
              post-processing job (trial/traces.py)
    analyze : trace_*.sqlite or their summaries, log.txt → analysis.json, timeline.json,
              top_kernels.json (trial/traces.py)
    decide  : analysis.json, config.json       → decision.json (the decisions the store holds)

and, before render when the tuner fits first (experiment/fit.py):

    fit     : config (+ experiment, templates) → fit/job.sh, fit/log_rank_R.txt, fit/fit.json
              (the layout's bounding ranks, one after another on one GPU, fake process group: the
              first and last stage and the one with the most MoE layers, experiment/fit.py bounding_ranks)

Each is a `Stage` of trial/framework.py, which records every run with the hash of its inputs and
skips a stage whose outputs are current unless forced; the file names are job/paths.py
`TrialPaths`. `run_stage(store, trial_id, name)` is what `moetune stage` calls.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from moetune.analysis.logs import parse_log
from moetune.experiment import fit
from moetune.experiment import preflight as preflight_spec
from moetune.experiment.config import TrainingConfig, args_for_megatron, run_args
from moetune.experiment.placement import Placement
from moetune.experiment.schema import Cluster
from moetune.job import cost, executors, postprocess, render, slurm
from moetune.job import scheduler as jobs
from moetune.job.paths import TrialPaths
from moetune.paths import write_whole
from moetune.store import now
from moetune.trial import framework
from moetune.trial.framework import NotReady, Stage, StageError, TrialContext
from moetune.trial.jobfiles import launcher as _launcher
from moetune.trial.jobfiles import load_ref, load_spec
from moetune.trial.traces import _analyze_inputs, _export_inputs, do_analyze, do_export

STAGE_ORDER = ("render", "submit", "collect", "export", "analyze", "decide")  # one run of a trial
FIT = "fit"  # before render, where the tuner fits first


# -- the stages ------------------------------------------------------------------------------
def _fit_inputs(t: TrialContext) -> tuple[list[Path], Any]:
    model, cluster = t.model_and_cluster()
    return [], {"config": t.row.config, "model": model.to_dict(), "cluster": cluster.model_dump(),
                "folder": str(t.folder), "launcher": _launcher(t), **job_facts(t),
                "templates": render.template_texts()}


def _render_inputs(t: TrialContext) -> tuple[list[Path], Any]:
    files, extra = _fit_inputs(t)
    bound = one_gpu_rank(t)  # a fit measured again may name another rank
    return files, {**extra, **({"one_gpu_rank": bound.to_dict()} if bound else {})}


def one_gpu_rank(t: TrialContext) -> fit.BoundRank | None:
    """In a one-GPU study, the rank that stands for the trial's layout (experiment/fit.py bound_rank):
    of its stages holding MoE layers, the one its fit (fit/fit.json) measured slowest; without a
    fit, the one with the most MoE layers and micro-batches in flight. None outside one."""
    if not t.placement.one_gpu:
        return None
    config = TrainingConfig.from_dict(t.row.config)
    pinned = pinned_rank(t, config)
    if pinned:
        return pinned
    model, cluster = t.model_and_cluster()
    fitted = t.paths.fit.fit_result
    measured = json.loads(fitted.read_text()).get("ranks") if fitted.exists() else None
    return fit.bound_rank(model, config, cluster.world, measured)


def pinned_rank(t: TrialContext, config: TrainingConfig) -> fit.BoundRank | None:
    """The rank an ancestor of the same pipeline layout ran: trials of one layout are compared on
    one rank. A fit of three iterations can rank two close stages either way from trial to trial,
    and a change judged on another stage than its parent's measures the stage, not the change."""
    key = fit.pipeline_layout(config)
    parent_id = t.row.parent_id
    first = None
    while parent_id is not None:
        parent = t.store.trial(parent_id)
        recorded = TrialPaths(parent.folder).one_gpu_rank if parent.folder else None
        if recorded and recorded.exists() and \
                fit.pipeline_layout(TrainingConfig.from_dict(parent.config)) == key:
            first = (parent, json.loads(recorded.read_text()))
        parent_id = parent.parent_id
    if first is None:
        return None
    bound = first[1]  # its why as recorded: the report names the trial whose fit chose it
    return fit.BoundRank(int(bound["rank"]), int(bound["stage"]), bound["why"])


def job_facts(t: TrialContext) -> dict:
    """What the trial's job script takes from the machines, read once: `node_cpus`, CPUs of one
    compute node shared out among its ranks (render.cpus_per_rank): what the latest preflight of
    this cluster and image found on a node, else Slurm's word for the partition, or this machine's
    where the job runs here; `megatron_core`, the image's version the preflight found (None where
    none ran: a flag Megatron renamed then goes by its newest name)."""
    _, cluster = t.model_and_cluster()
    row = t.store.latest_preflight(cluster.name, preflight_spec.image_key(cluster))
    found = preflight_spec.capabilities(row.record, cluster) if row and row.record else {}
    if _launcher(t) == "local":
        cpus = os.cpu_count()
    else:
        cpus = found.get("node_cpus") or slurm.node_cpus(cluster.partition)
    return {"node_cpus": cpus, "megatron_core": found.get("megatron_core")}


def trial_spec(*, name: str, folder: Path, config: TrainingConfig, model, cluster: Cluster,
               placement: Placement, launcher: str, node_cpus: int | None,
               megatron_core: str | None = None, extra_args: tuple[str, ...] | list[str] = ()) -> render.JobSpec:
    """What one trial submits: its layout's job, or in a one-GPU placement the layout's
    `placement.rank` (else 0) alone, profiled (experiment/fit.py one_gpu_config; fit.OneGpuError
    where the step cannot hold the layout). `megatron_core`: the image's version, where the
    preflight found it: a flag that Megatron renamed goes by the name that version knows.
    `extra_args`: the experiment's pass-through flags, after moetune's own."""
    one_rank = None
    if placement.one_gpu:
        world = cluster.world
        config = fit.one_gpu_config(config, world, int(placement.samples))
        one_rank = ((placement.rank or 0,), world)
    argv = config.to_args(model, has_apex=cluster.has_apex is not False) + run_args() + list(extra_args)
    if one_rank:
        argv += list(fit.FAKE_GROUP_ARGS)
    argv = args_for_megatron(argv, megatron_core)
    return render.job_spec(name=name, folder=folder, config=config.to_dict(), argv=argv,
                           cluster=cluster, launcher=launcher, fit=one_rank, profile=True,
                           node_cpus=node_cpus)


def write_trial_job(spec: render.JobSpec, config: dict) -> list[Path]:
    """The job's scripts and, beside them, its spec, the trial's config and the command line."""
    out = render.write_job(spec)
    for path, text in ((spec.paths.spec, json.dumps(asdict(spec), indent=1, sort_keys=True)),
                       (spec.paths.config, json.dumps(config, indent=1, sort_keys=True)),
                       (spec.paths.command, " ".join(map(render.shell_word, spec.command)))):
        write_whole(path, text + "\n")
        out.append(path)
    return out


def do_render(t: TrialContext) -> list[Path]:
    model, cluster = t.model_and_cluster()
    bound = one_gpu_rank(t)
    try:
        spec = trial_spec(name=t.job_name(), folder=t.folder, config=TrainingConfig.from_dict(t.row.config),
                          model=model, cluster=cluster,
                          placement=t.placement.at_rank(bound.rank) if bound else t.placement,
                          launcher=_launcher(t), extra_args=t.exp.extra_args, **job_facts(t))
    except fit.OneGpuError as e:
        raise StageError(f"trial {t.id}: {e}") from None
    out = write_trial_job(spec, t.row.config)
    if bound:
        write_whole(t.paths.one_gpu_rank, json.dumps(bound.to_dict(), indent=1, sort_keys=True) + "\n")
        out.append(t.paths.one_gpu_rank)
    t.store.update_trial(t.id, folder=str(t.folder))
    return out


def do_fit(t: TrialContext) -> list[Path]:
    """The layout's bounding ranks, one after another on one GPU under Megatron's fake
    process group, as a job of its own in fit/ (rendered from the same templates, submitted the
    same way); each rank's peak and step time, and whether the layout fits (fit/fit.json)."""
    model, cluster = t.model_and_cluster()
    folder = t.paths.fit.folder
    if folder.exists():  # a fit is measured whole, never half from an earlier run
        shutil.rmtree(folder)
    world = cluster.world
    config = fit.fit_config(TrainingConfig.from_dict(t.row.config), world)
    ranks = fit.bounding_ranks(config, world, model)
    facts = job_facts(t)
    argv = args_for_megatron(config.to_args(model, has_apex=cluster.has_apex is not False)
                             + run_args() + list(t.exp.extra_args) + list(fit.FAKE_GROUP_ARGS),
                             facts["megatron_core"])
    spec = render.job_spec(name=t.job_name() + ".fit", folder=folder, config=config.to_dict(),
                           argv=argv, cluster=cluster, launcher=_launcher(t), fit=(ranks, world),
                           node_cpus=facts["node_cpus"])
    render.write_job(spec)
    submitted = time.time()
    ref = jobs.submit(spec, jobs.resolve_kind(t.executor))
    state = jobs.wait(ref, poll_s=1.0)
    seconds, basis = cost.job_seconds(state.to_dict(), submitted, time.time())
    stages_of = {fit.stage_rank(s.index, config, world): s for s in fit.pipeline_stages(model, config)
                 if world >= config.pp}
    measured = {r: {**_fit_rank(t.paths.fit.rank_log(r)),
                    **({"stage": stages_of[r].index, "moe_layers": stages_of[r].moe_layers}
                       if r in stages_of else {})} for r in ranks}
    capacity = cluster.memory_gb
    result = {**fit.verdict(measured, capacity).to_dict(), "world": world,
              "job": {"job_id": ref.job_id, "state": state.state, "gpus": 1,  # one GPU, rank after rank
                      "seconds": None if seconds is None else round(seconds, 1), "basis": basis},
              "ranks": {str(r): m for r, m in measured.items()}}
    out = t.paths.fit.fit_result
    write_whole(out, json.dumps(result, indent=1, sort_keys=True) + "\n")
    figures = fit.fit_metrics(result)  # plan reads fit_peak_gb
    t.store.set_metrics(t.id, figures, replace=figures)  # the tuner's figures stay beside them
    return [out]


def _fit_rank(log: Path) -> dict:
    """One fit rank's measurement from its log: peak memory after the optimizer states exist,
    steady step time (the rank's compute alone: the fake group skips every collective), failure."""
    if not log.exists():
        return {"failure": "no log", "max_allocated_gb": None}
    p = parse_log(log)
    return {k: p.get(k) for k in ("max_allocated_gb", "max_reserved_gb", "step_time_ms", "iterations",
                                  "failure", "failure_line")}


def load_fit(t: TrialContext) -> dict:
    return json.loads(t.need(t.paths.fit.fit_result, FIT).read_text())


def submit_inputs(t: TrialContext, bank_dir: Path | None = None) -> tuple[list[Path], Any]:
    # a replay's bank is what its job reads in place of the script
    bank_dir = bank_dir or t.bank
    return [t.need(t.paths.job_script, "render"), t.need(t.paths.spec, "render")], \
        ({"replay": str(bank_dir)} if bank_dir else None)


def _set_aside(t: TrialContext, job_id: str) -> None:
    """A forced re-submit keeps the earlier attempt's files under previous/<job id>/."""
    dest = t.paths.previous(job_id)
    dest.mkdir(parents=True, exist_ok=True)
    for p in t.paths.attempt():
        shutil.move(str(p), str(dest / p.name))


def do_submit(t: TrialContext, force: bool = False, bank_dir: Path | None = None) -> list[Path]:
    """Submit the rendered job through the trial's executor (job/executors.py); job.json. A
    replayed study's job replays its bank (TrialContext.bank), also when submitted by hand."""
    spec = load_spec(t)
    bank_dir = bank_dir or t.bank  # read before job.json is set aside
    out = t.paths.job
    earlier = {p.name for p in t.paths.previous("*").parent.glob("*")}
    if out.exists():
        old = json.loads(out.read_text())
        earlier.add(old["job_id"])
        pp = t.paths.postprocess
        if pp.exists() and old.get("kind") == "slurm":  # it would write into the next attempt's folder
            postprocess.cancel(json.loads(pp.read_text())["job_id"])
        _set_aside(t, old["job_id"])
    executor = executors.get("replay" if t.experiment.get("replay") else t.executor, bank_dir=bank_dir)
    # a submit whose job id never reached the store (the tuner was killed right after it): that
    # job is this trial's, so take it instead of submitting a second one
    ref = None if force else executor.find(spec, earlier)
    if ref is None:
        ref = executor.submit(spec)
    write_whole(out, json.dumps({**ref.to_dict(), "submitted_at": now(),
                                 **({"bank": str(bank_dir)} if bank_dir else {})}, indent=1, sort_keys=True) + "\n")
    # a judged trial's state and times are the study's record: a submit by hand leaves them
    t.store.update_trial(t.id, job_id=ref.job_id,
                         **({} if t.judged else {"state": "submitted", "submitted_at": now()}))
    return [out]


def _collect_inputs(t: TrialContext) -> tuple[list[Path], Any]:
    return [t.need(t.paths.job, "submit")], None


def do_collect(t: TrialContext, wait: bool = True, poll_s: float = 2.0,
               timeout_s: float | None = None) -> list[Path]:
    ref = load_ref(t)
    if wait:
        st = jobs.wait(ref, poll_s=poll_s, timeout_s=timeout_s)
    else:
        st = jobs.job_state(ref)
        if not st.terminal:
            raise NotReady(f"trial {t.id}: job {ref.job_id} is {st.state}; collect again later")
    state = t.paths.state
    write_whole(state, json.dumps({"job_id": ref.job_id, **st.to_dict()}, indent=1, sort_keys=True) + "\n")
    if not t.judged:  # a judged trial's state is the tuner's verdict, not the job's alone
        t.store.update_trial(t.id, state=st.outcome.trial_state, started_at=st.start, ended_at=st.end)
    return [state] + [p for p in (t.paths.log,) if p.exists()] + t.paths.reports


def _decide_inputs(t: TrialContext) -> tuple[list[Path], Any]:
    return [t.need(t.paths.analysis, "analyze"), t.need(t.paths.config, "render")], None


def recorded_decisions(store, trial, analysis_result: dict) -> dict:
    """The decide stage's content: the decisions the store holds for this trial (the tuning loop
    makes them; this stage writes them beside the trial's other files)."""
    ds = [d for d in store.decisions(trial.study_id) if d.trial_id == trial.id]
    return {"trial": trial.number, "config_hash": trial.config_hash, "fix": trial.fix,
            "wall": analysis_result.get("wall"),
            "decisions": [{"kind": d.kind, "rule": d.rule, "reason": d.reason,
                           "evidence": d.evidence, "at": d.created_at} for d in ds]}


def do_decide(t: TrialContext) -> list[Path]:
    result = json.loads(t.paths.analysis.read_text())
    decision = recorded_decisions(t.store, t.row, result)
    out = t.paths.decision
    write_whole(out, json.dumps(decision, indent=1, sort_keys=True, default=str) + "\n")
    return [out]


STAGES: dict[str, Stage] = {st.name: st for st in (
    Stage(FIT, _fit_inputs, do_fit),
    Stage("render", _render_inputs, do_render),
    Stage("submit", submit_inputs, do_submit, options=("bank_dir",), input_options=("bank_dir",),
          takes_force=True),
    Stage("collect", _collect_inputs, do_collect, options=("wait", "poll_s", "timeout_s")),
    Stage("export", _export_inputs, do_export, options=("local",), input_options=("local",),
          takes_force=True),
    Stage("analyze", _analyze_inputs, do_analyze, options=("local",), input_options=("local",)),
    Stage("decide", _decide_inputs, do_decide),
)}


def run_stage(store, trial_id: int, stage: str, force: bool = False, **options: Any) -> list[str]:
    """Run the stage of this name for one trial (framework.run: skipped when current unless
    force); its output paths. Options: runs_root, executor, and the stage's own (collect: wait=True,
    poll_s=2.0, timeout_s=None; export, analyze: local)."""
    if stage not in STAGES:
        raise StageError(f"unknown stage {stage!r}; stages: {', '.join(STAGE_ORDER)}")
    return framework.run(store, trial_id, STAGES[stage], force, **options)


def run_stages(store, trial_id: int, through: str = "analyze", **options: Any) -> dict[str, list[str]]:
    """Every stage of a trial in order up to `through`; {stage: outputs}."""
    out = {}
    for stage in STAGE_ORDER[:STAGE_ORDER.index(through) + 1]:
        out[stage] = run_stage(store, trial_id, stage, **options)
    return out


def unfinished(store, study_id: int) -> list[int]:
    """Trials submitted whose collect has not run: what a resumed tuner re-attaches to."""
    return [tr.id for tr in store.trials(study_id)
            if store.last_stage(tr.id, "submit") and not store.last_stage(tr.id, "collect")]


def resume(store, study_id: int, **options: Any) -> dict[int, list[str]]:
    """Re-attach to the study's submitted-but-uncollected jobs and collect them."""
    return {tid: run_stage(store, tid, "collect", **options) for tid in unfinished(store, study_id)}
