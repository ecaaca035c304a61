"""TrainingConfig ↔ Megatron argv, both ways, for every field of the flag table."""
import pytest

from moetune.pipeline.spec.config import FLAGS, TrainingConfig
from moetune.pipeline.spec.model import ModelArch

MODEL = ModelArch("t", 4, 1024, 16, 4, 4096, 1024, 8, 2, 32000, 2048, first_dense_layers=1)

VALUES = {"int": 3, "float": 1.5, "str": "flex", "switch": True, "list": ("attn", "moe_router")}


@pytest.mark.parametrize("flag", FLAGS, ids=[f.field for f in FLAGS])
def test_each_field_round_trips(flag):
    value = VALUES[flag.kind]
    if flag.field == "transformer_impl":
        value = "local"
    cfg = TrainingConfig().replace(**{flag.field: value})
    argv = cfg.to_args(MODEL)
    assert flag.flag in argv
    assert TrainingConfig.from_args(argv, MODEL) == cfg


def test_hash_is_stable_and_sensitive():
    a = TrainingConfig(ep=2)
    assert a.config_hash() == TrainingConfig(ep=2).config_hash()
    assert a.config_hash() != a.replace(ep=4).config_hash()
    assert TrainingConfig.from_dict(a.to_dict()) == a


def test_model_arch_flags():
    argv = MODEL.to_args()
    assert argv[argv.index("--moe-layer-freq") + 1] == "([0]*1+[1]*3)"
    back = ModelArch.from_args(argv)
    assert (back.num_layers, back.num_experts, back.first_dense_layers) == (4, 8, 1)


def test_unknown_key_is_refused():
    with pytest.raises(ValueError, match="unknown training config keys"):
        TrainingConfig.from_dict({"tensor_parallel": 2})


@pytest.mark.parametrize("name", ["qwen3_235b", "qwen3_30b_a3b", "deepseek_v3", "mixtral_8x7b",
                                  "mixtral_8x22b", "moe_proxy"])
def test_model_arch_round_trips(name):
    """Every architecture field survives argv and back (the trial bank stores only the argv)."""
    from moetune.pipeline.spec.experiment import load_experiment
    m = load_experiment(name).model
    assert ModelArch.from_args(m.to_args(), name=m.name) == m


def test_where_apex_is_absent_gradient_accumulation_fusion_is_off_once():
    from moetune.pipeline.spec.config import APEX_LESS_FLAGS, TE_LESS_FLAGS, TrainingConfig
    te = TrainingConfig(transformer_impl="transformer_engine")
    local = TrainingConfig(transformer_impl="local")
    assert not set(APEX_LESS_FLAGS) & set(te.to_args())
    assert set(APEX_LESS_FLAGS) <= set(te.to_args(has_apex=False))
    for has_apex in (True, False):  # the local spec turns it off already, once
        argv = local.to_args(has_apex=has_apex)
        assert argv.count("--no-gradient-accumulation-fusion") == 1
        assert set(TE_LESS_FLAGS) <= set(argv)
