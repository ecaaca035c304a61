"""experiment/measuring.py: the one table of the trials' measuring flags, read by the export and by
the Megatron import alike."""
from moetune.experiment.config import run_args
from moetune.experiment.measuring import MEASURING, MEASURING_FLAGS
from moetune.report import megatron_export


def test_every_fixed_trial_flag_is_a_measuring_one():
    """The fixed part of each trial's argv (mock data, tokenizer, schedule, logging) is all in the
    table, each with why."""
    fixed = [t for t in run_args() if t.startswith("--")]
    assert fixed and all(flag in MEASURING and MEASURING[flag].why for flag in fixed)
    assert len(MEASURING) == len(MEASURING_FLAGS)  # no flag twice


def test_export_reads_the_same_table():
    assert megatron_export.MEASURING is MEASURING
