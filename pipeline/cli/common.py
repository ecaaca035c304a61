"""Pieces the subcommands' argument parsers share."""
from __future__ import annotations

import argparse
from typing import Callable

from moetune.pipeline.spec.gpus import GPU_TYPES


def exit_code(fn: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run a subcommand; argparse's usage errors and --help become exit codes, not SystemExit."""
    try:
        return fn(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2


def add_gpu_args(p: argparse.ArgumentParser, gpus_help: str) -> None:
    p.add_argument("--gpus", type=int, help=gpus_help)
    p.add_argument("--gpu-type", choices=GPU_TYPES)
