"""The host's cost a launch, read from benchmarks/device/host_cost.sh's runs on the one-GPU H200
machine (16 cores): one rank of Qwen3-30B-A3B's baseline layout, host-bound, run with no
profiler, under nsys, with gradient-accumulation fusion, and pinned to fewer cores.

    .venv/bin/python benchmarks/host_cost.py [--out benchmarks/results/host_cost.json]

benchmarks/host_cost/CALL/ holds each device call's logs (NAME.log.xz) and, for the runs under nsys,
a slimmed trace (NAME.sqlite.xz: the NVTX iterations and the kernels' start and end). A run's step
is judged as the tuner judges one (analysis/figures.py judged_step: the median of the log's steady
iterations, warm-up and the profiled window left out, and their spread). Runs are compared only
within a call (one machine, one boot): two calls of the same layout ran 740 to 1040 ms a step.

What it answers for the step-time model (estimate/rates.py host_us_per_kernel):
- how much nsys slows a host-bound step, outside its capture and inside it;
- the host's time a launch with no profiler at all;
- the launches gradient-accumulation fusion saves, and whether the step follows;
- whether fewer cores a rank slow the host;
from the vppLxMyPzVw runs, the host's time a virtual stage adds (estimate/rates.py
host_ms_per_virtual_stage_pass); and, from the memLxMy[Pz] / memgLxMy[Pz] runs (x layers, y
micro-batches, z pipeline stages, without and with TE's CUDA graphs of attn, moe_router and
moe_preprocess), the GPU memory the graphs' pools take (NAME.mem.xz: the memory in use, polled every
100 ms, capture included).
"""
from __future__ import annotations

import argparse
import json
import lzma
import re
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from moetune.analysis.figures import judged_step  # noqa: E402
from moetune.analysis.load import materialize  # noqa: E402
from moetune.analysis.logs import parse_log  # noqa: E402
from moetune.estimate import memory  # noqa: E402
from moetune.estimate.memory import graphed_saved_bytes, in_flight  # noqa: E402
from moetune.experiment.config import TrainingConfig  # noqa: E402
from moetune.experiment.schema import load_experiment  # noqa: E402

import near_capacity  # noqa: E402  (benchmarks/, beside this script)

RUNS = ROOT / "benchmarks" / "host_cost"
OUT = ROOT / "benchmarks" / "results" / "host_cost.json"
# each call's runs in the order they ran (host_cost.sh start's arguments)
ORDER = {"call1": ("plain", "nsys", "gaf_nsys", "gaf", "plain_again", "cpus2", "cpus4"),
         "call2": ("plain", "gaf", "plain_again", "gaf_again", "cpus8", "cpus2")}
LAYERS, MICRO_BATCHES, LOCAL_EXPERTS = 16, 4, 8  # the runs' layout (host_cost.sh)
# the graph-memory runs: without graphs (call3), then with them (call4), by (layers, micro-batches)
GRAPH_MEMORY = {"base": "call3", "graphs": "call4", "shapes": ((8, 4), (16, 4), (16, 8))}
# the graph-memory runs with and without graphs in one call, pipeline stages too (memLxMyPz, memgLxMyPz):
# calls 5-7 on one H100 machine, 13 and 15 on two others, each run's base the run without graphs of its call
GRAPH_POOLS = ("call5", "call6", "call7", "call13", "call15")
# the virtual-stage runs (vppLxMyPzVw): one rank's layers split into w virtual stages, by call: the
# machine and the training entry the runs used. "every chunk": the entry as it was to 9ff99bf, which
# read a batch (a seq x seq attention mask in each sample) on every virtual stage of every micro-batch;
# "first and last": as Megatron's pretrain_gpt reads, only where tokens are embedded or the loss is
# taken, no mask. Calls 8 and 9 on one H100 machine, 10 on another (nsys runs traced), 11-14 on a third,
# 15 on a fourth;
# a run tagged _prev used the earlier entry in a call of the newer one (an A/B of the entry).
VIRTUAL_STAGES = {"call8": ("H100 a", "every chunk"), "call9": ("H100 a", "every chunk"),
                  "call10": ("H100 b", "every chunk"), "call11": ("H100 c", "first and last"),
                  "call12": ("H100 c", "first and last"), "call13": ("H100 c", "first and last"),
                  "call14": ("H100 c", "first and last"), "call15": ("H100 d", "first and last")}
PREV_ENTRY = "every chunk"  # what host_cost.sh's _prev runs used
# A run whose steady iterations spread more than this share of its step had its host moved under it
# (neighbours on a shared machine): a pass adds under 1 % of these steps, so such a run resolves no
# pass cost. Its pairs stay in the record, unpriced.
STEADY_SPREAD = 0.05
PRICED_ENTRY = "first and last"  # the entry whose passes the rate prices: a training's own reads
VPP_NAME = re.compile(r"vppL(?P<layers>\d+)M(?P<mbs>\d+)P(?P<pp>\d+)V(?P<vpp>\d+)(?P<tags>(?:_[a-z0-9]+)*)$")
LAYOUT = "qwen3_30b_a3b-baseline-r0"  # benchmarks/fit_lease/layouts.json
GRAPHED = ("attn", "moe_router", "moe_preprocess")  # host_cost.sh's memg runs
MEM_NAME = re.compile(r"mem(?P<graphs>g?)L(?P<layers>\d+)M(?P<mbs>\d+)(?:P(?P<pp>\d+))?$")
MB_FIGURE = {"max_allocated_mb": re.compile(r"max allocated: ([\d.]+)"),
             "max_reserved_mb": re.compile(r"max reserved: ([\d.]+)"),
             "held_reserved_mb": re.compile(r"emptying the cache \(MB\) \| reserved: ([\d.]+)")}


def kind(name: str) -> dict:
    """What a run name says: profiler, fusion, cores (host_cost.sh's run)."""
    return {"profiler": "nsys" if name.endswith("nsys") else "none", "fusion": name.startswith("gaf"),
            "cores": int(name[4:]) if name.startswith("cpus") else 16}


def trace_steps(path: Path) -> list[dict]:
    """Each captured iteration of a slimmed trace: its time, its launches, its GPU busy share."""
    con = sqlite3.connect(materialize(path))
    out = []
    for text, start, end in con.execute(
            "SELECT text, start, end FROM NVTX_EVENTS WHERE text LIKE 'iteration %' ORDER BY start"):
        n, busy = con.execute("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                              "WHERE start >= ? AND start < ?", (start, end)).fetchone()
        out.append({"iteration": int(text.split()[1]), "ms": round((end - start) / 1e6, 1),
                    "launches": n, "gpu_busy_share": round(busy / (end - start), 3)})
    con.close()
    return out


def runs() -> list[dict]:
    out = []
    for call, names in ORDER.items():
        for i, name in enumerate(names):
            judged = judged_step({"log": parse_log(RUNS / call / f"{name}.log.xz")})
            row = {"call": call, "order": i, "name": name, **kind(name), "step_ms": round(judged["step_time_ms"], 1),
                   "spread_ms": round(judged["step_time_std_ms"], 1), "steady_iterations": judged["steps"]}
            trace = RUNS / call / f"{name}.sqlite.xz"
            if trace.exists():
                row["traced"] = trace_steps(trace)
            out.append(row)
    return out


def summary(rows: list[dict]) -> dict:
    traced = {r["fusion"]: r["traced"] for r in rows if "traced" in r}
    launches = {f: statistics.median(t["launches"] for t in its) for f, its in traced.items()}
    plain = lambda call, fusion=False: [r for r in rows if r["call"] == call and r["profiler"] == "none"  # noqa: E731
                                        and r["fusion"] == fusion and r["cores"] == 16]
    out: dict = {"launches_per_step": {"unfused": launches[False], "fused": launches[True]}}
    saved = launches[False] - launches[True]
    out["fusion_launches_saved"] = {
        "share": round(saved / launches[False], 4),
        "per_layer_and_micro_batch": round(saved / LAYERS / MICRO_BATCHES, 2),
        "note": f"one gradient add a weight TE accumulates itself: 2 attention, 2 x {LOCAL_EXPERTS} local experts"}
    # nsys against none, in the call that ran both (the untraced window, then the captured iterations)
    for r in rows:
        if r["profiler"] != "nsys":
            continue
        base = statistics.median(x["step_ms"] for x in plain(r["call"], r["fusion"]))
        r["over_no_profiler"] = round(r["step_ms"] / base, 3)
        r["captured_over_no_profiler"] = round(statistics.median(t["ms"] for t in r["traced"]) / base, 3)
    per_launch = [r["step_ms"] * 1e3 / launches[r["fusion"]] for r in rows
                  if r["profiler"] == "none" and not r["fusion"] and r["cores"] == 16]
    out["us_per_launch_no_profiler"] = {"median": round(statistics.median(per_launch), 1),
                                        "range": [round(min(per_launch), 1), round(max(per_launch), 1)]}
    nsys = [r for r in rows if r["profiler"] == "nsys"]
    out["nsys_outside_capture_over_none"] = [r["over_no_profiler"] for r in nsys]
    out["nsys_captured_over_none"] = [r["captured_over_no_profiler"] for r in nsys]
    # fusion: every fused run against the unfused unpinned runs of its call, each neighbour and their median
    fused = []
    for r in rows:
        if r["profiler"] == "none" and r["fusion"]:
            others = plain(r["call"])
            fused.append({"run": f"{r['call']}:{r['name']}", "over_call_median": round(
                r["step_ms"] / statistics.median(x["step_ms"] for x in others), 3),
                "over_each": {x["name"]: round(r["step_ms"] / x["step_ms"], 3) for x in others}})
    out["fusion_step_ratio"] = fused
    pinned = []
    for r in rows:
        if r["profiler"] == "none" and r["cores"] < 16:
            others = plain(r["call"])
            base = [x["step_ms"] for x in others]
            # slower only if beyond every unpinned run's step plus its own spread
            pinned.append({"run": f"{r['call']}:{r['name']}", "cores": r["cores"],
                           "over_call_median": round(r["step_ms"] / statistics.median(base), 3),
                           "within_unpinned_spread": r["step_ms"] <= max(x["step_ms"] + x["spread_ms"]
                                                                         for x in others)})
    out["fewer_cores"] = pinned
    return out


def peak_mib(path: Path) -> int:
    """The most memory in use an nvidia-smi poll saw (MiB, one value a line)."""
    with lzma.open(path, "rt") as f:
        return max(int(x) for x in f.read().split() if x.isdigit())


def graph_memory() -> dict:
    """Each (layers, micro-batches) run's peak without and with CUDA graphs, what the graphs added,
    and beside it the graphed scopes' saved tensors by the estimate (memory.graphed_saved_bytes);
    the pools' fixed part and their share of those tensors through the two 4-micro-batch runs (the
    micro-batches a step of the trials the estimate is checked on), the rows memory.py prices graphs
    by; and that checked on the 48-layer graphed trial of benchmarks/results/near_capacity.json."""
    rows = []
    for layers, mbs in GRAPH_MEMORY["shapes"]:
        base = peak_mib(RUNS / GRAPH_MEMORY["base"] / f"memL{layers}M{mbs}.mem.xz")
        graphs = peak_mib(RUNS / GRAPH_MEMORY["graphs"] / f"memgL{layers}M{mbs}.mem.xz")
        rows.append({"layers": layers, "micro_batches": mbs, "peak_mib": base, "graphs_peak_mib": graphs,
                     "graphs_add_mib": graphs - base, "saved_mib": round(saved_mib(layers, mbs), 1)})
    by = {(r["layers"], r["micro_batches"]): r for r in rows}
    lo, hi = by[8, 4], by[16, 4]
    factor = (hi["graphs_add_mib"] - lo["graphs_add_mib"]) / (hi["saved_mib"] - lo["saved_mib"])
    fixed = lo["graphs_add_mib"] - factor * lo["saved_mib"]
    return {"runs": rows,
            "per_layer_and_micro_batch_mib": {
                "layers 8 to 16 at 4 micro-batches": round((hi["graphs_add_mib"] - lo["graphs_add_mib"]) / (8 * 4), 1),
                "micro-batches 4 to 8 at 16 layers": round(
                    (by[16, 8]["graphs_add_mib"] - hi["graphs_add_mib"]) / (16 * 4), 1)},
            "pools": {"fixed_mib": round(fixed), "factor": round(factor, 4),
                      "from": "the 8- and 16-layer runs at 4 micro-batches"},
            "check": near_capacity_check(round(fixed), round(factor, 4))}


def saved_mib(layers: int, micro_batches: int, pp: int = 1) -> float:
    """memory.graphed_saved_bytes of a run's first stage (MiB): the layout's graphed scopes' saved
    tensors, its layers, its micro-batches in flight."""
    layout = next(x for x in json.loads((ROOT / "benchmarks" / "fit_lease" / "layouts.json").read_text())
                  if x["name"] == LAYOUT)
    m = load_experiment(layout["model"]).model
    c = TrainingConfig.from_dict(layout["config"]).replace(
        pp=pp, cuda_graph_impl="transformer_engine", cuda_graph_modules=GRAPHED,
        capacity_factor=1.0, pad_to_capacity=True)  # as its argv runs it
    return graphed_saved_bytes(m, c, 0, layers / pp, in_flight(c, micro_batches, 0)) / 2**20


def near_capacity_check(fixed_mib: float, factor: float) -> dict:
    """The graphed trial of near_capacity.json (Qwen3-30B-A3B, 48 layers, 4 micro-batches, one
    H100): the reserved memory over the most allocated, which the graphs' pools make (replays
    allocate nothing), beside the pools priced by this record's rows."""
    record = json.loads((ROOT / "benchmarks" / "results" / "near_capacity.json").read_text())
    v = next(x for x in record["variants"] if x["config"]["cuda_graph_impl"] != "none")
    exp = near_capacity.load_variant(v["variant"], Path(tempfile.mkdtemp()))
    m, world = exp.model, exp.cluster.gpus
    c = TrainingConfig.from_dict(v["config"])
    saved = graphed_saved_bytes(m, c, 0, m.num_layers, in_flight(c, v["micro_batches"], 0)) / 2**20
    measured = (v["max_reserved_gb"] - v["max_allocated_gb"]) * 1024
    priced = fixed_mib + factor * saved
    # the same layout's fits, without and with layernorm recompute (each twice): their peaks (the
    # reserved memory: graphs' pools in it) beside the whole estimate less its fixed overhead
    fits = []
    for fix, modules in (("baseline", ()), ("recompute_layernorm", ("layernorm",))):
        cfg = c.replace(recompute_granularity="selective" if modules else None, recompute_modules=modules)
        est = memory.estimate(m, cfg, world)
        fits.append({"fix": fix, "peaks_gb": [x["peak_gb"] for x in record["checks"] if x["fix"] == fix],
                     "estimate_gb": round(est.total_gb - est.fixed_gb, 2),
                     "cuda_graphs_gb": round(est.cuda_graphs_gb, 2)})
    return {"trial": v["variant"], "reserved_over_allocated_mib": round(measured), "saved_mib": round(saved, 1),
            "priced_mib": round(priced), "error": round(priced / measured - 1, 3), "fits": fits}


def mem_run(path: Path) -> dict:
    """One memLxMy[Pz] run of GRAPH_POOLS: its shape, the GPU's peak in use, and the allocator's
    figures (the last of each in the log: the end of the run, after the graphs' capture)."""
    name = path.name.removesuffix(".mem.xz")
    shape = MEM_NAME.match(name)
    if shape is None:
        raise ValueError(f"{path}: not a memLxMy[Pz] run")
    with lzma.open(path.with_name(f"{name}.log.xz"), "rt") as f:
        log = f.read()
    row = {"name": name, "graphs": bool(shape["graphs"]), "layers": int(shape["layers"]),
           "micro_batches": int(shape["mbs"]), "pp": int(shape["pp"] or 1), "peak_mib": peak_mib(path)}
    for key, pattern in MB_FIGURE.items():
        found = pattern.findall(log)
        row[key] = float(found[-1]) if found else None
    return row


def graph_pools(pools: dict) -> dict:
    """GRAPH_POOLS's runs: what each graphed run added to the GPU's peak over the run of the same
    layers, micro-batches and stages without graphs in its call (nvidia-smi's, and the allocator's
    reserved over its most allocated, which replays do not raise), beside the pools this record's
    rows price. `pools`: this record's rows (graph_memory's). (The allocator's figure after emptying
    its cache says nothing of the pools: Megatron has freed the graphs by then.)"""
    rows = []
    for call in GRAPH_POOLS:
        for p in sorted((RUNS / call).glob("mem*.mem.xz")):
            rows.append({"call": call, **mem_run(p)})
    shape = lambda r: (r["call"], r["layers"], r["micro_batches"], r["pp"])  # noqa: E731
    base = {shape(r): r for r in rows if not r["graphs"]}
    for r in (r for r in rows if r["graphs"]):
        r["saved_mib"] = round(saved_mib(r["layers"], r["micro_batches"], r["pp"]), 1)
        r["priced_mib"] = round(pools["fixed_mib"] + pools["factor"] * r["saved_mib"])
        r["reserved_over_allocated_mib"] = round(r["max_reserved_mb"] - r["max_allocated_mb"])
        if shape(r) in base:
            b = base[shape(r)]
            r["graphs_add_mib"] = r["peak_mib"] - b["peak_mib"]
            r["error"] = round(r["priced_mib"] / r["graphs_add_mib"] - 1, 3)
    return {"source": [str((RUNS / c).relative_to(ROOT)) for c in GRAPH_POOLS], "runs": rows}


def vpp_kind(name: str) -> dict:
    """What a vppLxMyPzVw[_tag...] name says: the shape, the profiler, the sends overlapped or not,
    and whether it ran the earlier entry (_prev)."""
    m = VPP_NAME.match(name)
    if m is None:
        raise ValueError(f"{name}: not a vppLxMyPzVw run")
    tags = set(m["tags"].split("_")) - {""}
    return {"layers": int(m["layers"]), "micro_batches": int(m["mbs"]), "pp": int(m["pp"]),
            "vpp": int(m["vpp"]), "profiler": "nsys" if "nsys" in tags else "none",
            "p2p_overlap": "nop2p" not in tags, "prev_entry": "prev" in tags}


def virtual_stages() -> dict:
    """VIRTUAL_STAGES's runs: each run's judged step; each run with w > 1 virtual stages against
    the w = 1 run of its call with the same entry, stages, profiler and send overlap. A micro-batch
    passes a rank's virtual stages once forward and once backward, so w stages make 2 (w - 1) passes
    a micro-batch beyond the first two: the host's time a pass is the step's growth over those passes
    (the layout is host-bound, and its GPU work is the same at every w). The traced pairs' launches
    say how little of it is kernels. The rate is the median over the PRICED_ENTRY's pairs; the
    earlier entry's pairs are kept, with what the entry itself cost (`entry_ab`: the same shape
    under both entries in one call)."""
    seen: dict[Path, dict] = {}  # each log judged once: the entry's A/B below reuses the runs'

    def judged_of(p: Path) -> dict:
        if p not in seen:
            seen[p] = judged_step({"log": parse_log(p)})
        return seen[p]

    rows = []
    for call, (machine, entry) in VIRTUAL_STAGES.items():
        for p in sorted((RUNS / call).glob("vpp*.log.xz")):
            name = p.name.removesuffix(".log.xz")
            judged = judged_of(p)
            shape = vpp_kind(name)
            row = {"call": call, "machine": machine, "name": name, **shape,
                   "entry": PREV_ENTRY if shape["prev_entry"] else entry,
                   "step_ms": round(judged["step_time_ms"], 1), "spread_ms": round(judged["step_time_std_ms"], 1)}
            trace = p.with_name(f"{name}.sqlite.xz")
            if trace.exists():
                row["traced"] = trace_steps(trace)
            rows.append(row)
    key = lambda r: (r["call"], r["entry"], r["layers"], r["micro_batches"], r["pp"], r["profiler"],  # noqa: E731
                     r["p2p_overlap"])
    base = {key(r): r for r in rows if r["vpp"] == 1}
    steady = lambda r: r["spread_ms"] <= STEADY_SPREAD * r["step_ms"]  # noqa: E731
    for r in rows:
        b = base.get(key(r))
        if r["vpp"] > 1 and b is not None:
            passes = 2 * (r["vpp"] - 1) * r["micro_batches"]
            r["passes_added"] = passes
            if not (steady(r) and steady(b)):
                r["unresolved"] = f"a run of the pair spread over {STEADY_SPREAD:.0%} of its step"
                continue
            r["ms_per_pass"] = round((r["step_ms"] - b["step_ms"]) / passes, 2)
            if "traced" in r and "traced" in b:
                added = statistics.median(t["launches"] for t in r["traced"]) - statistics.median(
                    t["launches"] for t in b["traced"])
                r["launches_per_pass"] = round(added / passes, 2)

    def per_pass(entry):
        got = [r["ms_per_pass"] for r in rows if "ms_per_pass" in r and r["entry"] == entry]
        return {"median": round(statistics.median(got), 2), "range": [min(got), max(got)], "n": len(got)}

    ab = []  # every run of these calls tagged _prev (PP 1's plain too) beside the same run untagged
    for call in VIRTUAL_STAGES:
        for p in sorted((RUNS / call).glob("*_prev.log.xz")):
            newer = p.with_name(p.name.replace("_prev", ""))
            if newer.exists():
                ab.append({"call": call, "run": newer.name.removesuffix(".log.xz"),
                           **{k: round(judged_of(f)["step_time_ms"], 1)
                              for k, f in (("every_chunk_ms", p), ("first_and_last_ms", newer))}})
    return {"source": [str((RUNS / c).relative_to(ROOT)) for c in VIRTUAL_STAGES], "runs": rows,
            "steady_spread": STEADY_SPREAD, "unresolved": sum("unresolved" in r for r in rows),
            "priced_entry": PRICED_ENTRY, "ms_per_pass": per_pass(PRICED_ENTRY),
            "ms_per_pass_every_chunk": per_pass(PREV_ENTRY), "entry_ab": ab,
            "launches_per_pass": {e: [r["launches_per_pass"] for r in rows
                                      if "launches_per_pass" in r and r["entry"] == e]
                                  for e in (PRICED_ENTRY, PREV_ENTRY)}}


def measure() -> dict:
    rows = runs()
    graphs = graph_memory()
    return {"source": str(RUNS.relative_to(ROOT)), "machine": "one H200, 16 cores (Intel Xeon, 1 thread a core)",
            "layout": "qwen3_30b_a3b-baseline-r0 (benchmarks/fit_lease/layouts.json), 16 layers, 4 micro-batches",
            "summary": summary(rows), "runs": rows, "cuda_graph_memory": graphs,
            "cuda_graph_pools": graph_pools(graphs["pools"]), "virtual_stages": virtual_stages()}


def table(record: dict) -> str:
    lines = [f"{'run':<18} {'profiler':>8} {'fused':>5} {'cores':>5} {'step ms':>8} {'spread':>6}"]
    for r in record["runs"]:
        lines.append(f"{r['call'] + ':' + r['name']:<18} {r['profiler']:>8} {'yes' if r['fusion'] else 'no':>5} "
                     f"{r['cores']:>5} {r['step_ms']:>8.0f} {r['spread_ms']:>6.0f}")
    s = record["summary"]
    lines += [f"launches a step: {s['launches_per_step']}; fusion saves {s['fusion_launches_saved']['share']:.1%} "
              f"({s['fusion_launches_saved']['per_layer_and_micro_batch']} a layer and micro-batch)",
              f"host us a launch, no profiler: {s['us_per_launch_no_profiler']}",
              f"nsys over none: outside capture {s['nsys_outside_capture_over_none']}, "
              f"captured {s['nsys_captured_over_none']}",
              "fused over unfused (call median): " + ", ".join(f"{f['run']} {f['over_call_median']}"
                                                               for f in s["fusion_step_ratio"]),
              "fewer cores over 16 (call median): " + ", ".join(f"{p['run']} {p['over_call_median']}"
                                                                for p in s["fewer_cores"])]
    g = record["cuda_graph_memory"]
    lines += ["CUDA graphs (attn, moe_router, moe_preprocess), peak MiB without / with: " + ", ".join(
        f"{r['layers']} layers x {r['micro_batches']} micro-batches {r['peak_mib']} / {r['graphs_peak_mib']} "
        f"(+{r['graphs_add_mib']})" for r in g["runs"]),
        "  added a layer and micro-batch: "
        + ", ".join(f"{k} {v}" for k, v in g["per_layer_and_micro_batch_mib"].items()),
        f"  pools priced as {g['pools']['fixed_mib']} MiB + {g['pools']['factor']} x the graphed scopes' saved "
        f"tensors ({g['pools']['from']}); {g['check']['trial']}: {g['check']['priced_mib']} MiB priced, "
        f"{g['check']['reserved_over_allocated_mib']} reserved over allocated ({g['check']['error']:+.1%})"]
    lines += [f"  its fit, {f['fix']}: peaks {', '.join(f'{x:.1f}' for x in f['peaks_gb'])} GB, estimated "
              f"{f['estimate_gb']:.1f} (pools {f['cuda_graphs_gb']:.1f})" for f in g["check"]["fits"]]
    lines += [f"  {r['call']}:{r['name']} (PP {r['pp']}, {r['layers'] // r['pp']} layers a stage): added "
              f"{r.get('graphs_add_mib', '-')} MiB to the peak, reserved over allocated "
              f"{r['reserved_over_allocated_mib']}, priced {r['priced_mib']}"
              for r in record["cuda_graph_pools"]["runs"] if r["graphs"]]
    v = record["virtual_stages"]
    lines.append("virtual stages (one rank of PP 4, 8 micro-batches), step ms by call:")
    for r in v["runs"]:
        extra = (f", {r['ms_per_pass']} ms a pass added" if "ms_per_pass" in r else "") + (
            f", unresolved ({r['unresolved']})" if "unresolved" in r else "") + (
            f", {r['launches_per_pass']} launches a pass" if "launches_per_pass" in r else "")
        lines.append(f"  {r['call']}:{r['name']} ({r['machine']}, {r['entry']}) {r['step_ms']:.0f} "
                     f"+- {r['spread_ms']:.0f}{extra}")
    lines += [f"  the entry's own A/B, {a['call']}:{a['run']}: a batch read every chunk {a['every_chunk_ms']:.0f}, "
              f"first and last only {a['first_and_last_ms']:.0f}" for a in v["entry_ab"]]
    for label, k in (("priced", "ms_per_pass"), ("every chunk reading", "ms_per_pass_every_chunk")):
        lines.append(f"  host ms a virtual-stage pass ({label}): median {v[k]['median']} of {v[k]['n']}, "
                     f"range {v[k]['range']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    record = measure()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))
    print(f"written: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
