"""The communication sweep's table: each run of benchmarks/device/comm.sh (NAME.log[.xz] and
NAME.sqlite[.xz] in a folder; without the trace, the log's figures alone) analysed by moetune (its
wall, the all-to-all's exposed time split into waiting and transfer), its judged step (the steady iterations' median, decide/judge.py) beside what
`moetune predict` says for the same config on the same GPU type, with no measurement in the store.

    python benchmarks/comm_results.py RUNS_DIR EXPERIMENT --gpu-type H200 --machine WORDS --out FILE.json

Writes FILE.json ({"sweep": [{"name", "measured_ms", "predicted_ms", "wall", "exposed_a2a_ms", ...}],
"sweep_gpu_hours", "machine", ...}) and prints a Markdown table."""
import argparse
import json
import lzma
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkout  # noqa: E402,F401  (moetune from this checkout)

from moetune.analysis import analyze  # noqa: E402
from moetune.decide.judge import judged_step  # noqa: E402
from moetune.estimate.pricing import price  # noqa: E402
from moetune.estimate.readings import StoreReadings  # noqa: E402
from moetune.experiment.schema import load_experiment  # noqa: E402

SPEC = Path(__file__).resolve().parent / "device" / "comm_sweep.py"


def sweep_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("comm_sweep", SPEC)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def trace_of(folder: Path, name: str, scratch: Path) -> Path | None:
    if (folder / f"{name}.sqlite").is_file():
        return folder / f"{name}.sqlite"
    xz = folder / f"{name}.sqlite.xz"
    if not xz.is_file():
        return None
    out = scratch / f"{name}.sqlite"
    with lzma.open(xz) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def row(folder: Path, name: str, env: dict, cfg, exp, gpu_type: str, scratch: Path) -> dict | None:
    log = folder / f"{name}.log"
    if not log.is_file() and (folder / f"{name}.log.xz").is_file():
        log = scratch / f"{name}.log"
        with lzma.open(folder / f"{name}.log.xz") as src, open(log, "wb") as dst:
            shutil.copyfileobj(src, dst)
    if not log.is_file():
        return None
    trace = trace_of(folder, name, scratch)
    an = analyze([str(trace)] if trace else [], log=str(log))
    judged = judged_step(an)
    c = an["metrics"]["combined"] if trace else {}
    pred = price(exp, cfg, StoreReadings.empty(), gpu_type=gpu_type)
    wall_s = json.loads((folder / f"{name}.json").read_text())["wall_s"] if (folder / f"{name}.json").is_file() else None
    out = {"name": name, "env": env, "measured_ms": judged.get("step_time_ms"),
           "measured_spread_ms": judged.get("step_time_std_ms"), "measured_by": judged.get("source"),
           "profiled_step_ms": c.get("step_time_ms"), "predicted_ms": round(pred.step_time_ms, 1),
           "predicted_terms_ms": {k: round(v, 1) for k, v in pred.terms.items()},
           "wall": an["wall"], "exposed_a2a_ms": c.get("exposed_a2a_ms"), "a2a_wait_ms": c.get("a2a_wait_ms"),
           "a2a_transfer_ms": c.get("a2a_transfer_ms"), "gpu_idle_share": c.get("gpu_idle_share"),
           "kernels_per_step": c.get("kernels_per_step"), "peak_memory_gb": c.get("peak_memory_gb"),
           "job_wall_s": wall_s}
    if trace and trace.parent == scratch:
        trace.unlink()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs")
    p.add_argument("experiment")
    p.add_argument("--gpu-type", required=True)
    p.add_argument("--machine", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    exp = load_experiment(a.experiment)
    sw = sweep_module()
    folder = Path(a.runs)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, changes, env in sw.sweep(exp):
            r = row(folder, name, env, sw.config(exp, changes), exp, a.gpu_type, Path(scratch))
            if r:
                rows.append(r)
    gpus = exp.cluster.gpus
    hours = sum((r["job_wall_s"] or 0) for r in rows) * gpus / 3600
    errs = [abs(r["predicted_ms"] / r["measured_ms"] - 1) for r in rows if r["measured_ms"]]
    record = {"experiment": exp.name, "machine": a.machine, "gpus": gpus, "sweep": rows,
              "sweep_gpu_hours": round(hours, 3),
              "median_abs_prediction_error": round(statistics.median(errs), 3) if errs else None}
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    print("| run | measured ms | predicted ms | wall | exposed a2a ms (wait / transfer) | GPU idle | peak GB |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['measured_ms']} ± {r['measured_spread_ms']} | {r['predicted_ms']} | {r['wall']} | "
              f"{r['exposed_a2a_ms']} ({r['a2a_wait_ms']} / {r['a2a_transfer_ms']}) | {r['gpu_idle_share']} | "
              f"{r['peak_memory_gb']} |")
    print(f"sweep GPU-hours {record['sweep_gpu_hours']}, median |predicted/measured - 1| "
          f"{record['median_abs_prediction_error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
