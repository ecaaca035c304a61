"""The tuner's one seam to the rest of moetune: experiments, constraints, and running a trial.

Everything the loop needs from other modules goes through here, so the loop itself stays a
function of the store. A trial runs as the stages of pipeline/stages.py — render, submit,
collect, export, analyze — each recorded in the store with the hash of its inputs; a stage whose
record is current is not run again (that is what makes a killed tuner resumable).

Executors: `local` and `slurm` submit the rendered job script (pipeline.jobs); `replay` (the
demo) submits `pipeline.replay.replay_job` through submitit's local executor instead, and every
other stage is the same. While a job runs its log is watched for hangs.
"""
from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from moetune.pipeline.spec.config import TrainingConfig
from moetune.pipeline.spec.model import ModelArch
from moetune.pipeline.spec.section import get as attr, gpu_count

REPO = Path(__file__).resolve().parents[1]
ITERATION_LINE = re.compile(r"iteration\s+\d+\s*/\s*\d+\s*\|")
WATCHDOG = re.compile(r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*timed out")


class TunerError(Exception):
    """A problem with the study an engineer can act on (one line)."""


# -- experiments and constraints (other modules' contracts) -----------------------------------
def load_experiment(name: str):
    """`pipeline.experiment.load_experiment` where it exists; else a plain YAML reading."""
    try:
        from moetune.pipeline.spec.experiment import load_experiment as real
    except ImportError:
        real = None
    if real is not None:
        return real(name)
    path = Path(name)
    if not path.suffix:
        path = REPO / "experiments" / f"{name}.yaml"
    if not path.exists():
        raise TunerError(f"{path}: no such experiment; give a name under experiments/ or a YAML path")
    data = yaml.safe_load(path.read_text()) or {}
    for key in ("model", "cluster", "baseline"):
        if key not in data:
            raise TunerError(f"{path}: missing section {key!r}")
    return SimpleNamespace(name=data.get("name", path.stem), model=ModelArch.from_dict(data["model"]),
                           cluster=SimpleNamespace(**data["cluster"]),
                           tuning=SimpleNamespace(**(data.get("tuning") or {})),
                           baseline=TrainingConfig.from_dict(data["baseline"]))


def constraint_check(config: TrainingConfig, model, cluster) -> list:
    """`pipeline.constraints.check`; an empty list where that module is not there yet."""
    try:
        from moetune.pipeline.spec.constraints import check
    except ImportError:
        return []
    return check(config, model, cluster)


def image_of(cluster) -> str:
    """What identifies the software on a cluster: a rule not applied is retried when it changes."""
    for key in ("image", "container_image", "template"):
        v = attr(cluster, key)
        if v:
            return str(v)
    return "default"


def gpus_of(config: TrainingConfig, cluster) -> int:
    return gpu_count(cluster)


# -- one trial's stages ------------------------------------------------------------------------
@dataclass
class Outcome:
    state: str  # completed | oom | failed | hung | skipped | timeout | cancelled | node_fail
    analysis: dict | None = None
    error: str | None = None
    last_lines: list[str] = field(default_factory=list)


def trial_folder(runs_root: Path, study: str, trial) -> Path:
    """Where pipeline.stages keeps a trial's files."""
    if getattr(trial, "folder", None):
        return Path(trial.folder)
    return (Path(runs_root) / study / str(trial.id)).resolve()


def command_line(argv: list[str], cluster) -> str:
    """The full command a node runs: the launcher, Megatron's entry point and its argv."""
    n = attr(cluster, "gpus_per_node", 1)
    return shlex.join(["torchrun", "--nproc_per_node", str(n), "pipeline/train_moe.py", *argv])


def submit_replay(store, trial_id: int, runs_root: Path, bank_dir: Path, force: bool = False) -> None:
    """The demo's submit stage: `replay_job` through submitit's local executor, recorded as
    pipeline.stages records its own submit (job.json in the same form)."""
    import submitit
    from moetune.pipeline.trial import stages
    from moetune.pipeline.job.replay import replay_job
    from moetune.pipeline.store import now
    t = stages.Trial(store, trial_id, runs_root, "local")
    files, _ = stages._submit_inputs(t)
    key = stages.inputs_hash("submit", files, {"replay": str(bank_dir)})
    if stages.current(store, trial_id, "submit", key) and not force:
        return
    folder = t.folder / "submitit"
    ex = submitit.LocalExecutor(folder=folder)
    ex.update_parameters(timeout_min=30)
    started = now()
    job = ex.submit(replay_job, t.row.config, str(t.folder), str(bank_dir))
    out = t.path("job.json")
    out.write_text(json.dumps({"job_id": str(job.job_id), "kind": "local", "folder": str(folder),
                               "name": t.job_name(), "submitted_at": now()}, indent=1) + "\n")
    store.update_trial(trial_id, slurm_job_id=str(job.job_id), state="submitted", submitted_at=now())
    store.record_stage(trial_id, "submit", key, [str(out)], started_at=started)


def watch(ref, log: Path, hang_timeout_s: float, poll_s: float = 0.5) -> tuple[str, str | None]:
    """Wait for a job (pipeline.jobs.JobRef); cancel it when its log shows no new iteration line
    for `hang_timeout_s` or an NCCL watchdog timeout. ('ended'|'hung', why)."""
    from moetune.pipeline.job import scheduler as jobs
    last_count, last_change = 0, time.monotonic()
    while True:
        try:
            st = jobs.job_state(ref)
        except jobs.JobError:  # the scheduler did not answer this time; ask again
            time.sleep(poll_s)
            continue
        if st.terminal:
            break
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
    """Cancel a job: scancel on Slurm; a local job gets SIGTERM (pipeline.jobs), then SIGINT
    and SIGKILL to its process group (submitit's local job ignores SIGTERM)."""
    import os
    import signal
    from moetune.pipeline.job import scheduler as jobs
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


ERROR_LINE = re.compile(r"^\s*([A-Za-z_.]*(Error|Exception)):\s*(.+)$")


def error_line(text: str) -> str | None:
    """The last `SomeError: message` line of a traceback text."""
    found = [m for m in map(ERROR_LINE.match, text.splitlines()) if m]
    if not found:
        return None
    m = found[-1]
    return f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(3).strip()}"


def job_error(ref) -> str | None:
    """Why a submitit job failed: its result pickle's traceback, else its stderr."""
    import pickle
    folder = Path(ref.folder)
    result = folder / f"{ref.job_id}_0_result.pkl"
    if result.exists():
        try:
            with open(result, "rb") as f:
                kind, value = pickle.load(f)
            if kind != "success":
                return error_line(str(value)) or str(value).strip().splitlines()[-1]
        except Exception:
            pass
    for err in folder.glob(f"{ref.job_id}_*log.err"):
        found = error_line(err.read_text(errors="replace"))
        if found:
            return found
    return None


def record_decide(store, trial, runs_root: Path, executor: str) -> None:
    """Run the decide stage (decision.json) for a judged trial that has an analysis."""
    from moetune.pipeline.trial import stages
    fresh = store.trial(trial.id)
    if not fresh.folder or not (Path(fresh.folder) / "analysis.json").exists():
        return
    try:
        stages.run_stage(store, trial.id, "decide", force=True, runs_root=runs_root,
                         executor="local" if executor == "replay" else executor)
    except stages.StageError:
        pass  # decision.json is a copy of what the store holds; the store is the record


def run_trial(store, trial, experiment, *, executor: str, runs_root: Path, study: str,
              bank_dir: Path | None = None, hang_timeout_s: float = 600.0) -> Outcome:
    """All stages of one trial (pipeline.stages; the demo's submit replays the bank); the
    outcome the tuner judges."""
    from moetune.pipeline.trial import stages
    kind = "local" if executor == "replay" else executor
    opts = {"runs_root": runs_root, "executor": kind}
    stages.run_stage(store, trial.id, "render", **opts)
    t = stages.Trial(store, trial.id, runs_root, kind)
    from moetune.pipeline.job import scheduler as jobs
    log = t.path("log.txt")
    for attempt in (0, 1):
        if executor == "replay":
            submit_replay(store, trial.id, runs_root, bank_dir, force=attempt > 0)
        else:
            stages.run_stage(store, trial.id, "submit", force=attempt > 0, **opts)
        ref = stages.load_ref(t)
        status, why = watch(ref, log, hang_timeout_s)
        # a local job that died with a killed tuner leaves no result: submit it again, once
        lost = ref.kind == "local" and status == "ended" and \
            not store.last_stage(trial.id, "collect") and \
            jobs.local_state(ref).reason == "process gone without a result"
        if not lost:
            break
    last = lambda: log.read_text(errors="replace").splitlines()[-10:] if log.exists() else []
    try:
        stages.run_stage(store, trial.id, "collect", **opts, poll_s=0.5)
    except stages.StageError as e:
        return Outcome("failed", error=str(e), last_lines=last())
    if status == "hung":
        return Outcome("hung", error=why, last_lines=last())
    state = json.loads(t.path("state.json").read_text())
    if state.get("outcome") != "completed":
        msg = job_error(ref) or f"job {state.get('state')}"
        if "not in the trial bank" in msg:
            return Outcome("skipped", error=msg)
        if not log.exists():
            return Outcome(state.get("outcome") or "failed", error=msg, last_lines=last())
    try:
        stages.run_stage(store, trial.id, "export", **opts)
        stages.run_stage(store, trial.id, "analyze", **opts)
    except stages.StageError as e:
        return Outcome("failed", error=str(e), last_lines=last())
    result = json.loads(t.path("analysis.json").read_text())
    failure = (result.get("log") or {}).get("failure")
    if failure == "nccl_timeout":
        return Outcome("hung", result, "NCCL watchdog timeout in the log", last())
    if failure == "oom":
        return Outcome("oom", result, "out of memory", last())
    step = (result.get("metrics") or {}).get("combined", {}).get("step_time_ms")
    if state.get("outcome") != "completed" or failure or not step:
        line = (result.get("log") or {}).get("failure_line")
        why = (f"{failure}: {line}" if failure and line else failure) or \
            (job_error(ref) if state.get("outcome") != "completed" else None)
        return Outcome(state.get("outcome") if state.get("outcome") != "completed" else "failed",
                       result, why or "no step time in trace or log", last())
    return Outcome("completed", result, None, last())


def _now() -> str:
    from moetune.pipeline.store import now
    return now()
