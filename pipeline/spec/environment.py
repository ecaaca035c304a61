"""The environment variables a training config needs in its job, as a table: (predicate on the
config dict, variables, where it comes from). The job script exports them (job/render.py), and
Megatron's validation on the CPU runs with them (spec/megatron_validate.py), since validate_args
reads some."""
from __future__ import annotations

from typing import Any, Mapping

ENV_RULES: tuple[tuple[Any, dict[str, str], str], ...] = (
    (lambda c: True, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                      "NCCL_NVLS_ENABLE": "0"}, "megatron-core-moe-readme.md (environment variables)"),
    (lambda c: c.get("overlap_ep_a2a"), {"CUDA_DEVICE_MAX_CONNECTIONS": "32"},
     "megatron-core-moe-readme.md (EP A2A overlap needs CUDA_DEVICE_MAX_CONNECTIONS > 1)"),
    (lambda c: not c.get("overlap_ep_a2a") and (c.get("tp_comm_overlap") or c.get("sequence_parallel")),
     {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, "megatron-core-moe-readme.md (example launch script)"),
    # the first row's expandable segments make Megatron refuse TE CUDA graphs at start-up unless NCCL
    # does not register graph buffers (illegal memory access otherwise); seen on the device
    (lambda c: c.get("cuda_graph_impl") == "transformer_engine", {"NCCL_GRAPH_REGISTER": "0"},
     "megatron-core 0.19.2 validate_args (megatron/training/arguments.py, cuda_graph_impl "
     "transformer_engine with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"),
)


def config_env(config: Mapping[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for applies, values, _source in ENV_RULES:
        if applies(config):
            env.update(values)
    return env
