"""The communication sweep's table: each run of benchmarks/device/comm.sh (NAME.log[.xz] and
NAME.sqlite[.xz] in a folder; without the trace, the log's figures alone) analysed by moetune (its
wall, the all-to-all's exposed time split into waiting and transfer), its judged step (the steady iterations' median, decide/judge.py) beside what
`moetune predict` says for the same config on the same GPU type, with no measurement in the store.

    python benchmarks/comm_results.py RUNS_DIR EXPERIMENT --gpu-type H200 --machine WORDS --out FILE.json \
        [--probe NAME=calibration.json ...]

Writes FILE.json ({"sweep": [{"name", "measured_ms", "predicted_ms", "wall", "exposed_a2a_ms", ...}],
"overlap_ab", "probes", "sweep_gpu_hours", "machine", ...}) and prints Markdown tables. Runs on the
slow link (NCCL through host memory) are predicted as if on NVLink, the only link of one host
moetune prices: they stay out of the prediction's error, and serve the overlap's A/B."""
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
from moetune.estimate.step import ep_overlapped_share, micro_batches  # noqa: E402
from moetune.experiment.schema import load_experiment  # noqa: E402
from moetune.store import Store  # noqa: E402

SPEC = Path(__file__).resolve().parent / "device" / "comm_sweep.py"


def sweep_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("comm_sweep", SPEC)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sweep_configs(exp) -> dict:
    """Each run of the sweep by name: its TrainingConfig (benchmarks/device/comm_sweep.py)."""
    sw = sweep_module()
    return {name: sw.config(exp, changes) for name, changes, _ in sw.sweep(exp)}


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


def row(folder: Path, name: str, env: dict, scratch: Path) -> dict | None:
    """One run's measured and traced figures (its predictions are reprice's)."""
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
    timing = folder / f"{name}.json"
    wall_s = json.loads(timing.read_text())["wall_s"] if timing.is_file() else None
    out = {"name": name, "env": env, "measured_ms": judged.get("step_time_ms"),
           "measured_spread_ms": judged.get("step_time_std_ms"), "measured_by": judged.get("source"),
           "profiled_step_ms": c.get("step_time_ms"), "wall": an["wall"],
           "exposed_a2a_ms": c.get("exposed_a2a_ms"), "a2a_wait_ms": c.get("a2a_wait_ms"),
           "a2a_transfer_ms": c.get("a2a_transfer_ms"), "gpu_idle_share": c.get("gpu_idle_share"),
           "kernels_per_step": c.get("kernels_per_step"), "peak_memory_gb": c.get("peak_memory_gb"),
           "job_wall_s": wall_s}
    if trace and trace.parent == scratch:
        trace.unlink()
    return out


def balanced_split(name: str) -> tuple[str, str]:
    """(the run's name without its _balanced suffix, that suffix or ""): a run with routing forced
    to balance pairs only with its balanced twin."""
    stem = name.removesuffix("_balanced")
    return stem, name[len(stem):]


def overlap_ab(rows: list[dict], configs: dict, gpus: int) -> list[dict]:
    """Each run with the EP overlap beside the same run without it (NAME_overlap beside NAME, or
    beside NAME_baseline: ep4_mbs4_overlap and ep4_mbs4, ep2_overlap and ep2_baseline): the step it saved, the
    all-to-all's transfer in the run without it (its trace's; for an untraced slow-link run, its
    NVLink twin's plus the slow link's extra step, all of it the all-to-all's), and the share of what
    the overlap could hide (the transfer of the micro-batches that run beside another's:
    step.ep_overlapped_share) that it hid."""
    by = {r["name"]: r for r in rows}
    out = []
    for r in rows:
        stem, tail = balanced_split(r["name"])
        if not stem.endswith("_overlap"):
            continue
        # NAME_overlap's other side: NAME, or NAME_baseline where the overlap is the sweep's one change
        base = by.get(stem.removesuffix("_overlap") + tail) or by.get(stem.removesuffix("overlap") + "baseline" + tail)
        if not base or not base["measured_ms"] or not r["measured_ms"]:
            continue
        transfer, how = base.get("a2a_transfer_ms"), "traced"
        twin = by.get(base["name"].replace("_slow_", "_", 1))
        if transfer is None and twin is not base and twin and twin.get("a2a_transfer_ms") is not None:
            transfer = twin["a2a_transfer_ms"] + base["measured_ms"] - twin["measured_ms"]
            how = f"{twin['name']}'s traced transfer plus the step the slow link added"
        if transfer is None:
            continue
        cfg = configs[r["name"]]
        paired = ep_overlapped_share(cfg, micro_batches(cfg, gpus))
        saved = base["measured_ms"] - r["measured_ms"]
        out.append({"without": base["name"], "with": r["name"], "env": r["env"], "saved_ms": round(saved, 1),
                    "a2a_transfer_ms": round(transfer, 1), "transfer_from": how, "paired_share": round(paired, 4),
                    "hidden_share": round(saved / (transfer * paired), 3) if paired else None})
    return out


def tp_overlap_ab(rows: list[dict]) -> list[dict]:
    """Each run with TP-comm overlap beside the same run without it (NAME_tpoverlap beside NAME):
    the step it saved, and the TP collectives' time the model prices for the run without it."""
    by = {r["name"]: r for r in rows}
    out = []
    for r in rows:
        stem, tail = balanced_split(r["name"])
        if not stem.endswith("_tpoverlap"):
            continue
        base = by.get(stem.removesuffix("_tpoverlap") + tail)
        if base and base["measured_ms"] and r["measured_ms"]:
            out.append({"without": base["name"], "with": r["name"],
                        "saved_ms": round(base["measured_ms"] - r["measured_ms"], 1),
                        "predicted_tp_collectives_ms": base["predicted_terms_ms"]["tp_collectives"]})
    return out


def setting_ab(rows: list[dict], prefix: str) -> list[dict]:
    """Each run whose name is another's with one setting more (NAME_PREFIX... beside NAME:
    ep4_mbs4_recompute_moe beside ep4_mbs4, ep4_pp2_vpp4 beside ep4_pp2): the step the setting added,
    measured (resolved where it exceeds the two runs' spreads together) and as the model prices it."""
    by = {r["name"]: r for r in rows}
    out = []
    for r in rows:
        stem, tail = balanced_split(r["name"])
        base_stem, sep, _ = stem.rpartition("_" + prefix)
        base = by.get(base_stem + tail) if sep else None
        if not (base and base["measured_ms"] and r["measured_ms"]
                and base.get("predicted_ms") and r.get("predicted_ms")):
            continue
        added = r["measured_ms"] - base["measured_ms"]
        spread = (r["measured_spread_ms"] or 0) + (base["measured_spread_ms"] or 0)
        out.append({"without": base["name"], "with": r["name"], "added_ms": round(added, 1),
                    "spread_ms": round(spread, 1), "resolved": abs(added) > spread,
                    "predicted_added_ms": round(r["predicted_ms"] - base["predicted_ms"], 1)})
    return out


SETTING_ABS = {"recompute_ab": "recompute_", "vpp_ab": "vpp"}  # record key: the runs' name part


def host_cpus(rows: list[dict], gpus: int) -> dict | None:
    """The pinned runs (CPUS: the job's cores) beside their unpinned twin: each one's step, and the
    fewest cores a rank had where the step was no slower than the twin's beyond the two spreads."""
    by = {r["name"]: r for r in rows}
    runs = []
    for r in rows:
        if "CPUS" not in r["env"]:
            continue
        stem, tail = balanced_split(r["name"])
        twin = by.get(stem.rsplit("_cpus", 1)[0] + tail)
        if twin and twin["measured_ms"] and r["measured_ms"]:
            runs.append({"name": r["name"], "cpus_a_rank": int(r["env"]["CPUS"]) // gpus,
                         "measured_ms": r["measured_ms"], "spread_ms": r["measured_spread_ms"],
                         "unpinned": twin["name"], "unpinned_ms": twin["measured_ms"],
                         "unpinned_spread_ms": twin["measured_spread_ms"]})
    if not runs:
        return None
    flat = [x["cpus_a_rank"] for x in runs
            if x["measured_ms"] - x["unpinned_ms"] <= (x["spread_ms"] or 0) + (x["unpinned_spread_ms"] or 0)]
    return {"runs": runs, "flat_from_cpus_a_rank": min(flat) if flat else None}


def errors(rows: list[dict], key: str) -> float | None:
    """Median |predicted / measured - 1| of `key` over the runs on NVLink with all their cores."""
    errs = [abs(r[key] / r["measured_ms"] - 1) for r in rows if r["measured_ms"] and r.get(key) and not r["env"]]
    return round(statistics.median(errs), 3) if errs else None


def reprice(record: dict, exp, gpu_type: str, calibrated_by: str | None = None) -> dict:
    """The record's predictions priced again by this checkout's model, its measured and traced
    figures kept: each run as `moetune predict` prices it with an empty store, and (calibrated_by:
    one of the record's probes) as it prices it once that probe is the cluster's calibration
    (`moetune calibrate`: its links, GEMMs, copy and launch move the rate table)."""
    configs = sweep_configs(exp)
    calibrated = None
    with tempfile.TemporaryDirectory() as scratch:
        if calibrated_by:
            store = Store(str(Path(scratch) / "calibration.sqlite"))
            store.add_calibration(exp.cluster.name, gpu_type, record["probes"][calibrated_by])
            calibrated = StoreReadings(store=store)
        for r in record["sweep"]:
            pred = price(exp, configs[r["name"]], StoreReadings.empty(), gpu_type=gpu_type)
            r["predicted_ms"] = round(pred.step_time_ms, 1)
            r["predicted_terms_ms"] = {k: round(v, 1) for k, v in pred.terms.items()}
            if calibrated is not None:
                r["predicted_calibrated_ms"] = round(price(exp, configs[r["name"]], calibrated,
                                                           gpu_type=gpu_type).step_time_ms, 1)
    record["median_abs_prediction_error"] = errors(record["sweep"], "predicted_ms")
    if calibrated_by:
        record["calibrated_by"] = calibrated_by
        record["median_abs_prediction_error_calibrated"] = errors(record["sweep"], "predicted_calibrated_ms")
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs")
    p.add_argument("experiment")
    p.add_argument("--gpu-type", required=True)
    p.add_argument("--machine", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--probe", action="append", default=[], metavar="NAME=FILE",
                   help="a link probe's record (calibrate.sh's calibration.json) to keep beside the sweep")
    p.add_argument("--calibrated-by", metavar="NAME",
                   help="price each run also with the probe NAME as the cluster's calibration")
    p.add_argument("--reprice", action="store_true",
                   help="only price again the runs of the record at --out (its measured and traced figures kept)")
    a = p.parse_args(argv)
    exp = load_experiment(a.experiment)
    known = [spec.partition("=")[0] for spec in a.probe]
    if a.reprice:
        record = json.loads(Path(a.out).read_text())
        known = list(record.get("probes") or {})
    if a.calibrated_by and a.calibrated_by not in known:
        p.error(f"--calibrated-by {a.calibrated_by}: no such probe; the probes: {', '.join(known) or 'none'}")
    if a.reprice:
        record = reprice(record, exp, a.gpu_type, a.calibrated_by)
        Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"median |predicted/measured - 1| {record['median_abs_prediction_error']}, calibrated by "
              f"{a.calibrated_by}: {record.get('median_abs_prediction_error_calibrated')} (NVLink runs)")
        return 0
    sw = sweep_module()
    folder = Path(a.runs)
    rows, configs = [], {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, changes, env in sw.sweep(exp):
            configs[name] = sw.config(exp, changes)
            r = row(folder, name, env, Path(scratch))
            if r:
                rows.append(r)
    gpus = exp.cluster.gpus
    hours = sum((r["job_wall_s"] or 0) for r in rows) * gpus / 3600
    probes = {}
    for spec in a.probe:
        label, _, path = spec.partition("=")
        probes[label] = json.loads(Path(path).read_text())
    ab = overlap_ab(rows, configs, gpus)
    record = {"experiment": exp.name, "machine": a.machine, "gpus": gpus, "sweep": rows, "overlap_ab": ab,
              "tp_overlap_ab": None, "host_cpus": host_cpus(rows, gpus),
              "probes": probes, "sweep_gpu_hours": round(hours, 3),
              "median_abs_prediction_error": None,
              "error_over": "the runs on NVLink (the slow link's are not priced as such)"}
    record = reprice(record, exp, a.gpu_type, a.calibrated_by)
    record["tp_overlap_ab"] = tp_overlap_ab(rows)  # reads the priced TP collectives
    for key, prefix in SETTING_ABS.items():  # read the predictions too
        record[key] = setting_ab(rows, prefix)
    Path(a.out).write_text(json.dumps(record, indent=1) + "\n")
    print("| run | measured ms | predicted ms | wall | exposed a2a ms (wait / transfer) | GPU idle | peak GB |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['name']} | {r['measured_ms']} ± {r['measured_spread_ms']} | {r['predicted_ms']} | {r['wall']} | "
              f"{r['exposed_a2a_ms']} ({r['a2a_wait_ms']} / {r['a2a_transfer_ms']}) | {r['gpu_idle_share']} | "
              f"{r['peak_memory_gb']} |")
    print(f"sweep GPU-hours {record['sweep_gpu_hours']}, median |predicted/measured - 1| "
          f"{record['median_abs_prediction_error']} (NVLink runs)")
    if ab:
        print("\n| without | with | saved ms | all-to-all transfer ms | paired share | hidden share |")
        print("|---|---|---:|---:|---:|---:|")
        for x in ab:
            print(f"| {x['without']} | {x['with']} | {x['saved_ms']} | {x['a2a_transfer_ms']} | {x['paired_share']} | "
                  f"{x['hidden_share']} |")
    if record["tp_overlap_ab"]:
        print("\n| without | with | saved ms | TP collectives priced ms |")
        print("|---|---|---:|---:|")
        for x in record["tp_overlap_ab"]:
            print(f"| {x['without']} | {x['with']} | {x['saved_ms']} | {x['predicted_tp_collectives_ms']} |")
    for key in SETTING_ABS:
        if record[key]:
            print("\n| without | with | step added ms (measured) | runs' spreads ms | resolved | predicted |")
            print("|---|---|---:|---:|---|---:|")
            for x in record[key]:
                print(f"| {x['without']} | {x['with']} | {x['added_ms']} | {x['spread_ms']} | "
                      f"{'yes' if x['resolved'] else 'no'} | {x['predicted_added_ms']} |")
    if record["host_cpus"]:
        print("\n| run | cores a rank | measured ms | unpinned ms |")
        print("|---|---:|---:|---:|")
        for x in record["host_cpus"]["runs"]:
            print(f"| {x['name']} | {x['cpus_a_rank']} | {x['measured_ms']} ± {x['spread_ms']} | "
                  f"{x['unpinned_ms']} ± {x['unpinned_spread_ms']} |")
        print(f"no slower from {record['host_cpus']['flat_from_cpus_a_rank']} cores a rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
