"""On the GPU machine: one rank of each layout in benchmarks/fit_lease/layouts.json, under
megatron-core's fake process group (WORLD_SIZE/RANK of the target job, one process, no torchrun),
one after another. Per layout: NAME.log; a line per layout to results.jsonl (peak allocated and
reserved from Megatron's memory report after iteration 2, the iteration times, OOM); a table last.

    python3 benchmarks/device/fit.py OUTDIR [NAME ...]     (default: every layout)
    python3 benchmarks/device/fit.py --ab ROOT             (the fill A/B's table: ROOT/fill{0,1}_rN)

FIT_EXTRA_ARGS (Megatron flags, appended: the later of a repeated flag wins) changes every run's
argv; MOETUNE_FILL_FAKE=0 runs with the skipped collectives' outputs unfilled (workloads/fake_fill.py).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

# FIT_LAYOUTS: another file of entries in this format (benchmarks/fit_lease/unseen.json)
LAYOUTS = Path(os.environ.get("FIT_LAYOUTS") or Path(__file__).resolve().parents[1] / "fit_lease" / "layouts.json")
MEM = re.compile(r"\(after (\d+) iterations\) memory \(MB\) \| allocated: ([\d.]+) \| max allocated: ([\d.]+)"
                 r" \| reserved: ([\d.]+) \| max reserved: ([\d.]+)")
ITER = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([\d.]+)")
OOM = re.compile(r"CUDA out of memory|OutOfMemoryError")
FILL = re.compile(r"^moetune: fake process group: (filling|outputs of skipped collectives left unfilled)", re.M)
TIMEOUT_S = int(os.environ.get("FIT_TIMEOUT_S", "420"))


def summarize(name: str, text: str, rc: int, wall: float) -> dict:
    mem = [(int(m[0]), *map(float, m[1:])) for m in MEM.findall(text)]
    last = max(mem) if mem else None  # the report after the latest iteration (2: optimizer states exist)
    iters = [(int(i), float(ms)) for i, ms in ITER.findall(text)]
    err = next((l.strip()[:200] for l in text.splitlines()
                if "Error" in l and not l.lstrip().startswith("warn")), None)
    fill = FILL.search(text)
    return {"name": name, "rc": rc, "wall_s": round(wall, 1), "oom": bool(OOM.search(text)),
            "filled": None if fill is None else fill[1] == "filling",
            "mem_after_iter": last[0] if last else None,
            "max_allocated_mb": last[2] if last else None, "max_reserved_mb": last[4] if last else None,
            "iteration_ms": [ms for _, ms in iters], "error": None if rc == 0 else err}


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    layouts = json.loads(LAYOUTS.read_text())
    names = set(argv[1:])
    rows = []
    for lay in layouts:
        if names and lay["name"] not in names:
            continue
        env = dict(os.environ, **lay["env"], WORLD_SIZE=str(lay["world_size"]), RANK=str(lay["rank"]),
                   LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
        cmd = [sys.executable, "-u", "moetune/workloads/train_moe.py", *lay["argv"],
               *shlex.split(os.environ.get("FIT_EXTRA_ARGS", ""))]
        log = out / f"{lay['name']}.log"
        t0 = time.time()
        with open(log, "w") as f:
            f.write("# " + " ".join(f"{k}={v}" for k, v in sorted(lay["env"].items()))
                    + f" WORLD_SIZE={lay['world_size']} RANK={lay['rank']} " + " ".join(cmd) + "\n")
            f.flush()
            try:
                rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=TIMEOUT_S).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        row = summarize(lay["name"], log.read_text(errors="replace"), rc, time.time() - t0)
        rows.append(row)
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    print(f"{'layout':<30} {'rc':>3} {'wall_s':>6} {'max_alloc_GB':>12} {'max_resv_GB':>11} {'oom':>4}  iteration ms")
    for r in rows:
        gb = lambda v: f"{v / 1024:.2f}" if v else "-"
        print(f"{r['name']:<30} {r['rc']:>3} {r['wall_s']:>6} {gb(r['max_allocated_mb']):>12} "
              f"{gb(r['max_reserved_mb']):>11} {'yes' if r['oom'] else '-':>4}  "
              + " ".join(f"{ms:.0f}" for ms in r["iteration_ms"]))
    return 0


def ab_table(root: Path, skip: int = 2) -> int:
    """Per layout and fill setting, the median step after the first `skip` of each run, and the
    change that filling makes (fill1 against fill0, every round pooled)."""
    steps: dict[tuple[str, bool], list[float]] = {}
    for path in sorted(root.glob("fill*_r*/results.jsonl")):
        for row in map(json.loads, path.read_text().splitlines()):
            if row["rc"] == 0 and row["filled"] is not None:
                steps.setdefault((row["name"], row["filled"]), []).extend(row["iteration_ms"][skip:])
    print(f"{'layout':<30} {'unfilled ms':>11} {'filled ms':>9} {'change':>7}  (median step, after {skip})")
    for name in sorted({n for n, _ in steps}):
        off, on = steps.get((name, False)), steps.get((name, True))
        a, b = (statistics.median(v) if v else None for v in (off, on))
        change = f"{(b / a - 1) * 100:+.1f}%" if a and b else "-"
        print(f"{name:<30} {a or 0:>11.0f} {b or 0:>9.0f} {change:>7}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ab"]:
        sys.exit(ab_table(Path(sys.argv[2])))
    sys.exit(main(sys.argv[1:]))
