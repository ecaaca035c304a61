"""experiment/megatron_import.py: a Megatron command line split into words as a shell would, its
launcher and world apart, and each flag in one place: the model, the baseline, dropped with why,
or extra_args; what moetune cannot model refused whole, every reason in one line."""
from pathlib import Path

import pytest

from moetune.experiment import megatron_import as mi
from moetune.experiment.extra_args import controlled_flags
from moetune.experiment.measuring import MEASURING
from moetune.experiment.schema import ConfigError, load_experiment

MODEL = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--ffn-hidden-size", "512",
         "--num-experts", "8", "--moe-router-topk", "2", "--seq-length", "1024", "--vocab-size", "32000",
         "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope"]


def test_read_command_joins_continuations_and_drops_comments():
    text = "# launch\ntorchrun --nproc-per-node 8 \\\n  pretrain_gpt.py \\\n  --num-layers 4 \\\n  --data-path 'a b'\n"
    assert mi.read_command(text) == ["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py", "--num-layers", "4",
                                     "--data-path", "a b"]
    with pytest.raises(ConfigError, match="cannot be split"):
        mi.read_command("--data-path 'unclosed")


@pytest.mark.parametrize("prefix, world", [
    (["torchrun", "--nnodes=2", "--nproc_per_node=8", "pretrain_gpt.py"], (2, 8)),
    (["python", "-m", "torch.distributed.run", "--nproc-per-node", "4", "pretrain_gpt.py"], (1, 4)),
    (["torchrun", "--nnodes", "1:4", "--nproc-per-node", "8", "pretrain_gpt.py"], None),
    (["torchrun", "--nproc-per-node", "gpu", "pretrain_gpt.py"], None),
    (["python", "pretrain_gpt.py"], None),
])
def test_launcher_world(prefix, world):
    """The world a torchrun prefix fixes; an elastic range or 'gpu' fixes none."""
    launcher, argv = mi.split_launcher(prefix + ["--num-layers", "4"])
    assert launcher == prefix and argv == ["--num-layers", "4"]
    assert mi.launcher_world(launcher) == world


def test_argv_starting_with_a_flag_has_no_launcher():
    """A value that ends in .py is not taken for the script where the words start with a flag."""
    assert mi.split_launcher(["--num-layers", "4", "--x", "a.py"]) == ([], ["--num-layers", "4", "--x", "a.py"])


def test_each_flag_lands_in_one_place():
    """Model and layout read, `--flag=value` split, unknown flags in extra_args in order, measuring
    flags dropped with the table's why; no controlled flag in extra_args."""
    argv = MODEL + ["--tensor-model-parallel-size=2", "--expert-model-parallel-size", "4", "--use-flash-attn",
                    "--lr", "3e-4", "--hidden-dropout", "0.1", "--train-iters", "1000", "--bf16"]
    got = mi.import_argv(argv, "m")
    assert (got.model.num_layers, got.model.num_experts, got.model.name) == (4, 8, "m")
    assert (got.baseline.tp, got.baseline.ep, got.baseline.train_iters) == (2, 4, 20)
    assert got.extra_args == ["--use-flash-attn", "--hidden-dropout", "0.1"]
    assert ("--lr 3e-4", MEASURING["--lr"].why) in got.dropped and "--train-iters 1000" in dict(got.dropped)
    assert not set(got.extra_args) & set(controlled_flags())
    assert not got.batch_given and got.world is None


def test_query_groups_need_group_query_attention():
    """Megatron reads --num-query-groups only with --group-query-attention: without it, MHA."""
    assert mi.import_argv(MODEL + ["--num-query-groups", "2"], "m").model.num_query_groups == 8
    gqa = mi.import_argv(MODEL + ["--group-query-attention", "--num-query-groups", "2"], "m")
    assert gqa.model.num_query_groups == 2


def test_refused_whole_naming_every_reason():
    """LayerNorm, a non-gated MLP, FP16 and a missing vocabulary size: one line naming all four."""
    argv = [a for a in MODEL if a not in ("--swiglu", "--vocab-size", "32000", "RMSNorm")]
    argv = [a if a != "--normalization" else "--fp16" for a in argv] + ["--normalization", "LayerNorm"]
    with pytest.raises(mi.ImportRefused) as e:
        mi.import_argv(argv, "m")
    line = str(e.value)
    assert "\n" not in line
    for says in ("LayerNorm", "--vocab-size missing", "no --swiglu", "FP16"):
        assert says in line


def test_deepseek_v3_argv_reads_back_whole():
    """MLA, router groups, dense leading layers, MTP and an uneven pipeline read back."""
    exp = load_experiment("deepseek_v3")
    got = mi.import_argv(exp.baseline.to_args(exp.model), exp.model.name)
    assert got.model == exp.model and got.baseline == exp.baseline and got.batch_given


@pytest.mark.parametrize("config", ["gpt_oss_120b", "kimi_k2", "glm_4_5_air", "qwen1_5_moe_a2_7b"])
def test_imported_hf_models_read_back_whole(config):
    """The families the HF import knows (sliding windows, sinks, biases, the clamped quick-GeGLU,
    dense layers in a pattern, a shared-expert gate): their model argv read back field for field."""
    from moetune.experiment.hf_import import model_from_hf, read_config
    path = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / f"{config}.json"
    model = model_from_hf(read_config(path), config)
    assert mi.import_argv(model.to_args(), config).model == model


def test_megatron_fsdp_command_line_reads_back_as_fsdp():
    """A command line with Megatron FSDP imports as fsdp with its strategy; its --ckpt-format is
    dropped (moetune renders it with FSDP), never left in extra_args, where it is refused."""
    argv = MODEL + ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads",
                    "--ckpt-format", "fsdp_dtensor", "--use-distributed-optimizer"]
    got = mi.import_argv(argv, "m")
    assert got.baseline.fsdp and got.baseline.fsdp_sharding == "optim_grads" and got.baseline.distributed_optimizer
    assert got.extra_args == [] and "--ckpt-format fsdp_dtensor" in dict(got.dropped)
    assert controlled_flags()["--ckpt-format"] == "baseline.fsdp"
