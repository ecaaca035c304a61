"""Experiments: one YAML per model and cluster (experiments/NAME.yaml), validated with a schema.

A wrong field raises ConfigError naming the file, the key and what is allowed.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moetune.errors import MoetuneError
from moetune.paths import EXPERIMENTS
from moetune.experiment import gpus
from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch
from moetune.experiment.section import as_dict, get, gpu_count

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
    this model, never a default of its own."""
    name: str = "local"
    executor: Literal["slurm", "local"] = "slurm"
    partition: str | None = None
    account: str | None = None
    wckey: str | None = None  # clusters that enforce wckeys; none is sent unless named
    nodes: int = Field(default=1, gt=0)
    gpus_per_node: int = Field(default=8, ge=0)  # 0: the CPU stand-in's nodes
    gpu_type: GpuType = "H100"
    nvlink_domain: int = Field(default=8, gt=0)
    time_limit: str | int = "00:30:00"  # "HH:MM:SS", "MM:SS", "D-HH:MM:SS" or whole minutes
    # resources as NVIDIA's Slurm launchers ask for them (Megatron-Bridge's scripts/performance
    # executors): whole nodes, all their memory, the node's CPUs shared out
    # among its ranks, each rank bound to its GPU's NUMA node
    exclusive: bool = True
    mem: str | None = "0"  # --mem per node; "0" is all of it; None sends no --mem
    cpus_per_task: int | None = Field(default=None, gt=0)  # None: the node's CPUs / ranks per node
    cpu_bind: Literal["numa", "none"] = "numa"
    gres: str | None = None  # e.g. "gpu:8", for clusters that need --gres beside --gpus-per-node
    ntasks_per_node: int | None = None
    template: Literal["container", "venv", "oci"] = "container"
    container_image: str | None = None
    # template "oci": an OCI bundle (config.json + rootfs/) for Slurm's own srun --container
    # (runc), where pyxis cannot run (CI: scripts/oci-bundle)
    container_bundle: str | None = None
    container_mounts: list[str] = []
    # Enroot set-ups whose default root file system is read-only (ENROOT_ROOTFS_WRITABLE=no)
    container_writable: bool = False
    venv: str | None = None
    modules: list[str] = []
    python: str | None = None
    # a Megatron-LM source tree inside the image (NeMo images carry one); first on PYTHONPATH
    megatron_path: str | None = None
    workdir: str | None = None  # where the job starts; None: the folder moetune runs in
    # what the image holds; None: what the preflight probed (explicit values override it)
    has_transformer_engine: bool | None = None
    has_deep_ep: bool | None = None
    has_hybrid_ep: bool | None = None  # deep_ep built with HybridEP
    has_apex: bool | None = None  # apex's fused kernels (NVIDIA's PyTorch containers have them)
    gpu_memory_gb: float | None = None
    # job-script knobs read by job/render.py
    workload: Literal["megatron", "cpu_stand_in"] = "megatron"
    stand_in: dict = {}
    # two ranks by default: with one rank traced, its all-to-all kernels waiting for a late peer
    # cannot be told from transfer (moetune/analysis/skew.py), and a host stall reads as communication
    profile_ranks: list[int] = [0, 1]
    nsys: str = "nsys"
    env: dict[str, str] = {}
    postprocess: Postprocess = Postprocess()

    @property
    def gpus(self) -> int:
        return gpu_count(self)

    @property
    def memory_gb(self) -> float:
        return self.gpu_memory_gb or gpus.GPUS[self.gpu_type].memory_gb

    @property
    def generation(self) -> str:
        return gpus.GPUS[self.gpu_type].generation


class Tuning(_Strict):
    budget_trials: int = Field(default=12, gt=0)
    budget_gpu_hours: float = Field(default=100.0, gt=0)
    profiled_steps: int = Field(default=3, gt=0)
    noise_threshold: float = Field(default=0.02, ge=0, lt=1)  # least relative gain that counts
    significance: float = Field(default=0.05, gt=0, lt=0.5)  # rank test's p below which a gain is real
    patience: int = Field(default=3, gt=0)
    hang_timeout_s: float = Field(default=900.0, gt=0)
    allow_token_drop: bool = False  # token drop changes the model's quality: opt in
    # fit each multi-GPU layout on one GPU before it is submitted (experiment/fit.py); None: when the
    # workload is a real training (the CPU stand-in's memory means nothing)
    fit_first: bool | None = None
    # every trial on one GPU: one rank of the layout alone (the slowest MoE stage the fit
    # measured) under Megatron's fake process group, its compute and host overhead at the
    # production shapes, collectives skipped (experiment/fit.py one_gpu_config); a study for the walls
    # one rank shows, before the cluster is touched
    one_gpu: bool = False
    # sequences per data-parallel rank in a one-GPU step; None: the least that every PP and micro
    # batch the study's rules can propose runs comparably (decide/one_gpu.py), fixed at its start
    one_gpu_samples: int | None = Field(default=None, gt=0)
    # layout and dispatcher moves tried in order of the step-time model's prediction, and those it
    # predicts slower than the incumbent beyond noise_threshold not submitted (tune/predicted.py)
    predict_moves: bool = True


def tuning_value(tuning, key: str, override=None):
    """A tuning section's value (a Tuning, or the dict a study's record keeps); the schema's
    default where the section lacks it."""
    if override is not None:
        return override
    v = get(tuning, key)
    return Tuning.model_fields[key].default if v is None else v


class ExperimentFile(_Strict):
    name: str
    description: str = ""
    model: ModelArch
    cluster: Cluster
    tuning: Tuning = Tuning()
    baseline: dict = {}


class Experiment:
    """A loaded experiment: model architecture, cluster, tuning budget and baseline config."""

    def __init__(self, path: Path, data: ExperimentFile, baseline: TrainingConfig):
        self.path = path
        self.name = data.name
        self.description = data.description
        self.model = data.model
        self.cluster = data.cluster
        self.tuning = data.tuning
        self.baseline = baseline


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


def cluster_section(cluster) -> Cluster:
    """A cluster section as the schema's model, whatever holds it (a stored study keeps a dict;
    keys an older schema had and left unset are dropped, a set one must still be known)."""
    if isinstance(cluster, Cluster):
        return cluster
    data = {k: v for k, v in as_dict(cluster).items() if k in Cluster.model_fields or v is not None}
    try:
        return Cluster.model_validate(data)
    except ValidationError as e:
        raise ConfigError(one_line(e, "cluster")) from None


def load_experiment(name_or_path: str | Path) -> Experiment:
    path = experiment_path(name_or_path)
    if not path.exists():
        raise ConfigError(f"{path}: no such experiment; known: {', '.join(list_experiments())}")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{at} not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with name, model, cluster, tuning, baseline")
    try:
        data = ExperimentFile.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(f"{path}: {one_line(e)}") from None
    try:
        baseline = TrainingConfig.from_dict(data.baseline)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: baseline: {e}") from None
    return Experiment(path, data, baseline)
