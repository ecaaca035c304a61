"""cli/check.py, `moetune check`: a Megatron command line checked against moetune's constraint table
(ok, or one line per refusal with its guidance document), usage errors as exit 2, a mistyped flag
named with the flag meant, and what Megatron's own parser refuses reported in one line."""
import pytest

from moetune.experiment import megatron_validate as mv


@pytest.mark.e2e
def test_check_cli(capsys):
    """`moetune check` says ok to a valid command line and names the broken rule with its guidance
    document (exit 1) for EP overlap without EP."""
    from moetune.cli.main import main
    assert main(["check", "--gpus", "8", "--", "--num-layers", "8", "--num-attention-heads", "16",
                 "--num-experts", "16", "--expert-model-parallel-size", "8", "--micro-batch-size", "1",
                 "--global-batch-size", "64"]) == 0
    assert capsys.readouterr().out.strip() == "ok"
    assert main(["check", "--gpus", "8", "--", "--num-layers", "8", "--num-attention-heads", "16",
                 "--num-experts", "16", "--expert-model-parallel-size", "1", "--micro-batch-size", "1",
                 "--global-batch-size", "64", "--overlap-moe-expert-parallel-comm",
                 "--moe-token-dispatcher-type", "alltoall"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["ep_overlap_needs_ep: EP all-to-all overlap needs EP > 1 [moe-comm-overlap.txt]"]


@pytest.mark.e2e
def test_check_cli_usage_errors_and_no_separator(capsys):
    """A bad --gpus and an empty Megatron command line are usage errors (exit 2); without `--`,
    moetune's own options are still read as its own."""
    from moetune.cli.check import main
    assert main(["--gpus", "x", "--", "--num-experts", "16"]) == 2
    assert "invalid int value: 'x'" in capsys.readouterr().err
    assert main(["--gpus", "8", "--"]) == 2  # no Megatron arguments
    # without `--`, moetune's options are still its own
    assert main(["--gpus", "6", "--num-layers", "8", "--num-attention-heads", "16", "--num-experts", "16",
                 "--expert-model-parallel-size", "4", "--micro-batch-size", "1", "--global-batch-size", "6"]) == 1
    assert "expert_folding" in capsys.readouterr().out


def test_a_model_flag_that_is_not_a_number_is_one_line(capsys):
    """`--num-layers x` (read for the model, not the layout) is one line naming the flag and value,
    exit 2, not a traceback."""
    from moetune.cli.check import main
    assert main(["--no-megatron-parser", "--", "--num-layers", "x", "--num-experts", "16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "moetune check: cannot read the arguments: --num-layers x: not a whole number"


def test_check_cli_names_an_argument_megatron_lacks(capsys):
    """A mistyped flag is named (with the flag meant), not read as absent: EP is not taken as 1,
    so the overlap flag is not blamed for it. Megatron's recorded option strings, no venv needed."""
    from moetune.cli.check import main
    assert main(["--gpus", "16", "--no-megatron-parser", "--", "--num-layers", "8",
                 "--num-attention-heads", "16", "--num-experts", "16", "--expert-model-paralel-size", "8",
                 "--overlap-moe-expert-parallel-comm", "--stand-in-busy=0.5"]) == 1
    assert capsys.readouterr().out.strip().splitlines() == [
        "not a Megatron argument: --expert-model-paralel-size (did you mean --expert-model-parallel-size?)",
        "not a Megatron argument: --stand-in-busy"]


@pytest.mark.megatron
@pytest.mark.skipif(not mv.available(), reason="no .venv-megatron (scripts/megatron-venv)")
def test_check_cli_reports_what_megatrons_parser_refuses(capsys):
    """A value Megatron's own parser refuses (a misspelt dispatcher) is its one line, prefixed."""
    from moetune.cli.check import main
    assert main(["--gpus", "8", "--", "--num-layers", "8", "--num-attention-heads", "16",
                 "--num-experts", "16", "--moe-token-dispatcher-type", "alltoal"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("Megatron's parser refuses it:")
    assert "--moe-token-dispatcher-type: invalid choice: 'alltoal'" in out[0]


DEEPSEEK_FLAGS = ["--num-layers", "61", "--hidden-size", "1024", "--num-attention-heads", "16", "--num-experts",
                  "64", "--mtp-num-layers", "1", "--tensor-model-parallel-size", "1", "--expert-model-parallel-size",
                  "8", "--micro-batch-size", "1", "--global-batch-size", "64",
                  "--moe-token-dispatcher-type", "alltoall"]


@pytest.mark.parametrize("split", [
    ["--pipeline-model-parallel-size", "8", "--pipeline-model-parallel-layout", "Et*3|(tt|)*29m|L"],
    ["--pipeline-model-parallel-size", "8", "--decoder-first-pipeline-num-layers", "6",
     "--decoder-last-pipeline-num-layers", "7"],
    ["--pipeline-model-parallel-size", "7", "--num-virtual-stages-per-pipeline-rank", "3",
     "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
], ids=["layout", "first-last", "embedding-loss"])
def test_check_takes_the_uneven_pipelines_megatron_takes(split, capsys):
    """61 layers (and an MTP layer) over PP 8 as an explicit layout or as first/last stages of 6 and
    7, and over PP 7 VPP 3 with the embedding and the loss counted (63 = 21 × 3): ok, where the
    even split is refused with the count; without the loss counted, 62 is refused."""
    from moetune.cli.check import main
    gpus = "56" if split[1] == "7" else "64"  # PP 7 on 7 × 8 GPUs
    assert main(["--gpus", gpus, "--no-megatron-parser", "--", *DEEPSEEK_FLAGS, *split]) == 0
    assert capsys.readouterr().out.strip() == "ok"
    assert main(["--gpus", gpus, "--no-megatron-parser", "--", *DEEPSEEK_FLAGS, *split[:2]]) == 1
    assert capsys.readouterr().out.strip().startswith("layers_not_divisible_by_pp: 61 layers must split evenly")
    if "--account-for-loss-in-pipeline-split" in split:
        assert main(["--gpus", gpus, "--no-megatron-parser", "--", *DEEPSEEK_FLAGS, *split[:-1]]) == 1
        assert "61 layers + embedding = 62 must split evenly over PP×VPP = 7×3" in capsys.readouterr().out


def test_check_takes_both_spellings_of_the_graph_scope(capsys):
    """--cuda-graph-scope (before megatron-core 0.18) and --cuda-graph-modules with the dropless
    modules: both ok."""
    from moetune.cli.check import main
    for flag in ("--cuda-graph-scope", "--cuda-graph-modules"):
        assert main(["--gpus", "8", "--no-megatron-parser", "--", *DEEPSEEK_FLAGS[:8], "--expert-model-parallel-size",
                     "8", "--global-batch-size", "64", "--moe-token-dispatcher-type", "alltoall",
                     "--cuda-graph-impl", "transformer_engine", flag, "attn", "moe_router", "moe_preprocess"]) == 0
        assert capsys.readouterr().out.strip() == "ok", flag


def test_check_refuses_virtual_stages_named_twice(capsys):
    """A layout names its virtual stages; Megatron refuses --num-virtual-stages-per-pipeline-rank
    beside it, even where the two agree."""
    from moetune.cli.check import main
    assert main(["--gpus", "64", "--no-megatron-parser", "--", *DEEPSEEK_FLAGS, "--pipeline-model-parallel-size",
                 "8", "--num-virtual-stages-per-pipeline-rank", "4", "--pipeline-model-parallel-layout",
                 "Et*3|(tt|)*29m|L"]) == 1
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("pipeline_split_conflict: --num-virtual-stages-per-pipeline-rank and "
                           "--pipeline-model-parallel-layout cannot be set together")
