"""Which wall holds the run back: memory, communication, host_overhead or compute.

`THRESHOLDS` is the policy as data, with the limits of the one input it derives from two metrics
(`LAUNCH_BOUND`) beside it. Each row: the wall, the metric, the comparison, the threshold, and
the guidance it comes from. A row fires when its metric crosses its threshold; its
strength is how far past (value / threshold). The strongest firing wall wins; ties go by
`WALL_ORDER` (fit first). No row fires: `compute` if the GPU is busy, else `unknown`.

A run is memory-walled when it ran out of GPU memory, as the guidance means it ("make the run
memory-feasible"). A run killed for the node's host memory (Slurm's cgroup, the kernel's OOM
killer: the log's `host_oom`) is not: no GPU memory fix (recompute, offload, more parallelism)
answers it. A run that completed with its allocator peak near the GPU's capacity is not either:
its wall is whatever else holds it back. Such rows (`LIMITS`) stand in the evidence with
`limits` instead of a wall (the rule table bars the fixes that grow memory through the same
share: a larger micro batch requires it under 0.6, moetune/decide/rules.yaml). A recorded H100 run
of Mixtral 8x7B at 95.7 % of capacity and 4.8 % GPU idle is compute-walled
(tests/benchmarks/test_near_capacity.py).
"""
from __future__ import annotations

WORKFLOW = "moe-optimization-workflow.md (Profile The Dominant Bottleneck)"

# the walls, in the order ties go (fit first); the rule table's walls (moetune/decide/rules.py)
WALL_ORDER = ("memory", "communication", "host_overhead", "compute")

# a launch-bound trace: median kernel under this many microseconds with the GPU idle over this share
LAUNCH_BOUND = {"median_kernel_us": 20, "gpu_idle_share": 0.10}

# (rule, wall, metric, op, threshold, source)
THRESHOLDS: tuple[tuple[str, str | None, str, str, float, str], ...] = (
    ("oom_in_log", "memory", "log_oom", ">=", 1.0, WORKFLOW + ": OOMs during warmup"),
    ("host_oom_in_log", None, "log_host_oom", ">=", 1.0,
     "the job went over the node's memory (Slurm's cgroup, the kernel's OOM killer), not the GPU's"),
    ("memory_near_capacity", "memory", "memory_used_share", ">=", 0.92,
     WORKFLOW + ": run fits only barely"),
    # all exposed communication (all-to-all and the other collectives, less the waiting), as the
    # guidance words it; the row's id stays as the trial bank's and every stored analysis's evidence
    # names it, and the all-to-all alone is the overlap rules' own condition (rules.yaml)
    ("exposed_a2a", "communication", "exposed_comm_share_net", ">=", 0.15,
     WORKFLOW + ": Nsight shows large all-to-all or collective blocks"),
    ("gpu_idle", "host_overhead", "gpu_idle_share", ">=", 0.25,
     WORKFLOW + ": GPU gaps, launch-bound traces"),
    ("straggler_wait", "host_overhead", "a2a_wait_share", ">=", 0.15,
     "a late rank makes its peers' all-to-all kernels (NCCL, DeepEP, HybridEP) wait: host stall, not communication"),
    ("short_kernels", "host_overhead", "launch_bound", ">=", 1.0,
     WORKFLOW + ": launch-bound (median kernel under 20 us with idle over 10%)"),
    ("busy_compute", "compute", "sm_util_estimate", ">=", 0.70,
     WORKFLOW + ": busy GPU; next fixes are kernel-level (grouped GEMM, fusion, FP8)"),
)

# rows that limit the next fixes instead of naming a wall: rule -> what they bar
LIMITS = {"memory_near_capacity": "memory: fixes that grow memory (a larger micro batch, less "
                                  "recompute) would not fit",
          "host_oom_in_log": "host memory, not the GPU's: no GPU memory fix answers it; the job "
                             "needs more of the node's memory or to hold less there"}

MIN_WINDOW_MS = 0.05  # below this the trace cannot decide


def _ops(v: float, op: str, t: float) -> bool:
    return v >= t if op == ">=" else v <= t


def memory_used_share(metrics: dict, log: dict | None, gpu_memory_gb: float | None) -> float | None:
    """The run's peak memory (the trace's, else the log's max allocated) as a share of the GPU's;
    None where either is unknown."""
    peak = metrics.get("peak_memory_gb") or (log or {}).get("max_allocated_gb")
    return peak / gpu_memory_gb if peak and gpu_memory_gb else None


def table_inputs(metrics: dict, log: dict | None, gpu_memory_gb: float | None) -> dict:
    """The metrics, with the inputs of THRESHOLDS that are not plain metrics added."""
    d = dict(metrics)
    failure = (log or {}).get("failure")
    d["log_oom"] = 1.0 if failure == "oom" else 0.0
    d["log_host_oom"] = 1.0 if failure == "host_oom" else 0.0
    share = memory_used_share(metrics, log, gpu_memory_gb)
    if share is not None:
        d["memory_used_share"] = share
    med, idle = metrics.get("median_kernel_us"), metrics.get("gpu_idle_share")
    if med is not None and idle is not None:
        d["launch_bound"] = 1.0 if (med < LAUNCH_BOUND["median_kernel_us"]
                                    and idle > LAUNCH_BOUND["gpu_idle_share"]) else 0.0
    return d


def classify(metrics: dict, log: dict | None = None, gpu_memory_gb: float | None = None) -> dict:
    """{wall, confidence, evidence}. Evidence lists every row that fired, strongest first."""
    d = table_inputs(metrics, log, gpu_memory_gb)
    fired = []
    for rule, wall, metric, op, thr, src in THRESHOLDS:
        v = d.get(metric)
        if v is None or not _ops(float(v), op, thr):
            continue
        strength = float(v) / thr if thr else float(v)
        row = {"rule": rule, "wall": wall, "metric": metric, "value": round(float(v), 4),
               "threshold": thr, "strength": round(strength, 3), "source": src}
        if rule in LIMITS:  # evidence, but no wall: see the module's docstring
            row.update(wall=None, limits=LIMITS[rule])
        fired.append(row)
    memory = [f for f in fired if f["wall"] == "memory"]
    if memory:  # the first wall: nothing else matters until the run fits
        return {"wall": "memory", "confidence": 0.95 if d["log_oom"] else 0.8,
                "evidence": memory + [f for f in fired if f["wall"] != "memory"]}
    window = metrics.get("window_ms", 0) or 0
    if window < MIN_WINDOW_MS:
        why = "no GPU activity in the window" if metrics else "no trace metrics"
        if log and log.get("failure"):
            why = f"the log ends in {log['failure']}"
        return {"wall": "unknown", "confidence": 0.0,
                "evidence": [{"rule": "no_window", "wall": "unknown", "metric": "window_ms",
                              "value": window, "threshold": MIN_WINDOW_MS, "reason": why}]
                + [f for f in fired if f["wall"] is None]}
    non_compute = [f for f in fired if f["wall"] in WALL_ORDER and f["wall"] != "compute"]
    if non_compute:
        best = max(non_compute, key=lambda f: (f["strength"], -WALL_ORDER.index(f["wall"])))
        runner_up = max([f["strength"] for f in non_compute if f["wall"] != best["wall"]], default=0.0)
        margin = best["strength"] - max(runner_up, 1.0)
        conf = min(0.95, 0.55 + 0.4 * min(1.0, margin / 1.0)) if runner_up < best["strength"] else 0.5
        ordered = sorted(fired, key=lambda f: -f["strength"])
        return {"wall": best["wall"], "confidence": round(conf, 3), "evidence": ordered}
    limits = [f for f in fired if f["wall"] is None]
    compute = [f for f in fired if f["wall"] == "compute"]
    if compute:
        return {"wall": "compute", "confidence": round(min(0.9, 0.5 + 0.4 * (compute[0]["strength"] - 1) * 3), 3),
                "evidence": compute + limits}
    return {"wall": "compute", "confidence": 0.4,
            "evidence": [{"rule": "nothing_else", "wall": "compute", "metric": "sm_util_estimate",
                          "value": metrics.get("sm_util_estimate"), "threshold": None,
                          "reason": "no communication, idle or memory row fired"}] + limits}
