"""cli/common.py: a subcommand's argparse exits become exit codes (usage errors 2, --help 0, the
subcommand's own code as it is), and --gpu-type offers exactly the GPU table's types."""
import argparse

import pytest

from moetune.cli.common import add_gpu_args, exit_code
from moetune.experiment.gpus import GPU_TYPES


def parser():
    p = argparse.ArgumentParser(prog="x")
    add_gpu_args(p, "GPUs in all")
    return p


def run(argv):
    parser().parse_args(argv)
    return 7


@pytest.mark.parametrize("argv, code", [(["--gpus", "8"], 7), (["--gpus", "eight"], 2),
                                        (["--help"], 0), (["--gpu-type", "H999"], 2)])
def test_argparse_exits_become_exit_codes(argv, code, capsys):
    """What the subcommand returns is the code; argparse's usage error is 2 and --help is 0."""
    assert exit_code(run, argv) == code


def test_gpu_type_choices_are_the_gpu_table():
    """Every type of experiment/gpus.py is accepted by --gpu-type, and nothing else."""
    for t in GPU_TYPES:
        assert parser().parse_args(["--gpu-type", t]).gpu_type == t
    (action,) = [a for a in parser()._actions if a.dest == "gpu_type"]
    assert tuple(action.choices) == GPU_TYPES


@pytest.mark.parametrize("text, ok", [("1", True), ("8", True), ("0", False), ("-1", False), ("x", False)])
def test_positive_int_says_what_is_allowed(text, ok):
    """positive_int takes whole numbers of 1 or more; anything else says give 1 or more."""
    from moetune.cli.common import positive_int
    if ok:
        assert positive_int(text) == int(text)
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="give 1 or more"):
            positive_int(text)


# The bad layouts of issue 35, each as an experiment whose baseline it is: (what it is, model
# changes, cluster changes, baseline changes, plan's flags that ask for it, the rule that refuses it)
BAD_LAYOUTS = [
    ("94 layers over PP 3", {"num_layers": 94}, {"nodes": 3}, {"pp": 3, "ep": 8, "global_batch": 64},
     ["--pp", "3", "--ep", "8"], "layers_not_divisible_by_pp"),
    ("EP overlap with PP 2 and no VPP", {}, {}, {"pp": 2, "ep": 8, "overlap_ep_a2a": True},
     ["--pp", "2", "--ep", "8", "--ep-overlap"], "ep_overlap_needs_vpp"),
    ("15 experts at EP 2", {"num_experts": 15}, {}, {"ep": 2}, ["--ep", "2"], "experts_not_divisible_by_ep"),
    ("top-k 32 of 16 experts", {"num_experts": 16, "moe_router_topk": 32}, {}, {"ep": 16}, ["--ep", "16"],
     "topk_exceeds_experts"),
    ("16 heads over 5 query groups", {"num_attention_heads": 16, "num_query_groups": 5}, {}, {"ep": 16},
     ["--ep", "16"], "heads_not_divisible_by_query_groups"),
]


@pytest.mark.parametrize("what, model, cluster, baseline, flags, rule", BAD_LAYOUTS, ids=[b[0] for b in BAD_LAYOUTS])
def test_check_predict_plan_render_refuse_a_layout_alike(what, model, cluster, baseline, flags, rule, tmp_path,
                                                        capsys, no_store):
    """A layout the constraint table refuses: `check` prints the rule's one line (its verdict,
    exit 1); `predict`, `plan` (asked for that layout) and `render` each exit 2 with one line that
    holds the same line, so the rule and its source read the same wherever the layout is asked."""
    import yaml

    from moetune.cli.main import main
    from moetune.experiment.schema import load_experiment
    from moetune.paths import EXPERIMENTS
    data = yaml.safe_load((EXPERIMENTS / "qwen3_30b_a3b.yaml").read_text())
    data["model"].update(model)
    data["cluster"].update(cluster)
    data["baseline"].update(baseline)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    exp = load_experiment(str(path))
    capsys.readouterr()
    assert main(["check", "--experiment", str(path), "--no-megatron-parser", "--",
                 *exp.baseline.to_args(exp.model)]) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"{rule}: ") and line.endswith("]"), line  # the rule, its message, its source
    for argv in (["predict", str(path)], ["plan", str(path), *flags],
                 ["render", str(path), "--out", str(tmp_path / "job")]):
        assert main(argv) == 2, (what, argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0] == f"moetune {argv[0]}: the constraint table refuses this layout: {line}", \
            (what, argv, err)
    assert not (tmp_path / "job").exists()  # render wrote nothing
