"""cli/new.py, `moetune new NAME --from-hf config.json`: the YAML written loads as an experiment whose
model is the config's, whose cluster is the GPUs named and whose baseline is the fastest fitting
layout of the plan's search; a config moetune cannot model, a bad name or path, an existing file or
GPUs nothing fits on: one line, exit 2, nothing written."""
import shlex
from dataclasses import replace
from pathlib import Path

import pytest

from moetune.cli.main import main
from moetune.estimate import StoreReadings
from moetune.estimate.memory import estimate
from moetune.estimate.search import search
from moetune.estimate.space import BRING_UP
from moetune.experiment.config import TrainingConfig
from moetune.experiment.schema import list_experiments, load_experiment

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "hf_configs"


def _new(name, config, *extra):
    return main(["new", name, "--from-hf", str(CONFIGS / f"{config}.json"), *extra])


def test_writes_an_experiment_of_the_model_with_the_fastest_fitting_baseline(capsys, no_store, tmp_path):
    """Qwen3-30B-A3B on 16 H100: the model section is the shipped experiment's; the cluster is two
    nodes of 8 H100; the baseline is the search's first layout and its estimate fits an H100."""
    out = tmp_path / "q.yaml"
    assert _new("q3", "qwen3_30b_a3b", "--gpus", "16", "--out", str(out)) == 0
    exp = load_experiment(out)
    shipped = load_experiment("qwen3_30b_a3b").model
    assert exp.name == "q3" and exp.model == type(shipped)(**{**shipped.to_dict(), "name": "q3"})
    assert (exp.cluster.nodes, exp.cluster.gpus_per_node, exp.cluster.gpu_type, exp.cluster.world) == (2, 8, "H100", 16)
    best = search(exp, StoreReadings(None), limit=1, fixed=BRING_UP).layouts[0]
    assert exp.baseline == best.config
    assert estimate(exp.model, exp.baseline, 16).total_gb < 80
    text = out.read_text()
    assert "fastest fitting layout" in text and f"TP{best.config.tp} PP{best.config.pp} EP{best.config.ep}" in text
    assert capsys.readouterr().out.startswith(f"{out}: q3, 48 layers, 128 experts top-8")


def test_kimi_k2_on_1024_h100_takes_an_uneven_pipeline(no_store, tmp_path):
    """Kimi-K2's 61 layers split over no pipeline evenly: the search tries shorter first and last
    stages, and the baseline found fits 1024 H100 with its split summing to the 61 layers."""
    out = tmp_path / "k.yaml"
    assert _new("kimi_k2", "kimi_k2", "--gpus", "1024", "--out", str(out)) == 0
    exp = load_experiment(out)
    c = exp.baseline
    assert exp.model.num_experts == 384 and exp.cluster.nodes == 128
    assert estimate(exp.model, c, 1024).total_gb < 80
    if c.first_pp_layers:
        middle = exp.model.num_layers - c.first_pp_layers - c.last_pp_layers
        assert middle % (c.pp - 2) == 0


def test_refused_config_is_one_line_exit_2_and_writes_nothing(capsys, no_store, tmp_path):
    """Qwen3-Next: exit 2, one line on stderr naming its linear-attention layers, no file."""
    out = tmp_path / "n.yaml"
    assert _new("next", "qwen3_next_80b_a3b", "--out", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("moetune new: ") and "linear_attention" in err
    assert not out.exists()


def test_existing_file_kept_without_force(capsys, no_store, tmp_path):
    """An existing --out is not overwritten (exit 2, naming --force); with --force it is."""
    out = tmp_path / "m.yaml"
    out.write_text("keep\n")
    assert _new("m", "mixtral_8x7b", "--gpus", "64", "--out", str(out)) == 2
    assert "--force" in capsys.readouterr().err and out.read_text() == "keep\n"
    assert _new("m", "mixtral_8x7b", "--gpus", "64", "--out", str(out), "--force") == 0
    assert load_experiment(out).model.num_experts == 8


def test_default_out_is_experiments_name_yaml(no_store, tmp_path):
    """Without --out the file is experiments/NAME.yaml under the folder it runs in."""
    assert _new("mix", "mixtral_8x7b", "--gpus", "64") == 0
    assert load_experiment(tmp_path / "experiments" / "mix.yaml").cluster.gpus == 64


@pytest.mark.parametrize("argv, says", [
    (["bad/name"], "a name takes"),
    (["ok", "--out", "x.txt"], "ends in .yaml"),
    (["ok", "--gpus", "12"], "multiple of 8"),
    (["ok", "--gpus", "1", "--gpu-type", "A100"], "no layout of ok fits on 1x A100"),
])
def test_user_errors_are_one_line_exit_2(capsys, no_store, argv, says):
    """A bad name, a non-YAML path, GPUs that are not whole nodes, GPUs nothing fits on."""
    name, *rest = argv
    assert _new(name, "deepseek_v3", *rest) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and says in err
    assert not list(Path.cwd().rglob("*.yaml"))


def test_gpt_oss_120b_predicted_near_nvidia_published_throughput(capsys, no_store, tmp_path):
    """GPT-OSS-120B imported, then predicted at NVIDIA's published H100 layout (Megatron-Bridge
    docs/performance-summary.md, 25.11 container, DGX-H100: 64 GPUs, BF16, GBS 512, MBS 4, seq 4096,
    TP1 PP4 EP8: 5630 tokens/s/GPU): within 20 %."""
    import json
    out = tmp_path / "g.yaml"
    assert _new("gpt_oss_120b", "gpt_oss_120b", "--gpus", "64", "--out", str(out)) == 0
    capsys.readouterr()
    # no virtual stages and no recompute, as published, whatever the baseline `new` chose has
    assert main(["predict", str(out), "--tp", "1", "--pp", "4", "--ep", "8", "--micro-batch", "4",
                 "--global-batch", "512", "--vpp", "1", "--recompute", "none", "--format", "json"]) == 0
    predicted = json.loads(capsys.readouterr().out)["tokens_per_s_per_gpu"]
    assert predicted == pytest.approx(5630, rel=0.20)


def test_keys_not_carried_are_named_in_the_yaml(no_store, tmp_path):
    """The config's ignored keys (RoPE scaling, quantization, token ids) are listed in a comment."""
    out = tmp_path / "d.yaml"
    assert _new("d", "deepseek_v3", "--gpus", "1024", "--out", str(out)) == 0
    comment = " ".join(line[2:] for line in out.read_text().splitlines() if line.startswith("# "))
    for key in ("rope_scaling", "quantization_config", "bos_token_id", "aux_loss_alpha"):
        assert key in comment
    assert "hidden_size" not in comment.split("not carried")[1]


# -- --from-megatron ----------------------------------------------------------------------------

MEASURED_FIELDS = ("train_iters", "profile_step_start", "profile_step_end", "force_balance")


def _shipped_argv(exp):
    """The argv a trial of the experiment's baseline runs: the model, the config, the measuring part."""
    from moetune.experiment.config import run_args
    return exp.baseline.to_args(exp.model, has_apex=exp.cluster.has_apex is not False) + run_args()


@pytest.mark.parametrize("shipped", list_experiments())
def test_from_megatron_round_trips_every_shipped_experiment(shipped, capsys, no_store, tmp_path):
    """`moetune render`'s command line of a shipped experiment's baseline (its command.txt: the
    trial's `python -u train_moe.py ARGS`) back through `new --from-megatron FILE`: the model and
    the baseline equal the original's field for field, but the fields the measuring flags set
    (dropped: a real run's --train-iters is not a trial's), which take moetune's defaults."""
    exp = load_experiment(shipped)
    assert main(["render", shipped, "--out", str(tmp_path / "job")]) == 0
    out = tmp_path / "rt.yaml"
    cl = exp.cluster
    capsys.readouterr()
    assert main(["new", shipped, "--from-megatron", str(tmp_path / "job" / "command.txt"), "--gpus", str(cl.world),
                 "--gpus-per-node", str(cl.gpus_per_node), "--gpu-type", cl.gpu_type, "--out", str(out)]) == 0, \
        capsys.readouterr().err
    new = load_experiment(out)
    # the model is named by the new experiment (a shipped one may name it after its family)
    assert new.model == replace(exp.model, name=shipped) and new.extra_args == []
    assert (new.cluster.world, new.cluster.gpus_per_node, new.cluster.gpu_type) == (cl.world, cl.gpus_per_node,
                                                                                    cl.gpu_type)
    assert {k: v for k, v in new.baseline.diff(exp.baseline).items() if k not in MEASURED_FIELDS} == {}
    default = TrainingConfig()
    assert all(getattr(new.baseline, f) == getattr(default, f) for f in MEASURED_FIELDS)


def test_from_megatron_unknown_flags_go_to_extra_args_measuring_flags_dropped(capsys, no_store, tmp_path):
    """Flags moetune does not model pass through in order with their values; the run's data,
    tokenizer, schedule and checkpoints are dropped, each named in the YAML's comment."""
    exp = load_experiment("mixtral_8x7b")
    argv = [t for t in _shipped_argv(exp) if t not in ("--mock-data",)]
    argv += ["--hidden-dropout", "0.0", "--data-path", "1.0", "/data/a_text", "--save", "/ckpt",
             "--use-flash-attn", "--lr", "3e-4", "--no-check-for-nan-in-loss-and-grad"]
    out = tmp_path / "m.yaml"
    assert main(["new", "m", "--from-megatron", "--gpus", "64", "--out", str(out), "--", *argv]) == 0
    new = load_experiment(out)
    assert new.extra_args == ["--hidden-dropout", "0.0", "--use-flash-attn", "--no-check-for-nan-in-loss-and-grad"]
    comment = "\n".join(line for line in out.read_text().splitlines() if line.startswith("#"))
    for dropped in ("--data-path 1.0 /data/a_text", "--save /ckpt", "--lr 3e-4", "--train-iters 20"):
        assert dropped in comment
    assert "/data/a_text" not in out.read_text().split("name: m\n")[1]
    assert new.baseline.tp == exp.baseline.tp and new.baseline.ep == exp.baseline.ep


@pytest.mark.parametrize("continued", [False, True])
def test_from_megatron_file_with_torchrun_prefix(continued, capsys, no_store, tmp_path):
    """A file of the command line, one line or `\\` continued one flag a line, with a torchrun
    prefix: the cluster is the launcher's world (8 nodes of 8), the model and baseline the argv's."""
    exp = load_experiment("mixtral_8x7b")
    prefix = ["torchrun", "--nnodes=8", "--nproc-per-node", "8", "--rdzv-endpoint", "host:29500",
              "pretrain_gpt.py"]
    words = [shlex.quote(w) for w in prefix + _shipped_argv(exp)]
    text = (" \\\n    ".join(words) if continued else " ".join(words)) + "\n"
    src = tmp_path / "run.sh"
    src.write_text("# our launch\n" + text)
    out = tmp_path / "f.yaml"
    assert main(["new", "f", "--from-megatron", str(src), "--out", str(out)]) == 0, capsys.readouterr().err
    new = load_experiment(out)
    assert (new.cluster.nodes, new.cluster.gpus_per_node) == (8, 8)
    assert new.model == type(exp.model)(**{**exp.model.to_dict(), "name": "f"}) and new.extra_args == []
    assert new.baseline.replace(train_iters=exp.baseline.train_iters) == exp.baseline


@pytest.mark.parametrize("args, says", [
    (["--tensor-model-parallel-size", "3"], "the constraint table refuses this layout"),
    (["--normalization", "LayerNorm"], "LayerNorm"),
    (["--fp16"], "FP16"),
    (["--num-layers"], "--num-layers needs a value"),
])
def test_from_megatron_refusals_are_one_line_exit_2(args, says, capsys, no_store, tmp_path):
    """A layout the constraint table refuses (TP 3 does not divide 32 heads), a model moetune
    cannot price, a flag with no value: one line, exit 2, nothing written."""
    exp = load_experiment("mixtral_8x7b")
    argv = _shipped_argv(exp)
    for flag in args[:1]:  # replace the flag where the shipped argv has it
        if flag in argv:
            i = argv.index(flag)
            argv = argv[:i] + argv[i + 2:]
    out = tmp_path / "x.yaml"
    assert main(["new", "x", "--from-megatron", "--gpus", "64", "--out", str(out), "--", *argv, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("moetune new: ") and says in err
    assert not out.exists()


def test_from_megatron_launcher_world_and_gpus_disagree(capsys, no_store, tmp_path):
    """--gpus other than the torchrun prefix's world: one line naming both, exit 2."""
    argv = ["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py", *_shipped_argv(load_experiment("qwen3_30b_a3b"))]
    assert main(["new", "q", "--from-megatron", "--gpus", "16", "--out", str(tmp_path / "q.yaml"), "--", *argv]) == 2
    err = capsys.readouterr().err
    assert "1 node(s) of 8" in err and "--gpus 16" in err
