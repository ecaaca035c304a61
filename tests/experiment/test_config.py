"""TrainingConfig ↔ Megatron argv, both ways, for every field of the flag table."""
import pytest

from moetune.experiment.config import FLAGS, TrainingConfig, diff_text
from moetune.experiment.model import ModelArch

MODEL = ModelArch("t", 4, 1024, 16, 4, 4096, 1024, 8, 2, 32000, 2048, first_dense_layers=1)

VALUES = {"int": 3, "float": 1.5, "str": "flex", "switch": True, "off": False, "list": ("attn", "moe_router")}


@pytest.mark.parametrize("flag", FLAGS, ids=[f.field for f in FLAGS])
def test_each_field_round_trips(flag):
    """Every field of the flag table renders to its Megatron flag and parses back to the same config."""
    value = VALUES[flag.kind]
    if flag.field == "transformer_impl":
        value = "local"
    cfg = TrainingConfig().replace(**{flag.field: value})
    argv = cfg.to_args(MODEL)
    assert flag.flag in argv
    assert TrainingConfig.from_args(argv, MODEL) == cfg


def test_hash_is_stable_and_sensitive():
    """Equal configs hash alike, a changed field changes the hash, and to_dict/from_dict round-trips."""
    a = TrainingConfig(ep=2)
    assert a.config_hash() == TrainingConfig(ep=2).config_hash()
    assert a.config_hash() != a.replace(ep=4).config_hash()
    assert TrainingConfig.from_dict(a.to_dict()) == a


def test_a_field_added_at_its_default_keeps_the_hash_a_config_had_before_it():
    """overlap_p2p_comm came after stores held hashes: at its default it is left out of the hash (a
    stored study's baseline keeps its identity); turned off, it changes the hash."""
    import hashlib
    import json
    a = TrainingConfig(ep=2)
    before = {k: v for k, v in a.to_dict().items() if k != "overlap_p2p_comm"}
    blob = json.dumps(before, sort_keys=True, separators=(",", ":"))
    assert a.config_hash() == hashlib.sha256(blob.encode()).hexdigest()[:16]
    assert a.replace(overlap_p2p_comm=False).config_hash() != a.config_hash()


def test_unknown_key_is_refused():
    """An unknown key in a stored config is refused by name."""
    with pytest.raises(ValueError, match="unknown training config keys"):
        TrainingConfig.from_dict({"tensor_parallel": 2})


def test_where_apex_is_absent_gradient_accumulation_fusion_is_off_once():
    """Without apex the apex-less flags are added; the local spec turns gradient accumulation fusion off
    exactly once either way."""
    from moetune.experiment.config import APEX_LESS_FLAGS, TE_LESS_FLAGS, TrainingConfig
    te = TrainingConfig(transformer_impl="transformer_engine")
    local = TrainingConfig(transformer_impl="local")
    assert not set(APEX_LESS_FLAGS) & set(te.to_args())
    assert set(APEX_LESS_FLAGS) <= set(te.to_args(has_apex=False))
    for has_apex in (True, False):  # the local spec turns it off already, once
        argv = local.to_args(has_apex=has_apex)
        assert argv.count("--no-gradient-accumulation-fusion") == 1
        assert set(TE_LESS_FLAGS) <= set(argv)


def test_a_change_reads_as_text():
    """diff_text: each changed field as `field old -> new`, lists joined, none for empty or unset."""
    a = TrainingConfig(micro_batch=2)
    b = a.replace(micro_batch=4, recompute_granularity="selective", recompute_modules=("moe_act", "layernorm"))
    assert diff_text(a.diff(b)) == ("micro_batch 2 -> 4, recompute_granularity none -> selective, "
                                    "recompute_modules none -> moe_act,layernorm")



def test_pipeline_layout_names_the_virtual_stages():
    """An explicit layout renders without --num-virtual-stages-per-pipeline-rank (Megatron takes one
    or the other) and reads back with VPP its stages over PP: DeepSeek-V3's 32 stages at PP 8 are 4."""
    cfg = TrainingConfig(pp=8, pp_layout="Et*3|(tt|)*29m|L", account_for_loss=False)
    assert cfg.vpp == 4
    argv = cfg.to_args()
    assert "--num-virtual-stages-per-pipeline-rank" not in argv
    assert argv[argv.index("--pipeline-model-parallel-layout") + 1] == "Et*3|(tt|)*29m|L"
    assert TrainingConfig.from_args(argv) == cfg
    split = TrainingConfig(pp=8, vpp=4, account_for_embedding=True, account_for_loss=True)
    argv = split.to_args()
    assert {"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"} <= set(argv)
    assert TrainingConfig.from_args(argv) == split


def test_cuda_graph_scope_reads_as_the_modules():
    """--cuda-graph-scope, the name before megatron-core 0.18 (which Megatron still takes), reads as
    --cuda-graph-modules does."""
    old = TrainingConfig.from_args(["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn",
                                    "moe_router", "moe_preprocess"])
    new = TrainingConfig.from_args(["--cuda-graph-impl", "transformer_engine", "--cuda-graph-modules", "attn",
                                    "moe_router", "moe_preprocess"])
    assert old == new and old.cuda_graph_modules == ("attn", "moe_router", "moe_preprocess")


def test_linear_biases_under_te_grouped_experts_turn_bias_dropout_fusion_off():
    """Megatron stops at start-up with biased linear layers in TE's grouped expert MLP unless the
    bias-dropout-add fusion is off (GPT-OSS-120B on the GPU machine): the argv turns it off there,
    and only there."""
    from moetune.experiment.schema import load_experiment
    m = load_experiment("mixtral_8x7b").model
    biased = ModelArch(**{**m.to_dict(), "add_bias_linear": True})
    grouped = TrainingConfig(ep=8, grouped_gemm=True)
    assert "--no-bias-dropout-fusion" in grouped.to_args(biased)
    assert "--no-bias-dropout-fusion" not in grouped.to_args(m)
    assert "--no-bias-dropout-fusion" not in grouped.replace(grouped_gemm=False).to_args(biased)


def test_megatron_fsdp_renders_its_checkpoint_format_and_reads_back():
    """FSDP renders --use-megatron-fsdp with the fsdp_dtensor checkpoint format Megatron requires, the
    sharding strategy only where it is not Megatron's default, and the argv parses back to the config;
    without FSDP none of it is rendered."""
    cfg = TrainingConfig(fsdp=True, ep=8)
    argv = cfg.to_args(MODEL)
    assert "--use-megatron-fsdp" in argv and argv[argv.index("--ckpt-format") + 1] == "fsdp_dtensor"
    assert "--data-parallel-sharding-strategy" not in argv
    assert TrainingConfig.from_args(argv, MODEL) == cfg
    optim = cfg.replace(fsdp_sharding="optim_grads")
    argv = optim.to_args(MODEL)
    assert argv[argv.index("--data-parallel-sharding-strategy") + 1] == "optim_grads"
    assert TrainingConfig.from_args(argv, MODEL) == optim
    plain = TrainingConfig(ep=8).to_args(MODEL)
    assert not {"--use-megatron-fsdp", "--ckpt-format", "--data-parallel-sharding-strategy"} & set(plain)
