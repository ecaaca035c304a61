"""A trial's training configuration and its Megatron-LM command line, both ways.

`FLAGS` is the one table that ties each field to its Megatron flag; rendering and parsing both
read it, so a field can't be rendered one way and parsed another.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from moetune.experiment.model import ModelArch
from moetune.experiment.pipeline import LayoutError, layout_stages

DISPATCHERS = ("alltoall", "allgather", "flex")
FLEX_BACKENDS = ("deepep", "hybridep")
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
# what Megatron's TransformerConfig recomputes when selective recompute names no modules
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                   "moe_act", "fused_group_mlp")
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess")
FP8_RECIPES = ("tensorwise", "delayed", "blockwise", "mxfp8")
# Megatron FSDP's --data-parallel-sharding-strategy values, least sharded first (megatron-core 0.19)
FSDP_SHARDING = ("no_shard", "optim", "optim_grads", "optim_grads_params")


@dataclass(frozen=True)
class TrainingConfig:
    """Everything a trial may change. Defaults are Megatron's own unless noted."""

    tp: int = 1
    """Tensor-parallel size: ranks one layer's matrices are split over; 1 is no split."""
    pp: int = 1
    """Pipeline-parallel size: stages the layers are split into; 1 is no pipeline."""
    vpp: int | None = None
    """Virtual stages per pipeline rank (interleaved schedule); None: one, no interleaving."""
    first_pp_layers: int | None = None
    """Uneven pipeline: layers of the first stage; None: an even share."""
    last_pp_layers: int | None = None
    """Uneven pipeline: layers of the last stage; None: an even share."""
    account_for_embedding: bool = False
    """Count the embedding as a layer when splitting the layers over the stages (the first stage
    then builds one decoder layer fewer); off by default."""
    account_for_loss: bool = False
    """Count the loss (output layer) as a layer when splitting the layers over the stages (the last
    stage then builds one decoder layer fewer); off by default."""
    pp_layout: str | None = None
    """An explicit pipeline layout (--pipeline-model-parallel-layout: E embedding, t decoder layer,
    m MTP layer, L loss, | between stages, (...)*n repeats; PP x VPP stages); None: none. VPP is
    the layout's stages over PP, and vpp is kept equal to it."""
    cp: int = 1
    """Context-parallel size: ranks a sequence is split over; 1 is no split."""
    ep: int = 1
    """Expert-parallel size: ranks the experts are spread over; 1 is every expert on each rank."""
    etp: int | None = None
    """Expert tensor-parallel size; None follows Megatron (= tp)."""
    sequence_parallel: bool = False
    """Sequence parallelism inside the TP group (activations split by sequence); off by default."""
    micro_batch: int = 1
    """Sequences per micro batch on one data-parallel rank."""
    global_batch: int = 8
    """Sequences per training step, over all data-parallel ranks."""
    seq_length: int | None = None
    """Tokens per sequence; None: the model's seq_length."""
    dispatcher: str = "alltoall"
    """The MoE token dispatcher (alltoall, allgather, flex); alltoall is moetune's baseline,
    Megatron's default is allgather."""
    flex_backend: str | None = None
    """The flex dispatcher's backend (deepep, hybridep); None: none (not flex)."""
    deepep_num_sms: int | None = None
    """SMs DeepEP's kernels take; None: Megatron's default (20)."""
    hybridep_num_sms: int | None = None
    """SMs HybridEP's kernels take; None: Megatron's default (16)."""
    overlap_ep_a2a: bool = False
    """Overlap the expert all-to-all with compute (1F1B A2A overlap); off by default."""
    delay_wgrad: bool = False
    """Delay the expert weight-gradient GEMMs to overlap the all-to-all; off by default."""
    shared_expert_overlap: bool = False
    """Overlap the shared expert with the dispatch; off by default."""
    tp_comm_overlap: bool = False
    """Overlap TP communication with GEMMs (Transformer Engine userbuffers); off by default."""
    overlap_p2p_comm: bool = True
    """Overlap the pipeline's sends and receives with compute, Megatron's default; only the
    interleaved schedule (VPP) does (Megatron turns it off without virtual stages). False renders
    --no-overlap-p2p-communication."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduce with the backward pass; off by default."""
    overlap_param_gather: bool = False
    """Overlap the distributed optimizer's parameter all-gather with the forward; off by default."""
    distributed_optimizer: bool = False
    """Shard optimizer states over data-parallel ranks; off by default."""
    precision_aware_optimizer: bool = False
    """Optimizer states in lower precision (Transformer Engine's FusedAdam); off by default."""
    fsdp: bool = False
    """Megatron FSDP (--use-megatron-fsdp) in place of the data-parallel gradient reduce: what
    fsdp_sharding names is sharded over the data-parallel group and gathered layer by layer as the
    passes need it; Megatron then runs its distributed optimizer whatever distributed_optimizer
    says. Off by default."""
    fsdp_sharding: str = "optim_grads_params"
    """What Megatron FSDP shards over the data-parallel group (--data-parallel-sharding-strategy):
    optim_grads_params (everything, Megatron's default), optim_grads, optim or no_shard."""
    recompute_granularity: str | None = None
    """Activation recompute: selective or full; None: none."""
    recompute_modules: tuple[str, ...] = ()
    """Modules recomputed under selective recompute; empty: Megatron's default (core_attn)."""
    recompute_num_layers: int | None = None
    """Layers per recompute chunk under full recompute (uniform method); None: Megatron's default."""
    offload_modules: tuple[str, ...] = ()
    """Modules whose activations are offloaded to host memory; empty: none."""
    cuda_graph_impl: str = "none"
    """CUDA graph implementation (none, local, transformer_engine, full_iteration); none by default."""
    cuda_graph_modules: tuple[str, ...] = ()
    """Modules captured in CUDA graphs; empty: the implementation's default scope."""
    fp8_format: str | None = None
    """FP8 format (e4m3, hybrid); None: no FP8 (BF16)."""
    fp8_recipe: str | None = None
    """FP8 scaling recipe (tensorwise, delayed, blockwise, mxfp8); None: Megatron's default where
    FP8 is on."""
    grouped_gemm: bool = False
    """The experts' GEMMs as one grouped GEMM; off by default."""
    permute_fusion: bool = False
    """Fused token permute/unpermute kernels; off by default."""
    router_fusion: bool = False
    """Fused router kernels (top-k, score); off by default."""
    cross_entropy_fusion: bool = False
    """Fused cross-entropy loss kernel; off by default."""
    router_dtype: str | None = None
    """The router's compute precision (fp32, fp64); None: the model's (BF16)."""
    force_balance: bool = False
    """Route tokens evenly regardless of the router (a benchmark's static routing); off by default."""
    capacity_factor: float | None = None
    """Expert capacity factor: tokens beyond it are dropped; None: dropless."""
    pad_to_capacity: bool = False
    """Pad each expert's tokens to its capacity (drop-and-pad); off by default."""
    manual_gc: bool = False
    """Python's garbage collector run by Megatron at fixed steps, not at random; off by default."""
    manual_gc_interval: int | None = None
    """Steps between manual collections; None: Megatron's default."""
    transformer_impl: str = "transformer_engine"
    """Layer implementation: transformer_engine, or local where TE is absent."""
    train_iters: int = 20
    """Training steps a trial runs."""
    profile_step_start: int = 10
    """The first step traced by nsys."""
    profile_step_end: int = 13
    """The step at which tracing stops (not traced)."""

    def __post_init__(self) -> None:
        # an explicit layout names the virtual stages: vpp follows it where not given
        if self.pp_layout and self.vpp is None:
            object.__setattr__(self, "vpp", layout_vpp(self.pp_layout, self.pp))

    # -- identity --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("recompute_modules", "offload_modules", "cuda_graph_modules"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainingConfig:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"unknown training config keys {unknown}; allowed: {sorted(known)}")
        data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**data)

    def replace(self, **changes: Any) -> TrainingConfig:
        changes = {k: tuple(v) if isinstance(v, list) else v for k, v in changes.items()}
        return replace(self, **changes)

    def config_hash(self) -> str:
        d = {k: v for k, v in self.to_dict().items() if HASHED_FROM_VALUE.get(k, object()) != v}
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def diff(self, other: TrainingConfig) -> dict[str, tuple[Any, Any]]:
        """Fields that differ: {name: (self's, other's)}."""
        a, b = self.to_dict(), other.to_dict()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}

    @property
    def model_size(self) -> int:
        """GPUs one model replica of the dense part spans: TP x PP x CP (Megatron's parallel_state
        calls it model_size; the data-parallel size is the world over it)."""
        return self.tp * self.pp * self.cp

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """The modules selective recompute runs again: those named, else Megatron's default."""
        if self.recompute_granularity != "selective":
            return ()
        return self.recompute_modules or DEFAULT_RECOMPUTE_MODULES

    @property
    def p2p_overlapped(self) -> bool:
        """The pipeline's sends run beside compute: overlap_p2p_comm under the interleaved schedule
        (without virtual stages Megatron turns it off)."""
        return self.pp > 1 and bool(self.vpp) and self.overlap_p2p_comm

    def data_parallel(self, world: int) -> int:
        """Replicas of the dense part on `world` GPUs (0 where the layout needs more)."""
        return world // self.model_size

    # -- Megatron command line ---------------------------------------------------------------
    def to_args(self, model: ModelArch | None = None, has_apex: bool = True) -> list[str]:
        """The Megatron-LM argv: model architecture and this config. `has_apex`: the job's image
        has apex's fused kernels (NVIDIA's PyTorch containers do; the GPU machine does not)."""
        argv = model.to_args() if model else []
        if model and self.seq_length and self.seq_length != model.seq_length:
            argv = _set_flag(argv, "--seq-length", str(self.seq_length))
            argv = _set_flag(argv, "--max-position-embeddings", str(self.seq_length))
        elif not model and self.seq_length:
            argv += ["--seq-length", str(self.seq_length)]
        for spec in FLAGS:
            if spec.field == "vpp" and self.pp_layout:
                continue  # the layout names the virtual stages; Megatron takes one or the other
            argv += spec.render(getattr(self, spec.field))
        if self.recompute_granularity == "full":
            argv += ["--recompute-method", "uniform"]
        if self.fsdp:  # Megatron FSDP saves only in its own format and refuses to start without it
            argv += ["--ckpt-format", FSDP_CKPT_FORMAT]
        if self.offload_modules:
            argv += ["--fine-grained-activation-offloading"]
        argv += ["--bf16"]
        if model and model.add_bias_linear and self.grouped_gemm and self.transformer_impl != "local":
            # TE's grouped expert MLP has no fused bias-dropout-add: Megatron stops at start-up
            # ("bias_dropout_fusion is not supported in TEGroupedMLP when add_bias_linear=True")
            argv += ["--no-bias-dropout-fusion"]
        if self.transformer_impl == "local":
            argv += list(TE_LESS_FLAGS)
        elif not has_apex:
            argv += list(APEX_LESS_FLAGS)
        return argv

    @classmethod
    def from_args(cls, argv: list[str], model: ModelArch | None = None) -> TrainingConfig:
        """Parse a Megatron argv back into a config (architecture flags are ignored; a
        `--seq-length` equal to the model's own reads as None)."""
        by_flag = {s.flag: s for s in FLAGS}
        values: dict[str, Any] = {}
        i = 0
        while i < len(argv):
            tok = argv[i]
            spec = by_flag.get(tok)
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            spec = spec or by_flag.get(FLAG_ALIASES.get(tok, ""))
            if spec:
                values[spec.field] = spec.parse(argv[i + 1:j])
            elif tok == "--seq-length" and i + 1 < len(argv):
                values["seq_length"] = int(argv[i + 1])
            i = j
        if model and values.get("seq_length") == model.seq_length:
            values["seq_length"] = None
        return cls(**values)


FSDP_CKPT_FORMAT = "fsdp_dtensor"
"""The --ckpt-format Megatron FSDP requires (megatron/training/arguments.py, validate_args)."""


TE_LESS_FLAGS = ("--no-rope-fusion", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion",
                 "--no-masked-softmax-fusion")
"""Fusions that need Transformer Engine or apex; off under `--transformer-impl local`
(seen on the device, see ../shared/device-notes.md)."""


APEX_LESS_FLAGS = ("--no-gradient-accumulation-fusion",)
"""Off where apex is absent, Transformer Engine or not: the output layer is Megatron's own
ColumnParallelLinear, which fuses the weight-gradient accumulation through apex's
fused_weight_gradient_mlp_cuda and refuses to start without it
(megatron/core/tensor_parallel/layers.py; seen on the device with TE 2.20)."""


@dataclass(frozen=True)
class Flag:
    """One TrainingConfig field and its Megatron flag. kind: int | float | str | switch | list |
    off (a switch that turns a field off: the flag is there when the value is False)."""

    field: str
    flag: str
    kind: str
    default: Any = None
    always: bool = False  # render even at the default (moetune pins it)

    def render(self, value: Any) -> list[str]:
        if self.kind == "switch":
            return [self.flag] if value else []
        if self.kind == "off":
            return [] if value else [self.flag]
        if self.kind == "list":
            return [self.flag, *value] if value else []
        if value is None or (value == self.default and not self.always):
            return []
        return [self.flag, str(value)]

    def parse(self, tokens: list[str]) -> Any:
        if self.kind in ("switch", "off"):
            return self.kind == "switch"
        if self.kind == "list":
            return tuple(tokens)
        if not tokens:
            raise ValueError(f"{self.flag} needs a value")
        return {"int": int, "float": float, "str": str}[self.kind](tokens[0])


FLAGS: tuple[Flag, ...] = (
    Flag("tp", "--tensor-model-parallel-size", "int", 1, always=True),
    Flag("pp", "--pipeline-model-parallel-size", "int", 1, always=True),
    Flag("vpp", "--num-virtual-stages-per-pipeline-rank", "int"),
    Flag("first_pp_layers", "--decoder-first-pipeline-num-layers", "int"),
    Flag("last_pp_layers", "--decoder-last-pipeline-num-layers", "int"),
    Flag("account_for_embedding", "--account-for-embedding-in-pipeline-split", "switch"),
    Flag("account_for_loss", "--account-for-loss-in-pipeline-split", "switch"),
    Flag("pp_layout", "--pipeline-model-parallel-layout", "str"),
    Flag("cp", "--context-parallel-size", "int", 1),
    Flag("ep", "--expert-model-parallel-size", "int", 1, always=True),
    Flag("etp", "--expert-tensor-parallel-size", "int"),
    Flag("sequence_parallel", "--sequence-parallel", "switch"),
    Flag("micro_batch", "--micro-batch-size", "int", always=True),
    Flag("global_batch", "--global-batch-size", "int", always=True),
    Flag("dispatcher", "--moe-token-dispatcher-type", "str", always=True),
    Flag("flex_backend", "--moe-flex-dispatcher-backend", "str"),
    Flag("deepep_num_sms", "--moe-deepep-num-sms", "int"),
    Flag("hybridep_num_sms", "--moe-hybridep-num-sms", "int"),
    Flag("overlap_ep_a2a", "--overlap-moe-expert-parallel-comm", "switch"),
    Flag("delay_wgrad", "--delay-wgrad-compute", "switch"),
    Flag("shared_expert_overlap", "--moe-shared-expert-overlap", "switch"),
    Flag("tp_comm_overlap", "--tp-comm-overlap", "switch"),
    Flag("overlap_p2p_comm", "--no-overlap-p2p-communication", "off"),
    Flag("overlap_grad_reduce", "--overlap-grad-reduce", "switch"),
    Flag("overlap_param_gather", "--overlap-param-gather", "switch"),
    Flag("distributed_optimizer", "--use-distributed-optimizer", "switch"),
    Flag("precision_aware_optimizer", "--use-precision-aware-optimizer", "switch"),
    Flag("fsdp", "--use-megatron-fsdp", "switch"),
    Flag("fsdp_sharding", "--data-parallel-sharding-strategy", "str", "optim_grads_params"),
    Flag("recompute_granularity", "--recompute-granularity", "str"),
    Flag("recompute_modules", "--recompute-modules", "list"),
    Flag("recompute_num_layers", "--recompute-num-layers", "int"),
    Flag("offload_modules", "--offload-modules", "list"),
    Flag("cuda_graph_impl", "--cuda-graph-impl", "str", "none"),
    Flag("cuda_graph_modules", "--cuda-graph-modules", "list"),
    Flag("fp8_format", "--fp8-format", "str"),
    Flag("fp8_recipe", "--fp8-recipe", "str"),
    Flag("grouped_gemm", "--moe-grouped-gemm", "switch"),
    Flag("permute_fusion", "--moe-permute-fusion", "switch"),
    Flag("router_fusion", "--moe-router-fusion", "switch"),
    Flag("cross_entropy_fusion", "--cross-entropy-loss-fusion", "switch"),
    Flag("manual_gc", "--manual-gc", "switch"),
    Flag("manual_gc_interval", "--manual-gc-interval", "int"),
    Flag("router_dtype", "--moe-router-dtype", "str"),
    Flag("force_balance", "--moe-router-force-load-balancing", "switch"),
    Flag("capacity_factor", "--moe-expert-capacity-factor", "float"),
    Flag("pad_to_capacity", "--moe-pad-expert-input-to-capacity", "switch"),
    Flag("transformer_impl", "--transformer-impl", "str", always=True),
    Flag("train_iters", "--train-iters", "int", always=True),
    Flag("profile_step_start", "--profile-step-start", "int", always=True),
    Flag("profile_step_end", "--profile-step-end", "int", always=True),
)


# older spellings Megatron still reads, parsed into the field of the flag moetune renders
FLAG_ALIASES = {"--cuda-graph-scope": "--cuda-graph-modules"}


# fields added after stores and the trial bank held hashes: left out of the hash at these values
# (their defaults), so that a config made before them keeps its identity
HASHED_FROM_VALUE: dict[str, Any] = {"overlap_p2p_comm": True}


def layout_vpp(layout: str, pp: int) -> int | None:
    """The virtual stages per rank an explicit layout names (its stages over PP; None for one, or
    where the layout cannot be read: the constraint table says why)."""
    try:
        stages = layout_stages(layout)
    except LayoutError:
        return None
    vpp = stages // max(pp, 1)
    return vpp if vpp > 1 and stages % max(pp, 1) == 0 else None


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    i = out.index(flag)
    out[i + 1] = value
    return out


def run_args() -> list[str]:
    """The fixed part of every trial's argv: mock data, a null tokenizer, logging, profiling."""
    return [
        "--mock-data", "--tokenizer-type", "NullTokenizer",
        "--lr", "1e-4", "--min-lr", "1e-5", "--lr-decay-style", "cosine", "--weight-decay", "0.1",
        "--clip-grad", "1.0", "--init-method-std", "0.008",
        "--log-interval", "1", "--log-throughput",
        "--eval-iters", "0", "--eval-interval", "1000000",
        "--split", "100,0,0",
    ]


@dataclass(frozen=True)
class FlagSince:
    """A flag moetune renders that older Megatrons know by another name (same values)."""

    flag: str
    since: tuple[int, int]  # the first megatron-core (major, minor) whose parser has `flag`
    before: str  # its name before that
    source: str


# Found by running each release's parse_args on every flag moetune renders (tests/experiment/test_megatron_validate.py)
FLAG_VERSIONS: tuple[FlagSince, ...] = (
    FlagSince("--cuda-graph-modules", (0, 18), "--cuda-graph-scope",
              "megatron/training/arguments.py: megatron-core 0.17.1 has only --cuda-graph-scope; "
              "0.18.0 adds --cuda-graph-modules and keeps the old name hidden"),
)


def megatron_minor(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a megatron-core version string ("0.17.1", "0.19.2+427767a"), else None."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m[1]), int(m[2])) if m else None


def args_for_megatron(argv: list[str], version: str | None) -> list[str]:
    """`argv` with each flag of FLAG_VERSIONS newer than megatron-core `version` given its older
    name; unchanged when the version is unknown (None: the newest is assumed)."""
    have = megatron_minor(version)
    if have is None:
        return list(argv)
    renames = {row.flag: row.before for row in FLAG_VERSIONS if have < row.since}
    return [renames.get(token, token) for token in argv]


def _value_text(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "none"
    return "none" if v is None else str(v)


def diff_text(diff: dict) -> str:
    """A config change ({field: (old, new)}, as TrainingConfig.diff gives it) as console text:
    `micro_batch 2 -> 4, recompute_modules none -> moe_act`, no Python literals."""
    return ", ".join(f"{k} {_value_text(a)} -> {_value_text(b)}" for k, (a, b) in diff.items())
