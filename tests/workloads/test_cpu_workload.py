"""workloads/cpu_workload.py, the CPU stand-in for training: its iteration lines are Megatron's as
moetune/analysis/logs.py reads them, it reads Megatron's parallel sizes and leaves the rest of a Megatron
command line alone, it refuses at start-up only where told to, and its slow-rank option is one
clear error when malformed. (Its runs as trials: tests/trial/test_stages.py, tests/tune/test_loop.py.)"""
import argparse

import pytest

from moetune.analysis.logs import parse_log
from moetune.workloads import cpu_workload as w


def test_iteration_lines_parse_as_megatrons(tmp_path):
    """Lines written by the stand-in give back their step times, count and batch through the same
    parser the trials' logs go through."""
    log = tmp_path / "log.txt"
    log.write_text("\n".join(w.iteration_line(i, 5, ms, 16) for i, ms in
                             enumerate((900.0, 120.0, 100.0, 102.0, 98.0), 1)) + "\n")
    p = parse_log(log)
    assert p["iterations"] == 5 and p["iteration_ms"] == [900.0, 120.0, 100.0, 102.0, 98.0]
    assert p["step_time_ms"] == pytest.approx(100.0) and p["failure"] is None


def test_megatron_flags_are_read_or_left_alone():
    """The parallel sizes and micro batch are read; other Megatron flags pass through; a flag named
    by --stand-in-refuse refuses only where the command line has it."""
    a = w.parse(["--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "4",
                 "--micro-batch-size", "3", "--stand-in-model-mb", "80", "--num-layers", "8",
                 "--stand-in-refuse=--recompute-modules"])
    assert (a.tensor_model_parallel_size, a.expert_model_parallel_size, a.micro_batch_size) == (2, 4, 3)
    assert a.refused is None
    assert w.model_mb(a) == pytest.approx(80 * 3 / 8)
    b = w.parse(["--recompute-modules", "core_attn", "--stand-in-refuse=--recompute-modules"])
    assert b.refused == "--recompute-modules"


def test_slow_ranks_option():
    """'R:X,...' is a map of rank to factor; anything else is argparse's one-line error."""
    assert w.slow_ranks("1:1.5, 3:2") == {1: 1.5, 3: 2.0}
    assert w.slow_ranks("") == {}
    with pytest.raises(argparse.ArgumentTypeError, match="expected RANK:FACTOR"):
        w.slow_ranks("1=2")
