"""The export and analyze stages of a trial (registered in trial/stages.py):

    export  : trace_*.nsys-rep → trace_*.sqlite (nsys export, on this node), or on Slurm
              (cluster.postprocess.where: job) a CPU job after the trial's that exports each rank and
              writes its summary: trace_*.sqlite, trace_*.metrics.json (job/postprocess.py submits
              workloads/postprocess.py)
    analyze : trace_*.sqlite, log.txt → analysis.json (analysis.analyze), or from the
              trace_*.metrics.json where every report has one (analysis.summary: no SQLite read);
              beside it what the report draws of the window, timeline.json and top_kernels.json
              (analysis.timeline), so that the report never opens a trace
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from moetune import analysis
from moetune.analysis import summary, timeline
from moetune.analysis.nsys import nsys_binary
from moetune.job import postprocess, render
from moetune.job import scheduler as jobs
from moetune.job.paths import TrialPaths
from moetune.paths import write_whole
from moetune.trial.framework import StageError, TrialContext
from moetune.trial.jobfiles import launcher, load_ref, load_spec
from moetune.workloads import postprocess as in_job


def as_job(t: TrialContext, local: bool = False) -> bool:
    """Whether export and the per-rank metrics run as a Slurm job of their own (not `--local`,
    not the local executor, not cluster.postprocess.where: login, and only with reports)."""
    if local or launcher(t) != "srun":
        return False
    _, cluster = t.model_and_cluster()
    return postprocess.settings(cluster)["where"] == "job" and (load_spec(t).nsys is not None)


def _stat_key(files: list[Path]) -> list:
    # a report's name, size and mtime stand for its contents: hashing GBs of reports on the
    # login node is the work the post-processing job is there to take off it
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def _export_inputs(t: TrialContext, local: bool = False) -> tuple[list[Path], Any]:
    t.need(t.paths.state, "collect")
    if as_job(t, local):
        return [t.paths.job], {"job": _stat_key(t.paths.reports)}
    return t.paths.reports, None


def start_postprocess(t: TrialContext, force: bool = False) -> str | None:
    """Submit the trial's post-processing job after its current job (afterany), unless one for
    that job is already submitted; its job id. None where it does not run as a job."""
    if not as_job(t):
        return None
    ref = load_ref(t)
    state = t.paths.postprocess
    if state.exists() and not force:
        known = json.loads(state.read_text())
        if known.get("for_job") == ref.job_id:
            return known["job_id"]
    spec = load_spec(t)
    _, cluster = t.model_and_cluster()
    assert spec.nsys is not None  # as_job: only a profiled trial's export runs as a job
    ranks = [r for r in spec.nsys.ranks if r < spec.ntasks]
    try:
        return postprocess.submit(t.folder, ranks, cluster, after=ref.job_id,
                                  name=t.job_name() + ".post")
    except postprocess.PostprocessError as e:
        raise StageError(f"trial {t.id}: {e}") from None


def _nsys(t: TrialContext) -> str:
    try:
        return nsys_binary()
    except analysis.TraceError as e:
        raise StageError(f"trial {t.id}: {e}") from None


def do_export(t: TrialContext, local: bool = False, force: bool = False) -> list[Path]:
    """Each rank's report → SQLite. A bare .qdstrm (nsys could not run its importer inside the
    job) is imported to .nsys-rep first. As a job (as_job): wait for the post-processing job,
    which does that and writes each rank's summary; the reports are not opened here."""
    if as_job(t, local):
        return _export_as_job(t, force)
    for stale in t.paths.each(t.paths.metrics):  # made from an earlier export
        stale.unlink()
    # each rank's report as the post-processing job reads it: the job's own export where it made
    # one, else the report exported here (a bare .qdstrm imported first)
    ranks = {t.paths.rank_of(p) for p in t.paths.reports}
    imported, out = [], []
    for rank in sorted(ranks):
        report = in_job.rank_report(t.folder, rank)
        assert report is not None  # the rank is one of the reports found
        rep = t.paths.report(rank)
        if not rep.exists():
            imported.append(rep)
        try:
            sqlite = in_job.export(report)
        except (in_job.PostprocessError, analysis.TraceError) as e:
            raise StageError(f"trial {t.id}: {e}") from None
        out += [sqlite, in_job.write_recipes(_nsys(t), rep, sqlite)]
    return imported + out


def _export_as_job(t: TrialContext, force: bool) -> list[Path]:
    job_id = start_postprocess(t, force=force)
    assert job_id is not None  # called only where as_job holds
    known = json.loads(t.paths.postprocess.read_text())
    _, cluster = t.model_and_cluster()
    limit_s = 60 * render.time_minutes(postprocess.settings(cluster)["time_limit"])
    # the trial's job first (it may queue long), then the array's own time limit and some slack
    jobs.wait(load_ref(t), poll_s=1.0)
    state = postprocess.wait(job_id, len(known["ranks"]), timeout_s=limit_s + 600)
    if state != "COMPLETED":
        tails = [line for p in t.paths.each(t.paths.postprocess_out)
                 for line in p.read_text(errors="replace").strip().splitlines()[-1:]]
        raise StageError(f"trial {t.id}: post-processing job {job_id} ended {state}"
                         + (f": {tails[0][:200]}" if tails else f"; see {t.paths.postprocess_out('*')}"))
    return sorted(t.paths.each(t.paths.sqlite) + t.paths.each(t.paths.metrics))


def summaries(t: TrialContext) -> list[Path] | None:
    """The per-rank summaries, in the reports' order, where every exported report has one made
    for the trial's current job; else None (analyze the SQLite here)."""
    return None if summary_gap(t) else _summary_paths(t)


def _summary_paths(t: TrialContext) -> list[Path]:
    return [t.paths.metrics(t.paths.rank_of(p)) for p in t.paths.each(t.paths.sqlite)]


def summary_gap(t: TrialContext) -> str | None:
    """Why the per-rank summaries cannot stand for the traces (None: they can)."""
    found = _summary_paths(t)
    if not found:
        return "no exported report"
    missing = [p.name for p in found if not p.exists()]
    if missing:
        return f"no {', '.join(missing)}"
    job = load_ref(t).job_id if t.paths.job.exists() else None
    other = [f"{p.name} (job {_for_job(p)})" for p in found if _for_job(p) != job]
    return f"made for another job than {job}: {', '.join(other)}" if other else None


def _settled_summaries(t: TrialContext, settle_s: float = 30.0,
                       poll_s: float = 0.5) -> tuple[list[Path] | None, str | None]:
    """The summaries where the export ran as a job: accounting can call the array done a moment
    before the last element's files are seen here, so a gap is given a short while to close; what
    still stands is said, not passed over (the SQLite is then read here)."""
    deadline = time.monotonic() + settle_s
    while (gap := summary_gap(t)) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return (None, gap) if gap else (_summary_paths(t), None)


def _for_job(path: Path) -> str | None:
    """The job a summary was made for. The file is written with sorted keys, `for_job` first, so
    its head says it without parsing megabytes of kernel starts."""
    with open(path) as f:
        head = f.read(200)
    m = re.match(r'\{"for_job":\s*(?:"([^"]*)"|null)', head)
    return m.group(1) if m else json.loads(Path(path).read_text()).get("for_job")


def _analyze_inputs(t: TrialContext, local: bool = False) -> tuple[list[Path], Any]:
    small = None if local else summaries(t)
    log = [p for p in (t.paths.log,) if p.exists()]
    traces = small if small is not None else t.paths.each(t.paths.sqlite)  # a summary stands for its SQLite
    return [t.need(t.paths.state, "collect")] + sorted(log + traces + t.paths.each(t.paths.recipes)), None


def do_analyze(t: TrialContext, local: bool = False) -> list[Path]:
    traces = [str(p) for p in t.paths.each(t.paths.sqlite)]
    log = t.paths.log
    if not traces and not log.exists():
        raise StageError(f"trial {t.id}: no trace and no log in {t.folder}; nothing to analyze")
    small, gap = None, None
    if not local:
        small, gap = _settled_summaries(t) if t.paths.postprocess.exists() and as_job(t) else (summaries(t), None)
    try:
        if small is not None:  # combine only: the SQLite stays unread on this node
            loaded = [summary.load_summary(p) for p in small]
            result = summary.combine_summaries(loaded, log=str(log) if log.exists() else None)
            result["summaries"] = [str(p) for p in small]
            views = summary.summary_views(loaded)
        else:
            result = analysis.analyze(traces, log=str(log) if log.exists() else None)
            views = _trace_views(traces)
    except analysis.TraceError as e:
        raise StageError(f"trial {t.id}: {e}") from None
    if gap:  # the export ran as a job, yet its summaries do not cover the traces
        result.setdefault("warnings", []).append(f"per-rank summaries not used ({gap}): the traces were read here")
    # moetune's figures beside NVIDIA's recipes, as the export (here or in its job) compared them
    beside = {t.paths.trace(t.paths.rank_of(p)).name: json.loads(p.read_text())
              for p in t.paths.each(t.paths.recipes)}
    if beside:
        result["recipes"] = beside
    out = t.paths.analysis
    text = json.dumps(result, indent=1, sort_keys=True, default=str) + "\n"
    earlier = out.read_text() if out.exists() else None
    kept = _keep_earlier(t, earlier) if earlier not in (None, text) else []
    write_whole(out, text)
    drawn = write_views(t.paths, views)
    if not t.judged:  # a judged trial's figures are what the tuner decided by: they stay
        record_analysis(t.store, t.id, result, json.loads(earlier) if earlier else None)
    return [out] + drawn + kept


def _keep_earlier(t: TrialContext, earlier: str) -> list[Path]:
    """An analysis that a new one of other content replaces, kept under previous/analyses/."""
    folder = t.paths.previous("analyses")
    folder.mkdir(parents=True, exist_ok=True)
    kept = folder / f"analysis.{len(list(folder.glob('analysis.*.json'))) + 1}.json"
    write_whole(kept, earlier)
    return [kept]


def row_figures(result: dict) -> dict:
    """The trial row's figures of an analysis, as the tuner records them (tune/loop.py
    record_figures): TFLOP/s/GPU from the log where the trace has none."""
    combined = (result.get("metrics") or {}).get("combined") or {}
    figures = {k: combined.get(k) for k in ("step_time_ms", "step_time_std_ms", "peak_memory_gb")}
    figures["tflops_per_gpu"] = combined.get("tflops_per_gpu") or (result.get("log") or {}).get("tflops_per_gpu")
    return {"wall": result.get("wall"), **figures}


def record_analysis(store, trial_id: int, result: dict, earlier: dict | None = None) -> None:
    """An analysis's figures into the store: the trial's row and its metrics, each rank's whole,
    the combined ones only by the names this analysis or the `earlier` one wrote, so that what
    the tuner recorded beside them (judged step, GPU-hours, prediction, fit) stays."""
    def combined(r: dict | None) -> dict:
        return ((r or {}).get("metrics") or {}).get("combined") or {}
    store.set_metrics(trial_id, combined(result), replace=set(combined(result)) | set(combined(earlier)))
    for rank, values in ((result.get("metrics") or {}).get("per_rank") or {}).items():
        store.set_metrics(trial_id, values, rank=int(rank))
    store.update_trial(trial_id, **row_figures(result))


def _trace_views(traces: list[str]) -> list[dict] | None:
    """The views of the window the report draws, read from the traces; None where they cannot be
    read whole (the analysis read them: the report leaves its plot out rather than fail)."""
    if not traces:
        return None
    try:
        return timeline.trace_views(traces)
    except Exception:  # noqa: BLE001 -- any reader failure only costs the report its plot
        return None


def write_views(paths: TrialPaths, views: list[dict] | None) -> list[Path]:
    """timeline.json and top_kernels.json of these rank views, the paths written; None (no views):
    neither, and an earlier analysis's removed, so that the report shows no stale window."""
    files = (paths.timeline, paths.top_kernels)
    if views is None:
        for p in files:
            p.unlink(missing_ok=True)
        return []
    for p, content in zip(files, (timeline.timeline(views), timeline.top_kernels(views)), strict=True):
        write_whole(p, json.dumps(content, indent=1, sort_keys=True) + "\n")
    return list(files)
