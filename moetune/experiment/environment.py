"""The environment variables a trial's job needs, as a table: (predicate on the config and the
cluster section, variables, where it comes from). The job script exports them and passes their
names into the container (job/render.py: pyxis lets an image's own value win over the host's
unless the name is in --container-env); Megatron's validation on the CPU runs with them
(experiment/megatron_validate.py), since validate_args reads some.

A value is a string, or a function of (config, cluster) where it depends on them."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from moetune.experiment.schema import Cluster

BRIDGE = "Megatron-Bridge scripts/performance (../shared/cluster-notes.md, Environment)"
# Megatron's defaults for the SMs the flex dispatcher's kernels take (--moe-deepep-num-sms,
# --moe-hybridep-num-sms): the layernorm kernels leave that many free for them
FLEX_SMS_DEFAULT = {"deepep": 20, "hybridep": 16}


def _flex(c: Mapping[str, Any]) -> str | None:
    return c.get("flex_backend") if c.get("dispatcher") == "flex" else None


def _dispatcher_sms(c: Mapping[str, Any], _cluster: Any) -> str:
    backend = _flex(c)
    return str(c.get(f"{backend}_num_sms") or FLEX_SMS_DEFAULT[backend])


Value = str | Callable[[Mapping[str, Any], Any], str]
ENV_RULES: tuple[tuple[Callable[[Mapping[str, Any], Any], Any], dict[str, Value], str], ...] = (
    (lambda c, k: True, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                         "NCCL_NVLS_ENABLE": "0"}, "megatron-core-moe-readme.md (environment variables)"),
    # no recordStream on NCCL's tensors (memory freed when the collective ends, not later); NCCL's
    # streams at high priority so communication is not queued behind compute
    (lambda c, k: True, {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "TORCH_NCCL_HIGH_PRIORITY": "1"},
     BRIDGE),
    (lambda c, k: c.get("overlap_ep_a2a") or _flex(c), {"CUDA_DEVICE_MAX_CONNECTIONS": "32"},
     "megatron-core-moe-readme.md (EP A2A overlap needs CUDA_DEVICE_MAX_CONNECTIONS > 1); "
     + BRIDGE + " (32 for DeepEP/HybridEP)"),
    (lambda c, k: not c.get("overlap_ep_a2a") and not _flex(c)
     and (c.get("tp_comm_overlap") or c.get("sequence_parallel")),
     {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, "megatron-core-moe-readme.md (example launch script)"),
    # Megatron FSDP refuses to start with one connection; this row comes after the one above so it
    # wins where sequence parallelism would ask for one
    (lambda c, k: c.get("fsdp") and not c.get("overlap_ep_a2a") and not _flex(c),
     {"CUDA_DEVICE_MAX_CONNECTIONS": "8"},
     "megatron-core 0.19.2 validate_args (megatron/training/arguments.py: Megatron FSDP needs "
     "CUDA_DEVICE_MAX_CONNECTIONS > 1 or unset); " + BRIDGE + " (8 on H100 MoE recipes)"),
    # the dispatcher's kernels run beside the layernorms: leave them their SMs
    (lambda c, k: _flex(c) in FLEX_SMS_DEFAULT,
     {"NVTE_FWD_LAYERNORM_SM_MARGIN": _dispatcher_sms, "NVTE_BWD_LAYERNORM_SM_MARGIN": _dispatcher_sms},
     BRIDGE + " (layernorm SM margins on MoE)"),
    # a wrong value makes HybridEP slow or wrong
    (lambda c, k: _flex(c) == "hybridep",
     {"NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": lambda c, k: str(k.nvlink_domain)},
     "moe-dispatcher-selection.txt (HybridEP)"),
    # the first row's expandable segments make Megatron refuse TE CUDA graphs at start-up unless NCCL
    # does not register graph buffers (illegal memory access otherwise); seen on the device
    (lambda c, k: c.get("cuda_graph_impl") == "transformer_engine", {"NCCL_GRAPH_REGISTER": "0"},
     "megatron-core 0.19.2 validate_args (megatron/training/arguments.py, cuda_graph_impl "
     "transformer_engine with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"),
)


def config_env(config: Mapping[str, Any], cluster: Cluster | None = None) -> dict[str, str]:
    """The variables of every row that applies to this config on this cluster (None: the schema's
    default cluster)."""
    env: dict[str, str] = {}
    cluster = Cluster() if cluster is None else cluster
    for applies, values, _source in ENV_RULES:
        if applies(config, cluster):
            env.update({k: v(config, cluster) if callable(v) else v for k, v in values.items()})
    return env
