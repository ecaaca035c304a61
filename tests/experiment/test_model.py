"""experiment/model.py: a ModelArch turns into Megatron's architecture flags and back unchanged (the trial
bank stores only the argv), for every shipped experiment."""
import pytest

from moetune.experiment.model import ModelArch

MODEL = ModelArch("t", 4, 1024, 16, 4, 4096, 1024, 8, 2, 32000, 2048, first_dense_layers=1)


def test_model_arch_flags():
    """A model with one leading dense layer renders Megatron's --moe-layer-freq pattern, and parsing
    the argv back gives its layers, experts and dense layers."""
    argv = MODEL.to_args()
    assert argv[argv.index("--moe-layer-freq") + 1] == "([0]*1+[1]*3)"
    back = ModelArch.from_args(argv)
    assert (back.num_layers, back.num_experts, back.first_dense_layers) == (4, 8, 1)


@pytest.mark.parametrize("name", ["qwen3_235b", "qwen3_30b_a3b", "deepseek_v3", "mixtral_8x7b",
                                  "mixtral_8x22b", "moe_proxy"])
def test_model_arch_round_trips(name):
    """Every architecture field survives argv and back (the trial bank stores only the argv)."""
    from moetune.experiment.schema import load_experiment
    m = load_experiment(name).model
    assert ModelArch.from_args(m.to_args(), name=m.name) == m
