"""`moetune analyze PATH... [--log FILE] [--format text|json|markdown]`."""
from __future__ import annotations

import argparse
import json
import sys

from analysis import TraceError, analyze
from analysis.render import render_markdown, render_text


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="moetune analyze",
                                description="Classify the wall of Nsight Systems traces (SQLite, "
                                            ".nsys-rep, or folders of them) and/or a training log.")
    p.add_argument("paths", nargs="*", help="trace files or folders (one file per rank or node)")
    p.add_argument("--log", help="the Megatron training log of the same job")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    p.add_argument("--gpu-memory-gb", type=float, help="GPU memory (default: from the trace)")
    args = p.parse_args(argv)
    try:
        result = analyze(args.paths, log=args.log, gpu_memory_gb=args.gpu_memory_gb)
    except TraceError as e:
        print(f"moetune analyze: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(result, indent=1, default=str))
    elif args.format == "markdown":
        print(render_markdown(result))
    else:
        print(render_text(result))
    return 0
