"""The flags a trial's Megatron command line carries for the measurement and a real run does not
keep (mock data, a short run, nsys's window, a stand-in learning rate), each with why. One table,
read where a study is exported (report/megatron_export.py) and where a Megatron command line is
imported (experiment/megatron_import.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeasuringFlag:
    """A flag the trials ran with that a real run does not keep."""
    flag: str
    """The Megatron flag, as the trials' argv has it."""
    why: str
    """Why a measurement sets it and a real run leaves it out."""


MEASURING_FLAGS: tuple[MeasuringFlag, ...] = (
    MeasuringFlag("--mock-data", "synthetic tokens: a step's time does not depend on the data"),
    MeasuringFlag("--tokenizer-type", "NullTokenizer reads no tokenizer file; mock data needs none"),
    MeasuringFlag("--tokenizer-model", "the tokenizer is the run's, not the measurement's"),
    MeasuringFlag("--vocab-file", "the tokenizer is the run's, not the measurement's"),
    MeasuringFlag("--merge-file", "the tokenizer is the run's, not the measurement's"),
    MeasuringFlag("--data-path", "the trials read mock data"),
    MeasuringFlag("--split", "the mock data's train/valid/test split"),
    MeasuringFlag("--train-iters", "a trial is a few steps: enough to warm up and time the steady ones"),
    MeasuringFlag("--lr", "a stand-in: the learning rate does not change a step's time"),
    MeasuringFlag("--min-lr", "a stand-in schedule's floor"),
    MeasuringFlag("--lr-decay-style", "a stand-in schedule"),
    MeasuringFlag("--lr-warmup-iters", "a stand-in schedule"),
    MeasuringFlag("--weight-decay", "a stand-in: the optimizer's hyperparameters are the model owner's"),
    MeasuringFlag("--clip-grad", "a stand-in: the optimizer's hyperparameters are the model owner's"),
    MeasuringFlag("--init-method-std", "a stand-in initialisation: the trials start from random weights"),
    MeasuringFlag("--log-interval", "every step logged: the tuner judges by each step's time"),
    MeasuringFlag("--log-throughput", "the per-step throughput line the tuner reads"),
    MeasuringFlag("--eval-iters", "evaluation off while measuring"),
    MeasuringFlag("--eval-interval", "evaluation off while measuring"),
    MeasuringFlag("--profile", "nsys's capture range: profiling only"),
    MeasuringFlag("--profile-step-start", "the first step nsys traces: profiling only"),
    MeasuringFlag("--profile-step-end", "the step nsys stops at: profiling only"),
    MeasuringFlag("--profile-ranks", "the ranks nsys traces: profiling only"),
    MeasuringFlag("--fake-process-group", "a one-GPU measurement of one rank alone; a real run has all its ranks"),
    MeasuringFlag("--moe-router-force-load-balancing",
                  "static routing for a benchmark: a real run routes by its router (expect the imbalance "
                  "the trials did not see)"),
    MeasuringFlag("--save", "the trials save no checkpoint"),
    MeasuringFlag("--load", "the trials load no checkpoint"),
    MeasuringFlag("--save-interval", "the trials save no checkpoint"),
    MeasuringFlag("--exit-interval", "a measurement's stop"),
    MeasuringFlag("--exit-duration-in-mins", "a measurement's stop"),
)
MEASURING = {m.flag: m for m in MEASURING_FLAGS}
