"""Megatron FSDP's model state on one rank: what its sharding strategy splits over the
data-parallel group, and the layers it holds gathered whole while a pass runs through them.

Dense parameters are sharded over DP x CP, expert parameters over the expert-data-parallel group
(the groups the distributed optimizer shards over). Megatron FSDP keeps the bf16 compute weights,
the gradients in the model's own dtype (--megatron-fsdp-main-grads-dtype auto: bf16 here), and the
fp32 main weights with Adam's two moments (megatron-core 0.19, megatron_fsdp/mixed_precision.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from moetune.experiment.config import TrainingConfig

PARAM_BYTES = 2  # bf16 compute weights
GRAD_BYTES = 2  # the model's gradient dtype (bf16): FSDP's main-grads default
# Megatron FSDP sizes its communication unit at twice the average FSDP unit (a decoder layer) so that
# it works on one layer while it fetches the next (megatron_fsdp.py, suggested_communication_unit_size):
# the current layer and the prefetched one are held whole, weights and gradient buffers alike
GATHERED_LAYERS = 2


@dataclass(frozen=True)
class Sharding:
    """What one strategy of --data-parallel-sharding-strategy splits over the data-parallel group."""

    weights: bool
    """The bf16 compute weights are sharded (and gathered a layer at a time)."""
    grads: bool
    """The gradients are reduce-scattered into shards (a layer's whole gradient only while it is made)."""
    optimizer: bool
    """The fp32 main weights and Adam's moments are sharded."""


STRATEGIES = {"no_shard": Sharding(False, False, False), "optim": Sharding(False, False, True),
              "optim_grads": Sharding(False, True, True), "optim_grads_params": Sharding(True, True, True)}


@dataclass(frozen=True)
class FsdpState:
    """One rank's model state under Megatron FSDP, bytes."""

    weights: float
    """bf16 weights: the rank's shard (or all of them, unsharded) plus the gathered layers."""
    grads: float
    """Gradients: the shard plus the gathered layers' buffers, or all of them where not sharded."""
    optimizer: float
    """fp32 main weights and Adam's moments (bf16 moments with the precision-aware optimizer)."""
    gathered: float
    """Of weights and grads, the layers held whole at a time (GATHERED_LAYERS of them)."""


def model_state(c: TrainingConfig, dense: float, experts: float, dp: int, edp: int, layer: float) -> FsdpState:
    """Model state of a rank holding `dense` parameters (sharded over `dp`, the DP x CP group) and
    `experts` (over `edp`); `layer`: the parameters of one of its decoder layers, on average."""
    s = STRATEGIES[c.fsdp_sharding]
    shard = dense / max(dp, 1) + experts / max(edp, 1)
    whole = dense + experts
    optimizer = (8.0 if c.precision_aware_optimizer else 12.0) * (shard if s.optimizer else whole)
    gathered_w = GATHERED_LAYERS * layer * PARAM_BYTES if s.weights else 0.0
    gathered_g = GATHERED_LAYERS * layer * GRAD_BYTES if s.grads else 0.0
    weights = PARAM_BYTES * (shard if s.weights else whole) + gathered_w
    grads = GRAD_BYTES * (shard if s.grads else whole) + gathered_g
    return FsdpState(weights, grads, optimizer, gathered_w + gathered_g)
