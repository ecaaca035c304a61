"""Experiments: one YAML per model and cluster (experiments/NAME.yaml), validated once into the
typed `Experiment` that every layer takes; a study's stored copy reads back into the same model.

A wrong field raises ConfigError naming the file, the key and what is allowed.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moetune.errors import MoetuneError
from moetune.experiment import gpus
from moetune.experiment.config import TrainingConfig
from moetune.experiment.extra_args import check as check_extra_args
from moetune.experiment.model import ModelArch
from moetune.paths import EXPERIMENTS

GpuType = Literal[gpus.GPU_TYPES]  # type: ignore[valid-type]


class ConfigError(MoetuneError):
    """A malformed experiment (one line: file, key, what is allowed)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Postprocess(_Strict):
    """A trial's export and per-rank metrics (moetune/job/postprocess.py): `job`, a CPU job of
    its own after the trial's (on Slurm); `login`, in the tuner's process."""
    where: Literal["job", "login"] = "job"
    partition: str | None = None  # else the cluster's
    account: str | None = None
    time_limit: str = "00:30:00"
    mem: str = "4G"  # per CPU
    cpus_per_task: int = Field(default=1, gt=0)


class Cluster(_Strict):
    """Where and how trials run. Every job-script default lives here, once; job/render.py reads
    this model, never a default of its own. The world size is `world`, computed here only."""
    name: str = "local"
    """The cluster's name in the store: preflights and rules not applied are kept per name."""
    executor: Literal["slurm", "local"] = "slurm"
    """Where jobs go: Slurm's sbatch, or processes on this machine (submitit's local executor)."""
    partition: str | None = None
    """Slurm partition of the trials' jobs; None: the site's default partition."""
    account: str | None = None
    """Slurm account charged; None: the user's default account."""
    wckey: str | None = None
    """Slurm wckey, for clusters that enforce them; None sends none."""
    nodes: int = Field(default=1, gt=0)
    """Nodes of one trial's job."""
    gpus_per_node: int = Field(default=8, ge=0)
    """GPUs of one node a job uses; 0: the CPU stand-in's nodes (ranks are then ntasks_per_node).
    The default, 8, is an HGX node's."""
    gpu_type: GpuType = "H100"
    """The GPU model (experiment/gpus.py): its memory, generation and rates."""
    nvlink_domain: int = Field(default=8, gt=0)
    """GPUs one NVLink domain joins (8 on HGX, 72 on GB200 NVL72); beyond it traffic goes by network."""
    time_limit: str | int = "00:30:00"
    """A trial job's wall-clock limit: "HH:MM:SS", "MM:SS", "D-HH:MM:SS" or whole minutes."""
    # resources as NVIDIA's Slurm launchers ask for them (Megatron-Bridge's scripts/performance
    # executors): whole nodes, all their memory, the node's CPUs shared out
    # among its ranks, each rank bound to its GPU's NUMA node
    exclusive: bool = True
    """Whole nodes (--exclusive)."""
    mem: str | None = "0"
    """--mem per node; "0" is all of it; None sends no --mem."""
    cpus_per_task: int | None = Field(default=None, gt=0)
    """CPUs of one rank; None: the node's CPUs shared out among its ranks."""
    cpu_bind: Literal["numa", "none"] = "numa"
    """Each rank bound to its GPU's NUMA node, or not bound."""
    gres: str | None = None
    """--gres (e.g. "gpu:8"), for clusters that need it beside --gpus-per-node; None sends none."""
    ntasks_per_node: int | None = None
    """Ranks of one node; None: one per GPU (one for a node without GPUs)."""
    template: Literal["container", "venv", "oci"] = "container"
    """The job script's kind: a pyxis/enroot container, a Python environment, or an OCI bundle."""
    container_image: str | None = None
    """The image of template "container" (required there)."""
    container_bundle: str | None = None
    """Template "oci": an OCI bundle (config.json + rootfs/) for Slurm's own srun --container
    (runc), where pyxis cannot run (CI: scripts/oci-bundle)."""
    container_mounts: list[str] = []
    """Mounts of the container, "SRC:DST[:FLAGS]"; none by default."""
    container_writable: bool = False
    """A writable container root, for Enroot set-ups whose default is read-only
    (ENROOT_ROOTFS_WRITABLE=no)."""
    venv: str | None = None
    """Template "venv": the environment activated; None: the interpreter running moetune."""
    modules: list[str] = []
    """Environment modules loaded before the job runs (`module load`); none by default."""
    python: str | None = None
    """The interpreter of the job; None: the container's or venv's `python`."""
    megatron_path: str | None = None
    """A Megatron-LM source tree inside the image (NeMo images carry one), first on PYTHONPATH;
    None: the installed megatron-core."""
    workdir: str | None = None
    """Where the job starts; None: the folder moetune runs in."""
    has_transformer_engine: bool | None = None
    """The image has Transformer Engine; None: what the preflight probed (else assumed yes)."""
    has_deep_ep: bool | None = None
    """The image has DeepEP usable across this cluster's nodes; None: the preflight's (else no)."""
    has_hybrid_ep: bool | None = None
    """DeepEP was built with HybridEP; None: the preflight's (else no)."""
    has_apex: bool | None = None
    """The image has apex's fused kernels (NVIDIA's PyTorch containers do); None: the preflight's
    (else assumed yes)."""
    gpu_memory_gb: float | None = None
    """One GPU's usable memory (GB); None: gpu_type's data sheet (experiment/gpus.py)."""
    workload: Literal["megatron", "cpu_stand_in"] = "megatron"
    """What each rank runs: Megatron's training, or the CPU stand-in that mimics its trace."""
    stand_in: dict = {}
    """The CPU stand-in's knobs (ms_per_iter, busy, alloc_mb, ...); empty by default."""
    profile_ranks: list[int] = [0, 1]
    """Ranks traced by nsys. Two by default: with one rank traced, its all-to-all kernels waiting
    for a late peer cannot be told from transfer (moetune/analysis/skew.py), and a host stall
    reads as communication."""
    nsys: str = "nsys"
    """The nsys binary in the job; "off" traces nothing."""
    env: dict[str, str] = {}
    """Environment variables set in every job; none by default."""
    postprocess: Postprocess = Postprocess()
    """Where a trial's export and per-rank metrics run, and with what."""

    @property
    def gpus(self) -> int:
        """GPUs the cluster's jobs hold: nodes x gpus_per_node (0 on the CPU stand-in's nodes)."""
        return self.nodes * self.gpus_per_node

    @property
    def world(self) -> int:
        """The world size of a trial's training: its ranks, one per GPU (nodes x gpus_per_node);
        on nodes without GPUs, ntasks_per_node (else one) on each node."""
        return self.nodes * (self.gpus_per_node or self.ntasks_per_node or 1)

    def with_gpus(self, gpus: int) -> Cluster:
        """The cluster cut to `gpus` GPUs: part of one node (a --gpus below a node's, or one GPU
        for a one-GPU study), else whole nodes of gpus_per_node each."""
        per_node = min(gpus, self.gpus_per_node) if self.gpus_per_node else gpus
        return self.model_copy(update={"nodes": max(1, gpus // per_node), "gpus_per_node": per_node})

    @property
    def memory_gb(self) -> float:
        """One GPU's memory (GB): gpu_memory_gb, else the GPU type's."""
        return self.gpu_memory_gb or gpus.GPUS[self.gpu_type].memory_gb

    @property
    def generation(self) -> str:
        """The GPU type's architecture generation (e.g. "hopper")."""
        return gpus.GPUS[self.gpu_type].generation


class Tuning(_Strict):
    """The tuning loop's budget and its judging of a change (tune/loop.py)."""
    budget_trials: int = Field(default=12, gt=0)
    """Trials the study runs at most (the baseline counts); `moetune tune --max-trials` overrides it."""
    budget_gpu_hours: float = Field(default=100.0, gt=0)
    """GPU-hours the study may spend, whole jobs (each trial's job and fit, the preflight), before
    it stops; `moetune tune --max-gpu-hours` overrides it."""
    noise_threshold: float = Field(default=0.02, ge=0, lt=1)
    """The least relative gain in step time that counts (0.02: 2 %)."""
    significance: float = Field(default=0.05, gt=0, lt=0.5)
    """The rank test's p-value below which a gain is real."""
    patience: int = Field(default=3, gt=0)
    """Trials in a row without a kept change before the study stops."""
    hang_timeout_s: float = Field(default=900.0, gt=0)
    """Seconds a running job may go without progress before it is judged hung and cancelled."""
    allow_token_drop: bool = False
    """Propose token drop (capacity factor): it changes the model's quality, so opt in."""
    fit_first: bool | None = None
    """Fit each multi-GPU layout on one GPU before it is submitted (experiment/fit.py); None: when
    the workload is a real training (the CPU stand-in's memory means nothing)."""
    one_gpu: bool = False
    """Every trial on one GPU: one rank of the layout alone (the slowest MoE stage the fit
    measured) under Megatron's fake process group, its compute and host overhead at the
    production shapes, collectives skipped (experiment/fit.py one_gpu_config); a study for the
    walls one rank shows, before the cluster is touched."""
    one_gpu_samples: int | None = Field(default=None, gt=0)
    """Sequences per data-parallel rank in a one-GPU step; None: the least that every PP and micro
    batch the study's rules can propose runs comparably (decide/one_gpu.py), fixed at its start."""
    predict_moves: bool = True
    """Try layout and dispatcher moves in order of the step-time model's prediction, and do not
    submit those it predicts slower than the incumbent beyond noise_threshold (tune/predicted.py)."""

    @classmethod
    def from_stored(cls, section: dict | None, where: str = "stored experiment") -> Tuning:
        """A study's stored tuning section as the model: a key stored as None takes the schema's
        default, one an older schema had and left unset is dropped. ConfigError (one line) otherwise."""
        try:
            return cls.model_validate(_known(section, cls, drop_none=True))
        except ValidationError as e:
            raise ConfigError(f"{where}: {one_line(e, 'tuning')}") from None


class ExperimentFile(_Strict):
    """An experiment's YAML as written (experiments/NAME.yaml)."""
    name: str
    """The experiment's name: its studies are named by it."""
    description: str = ""
    """One line on what the experiment is for; empty by default."""
    model: ModelArch
    """The model's architecture (experiment/model.py)."""
    cluster: Cluster
    """Where and how its trials run."""
    tuning: Tuning = Tuning()
    """The tuning loop's budget and judging; the schema's defaults where absent."""
    baseline: dict = {}
    """The first trial's TrainingConfig fields where they differ from its defaults."""
    extra_args: list[str] = []
    """Megatron flags moetune does not model, added to every trial's command line as written and
    not priced (experiment/extra_args.py); none by default."""


class Experiment(ExperimentFile):
    """A loaded experiment, validated once (load_experiment, or from_stored for a study's copy)
    and passed as this model everywhere."""
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    baseline: TrainingConfig = TrainingConfig()  # type: ignore[assignment]  # the file's dict, parsed
    """The first trial's training configuration (experiment/config.py)."""
    path: Path | None = None
    """The YAML it was loaded from; None for one read back from the store."""

    def to_stored(self) -> dict:
        """The experiment as a study's record keeps it (JSON): `experiment` (its name), `model`,
        `cluster`, `tuning`, `baseline`."""
        return {"experiment": self.name, "model": self.model.to_dict(), "cluster": self.cluster.model_dump(),
                "tuning": self.tuning.model_dump(), "baseline": self.baseline.to_dict(),
                **({"extra_args": list(self.extra_args)} if self.extra_args else {})}

    @classmethod
    def from_stored(cls, record: dict) -> Experiment:
        """A study's stored experiment (to_stored's dict, the store's JSON) as the typed model.
        Keys an older schema had and left unset are dropped (a set one must still be known); a
        tuning key stored as None takes the schema's default. ConfigError (one line) otherwise."""
        name = str(record.get("experiment") or (record.get("model") or {}).get("name") or "stored")
        tuning = Tuning.from_stored(record.get("tuning"), f"stored experiment {name}")
        try:
            model = ModelArch.from_dict(record.get("model") or {})
            baseline = TrainingConfig.from_dict(record.get("baseline") or {})
        except (TypeError, ValueError) as e:
            raise ConfigError(f"stored experiment {name}: {e}") from None
        return cls(name=name, model=model, cluster=cluster_section(record.get("cluster") or {}),
                   tuning=tuning, baseline=baseline, extra_args=list(record.get("extra_args") or []))


# keys a stored study may hold that the schema dropped (they never changed a job): read past
REMOVED = {"profiled_steps"}


def _known(section: Any, schema: type[BaseModel], drop_none: bool = False) -> dict:
    """A stored section's keys the schema knows, and any unknown one that is set (to be refused)
    but those the schema removed."""
    return {k: v for k, v in dict(section or {}).items() if k not in REMOVED
            and (k in schema.model_fields or v is not None) and not (drop_none and v is None)}


def experiment_path(name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    return EXPERIMENTS / f"{name_or_path}.yaml"


def list_experiments() -> list[str]:
    return sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))


def _where(err: dict) -> str:
    return ".".join(str(x) for x in err["loc"])


def _keys(section: str | None) -> list[str]:
    if section == "model":
        return [f.name for f in dataclasses.fields(ModelArch)]
    return list({"cluster": Cluster, "tuning": Tuning, "cluster.postprocess": Postprocess}
                .get(section, ExperimentFile).model_fields)


def one_line(e: ValidationError, section: str = "") -> str:
    """pydantic's first error as `key: what is wrong; what is allowed`. `section`: where the
    validated data sits in an experiment file (e.g. "cluster")."""
    err = dict(e.errors()[0])
    err["loc"] = tuple(section.split(".") if section else ()) + tuple(err["loc"])
    allowed = ""
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        where = ".".join(map(str, err["loc"][:-1])) or None
        allowed = f"; allowed keys: {', '.join(_keys(where))}"
    msg = err["msg"]
    if err["type"] == "literal_error":  # pydantic's message already lists what is allowed
        msg = f"{err.get('input')!r} is not allowed; use one of {err['ctx']['expected']}"
    return f"{_where(err)}: {msg}{allowed}"


def cluster_section(cluster: Cluster | dict) -> Cluster:
    """A cluster section as the schema's model: a stored study keeps a dict (keys an older schema
    had and left unset are dropped, a set one must still be known)."""
    if isinstance(cluster, Cluster):
        return cluster
    try:
        return Cluster.model_validate(_known(cluster, Cluster))
    except ValidationError as e:
        raise ConfigError(one_line(e, "cluster")) from None


# names become folder and file names (runs/<study>/, reports/<study>.md): no separator, no parent
NAME = re.compile(r"[A-Za-z0-9._-]+")
NAME_ALLOWED = "letters, digits, '.', '_' and '-' only, and no '..'"


def check_name(value: str, where: str) -> str:
    """`value` where it is a name that becomes a folder or file name; ConfigError (one line, naming
    `where` and what is allowed) otherwise."""
    if not NAME.fullmatch(value) or ".." in value or value == ".":
        raise ConfigError(f"{where} {value!r}: a name takes {NAME_ALLOWED}")
    return value


def load_experiment(name_or_path: str | Path) -> Experiment:
    """The experiment of experiments/NAME.yaml (or a YAML path), validated into its typed model."""
    path = experiment_path(name_or_path)
    if not path.exists():
        raise ConfigError(f"{path}: no such experiment; known: {', '.join(list_experiments())}")
    if not path.is_file():
        raise ConfigError(f"{path}: not a file; give an experiment's YAML file or its name")
    try:
        raw = yaml.safe_load(path.read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not text (not UTF-8); give an experiment's YAML file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{at} not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with name, model, cluster, tuning, baseline")
    if isinstance(raw.get("tuning"), dict) and "profiled_steps" in raw["tuning"]:
        raise ConfigError(f"{path}: tuning.profiled_steps is not a key (it never reached a job): the "
                          "profiled steps are baseline.profile_step_start to profile_step_end - 1; "
                          "remove it and set those")
    try:
        data = ExperimentFile.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"{path}: {one_line(e)}") from None
    # checked here, where a name enters, and not in the model: a stored study may name its
    # experiment by the path it was loaded from (Experiment.from_stored)
    check_name(data.name, f"{path}: name")
    check_name(data.cluster.name, f"{path}: cluster.name")
    try:
        baseline = TrainingConfig.from_dict(data.baseline)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: baseline: {e}") from None
    try:
        extra = check_extra_args(data.extra_args, f"{path}: extra_args")
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return Experiment(name=data.name, description=data.description, model=data.model, cluster=data.cluster,
                      tuning=data.tuning, baseline=baseline, extra_args=extra, path=path)
