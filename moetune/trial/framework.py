"""The stage framework, knowing no stage by name: a `Stage` is a function from files in a trial
folder to files out, with a function naming its inputs; `run(store, trial_id, stage)` records each
run in the store with the hash of those inputs (names and contents) and skips a stage whose last
good run had the same hash and whose outputs are all there, unless forced. What differs between
stages is data on the `Stage` (which options it takes, whether a forced run is told so), never a
test of its name here. The stages themselves are trial/stages.py.

The trial folder is `trial.folder` once rendered, else `<runs_root>/<study>/<trial id>/`; its file
names are job/paths.py `TrialPaths`. The experiment comes from the study's `experiment` record: its
`model` and `cluster` sections where they are stored there, else loaded by its `experiment` name.
"""
from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moetune import settings
from moetune.errors import MoetuneError
from moetune.experiment.placement import Placement
from moetune.experiment.schema import Experiment, Tuning, load_experiment
from moetune.job.paths import TrialPaths
from moetune.paths import trial_folder
from moetune.store import Study, now


class StageError(MoetuneError):
    """A stage cannot run or failed (one line: which trial, which stage, what to do)."""


class NotReady(StageError):
    """The job has not ended yet; collect again later (not a failure, not recorded)."""


# -- hashing and currency ----------------------------------------------------------------------
def file_hash(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def inputs_hash(stage: str, files: list[Path], extra: Any = None) -> str:
    h = hashlib.sha256(stage.encode())
    for p in sorted(files, key=lambda p: p.name):
        h.update(f"\0{p.name}\0{file_hash(p)}".encode())
    h.update(json.dumps(extra, sort_keys=True, default=str).encode())
    return h.hexdigest()[:32]


def current(store, trial_id: int, stage: str, key: str):
    run = store.last_stage(trial_id, stage)
    if run and run.inputs_hash == key and all(Path(p).exists() for p in run.outputs):
        return run
    return None


# the decisions that name a trial before the tuner judged it (tune/state.py JUDGED: the others)
OPEN_KINDS = ("apply", "retry")


# -- the trial's context -----------------------------------------------------------------------
class TrialContext:
    """One trial with what its stages read: store rows, experiment parts, folder and its files."""

    def __init__(self, store, trial_id: int, runs_root: str | Path | None = None,
                 executor: str | None = None):
        self.store = store
        self.row = store.trial(trial_id)
        with store.session() as s:
            self.study = s.get(Study, self.row.study_id)
        self.experiment = dict(self.study.experiment or {})
        self.folder = trial_folder(runs_root or settings.runs(), self.study.name, self.row)
        self.paths = TrialPaths(self.folder)
        self.executor = executor or self.experiment.get("executor") or "auto"

    @property
    def id(self) -> int:
        return self.row.id

    def need(self, path: Path, stage: str) -> Path:
        """A file of the trial's folder that `stage` writes, or a line saying to run that first."""
        if not path.exists():
            raise StageError(f"trial {self.id}: {path} is missing; run `moetune stage {stage} "
                             f"--trial {self.id}` first")
        return path

    @functools.cached_property
    def bank(self) -> Path | None:
        """The trial bank a replayed (demo) study plays back, None outside one: the bank its last
        submit named (job.json), else the study record's, else the default bank."""
        if not self.experiment.get("replay"):
            return None
        job = self.paths.job
        named = json.loads(job.read_text()).get("bank") if job.exists() else None
        return Path(named or self.experiment.get("bank") or settings.bank())

    @property
    def judged(self) -> bool:
        """The tuner has judged the trial: its row is the study's record, which a stage run by
        hand keeps (a decision other than OPEN_KINDS names it)."""
        return any(d.trial_id == self.id and d.kind not in OPEN_KINDS
                   for d in self.store.decisions(self.study.id))

    @functools.cached_property
    def exp(self) -> Experiment:
        """The study's experiment, typed: its stored record, else (a record without model and
        cluster) the experiment its `experiment` name loads, under the record's tuning if stored."""
        rec = self.experiment
        if isinstance(rec.get("model"), dict) and isinstance(rec.get("cluster"), dict):
            return Experiment.from_stored(rec)
        loaded = load_experiment(rec.get("experiment") or self.study.model)
        if isinstance(rec.get("tuning"), dict):
            loaded.tuning = Tuning.from_stored(rec["tuning"])
        return loaded

    def model_and_cluster(self):
        """(ModelArch, Cluster) of the study's experiment."""
        return self.exp.model, self.exp.cluster

    @functools.cached_property
    def placement(self) -> Placement:
        """Where the study's trials run, as decided at its start (experiment/placement.py): one GPU
        runs every trial as one rank of its layout alone (stages.one_gpu_rank)."""
        return Placement.of_study(self.experiment, self.exp.cluster.world)

    def job_name(self) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.study.name)
        # the folder's hash keeps two stores' trials of one study name apart in Slurm
        where = hashlib.sha256(str(self.folder).encode()).hexdigest()[:8]
        return f"moetune.{safe[:60]}.t{self.id}.{where}"


# -- a stage and one run of it -----------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    name: str
    inputs: Callable[..., tuple[list[Path], Any]]  # (t, **input_options) -> (files, extra)
    do: Callable[..., list[Path]]  # (t, **options) -> output paths
    options: tuple[str, ...] = ()  # the run's options passed on to `do`
    input_options: tuple[str, ...] = ()  # those that also change what its inputs are
    takes_force: bool = False  # `do` is told when the run is forced (it sets an attempt aside...)


def run(store, trial_id: int, stage: Stage, force: bool = False, *,
        runs_root: str | Path | None = None, executor: str | None = None,
        **options: Any) -> list[str]:
    """Run one stage of one trial (skipped when current unless force); its output paths. Raises
    StageError (NotReady for a job still running: not recorded)."""
    t = TrialContext(store, trial_id, runs_root, executor)
    files, extra = stage.inputs(t, **{k: options[k] for k in stage.input_options if options.get(k)})
    key = inputs_hash(stage.name, files, extra)
    done = current(store, trial_id, stage.name, key)
    if done and not force:
        return list(done.outputs)
    kwargs = {k: v for k, v in options.items() if k in stage.options}
    if stage.takes_force:
        kwargs["force"] = force
    started = now()
    t.folder.mkdir(parents=True, exist_ok=True)
    try:
        outputs = stage.do(t, **kwargs)
    except NotReady:
        raise
    except MoetuneError as e:
        store.record_stage(trial_id, stage.name, key, [], status="failed", error=str(e), started_at=started)
        raise StageError(str(e)) from None
    store.record_stage(trial_id, stage.name, key, [str(p) for p in outputs], started_at=started)
    return [str(p) for p in outputs]
