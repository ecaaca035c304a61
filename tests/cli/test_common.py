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
