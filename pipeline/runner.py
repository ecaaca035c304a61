"""The tuner's one seam to the rest of moetune: experiments, constraints, and running a trial.

Everything the loop needs from other modules goes through here, so the loop itself stays a
function of the store. A trial runs as the stages of docs/architecture.md — render, submit,
collect, export, analyze — each recorded in the store with the hash of its inputs; a stage whose
record is current is not run again (that is what makes a killed tuner resumable).

Executors: `replay` runs `pipeline.replay.replay_job` (the trial bank) through submitit's local
executor; `local` and `slurm` run the rendered job script through submitit (local executor or
Slurm), watched for hangs.
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from pipeline.config import TrainingConfig, run_args
from pipeline.model import ModelArch

REPO = Path(__file__).resolve().parents[1]
ITERATION_LINE = re.compile(r"iteration\s+\d+\s*/\s*\d+\s*\|")
WATCHDOG = re.compile(r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*timed out")


class TunerError(Exception):
    """A problem with the study an engineer can act on (one line)."""


# -- experiments and constraints (other modules' contracts) -----------------------------------
def load_experiment(name: str):
    """`pipeline.experiment.load_experiment` where it exists; else a plain YAML reading."""
    try:
        from pipeline.experiment import load_experiment as real
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
        from pipeline.constraints import check
    except ImportError:
        return []
    return check(config, model, cluster)


def attr(obj, name: str, default=None):
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def image_of(cluster) -> str:
    """What identifies the software on a cluster: a rule not applied is retried when it changes."""
    for key in ("image", "container_image", "template"):
        v = attr(cluster, key)
        if v:
            return str(v)
    return "default"


def gpus_of(config: TrainingConfig, cluster) -> int:
    return int(attr(cluster, "nodes", 1) or 1) * int(attr(cluster, "gpus_per_node", 1) or 1)


# -- one trial's stages ------------------------------------------------------------------------
@dataclass
class Outcome:
    state: str  # completed | oom | failed | hung | skipped
    analysis: dict | None = None
    error: str | None = None
    last_lines: list[str] = field(default_factory=list)


def _hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _current(store, trial_id: int, stage: str, inputs_hash: str):
    run = store.last_stage(trial_id, stage)
    if run and run.inputs_hash == inputs_hash and all(Path(p).exists() for p in run.outputs):
        return run
    return None


def trial_folder(runs_root: Path, study: str, trial) -> Path:
    return Path(runs_root) / study / f"trial_{trial.number:03d}_{trial.config_hash}"


def render(store, trial, experiment, folder: Path) -> Path:
    config = TrainingConfig.from_dict(trial.config)
    argv = config.to_args(experiment.model) + run_args()
    key = _hash("render", trial.config, argv)
    if _current(store, trial.id, "render", key):
        return folder / "job.sh"
    folder.mkdir(parents=True, exist_ok=True)
    gpus = gpus_of(config, experiment.cluster)
    script = ["#!/bin/bash", "set -euo pipefail", f"cd {shlex.quote(str(folder))}",
              "torchrun --nproc_per_node " + shlex.quote(str(attr(experiment.cluster, "gpus_per_node", gpus)))
              + " " + shlex.quote(str(REPO / "pipeline" / "train_moe.py")) + " "
              + shlex.join(argv) + " 2>&1 | tee log.txt"]
    (folder / "job.sh").write_text("\n".join(script) + "\n")
    (folder / "config.json").write_text(json.dumps(trial.config, indent=1, sort_keys=True))
    (folder / "command.txt").write_text(command_line(argv, experiment.cluster) + "\n")
    store.record_stage(trial.id, "render", key, [str(folder / "job.sh"), str(folder / "config.json")])
    return folder / "job.sh"


def command_line(argv: list[str], cluster) -> str:
    """The full command a node runs: the launcher, Megatron's entry point and its argv."""
    n = attr(cluster, "gpus_per_node", 1)
    return shlex.join(["torchrun", "--nproc_per_node", str(n), "pipeline/train_moe.py", *argv])


def _executor(kind: str, folder: Path, experiment):
    import submitit
    if kind == "slurm":
        ex = submitit.AutoExecutor(folder=folder / "submitit", cluster="slurm")
        c = experiment.cluster
        ex.update_parameters(nodes=int(attr(c, "nodes", 1)), gpus_per_node=int(attr(c, "gpus_per_node", 1)),
                             tasks_per_node=1, slurm_partition=attr(c, "partition"),
                             timeout_min=_minutes(attr(c, "time_limit", "00:30:00")))
        return ex
    ex = submitit.LocalExecutor(folder=folder / "submitit")
    ex.update_parameters(timeout_min=_minutes(attr(experiment.cluster, "time_limit", "00:30:00")))
    return ex


def _minutes(limit: str) -> int:
    parts = [int(p) for p in str(limit).split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, s = parts[-3:]
    return max(1, h * 60 + m + (1 if s else 0))


def submit_and_wait(store, trial, experiment, folder: Path, executor: str, bank_dir: Path | None,
                    hang_timeout_s: float, poll_s: float = 0.5) -> tuple[str, str | None]:
    """Submit the trial's job and wait for it: ('ok'|'failed'|'hung'|'skipped', message)."""
    key = _hash("submit", trial.config, executor, str(bank_dir))
    done = _current(store, trial.id, "collect", _hash("collect", key))
    if done:  # the job finished before a kill: its files are here
        return "ok", None
    log = folder / "log.txt"
    ex = _executor("local" if executor in ("replay", "local") else "slurm", folder, experiment)
    if executor == "replay":
        from pipeline.replay import replay_job
        job = ex.submit(replay_job, trial.config, str(folder), str(bank_dir))
    else:
        import submitit
        job = ex.submit(submitit.helpers.CommandFunction(["bash", str(folder / "job.sh")]))
    store.update_trial(trial.id, slurm_job_id=str(job.job_id), state="running",
                       submitted_at=_now())
    store.record_stage(trial.id, "submit", key, [str(folder / "job.sh")])
    status, message = watch(job, log, hang_timeout_s, poll_s)
    if status == "ok":
        store.record_stage(trial.id, "collect", _hash("collect", key), [str(log)])
    else:
        store.record_stage(trial.id, "collect", _hash("collect", key), [], status="failed",
                           error=message)
    return status, message


def watch(job, log: Path, hang_timeout_s: float, poll_s: float = 0.5) -> tuple[str, str | None]:
    """Wait for a submitit job; cancel it when its log shows no new iteration line for
    `hang_timeout_s` or an NCCL watchdog timeout."""
    last_count, last_change = 0, time.monotonic()
    while not job.done():
        text = log.read_text(errors="replace") if log.exists() else ""
        count = len(ITERATION_LINE.findall(text))
        if WATCHDOG.search(text):
            job.cancel()
            return "hung", "NCCL watchdog timeout in the log"
        if count != last_count:
            last_count, last_change = count, time.monotonic()
        elif time.monotonic() - last_change > hang_timeout_s:
            job.cancel()
            return "hung", f"no iteration line for {hang_timeout_s:.0f} s"
        time.sleep(poll_s)
    try:
        job.result()
    except Exception as e:  # submitit wraps the job's exception in its traceback text
        msg = error_line(str(e)) or type(e).__name__
        return ("skipped" if "not in the trial bank" in msg else "failed"), msg
    return "ok", None


ERROR_LINE = re.compile(r"^\s*([A-Za-z_.]*(Error|Exception)):\s*(.+)$")


def error_line(text: str) -> str | None:
    """The last `SomeError: message` line of a traceback text."""
    found = [m for m in map(ERROR_LINE.match, text.splitlines()) if m]
    if not found:
        return None
    m = found[-1]
    return f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(3).strip()}"


def export(store, trial, folder: Path) -> list[Path]:
    """nsys-rep → SQLite where a report is there and no SQLite is; replayed traces are SQLite."""
    outs = []
    for rep in sorted(folder.glob("trace_*.nsys-rep")):
        sqlite = rep.with_suffix(".sqlite")
        if not sqlite.exists() and shutil.which("nsys"):
            subprocess.run(["nsys", "export", "--type", "sqlite", "-o", str(sqlite),
                            "--force-overwrite", "true", str(rep)], check=False,
                           capture_output=True, timeout=1800)
    outs = sorted(folder.glob("trace_*.sqlite"))
    store.record_stage(trial.id, "export", _hash("export", [p.name for p in outs]),
                       [str(p) for p in outs])
    return outs


def analyze(store, trial, folder: Path, experiment) -> dict:
    import analysis as an
    traces = sorted(folder.glob("trace_*.sqlite"))
    log = folder / "log.txt"
    key = _hash("analyze", [(p.name, p.stat().st_size) for p in traces],
                log.stat().st_size if log.exists() else None)
    out = folder / "analysis.json"
    if _current(store, trial.id, "analyze", key) and out.exists():
        return json.loads(out.read_text())
    mem = None
    from pipeline.rules import GPU_MEMORY_GB
    mem = GPU_MEMORY_GB.get(str(attr(experiment.cluster, "gpu_type", "")))
    try:
        result = an.analyze([str(p) for p in traces], log=str(log) if log.exists() else None,
                            gpu_memory_gb=mem)
    except an.TraceError as e:
        store.record_stage(trial.id, "analyze", key, [], status="failed", error=str(e))
        raise
    out.write_text(json.dumps(result, indent=1, default=str))
    store.record_stage(trial.id, "analyze", key, [str(out)])
    return result


def run_trial(store, trial, experiment, *, executor: str, runs_root: Path, study: str,
              bank_dir: Path | None = None, hang_timeout_s: float = 600.0) -> Outcome:
    """All stages of one trial; the outcome the tuner judges."""
    folder = trial_folder(runs_root, study, trial)
    render(store, trial, experiment, folder)
    status, message = submit_and_wait(store, trial, experiment, folder, executor, bank_dir,
                                      hang_timeout_s)
    log = folder / "log.txt"
    last = log.read_text(errors="replace").splitlines()[-10:] if log.exists() else []
    if status == "skipped":
        return Outcome("skipped", error=message)
    if status == "hung":
        return Outcome("hung", error=message, last_lines=last)
    export(store, trial, folder)
    try:
        result = analyze(store, trial, folder, experiment)
    except Exception as e:
        return Outcome("failed", error=message or str(e), last_lines=last)
    failure = (result.get("log") or {}).get("failure")
    if failure == "nccl_timeout":
        return Outcome("hung", result, "NCCL watchdog timeout in the log", last)
    if failure == "oom":
        return Outcome("oom", result, "out of memory", last)
    step = (result.get("metrics") or {}).get("combined", {}).get("step_time_ms")
    if status != "ok" or failure or not step:
        return Outcome("failed", result, message or failure or "no step time in trace or log", last)
    return Outcome("completed", result, None, last)


def _now() -> str:
    from pipeline.store import now
    return now()
