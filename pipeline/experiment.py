"""Experiments: one YAML per model and cluster (experiments/NAME.yaml), validated with a schema.

A wrong field raises ConfigError naming the file, the key and what is allowed.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.config import TrainingConfig
from pipeline.model import ModelArch

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "experiments"

GPU_MEMORY_GB = {"H100": 80.0, "H200": 141.0, "B200": 180.0, "GB200": 186.0, "GB300": 279.0}
GPU_GENERATION = {"H100": "hopper", "H200": "hopper", "B200": "blackwell", "GB200": "blackwell",
                  "GB300": "blackwell"}


class ConfigError(Exception):
    """A malformed experiment (one line: file, key, what is allowed)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSection(_Strict):
    name: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_query_groups: int = Field(gt=0)
    ffn_hidden_size: int = Field(gt=0)
    moe_ffn_hidden_size: int = Field(gt=0)
    num_experts: int = Field(gt=1)
    moe_router_topk: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    seq_length: int = Field(gt=0)
    kv_channels: int | None = None
    moe_shared_expert_intermediate_size: int | None = None
    first_dense_layers: int = Field(default=0, ge=0)
    qk_layernorm: bool = False
    multi_latent_attention: bool = False
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_head_dim: int | None = None
    qk_pos_emb_head_dim: int | None = None
    v_head_dim: int | None = None
    rotary_base: int = 10000
    moe_router_score_function: Literal["softmax", "sigmoid"] = "softmax"
    mtp_num_layers: int = Field(default=0, ge=0)
    untie_embeddings: bool = True
    moe_router_num_groups: int | None = Field(default=None, gt=0)
    moe_router_group_topk: int | None = Field(default=None, gt=0)
    moe_router_topk_scaling_factor: float | None = Field(default=None, gt=0)
    moe_router_enable_expert_bias: bool = False


class Cluster(_Strict):
    name: str = "local"
    executor: Literal["slurm", "local"] = "slurm"
    partition: str | None = None
    account: str | None = None
    nodes: int = Field(default=1, gt=0)
    gpus_per_node: int = Field(default=8, gt=0)
    gpu_type: Literal["H100", "H200", "B200", "GB200", "GB300"] = "H100"
    nvlink_domain: int = Field(default=8, gt=0)
    container_image: str | None = None
    container_mounts: list[str] = []
    time_limit: str = "00:30:00"
    template: Literal["container", "venv"] = "container"
    venv: str | None = None
    modules: list[str] = []
    has_transformer_engine: bool = True
    has_deep_ep: bool = False
    has_hybrid_ep: bool = False  # deep_ep built with HybridEP
    has_apex: bool = True  # apex's fused kernels (NVIDIA's PyTorch containers have them)
    gpu_memory_gb: float | None = None
    mem_per_node: str | None = None
    # job-script knobs read by pipeline/render.py
    workload: Literal["megatron", "cpu_stand_in"] = "megatron"
    stand_in: dict = {}
    # two ranks by default: with one rank traced, its all-to-all kernels waiting for a late peer
    # cannot be told from transfer (analysis/skew.py), and a host stall reads as communication
    profile_ranks: list[int] = [0, 1]
    nsys: str = "nsys"
    env: dict[str, str] = {}
    cpus_per_task: int | None = None
    ntasks_per_node: int | None = None
    python: str | None = None

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def memory_gb(self) -> float:
        return self.gpu_memory_gb or GPU_MEMORY_GB[self.gpu_type]

    @property
    def generation(self) -> str:
        return GPU_GENERATION[self.gpu_type]


class Tuning(_Strict):
    budget_trials: int = Field(default=12, gt=0)
    budget_gpu_hours: float = Field(default=100.0, gt=0)
    profiled_steps: int = Field(default=3, gt=0)
    noise_threshold: float = Field(default=0.02, ge=0, lt=1)  # least relative gain that counts
    significance: float = Field(default=0.05, gt=0, lt=0.5)  # rank test's p below which a gain is real
    patience: int = Field(default=3, gt=0)
    hang_timeout_s: float = Field(default=900.0, gt=0)
    allow_token_drop: bool = False  # token drop changes the model's quality: opt in


class ExperimentFile(_Strict):
    name: str
    description: str = ""
    model: ModelSection
    cluster: Cluster
    tuning: Tuning = Tuning()
    baseline: dict = {}


class Experiment:
    """A loaded experiment: model architecture, cluster, tuning budget and baseline config."""

    def __init__(self, path: Path, data: ExperimentFile, baseline: TrainingConfig):
        self.path = path
        self.name = data.name
        self.description = data.description
        self.model = ModelArch.from_dict(data.model.model_dump())
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
        err = e.errors()[0]
        allowed = ""
        if err["type"] == "extra_forbidden":
            section = err["loc"][0] if len(err["loc"]) > 1 else None
            model = {"model": ModelSection, "cluster": Cluster, "tuning": Tuning}.get(section, ExperimentFile)
            allowed = f"; allowed keys: {', '.join(model.model_fields)}"
        msg = err["msg"]
        if err["type"] == "literal_error":  # pydantic's message already lists what is allowed
            msg = f"{err.get('input')!r} is not allowed; use one of {err['ctx']['expected']}"
        raise ConfigError(f"{path}: {_where(err)}: {msg}{allowed}") from None
    try:
        baseline = TrainingConfig.from_dict(data.baseline)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{path}: baseline: {e}") from None
    return Experiment(path, data, baseline)
