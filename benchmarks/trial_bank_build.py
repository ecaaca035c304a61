"""Build data/trial_bank/ from what `benchmarks/device/run.sh bank` left on the device.

    python data/trial_bank_build.py DIR [DIR ...]     # folders holding NAME.log, NAME.json,
                                                           # NAME.sqlite.xz (unpacked call tars)
    python data/trial_bank_build.py --add DIR [...]  # keep the bank, add or replace what DIR
                                                           # holds, re-analyse every stored trace

For each config of benchmarks/device/bank_configs.py found there it writes one line of bank.jsonl
(config, argv, state, step time from the trace's NVTX steps, TFLOP/s and memory from the log, the
moetune analysis) and copies the log and the trace (xz) into the bank. Nothing is edited by hand.
"""
from __future__ import annotations

import json
import lzma
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import checkout  # noqa: E402,F401  (moetune from this checkout)
sys.path.insert(0, str(REPO / "benchmarks" / "device"))

from moetune import analysis  # noqa: E402
from bank_configs import BASE, CONFIGS, MODEL, argv  # noqa: E402
from moetune.analysis.logs import parse_log  # noqa: E402

BANK = REPO / "data" / "trial_bank"

# Traces analysed but not kept (the bank is 54 MiB with the kept ones): each repeats what a kept
# trace shows.
# Their analysis stays in bank.jsonl; `trace` is null.
TRACE_DROPPED = {
    "mbs1": "same timeline as baseline with half the tokens per step",
    "distopt": "baseline's timeline; only the optimizer shards differ",
    "force_balance": "baseline's timeline with even routing",
    "manual_gc": "baseline's timeline; manual_gc_mbs4 keeps the GC case",
    "recompute_mlp": "recompute_moe_1gpu keeps the recompute case",
    "mbs4_1gpu": "mbs4 and mbs8_1gpu bracket it",
    "seq4096_1gpu": "seq4096 keeps the long-sequence case",
    "seq1024_1gpu": "seq1024 keeps the short-sequence case",
}


def state_of(rc: int | None, log: dict, train_iters: int) -> str:
    if log.get("failure") == "oom":
        return "OUT_OF_MEMORY"
    if rc == 0 and log["iterations"] >= train_iters:
        return "COMPLETED"
    if rc is None and log["iterations"] >= train_iters:
        return "COMPLETED"  # finished, but its runner was cut off before writing rc and trace
    return "FAILED"


def first_error(text: str) -> str | None:
    for line in text.splitlines():
        s = line.split("]: ", 1)[-1].strip()
        if s.startswith(("AssertionError", "torch.OutOfMemoryError", "torch.AcceleratorError",
                         "RuntimeError", "ValueError", "ImportError")):
            return s[:300]
    crash = re.search(r"Signal \d+ \(SIG\w+\)", text)  # a native crash: torchrun's summary only
    return f"{crash.group(0)} in the training processes, no Python traceback" if crash else None


def _analyse(name: str, trace: Path | None, log: Path) -> dict:
    work = Path("/tmp/moetune-bank") / name
    work.mkdir(parents=True, exist_ok=True)
    paths = []
    if trace is not None and trace.exists():
        shutil.copyfile(trace, work / trace.name)
        paths = [work / trace.name]
    result = analysis.analyze(paths, log=log)
    result["metrics"].pop("per_rank", None)  # keep the bank small; the trace has them
    result.pop("log", None)
    return result


def _timing(entry: dict, result: dict) -> dict:
    c = result["metrics"]["combined"]
    done = entry["state"] == "COMPLETED"
    return {"step_time_ms": c.get("step_time_ms") if done else None,
            "step_time_std_ms": c.get("step_time_std_ms") if done else None, "analysis": result}


def from_run(name: str, changes: dict, d: Path) -> dict:
    """A bank entry from one run's files (NAME.log, NAME.json, NAME.sqlite.xz in d)."""
    cfg = BASE.replace(**changes)
    meta = json.loads((d / f"{name}.json").read_text()) if (d / f"{name}.json").exists() else {}
    text = (d / f"{name}.log").read_text(errors="replace")
    log = parse_log(d / f"{name}.log")
    state = state_of(meta.get("rc"), log, cfg.train_iters)
    with lzma.open(BANK / "logs" / f"{name}.log.xz", "wt") as f:
        f.write(text)
    trace = d / f"{name}.sqlite.xz"
    trace_rel = None
    if trace.exists() and name not in TRACE_DROPPED:
        trace_rel = f"traces/{name}.sqlite.xz"
        shutil.copyfile(trace, BANK / trace_rel)
    entry = {
        "name": name, "gpus": 1 if name.endswith("_1gpu") else 2,
        "args": argv(changes), "config": cfg.to_dict(), "config_hash": cfg.config_hash(),
        "state": state, "error": None if state == "COMPLETED" else first_error(text),
        "log_step_time_ms": log["step_time_ms"], "tflops_per_gpu": log["tflops_per_gpu"],
        "peak_memory_gb": log["max_allocated_gb"], "wall_s": meta.get("wall_s"),
        "log": f"logs/{name}.log.xz", "trace": trace_rel,
    }
    return {**entry, **_timing(entry, _analyse(name, trace, d / f"{name}.log"))}


def reanalysed(entry: dict) -> dict:
    """An entry whose trace the bank keeps, analysed again by the current analysis (entries whose
    trace was dropped keep the analysis they were recorded with)."""
    if not entry.get("trace"):
        return entry
    result = _analyse(entry["name"], BANK / entry["trace"], BANK / entry["log"])
    return {**entry, **_timing(entry, result)}


def build(dirs: list[Path], add: bool = False) -> list[dict]:
    found = {}
    for d in dirs:
        for log in d.glob("*.log"):
            found[log.stem] = d
    (BANK / "logs").mkdir(parents=True, exist_ok=True)
    (BANK / "traces").mkdir(parents=True, exist_ok=True)
    stored = [json.loads(x) for x in (BANK / "bank.jsonl").read_text().splitlines()] \
        if (BANK / "bank.jsonl").exists() else []
    old = {e["name"]: e for e in stored} if add else {}
    entries = []
    for name, changes in CONFIGS:
        if name in found:
            entries.append(from_run(name, changes, found[name]))
        elif name in old:
            entries.append(reanalysed(old[name]))
    # a tuning study's trials (benchmarks/one_gpu_tuning.py) are not configs of this sweep: kept
    entries += [reanalysed(e) for e in stored if e.get("study")]
    kept = {e["trace"] for e in entries if e["trace"]} | {e["log"] for e in entries}
    for stale in list((BANK / "traces").glob("*")) + list((BANK / "logs").glob("*")):
        if f"{stale.parent.name}/{stale.name}" not in kept:
            stale.unlink()  # from an earlier build: dropped or no longer a config
    with open(BANK / "bank.jsonl", "w") as f:
        for e in entries:
            f.write(json.dumps(e, default=str) + "\n")
    return entries


def table(entries: list[dict]) -> str:
    rows = ["| config | GPUs | state | step ms (± std) | TFLOP/s/GPU | max alloc GB | wall | confidence |",
            "|---|---|---|---|---|---|---|---|"]
    for e in sorted(entries, key=lambda e: (e["state"] != "COMPLETED", e["gpus"], e["step_time_ms"] or 1e9)):
        st = f"{e['step_time_ms']:.0f} ± {e['step_time_std_ms']:.0f}" if e["step_time_ms"] else "-"
        a = e["analysis"]
        rows.append(f"| {e['name']} | {e['gpus']} | {e['state']} | {st} | {e['tflops_per_gpu'] or '-'} | "
                    f"{e['peak_memory_gb'] or '-'} | {a['wall']} | {a['confidence']:.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    add = sys.argv[1:2] == ["--add"]
    es = build([Path(p) for p in sys.argv[1 + add:]], add=add)
    print(table(es))
