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
