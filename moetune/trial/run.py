"""One run of a trial: its stages in order (trial/stages.py), the job watched for hangs while it
runs, and what came of it (`TrialOutcome`) for the tuner to judge.

The submit stage goes through the trial's executor (job/executors.py: slurm, local, or the demo's
replay); an executor that refuses the config (a replay of a config the bank does not hold) leaves
the trial skipped, with nothing submitted.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from moetune.errors import MoetuneError
from moetune.experiment.config import TrainingConfig
from moetune.job import executors
from moetune.job import scheduler as jobs
from moetune.job.paths import TrialPaths
from moetune.trial import framework, stages, traces

ITERATION_LINE = re.compile(r"iteration\s+\d+\s*/\s*\d+\s*\|")
WATCHDOG = re.compile(r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*timed out")


@dataclass
class TrialOutcome:
    # completed | oom | host_oom | failed | hung | skipped | timeout | cancelled | node_fail | stage_error | no_fit
    state: str
    analysis: dict | None = None
    error: str | None = None
    last_lines: list[str] = field(default_factory=list)
    fit: dict | None = None  # the fit that let the trial onto the cluster (or kept it off)
    retry: bool = False  # the job ended by no fault of the config (scheduler.OUTCOMES): run it again
    job_id: str | None = None  # the job that ended so (where retry)
    stage: str | None = None  # the stage that raised (state stage_error)


class StageFailure(MoetuneError):
    """A stage of the trial raised one of moetune's errors: the trial measured nothing (its
    outcome is stage_error, with the stage and the error's line)."""

    def __init__(self, stage: str, error: Exception):
        super().__init__(f"{stage}: {error}")
        self.stage = stage


def _stage(name: str, fn, *args, **kwargs):
    """fn(*args, **kwargs), its errors named by the stage they stopped (NotReady passes through)."""
    try:
        return fn(*args, **kwargs)
    except framework.NotReady:
        raise
    except MoetuneError as e:  # a TraceError too
        raise StageFailure(name, e) from None


def watch(ref, log: Path, hang_timeout_s: float, poll_s: float = 0.5,
          never_after_s: float | None = None) -> tuple[str, str | None]:
    """Wait for a job (scheduler.JobRef); cancel it when its log shows no new iteration line
    for `hang_timeout_s` or an NCCL watchdog timeout, or when it stays pending for a reason that
    never clears (scheduler.NEVER_STARTS) for `never_after_s`. ('ended'|'hung'|'unstartable', why)."""
    last_count, last_change = 0, time.monotonic()
    stuck_since, never_after_s = None, jobs.NEVER_STARTS_AFTER_S if never_after_s is None else never_after_s
    while True:
        try:
            st = jobs.job_state(ref)
        except jobs.JobError:  # the scheduler did not answer this time; ask again
            time.sleep(poll_s)
            continue
        if st.terminal:
            break
        why = jobs.never_starts(st)
        stuck_since = (stuck_since or time.monotonic()) if why else None
        if why and time.monotonic() - stuck_since >= never_after_s:
            cancel(ref)
            return "unstartable", f"job {ref.job_id} will never start: {why}"
        if st.state != "RUNNING":  # queued time is not hang time
            last_change = time.monotonic()
            time.sleep(poll_s)
            continue
        text = log.read_text(errors="replace") if log.exists() else ""
        count = len(ITERATION_LINE.findall(text))
        if WATCHDOG.search(text):
            cancel(ref)
            return "hung", "NCCL watchdog timeout in the log"
        if count != last_count:
            last_count, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > hang_timeout_s:
            cancel(ref)
            return "hung", f"no iteration line for {hang_timeout_s:.0f} s"
        time.sleep(poll_s)
    return "ended", None


def cancel(ref, grace_s: float = 3.0) -> None:
    """Cancel a job: scancel on Slurm; a local job gets SIGTERM (job/scheduler.py), then SIGINT
    and SIGKILL to its process group (submitit's local job ignores SIGTERM)."""
    jobs.cancel(ref)
    if ref.kind != "local":
        return
    pid = int(ref.job_id)
    for sig in (signal.SIGINT, signal.SIGKILL):
        t0 = time.monotonic()
        while time.monotonic() - t0 < grace_s:
            if jobs.local_state(ref).terminal:
                return
            time.sleep(0.1)
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            return


# the log's failure (moetune/analysis/logs.py) -> (trial state, why), whatever the job's state
LOG_OUTCOMES = {"nccl_timeout": ("hung", "NCCL watchdog timeout in the log"),
                "oom": ("oom", "out of GPU memory"),
                "host_oom": ("host_oom", jobs.HOST_OOM_ADVICE)}


ERROR_LINE = re.compile(r"^\s*([A-Za-z_.]*(Error|Exception)):\s*(.+)$")


def error_line(text: str) -> str | None:
    """The last `SomeError: message` line of a traceback text."""
    found = [m for m in map(ERROR_LINE.match, text.splitlines()) if m]
    if not found:
        return None
    m = found[-1]
    return f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(3).strip()}"


def job_error(ref) -> str | None:
    """Why a submitit job failed: its result pickle's traceback, else its stderr (or its stdout,
    where the Slurm job sends stderr there)."""
    paths = ref.paths
    if paths.result_pickle.exists():
        try:
            with open(paths.result_pickle, "rb") as f:
                kind, value = pickle.load(f)
            if kind != "success":
                return error_line(str(value)) or str(value).strip().splitlines()[-1]
        except Exception:
            pass
    for out in (paths.stderr, paths.stdout):
        found = error_line(out.read_text(errors="replace")) if out.exists() else None
        if found:
            return found
    return None


def write_decision_file(store, trial, runs_root: Path, executor: str) -> None:
    """decision.json beside a judged trial's analysis: the decide stage, which decides nothing,
    only copies the decisions the tuner (tune/loop.py) already wrote to the store, the one record."""
    fresh = store.trial(trial.id)
    if not fresh.folder or not TrialPaths(fresh.folder).analysis.exists():
        return
    try:
        stages.run_stage(store, trial.id, "decide", force=True, runs_root=runs_root, executor=executor)
    except stages.StageError:
        pass  # decision.json is a copy of what the store holds; the store is the record


def run_trial(store, trial, *, executor: str, runs_root: Path,
              bank_dir: Path | None = None, hang_timeout_s: float = 600.0,
              fit_first: bool = False, resubmit: bool = False) -> TrialOutcome:
    """All stages of one trial (the demo's submit replays the bank); the outcome the tuner judges.
    `fit_first`: measure the layout on one GPU first and submit nothing that does not fit.
    `resubmit`: submit the job again although one ran (the tuner's retry of a node failure); the
    earlier attempt's files stay under previous/<job id>/."""
    opts = {"runs_root": runs_root, "executor": executor}
    fitted = None
    try:
        if fit_first:
            _stage(stages.FIT, stages.run_stage, store, trial.id, stages.FIT, **opts)
            fitted = _stage(stages.FIT, stages.load_fit, stages.TrialContext(store, trial.id, runs_root, executor))
            if not fitted["fits"]:
                return TrialOutcome("no_fit", error=f"fit: {fitted['reason']}", fit=fitted)
        out = _run_on_cluster(store, trial, executor, runs_root, bank_dir, hang_timeout_s, resubmit)
    except StageFailure as e:  # a config that cannot be rendered or submitted, a job not collected...
        log = stages.TrialContext(store, trial.id, runs_root, executor).paths.log
        lines = log.read_text(errors="replace").splitlines()[-10:] if log.exists() else []
        return TrialOutcome("stage_error", error=str(e), stage=e.stage, fit=fitted, last_lines=lines)
    out.fit = fitted
    return out


def _run_on_cluster(store, trial, executor: str, runs_root: Path, bank_dir: Path | None,
                    hang_timeout_s: float, resubmit: bool = False) -> TrialOutcome:
    opts = {"runs_root": runs_root, "executor": executor}
    _stage("render", stages.run_stage, store, trial.id, "render", **opts)
    t = stages.TrialContext(store, trial.id, runs_root, executor)
    log = t.paths.log
    refused = _stage("submit", lambda: executors.get(executor, bank_dir=bank_dir).refuses(
        TrainingConfig.from_dict(trial.config)))
    if refused:  # nothing this executor can run (a config the bank does not hold): no job is submitted
        return TrialOutcome("skipped", error=refused)
    for attempt in (0, 1):
        _stage("submit", stages.run_stage, store, trial.id, "submit", force=attempt > 0 or resubmit,
               bank_dir=bank_dir, **opts)
        try:  # queued now, behind the trial's job (afterany): it starts when that ends
            traces.start_postprocess(t)
        except stages.StageError:
            pass  # the export stage submits it again, and says why where it cannot
        ref = _stage("submit", stages.load_ref, t)
        status, why = _stage("collect", watch, ref, log, hang_timeout_s)
        if status == "unstartable":  # nothing ran: the trial is recorded as one it could not start
            return TrialOutcome("stage_error", error=f"submit: {why}", stage="submit")
        # a local job that died with a killed tuner leaves no result: submit it again, once
        lost = ref.kind == "local" and status == "ended" and \
            not store.last_stage(trial.id, "collect") and \
            jobs.local_state(ref).reason == "process gone without a result"
        if not lost:
            break

    def last() -> list[str]:
        return log.read_text(errors="replace").splitlines()[-10:] if log.exists() else []

    _stage("collect", stages.run_stage, store, trial.id, "collect", **opts, poll_s=0.5)
    if status == "hung":
        return TrialOutcome("hung", error=why, last_lines=last())
    state = json.loads(t.paths.state.read_text())
    if state.get("retry"):  # the node, not the config: nothing of this run is a measurement
        where = f" on {state['node']}" if state.get("node") else ""
        return TrialOutcome(state.get("outcome") or "failed", retry=True, last_lines=last(),
                            job_id=state.get("job_id"),
                            error=f"job {state.get('job_id')} ended {state.get('state')}{where} "
                                  "(the node or the scheduler, not the config)")
    if state.get("outcome") != "completed":
        msg = job_error(ref) or f"job {state.get('state')}"
        if not log.exists():
            return TrialOutcome(state.get("outcome") or "failed", error=msg, last_lines=last())
    _stage("export", stages.run_stage, store, trial.id, "export", **opts)
    _stage("analyze", stages.run_stage, store, trial.id, "analyze", **opts)
    result = json.loads(t.paths.analysis.read_text())
    failure = (result.get("log") or {}).get("failure")
    if state.get("outcome") == "host_oom":  # Slurm's cgroup said so, whatever the log shows
        failure = "host_oom"
    if failure in LOG_OUTCOMES:
        judged, why = LOG_OUTCOMES[failure]
        return TrialOutcome(judged, result, why, last())
    step = (result.get("metrics") or {}).get("combined", {}).get("step_time_ms")
    if state.get("outcome") != "completed" or failure or not step:
        line = (result.get("log") or {}).get("failure_line")
        why = (f"{failure}: {line}" if failure and line else failure) or \
            (job_error(ref) if state.get("outcome") != "completed" else None)
        return TrialOutcome(state.get("outcome") if state.get("outcome") != "completed" else "failed",
                       result, why or "no step time in trace or log", last())
    return TrialOutcome("completed", result, None, last())
