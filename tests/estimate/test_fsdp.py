"""estimate/fsdp.py: Megatron FSDP's model state on a rank, by sharding strategy, against hand
computations."""
import pytest

from moetune.estimate import fsdp
from moetune.experiment.config import FSDP_SHARDING, TrainingConfig

DENSE, EXPERTS, DP, EDP, LAYER = 8e9, 24e9, 256, 32, 0.3e9


def test_full_sharding_splits_every_byte_and_holds_two_layers_whole():
    """optim_grads_params: 2 B weights, 2 B gradients and 12 B of optimizer a parameter, sharded dense
    over DP and experts over EDP; two layers' weights and gradient buffers held whole besides."""
    s = fsdp.model_state(TrainingConfig(fsdp=True), DENSE, EXPERTS, DP, EDP, LAYER)
    shard = DENSE / DP + EXPERTS / EDP
    assert s.weights == pytest.approx(2 * shard + 2 * 2 * LAYER)
    assert s.grads == pytest.approx(2 * shard + 2 * 2 * LAYER)
    assert s.optimizer == pytest.approx(12 * shard)
    assert s.gathered == pytest.approx(8 * LAYER)
    aware = fsdp.model_state(TrainingConfig(fsdp=True, precision_aware_optimizer=True), DENSE, EXPERTS, DP, EDP, LAYER)
    assert aware.optimizer == pytest.approx(8 * shard)


def test_each_strategy_shards_less_than_the_one_after_it():
    """no_shard keeps everything whole, optim shards the optimizer, optim_grads the gradients too,
    optim_grads_params the weights too: the model state falls strategy by strategy."""
    states = [fsdp.model_state(TrainingConfig(fsdp=True, fsdp_sharding=k), DENSE, EXPERTS, DP, EDP, LAYER)
              for k in FSDP_SHARDING]
    whole = DENSE + EXPERTS
    assert (states[0].weights, states[0].grads, states[0].optimizer) == (2 * whole, 2 * whole, 12 * whole)
    assert states[1].optimizer < states[0].optimizer and states[1].grads == states[0].grads
    assert states[2].grads < states[1].grads and states[2].weights == states[1].weights
    assert states[3].weights < states[2].weights
    totals = [s.weights + s.grads + s.optimizer for s in states]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4
