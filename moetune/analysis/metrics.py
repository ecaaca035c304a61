"""Per-rank metrics of the profiled window, each a small function of the trace frames.

Shares are fractions of the window. Interval unions, not sums: two overlapping kernels count once.
  gpu_busy_share      union of all kernels and copies / window
  gpu_idle_share      1 - gpu_busy_share
  comm_share          union of communication kernels / window (raw: includes waiting)
  exposed_comm_share  communication time during which no compute kernel runs on that GPU / window
  exposed_a2a_ms      the same for all-to-all (NCCL SendRecv, DeepEP, HybridEP), per step
  sm_util_estimate    union of compute kernels / window (a timeline estimate, not SM counters)
  idle_gaps           gaps in the busy union above 10 us / 100 us / 1 ms: count and total ms
  idle causes         launch_starved (the next kernel's launch call ended after the gap began),
                      sync_blocked (a synchronising call spans the gap), other_wait (a stream or
                      a peer rank)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from moetune.analysis import intervals as iv
from moetune.analysis.kernels import A2A_CLASSES, CLASSES, COMM_CLASSES, NON_COMPUTE
from moetune.analysis.load import LAUNCH_CALLS, SYNC_CALLS
from moetune.analysis.window import Window

GAP_THRESHOLDS_US = (10, 100, 1000)
NS_PER_MS = 1e6


def _u(df: pd.DataFrame):
    return iv.union(df["start"].to_numpy(), df["end"].to_numpy())


def rows_where(df: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """df[keep], built column by column (a block each): a boolean take on the whole frame copies
    its 2-D blocks and was the largest cost of a rank's metrics."""
    if keep.all():
        return df
    return pd.DataFrame({c: df[c].array[keep] for c in df.columns}, index=df.index[keep], copy=False)


def in_window(df: pd.DataFrame, w: Window) -> pd.DataFrame:
    """Rows that overlap the window, clipped to it."""
    if df.empty:
        return df
    s, e = df["start"].to_numpy(), df["end"].to_numpy()
    keep = (e > w.start) & (s < w.end)
    cols = {c: (df[c].array if keep.all() else df[c].array[keep]) for c in df.columns}
    if np.issubdtype(s.dtype, np.number) and np.issubdtype(e.dtype, np.number):
        cols["start"] = np.maximum(s[keep], w.start) if not keep.all() else np.maximum(s, w.start)
        cols["end"] = np.minimum(e[keep], w.end) if not keep.all() else np.minimum(e, w.end)
        return pd.DataFrame(cols, index=df.index if keep.all() else df.index[keep], copy=False)
    out = df[keep].copy()  # object columns (an empty frame's): pandas' own clip
    out["start"] = out["start"].clip(lower=w.start)
    out["end"] = out["end"].clip(upper=w.end)
    return out


def name_mask(names: pd.Series, wanted) -> np.ndarray:
    """names.isin(wanted) as numpy; on a categorical it tests the categories once, then the codes."""
    if isinstance(names.dtype, pd.CategoricalDtype):
        hit = np.append(np.asarray(names.cat.categories.isin(wanted)), False)  # code -1 (NaN): no
        return hit[names.cat.codes.to_numpy()]
    return names.isin(wanted).to_numpy()


def class_times(k: pd.DataFrame) -> tuple[dict, dict]:
    """Raw kernel time (ms) and count by class; every class of `kernels.CLASSES` is a key."""
    ms = dict.fromkeys(CLASSES, 0.0)
    count = dict.fromkeys(CLASSES, 0)
    if k.empty:
        return ms, count
    dur = (k["end"] - k["start"]) / NS_PER_MS
    ms.update(dur.groupby(k["cls"], observed=True).sum().round(4).to_dict())
    count.update({c: int(n) for c, n in k["cls"].value_counts().items() if n})
    return ms, count


def class_mask(cls: pd.Series):
    """`of(classes)`: a numpy mask of the rows in those classes; on kernels.classify's categorical it
    compares small integer codes (4x faster than isin on the series), and no frame is copied."""
    if isinstance(cls.dtype, pd.CategoricalDtype) and tuple(cls.cat.categories) == CLASSES:
        codes = cls.cat.codes.to_numpy()

        def of(classes):  # a lookup table on the codes (-1, a missing class: the extra False)
            table = np.zeros(len(CLASSES) + 1, dtype=bool)
            table[[CLASSES.index(c) for c in classes]] = True
            return table[codes]
        return of
    return lambda classes: cls.isin(classes).to_numpy()


def comm_exposure(k: pd.DataFrame) -> dict:
    """Raw and exposed communication (ns): comm time not covered by any compute kernel."""
    s, e = k["start"].to_numpy(), k["end"].to_numpy()
    of = class_mask(k["cls"])
    compute = iv.union(s[~of(NON_COMPUTE)], e[~of(NON_COMPUTE)])
    comm = iv.union(s[of(COMM_CLASSES)], e[of(COMM_CLASSES)])
    a2a = iv.union(s[of(A2A_CLASSES)], e[of(A2A_CLASSES)])
    other = iv.union(s[of(("nccl_other",))], e[of(("nccl_other",))])
    return {
        "compute_ns": iv.length(compute),
        "comm_ns": iv.length(comm),
        "a2a_ns": iv.length(a2a),
        "exposed_comm_ns": iv.length(comm) - iv.intersection_length(comm, compute),
        "exposed_a2a_ns": iv.length(a2a) - iv.intersection_length(a2a, compute),
        "exposed_other_comm_ns": iv.length(other) - iv.intersection_length(other, compute),
    }


def idle_gaps(busy, w: Window) -> tuple[np.ndarray, np.ndarray]:
    return iv.gaps(busy, w.start, w.end)


def gap_histogram(gs: np.ndarray, ge: np.ndarray) -> dict:
    d = (ge - gs) / 1e3  # us
    out = {}
    for t in GAP_THRESHOLDS_US:
        sel = d > t
        out[f"gaps_over_{t}us"] = int(sel.sum())
        out[f"gaps_over_{t}us_ms"] = round(float(d[sel].sum()) / 1e3, 4)
    return out


def _coverage(u, t: np.ndarray) -> np.ndarray:
    """Length of the disjoint sorted set `u` that lies before each time in `t`."""
    return iv.covered_before(u, t)


def idle_causes(gs, ge, k: pd.DataFrame, runtime: pd.DataFrame) -> dict:
    """Split idle time by what the GPU waited for (needs the CUDA runtime table)."""
    out = {"launch_starved_ms": 0.0, "sync_blocked_ms": 0.0, "other_wait_ms": 0.0}
    if gs.size == 0 or k.empty:
        return out
    dur = (ge - gs).astype(np.float64)
    starts = k["start"].to_numpy()
    order = None if iv.is_sorted(starts) else np.argsort(starts, kind="stable")
    starts = starts if order is None else starts[order]
    nxt = np.minimum(np.searchsorted(starts, ge, side="left"), len(starts) - 1)
    launch_end = np.full(gs.size, -1, dtype=np.int64)
    sync_u = (np.array([], np.int64), np.array([], np.int64))
    if not runtime.empty:
        is_launch = name_mask(runtime["name"], LAUNCH_CALLS)
        corr = k["correlationId"].to_numpy()
        corr = (corr if order is None else corr[order])[nxt]
        lc, le = runtime["correlationId"].to_numpy()[is_launch], runtime["end"].to_numpy()[is_launch]
        srt = np.argsort(lc, kind="stable")
        pos = np.searchsorted(lc[srt], corr)
        hit = ((pos < lc.size) & (lc[srt][np.minimum(pos, lc.size - 1)] == corr) if lc.size
               else np.zeros(corr.size, bool))
        launch_end = np.where(hit, le[srt][np.minimum(pos, max(lc.size - 1, 0))] if lc.size else -1, -1)
        is_sync = name_mask(runtime["name"], SYNC_CALLS)
        if is_sync.any():
            sync_u = iv.union(runtime["start"].to_numpy()[is_sync], runtime["end"].to_numpy()[is_sync])
    starved = launch_end >= gs
    synced = ~starved & ((_coverage(sync_u, ge) - _coverage(sync_u, gs)) > 0.5 * dur)
    other = ~starved & ~synced

    def to_ms(sel) -> float:
        return round(float(dur[sel].sum()) / NS_PER_MS, 4)
    return {"launch_starved_ms": to_ms(starved), "sync_blocked_ms": to_ms(synced), "other_wait_ms": to_ms(other)}


def peak_memory_gb(memory: pd.DataFrame) -> float | None:
    """Peak of allocated minus freed bytes over the trace (CUDA memory events)."""
    if memory.empty:
        return None
    m = memory.sort_values("start")
    signed = np.where(m["op"].to_numpy() == 1, -1, 1) * m["bytes"].to_numpy(dtype=np.float64)
    return round(float(np.cumsum(signed).max()) / 2**30, 4)


def gemm_streams(k: pd.DataFrame) -> int:
    """Streams that ran GEMM kernels (class gemm or grouped_gemm). Transformer Engine's grouped GEMM
    on Hopper runs one cuBLAS GEMM per local expert spread over its own compute streams (4 besides
    the main one in TE 2.20), so the number rises where the kernel names cannot tell (0: no
    stream ids in the trace)."""
    if "streamId" not in k or k.empty:
        return 0
    s = k["streamId"].to_numpy()[class_mask(k["cls"])(("gemm", "grouped_gemm"))]
    return int(np.unique(s[s >= 0]).size)


def rank_metrics(k: pd.DataFrame, copies: pd.DataFrame, runtime: pd.DataFrame,
                 memory: pd.DataFrame, w: Window) -> dict:
    """All metrics of one rank. `k` carries a `cls` column (kernels.classify)."""
    wms = w.ns / NS_PER_MS
    k = in_window(k, w)
    copies = in_window(copies, w)
    if not runtime.empty:
        rs = runtime["start"].to_numpy()
        rt = rows_where(runtime, (rs >= w.start) & (rs < w.end))
    else:
        rt = runtime
    steps = max(w.steps, 1)
    m: dict = {"window_ms": round(wms, 4), "steps": w.steps, "window_source": w.source}
    if w.step_times_ns:
        st = np.array(w.step_times_ns) / NS_PER_MS
        m["step_time_ms"] = round(float(st.mean()), 4)
        m["step_time_std_ms"] = round(float(st.std(ddof=1)) if st.size > 1 else 0.0, 4)
    m["kernel_class_ms"], m["kernel_class_count"] = class_times(k)
    for c in copies["kind"].unique() if not copies.empty else []:
        sel = copies[copies["kind"] == c]
        m["kernel_class_ms"][c] = round(float((sel["end"] - sel["start"]).sum() / NS_PER_MS), 4)
        m["kernel_class_count"][c] = int(len(sel))
    if wms <= 0:
        return m
    busy = (iv.union(k["start"].to_numpy(), k["end"].to_numpy()) if copies.empty else
            iv.union(np.concatenate([k["start"].to_numpy(), copies["start"].to_numpy()]),
                     np.concatenate([k["end"].to_numpy(), copies["end"].to_numpy()])))
    busy_ns = iv.length(busy)
    ce = comm_exposure(k)
    m.update({
        "gpu_busy_share": round(busy_ns / w.ns, 4),
        "gpu_idle_share": round(1 - busy_ns / w.ns, 4),
        "sm_util_estimate": round(ce["compute_ns"] / w.ns, 4),
        "comm_share": round(ce["comm_ns"] / w.ns, 4),
        "exposed_comm_share": round(ce["exposed_comm_ns"] / w.ns, 4),
        "exposed_a2a_share": round(ce["exposed_a2a_ns"] / w.ns, 4),
        "exposed_other_comm_share": round(ce["exposed_other_comm_ns"] / w.ns, 4),
        "a2a_ms": round(ce["a2a_ns"] / NS_PER_MS / steps, 4),
        "exposed_a2a_ms": round(ce["exposed_a2a_ns"] / NS_PER_MS / steps, 4),
        "exposed_comm_ms": round(ce["exposed_comm_ns"] / NS_PER_MS / steps, 4),
        "kernels_per_step": round(len(k) / steps, 2),
        "gemm_streams": gemm_streams(k),
        "median_kernel_us": round(float(((k["end"] - k["start"]) / 1e3).median()), 3) if len(k) else 0.0,
    })
    gs, ge = idle_gaps(busy, w)
    m.update(gap_histogram(gs, ge))
    m.update(idle_causes(gs, ge, k, rt))
    if not rt.empty:
        launches = name_mask(rt["name"], LAUNCH_CALLS)
        m["launch_rate_per_ms"] = round(float(launches.sum()) / wms, 3)
        m["cuda_graph_launches"] = int(name_mask(rt["name"], ("cudaGraphLaunch", "cuGraphLaunch")).sum())
    else:
        m["cuda_graph_launches"] = 0
    peak = peak_memory_gb(memory)
    if peak is not None:
        m["peak_memory_gb"] = peak
    return m


SHARE_KEYS = ("gpu_busy_share", "gpu_idle_share", "sm_util_estimate", "comm_share",
              "exposed_comm_share", "exposed_a2a_share", "exposed_other_comm_share")


def combine(per_rank: dict[int, dict], a2a_wait_ns: dict[int, float] | None = None) -> dict:
    """Across ranks: means of shares and times, the slowest step, and the all-to-all skew split.

    With `a2a_wait_ns` (analysis.skew: each rank's wait for its peers' matching kernels) the wait
    is that, per step, and the transfer is the rest of the all-to-all time. Without it (one rank's
    trace, or kernels not matched) the transfer is the time of the rank that spends least in the
    all-to-all (that rank did not wait), and what the others spend beyond it is waiting.
    """
    ranks = [m for m in per_rank.values() if m.get("window_ms", 0) > 0]
    out: dict = {"ranks": len(per_rank)}
    if not ranks:  # no GPU activity (a CPU-only trace): keep the host-side step times
        host = [m for m in per_rank.values() if m.get("step_time_ms") is not None]
        if host:
            out["step_time_ms"] = max(m["step_time_ms"] for m in host)
            out["step_time_std_ms"] = round(float(np.mean([m["step_time_std_ms"] for m in host])), 4)
            out["steps"] = min(m["steps"] for m in host)
        return out
    keys = set().union(*(m.keys() for m in ranks))
    for key in sorted(keys):
        vals = [m[key] for m in ranks if isinstance(m.get(key), (int, float)) and not isinstance(m.get(key), bool)]
        if vals:
            out[key] = round(float(np.mean(vals)), 4)
    for key in ("kernel_class_ms", "kernel_class_count"):
        agg: dict = {}
        for m in ranks:
            for c, v in m.get(key, {}).items():
                agg[c] = agg.get(c, 0) + v
        out[key] = {c: (round(v / len(ranks), 4) if key.endswith("ms") else v) for c, v in agg.items()}
    if "step_time_ms" in out:
        out["step_time_ms"] = max(m.get("step_time_ms", 0) for m in ranks)
    out["steps"] = min(m.get("steps", 0) for m in ranks)
    for key in ("gpu_idle_share", "exposed_comm_share"):
        out[f"max_{key}"] = max(m.get(key, 0) for m in ranks)
    if "peak_memory_gb" in out:
        out["peak_memory_gb"] = max(m.get("peak_memory_gb", 0) for m in ranks)
    a2a = [m.get("a2a_ms", 0.0) for m in ranks]
    if a2a_wait_ns:
        waits = []
        for rank, m in per_rank.items():
            if m.get("window_ms", 0) > 0:
                per_step = a2a_wait_ns.get(rank, 0.0) / NS_PER_MS / max(m.get("steps", 0), 1)
                m["a2a_wait_ms"] = round(min(per_step, m.get("a2a_ms", 0.0)), 4)
                waits.append(m["a2a_wait_ms"])
        wait = float(np.mean(waits))
        transfer = float(np.mean(a2a)) - wait
    else:
        transfer = min(a2a)
        wait = float(np.mean(a2a)) - transfer
    out["a2a_transfer_ms"] = round(transfer, 4)
    out["a2a_wait_ms"] = round(wait, 4)
    step = out.get("step_time_ms") or out["window_ms"] / max(out["steps"], 1)
    out["a2a_wait_share"] = round(wait / step, 4) if step else 0.0
    for key in ("exposed_comm_share", "exposed_a2a_share"):
        out[f"{key}_net"] = less_waiting(out.get(key, 0), out["a2a_wait_share"])
    return out


def less_waiting(exposed_share: float, a2a_wait_share: float) -> float:
    """An exposed share less the all-to-all time spent waiting for a late peer: what overlap could hide."""
    return round(max(0.0, exposed_share - a2a_wait_share), 4)
