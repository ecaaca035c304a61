"""`moetune analyze PATH... [--log FILE] [--format text|json|markdown]`."""
from __future__ import annotations

import json
import sys

from moetune.analysis import analyze
from moetune.analysis.errors import MoetuneError
from moetune.analysis.render import figure_rows, render_markdown, render_text
from moetune.analysis.usage import Parser


def main(argv: list[str]) -> int:
    p = Parser(prog="moetune analyze",
               description="Classify the wall of Nsight Systems traces (SQLite, "
                           ".nsys-rep, or folders of them) and/or a training log.")
    p.add_argument("paths", nargs="*", help="trace files or folders (one file per rank or node)")
    p.add_argument("--log", help="the Megatron training log of the same job")
    p.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    p.add_argument("--gpu-memory-gb", type=float, help="GPU memory (default: from the trace)")
    p.add_argument("--workers", type=int, help="processes that measure ranks at once (default: one per "
                                               "core, at most 8, as free memory allows; 1: no workers)")
    try:
        args = p.parse_args(argv)
        if not args.paths and not args.log:
            p.error("give trace files or folders, and/or --log FILE")
        if args.gpu_memory_gb is not None and args.gpu_memory_gb <= 0:
            p.error(f"--gpu-memory-gb must be positive, got {args.gpu_memory_gb}")
        if args.workers is not None and args.workers < 1:
            p.error(f"--workers must be 1 or more, got {args.workers}")
    except SystemExit as e:  # usage error (one line already printed) or --help
        return int(e.code or 0)
    try:
        result = analyze(args.paths, log=args.log, gpu_memory_gb=args.gpu_memory_gb, workers=args.workers)
    except MoetuneError as e:  # a trace it cannot read, a setting it does not take
        print(f"moetune analyze: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(result, indent=1, default=str))
    elif result.get("log_only"):
        rows = log_rows(result)
        print("\n".join(f"- {k}: {v}" for k, v in rows) if args.format == "markdown"
              else "\n".join(f"{k}: {v}" if i == 0 else f"  {k:<20} {v}" for i, (k, v) in enumerate(rows)))
    elif args.format == "markdown":
        print(render_markdown(result))
    else:
        print(render_text(result))
    return 0


def log_rows(r: dict) -> list[tuple[str, str]]:
    """(label, value) of an analysis of a log alone: its wall or why there is none, then what the
    log shows, the steady steps' median first (what a trial is judged by), and how it ended."""
    log = r.get("log") or {}
    ev = (r.get("evidence") or [{}])[0]
    wall = (f"{r['wall']} (confidence {r['confidence']:.2f}; {ev.get('metric')} = {ev.get('value')}, rule "
            f"{ev.get('rule')})" if r["wall"] != "unknown" else f"not judged ({ev.get('reason')})")
    rows = [("wall", wall), ("iterations", str(log.get("iterations") or 0)), *figure_rows(r)]
    failure = log.get("failure")
    rows.append(("ended", f"{failure}: {log.get('failure_line')}" if failure else "no failure in the log"))
    return rows
