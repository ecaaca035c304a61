"""Map per rank, reduce across ranks: each rank's metrics from its own rows, in worker processes.

A rank is one (globalPid, deviceId) of one file: a file per rank, or one process of a one-file
export. plan() lists the ranks (a DISTINCT query per file) and packs them into tasks of up to
ROWS_PER_TASK kernels. read_ranks() is the one reader of per-rank data: it reads a task's rows only
(WHERE on its processes and GPUs, and runtime calls and copies from the first step's start on: the
rows before the steps' window feed no metric) and splits them by rank. summarize() measures each
rank alone (measure_rank) and returns small summaries: its metrics, its window, its all-to-all
kernel starts (all the cross-rank wait split needs, analysis.skew) and its GPU's memory.
map_ranks() runs the tasks over `workers` processes; only summaries come back, so memory is bounded
by the tasks in flight, not by the trace set. analyze() and the per-rank summary files
(analysis.summary) both measure through map_ranks; rank_frames() hands the report every row.

Rows before the window: a kernel ends after its launch call begins, so the window, which begins
with the first kernel launched in the steps, begins at or after the first step's start; should it
begin earlier all the same (clocks out of step), that rank is read again whole. Kernels are read
whole: the split pairs all-to-all kernels by order over the whole capture.
"""
from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moetune.analysis import keys as rank_scan
from moetune.analysis.columnar import used_here
from moetune.analysis.files import trace_files
from moetune.analysis.gpu_metrics import for_device, read_sm_active, sm_active_share
from moetune.analysis.kernels import A2A_CLASSES, classify
from moetune.analysis.load import (
    KERNEL_TABLE,
    PID_MASK,
    both,
    connect,
    kernels_and_runtime,
    read_copies,
    read_gpus,
    read_memory,
    read_nvtx,
    tables_of,
)
from moetune.analysis.metrics import class_mask, rank_metrics, rows_where
from moetune.analysis.skew import a2a_starts
from moetune.analysis.window import Window, find_window, step_ranges

ALL_TIDS = ~PID_MASK  # a process's thread ids: globalPid | 0..0xFFFFFF
# a profiled rank's report is trace_<RANK>.* (the job script names it so, pipeline TrialPaths.trace):
# the rank is read back from the name
REPORT_PREFIX = "trace_"
RANK_IN_NAME = re.compile(rf"{REPORT_PREFIX}(\d+)\.")

# Kernels a worker reads in one query. A one-file export's ranks are read in groups up to this many
# rows: every query scans the whole table (its rows of all ranks are interleaved), so one query per
# rank would scan an 8-rank file 8 times; a group bounds a worker's memory all the same.
ROWS_PER_TASK = 1_000_000


@dataclass(frozen=True)
class Task:
    path: str  # the input as given (messages name it)
    ranks: tuple  # ((rank, (globalPid, deviceId) or None for a file without kernels, kernels), ...)


@dataclass
class RankSummary:
    rank: int
    metrics: dict
    window: Window
    a2a: dict | None = None  # analysis.skew.a2a_starts; None: no kernels or an empty window
    gpu_memory_gb: float | None = None
    rows_read: dict = field(default_factory=dict)


MAX_DEFAULT_WORKERS = 8
WORKER_GB = 0.6  # a worker's peak on a task of ROWS_PER_TASK kernels, measured (benchmarks/analysis.py)


def default_workers() -> int:
    """One worker per core this process may run on, at most 8, and no more than the free memory
    holds (a 128-core node would otherwise start 64 workers for 64 rank files)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    free_gb = float("inf")
    try:  # MemAvailable counts the page cache the kernel can drop; free pages alone do not
        with open("/proc/meminfo") as f:
            free_gb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 2**20
    except (OSError, StopIteration, ValueError):
        pass
    return max(1, min(cores, MAX_DEFAULT_WORKERS, int(free_gb / WORKER_GB)))


def rank_labels(per_file) -> list[int]:
    """The ranks' numbers, in the order of `per_file` [(path, keys), ...]: the job's own where every
    file holds one rank and is named for it (trace_<RANK>.*, as the job script names each profiled
    rank's report), else 0, 1, ... in file order."""
    named = [RANK_IN_NAME.match(Path(path).name) for path, _ in per_file]
    if all(m and len(keys) == 1 for m, (_, keys) in zip(named, per_file, strict=True)):
        ranks = [int(m.group(1)) for m in named]
        if len(set(ranks)) == len(ranks):
            return ranks
    return list(range(sum(len(keys) for _, keys in per_file)))


def plan(files, workers: int = 1) -> list[Task]:
    """The ranks of these files, numbered in file order, then by (globalPid, deviceId), packed into
    tasks of up to ROWS_PER_TASK kernels (a rank is never split); at least `workers` tasks where
    there are that many ranks."""
    per_file = []
    for path in files:
        with connect(path) as (con, _local):
            tables = tables_of(con, path)
            rows, total = [], 0
            if KERNEL_TABLE in tables:  # a GROUP BY count would sort the table: 5x slower
                rows, total = rank_scan.take(path) or rank_scan.rank_keys(con)  # scanned while importing?
        keys = sorted(((-1 if p is None else int(p), -1 if d is None else int(d)), total // len(rows))
                      for p, d in rows)  # kernels per rank: the file's share, as an estimate
        per_file.append((path, keys or [(None, 0)]))
    rank_scan.wait()  # a file without kernels takes no answer: the scan may still run, and workers fork next
    labels = iter(rank_labels(per_file))
    groups: list[tuple[str, list]] = []
    for path, keys in per_file:
        group, size = [], 0
        for key, n in keys:
            if group and size + n > ROWS_PER_TASK:
                groups.append((str(path), group))
                group, size = [], 0
            group.append((next(labels), key, n))
            size += n
        groups.append((str(path), group))
    while len(groups) < workers and any(len(g) > 1 for _, g in groups):  # split the biggest
        i = max(range(len(groups)), key=lambda j: sum(n for *_, n in groups[j][1]) if len(groups[j][1]) > 1 else -1)
        path, g = groups[i]
        groups[i:i + 1] = [(path, g[:len(g) // 2]), (path, g[len(g) // 2:])]
    return [Task(path, tuple(g)) for path, g in groups]


def _in(col: str, values) -> str:
    vals = sorted(set(values))
    parts = [f"{col} IN ({', '.join(str(v) for v in vals if v != -1)})"] if any(v != -1 for v in vals) else []
    parts += [f"{col} IS NULL"] if -1 in vals else []
    return "(" + " OR ".join(parts) + ")"


def _conditions(keys) -> tuple[str, str]:
    """SQL conditions for these ranks' rows: (on globalPid and deviceId, on globalTid). A group's
    pid x device product may take in rows of other ranks; the split by key drops them."""
    if keys == [None]:
        return "", ""
    pids = {p for p, _ in keys}
    tids = [f"globalTid BETWEEN {p} AND {p | ALL_TIDS}" for p in sorted(pids) if p != -1] or ["0 = 1"]
    return f"{_in('globalPid', pids)} AND {_in('deviceId', {d for _, d in keys})}", f"({' OR '.join(tids)})"


def _index(df: pd.DataFrame, cols, keys=None) -> dict:
    """{key tuple: positions of its rows}, one pass; with a few `keys` (a task's ranks), those keys'
    positions by comparing the columns (a groupby hashes every row: 3x slower)."""
    if df.empty:
        return {}
    if keys is not None and len(keys) <= 8:
        vals = [df[c].to_numpy() for c in cols]
        out = {}
        for key in keys:
            hit = vals[0] == key[0]
            for v, x in zip(vals[1:], key[1:], strict=False):
                hit &= v == x
            at = np.flatnonzero(hit)
            if at.size:
                out[tuple(key)] = at
        return out
    by = list(cols) if len(cols) > 1 else cols[0]
    return {tuple(int(x) for x in (k if isinstance(k, tuple) else (k,))): v
            for k, v in df.groupby(by, sort=False).indices.items()}


def _rows(df: pd.DataFrame, index: dict, key) -> pd.DataFrame:
    if key is None:
        return df
    if key not in index:
        return df.iloc[0:0]
    at = index[key]
    if len(at) == len(df):  # every row is this rank's
        return df
    if at[-1] - at[0] + 1 == len(at):  # the rank's rows are one run (a file written rank by rank): a view
        return df.iloc[int(at[0]):int(at[-1]) + 1]
    return df.iloc[at]


def _libc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc: nothing to do
        return None


_LIBC = _libc()
M_ARENA_MAX = -8  # glibc's mallopt parameter


def _bound_heap(done: bool) -> None:
    """glibc keeps freed memory in per-thread arenas, and connectorx reads in threads: a process
    that ran 10 tasks held 430 MB more than one that ran one (measured on the benchmark's 500k-kernel
    ranks). With 2 arenas, and a trim after each task, it stays at one task's memory."""
    if _LIBC is None:
        return
    if done:
        gc.collect()
        _LIBC.malloc_trim(0)
    else:
        _LIBC.mallopt(M_ARENA_MAX, 2)


@dataclass
class RankRows:
    """One rank's rows of a trace, as read_ranks() reads them. Runtime calls and copies start at
    `lo` (the first step's start; None: every row); whole() has them all."""
    rank: int
    key: tuple | None  # (globalPid, deviceId); None: a file without kernels, read whole
    kernels: pd.DataFrame  # with `cls`, the kernel class (a categorical of kernels.CLASSES)
    copies: pd.DataFrame
    runtime: pd.DataFrame
    nvtx: pd.DataFrame
    memory: pd.DataFrame
    sm_active: pd.DataFrame  # the rank's GPU's SM-activity samples (gpu_metrics)
    gpus: pd.DataFrame  # the file's GPUs
    lo: int | None = None
    read_again: Callable[[RankRows], RankRows] | None = None  # every row of this rank, while the file is open

    def whole(self) -> RankRows:
        return self if self.lo is None else self.read_again(self)

    @property
    def gpu_memory_gb(self) -> float | None:
        g = self.gpus
        return float(g["totalMemory"].max()) / 2**30 if not g.empty and "totalMemory" in g else None


def read_ranks(task: Task, whole: bool = False) -> Iterator[RankRows]:
    """The rows of a task's ranks, read from its file together and split by rank: the one reader of
    per-rank data (analyze, the per-rank summaries and the report's timelines all read through it).
    `whole`: every row, not only those from the first step on."""
    keys = [key for _, key, _ in task.ranks]
    with connect(task.path) as (con, local):
        tables = tables_of(con, task.path)
        on_gpu, on_tid = _conditions(keys)
        nvtx = read_nvtx(con, tables, on_tid)
        nvtx_at = _index(nvtx, ("globalPid",))
        firsts = [step_ranges(_rows(nvtx, nvtx_at, key and key[:1])) for key in keys]
        # rows before the first step feed no metric (module doc); kernels are read whole: the
        # all-to-all kernels pair across ranks over the whole capture
        lo = (min(int(s["start"].iloc[0]) for s in firsts)
              if not whole and None not in keys and all(not s.empty for s in firsts) else None)

        def read(on_gpu, on_tid, lo):
            def after(col: str) -> str:
                return f'"{col}" >= {lo}' if lo is not None else ""
            k, rt = kernels_and_runtime(con, local, tables, on_gpu, both(on_tid, after("start")))
            k = k.assign(cls=classify(k["name"])) if not k.empty else k.assign(cls=[])
            return k, rt, read_copies(con, tables, both(on_gpu, after("end")))

        def read_again(r: RankRows) -> RankRows:
            one_gpu, one_tid = _conditions([r.key])
            k1, rt1, c1 = read(one_gpu, one_tid, None)
            return RankRows(r.rank, r.key, k1, c1, rt1, r.nvtx, r.memory, r.sm_active, r.gpus)

        k, rt, copies = read(on_gpu, on_tid, lo)
        memory = read_memory(con, tables, on_gpu)
        gpu_keys = None if None in keys else keys
        pid_keys = None if None in keys else sorted({key[:1] for key in keys})
        at = {"k": _index(k, ("globalPid", "deviceId"), gpu_keys), "rt": _index(rt, ("globalPid",), pid_keys),
              "copies": _index(copies, ("globalPid", "deviceId"), gpu_keys),
              "memory": _index(memory, ("globalPid", "deviceId"), gpu_keys)}
        sm = read_sm_active(con, tables)
        gpus = read_gpus(con, tables)
        for rank, key, _n in task.ranks:
            pid = key and key[:1]
            yield RankRows(rank, key, _rows(k, at["k"], key), _rows(copies, at["copies"], key),
                           _rows(rt, at["rt"], pid), _rows(nvtx, nvtx_at, pid), _rows(memory, at["memory"], key),
                           for_device(sm, key[1]) if key else sm, gpus, lo, read_again)


def measure_rank(rows: RankRows) -> RankSummary | None:
    """One rank's summary; None when its window begins before the first row read (`rows.lo`)."""
    k = rows.kernels
    w = find_window(k, rows.runtime, rows.nvtx)
    if rows.lo is not None and not k.empty and w.start < rows.lo:
        return None
    m = rank_metrics(k, rows.copies, rows.runtime, rows.memory, w)
    sampled = sm_active_share(rows.sm_active, w.start, w.end)
    if sampled is not None:  # measured by the GPU, beside the timeline's sm_util_estimate
        m["sm_active_share"] = sampled
    a2a = None
    if not k.empty and w.ns > 0:
        a2a = a2a_starts(rows_where(k[["start", "end", "name"]], class_mask(k["cls"])(A2A_CLASSES)))
    return RankSummary(rows.rank, m, w, a2a, rows.gpu_memory_gb,
                       rows_read={"kernels": len(k), "runtime": len(rows.runtime)})


def summarize(task: Task) -> list[RankSummary]:
    """The summaries of a task's ranks, read from its file together and measured one by one; a rank
    whose window begins before the rows read (clocks out of step) is read again whole."""
    _bound_heap(done=False)
    try:
        out = []
        for rows in read_ranks(task):
            s = measure_rank(rows)
            out.append(s if s is not None else measure_rank(rows.whole()))
        return out
    finally:
        _bound_heap(done=True)


def rank_frames(paths):
    """Yield (rank, kernels, copies, runtime, nvtx, memory, gpus) for every rank of these trace files
    (or folders of them), every row read; the kernels' `cls` as plain objects."""
    for task in plan(trace_files(paths)):
        for r in read_ranks(task, whole=True):
            yield (r.rank, r.kernels.assign(cls=r.kernels["cls"].astype(object)), r.copies, r.runtime,
                   r.nvtx, r.memory, r.gpus)


def _context():
    """Fork (fast, and a script needs no `if __name__ == "__main__"` guard) where no other Python thread
    runs and this process has not read through connectorx; else a fork server started clean, with the
    analysis imported. A fork copies every lock as it stands, held by threads the child does not have:
    the tuner's store thread inside SQLite left a forked worker waiting forever on SQLite's allocator
    mutex, and connectorx's thread pools crash a forked reader (columnar.used_here). (Native pools
    idle in numpy's and Arrow's libraries are not counted: they take their locks across a fork.)"""
    methods = mp.get_all_start_methods()
    if "fork" in methods and not used_here() and threading.active_count() == 1:
        return mp.get_context("fork")
    if "forkserver" not in methods:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["moetune.analysis.ranks", "moetune.analysis.metrics",
                                "moetune.analysis.window", "moetune.analysis.skew",
                                "moetune.analysis.gpu_metrics"])
    return ctx


def map_ranks(files, workers: int | None = None):
    """RankSummary of every rank of these files, in rank order; tasks run in `workers` processes
    (None: one per core; 1: in this process). Should the pool break (a worker killed), the tasks
    not yet done run in this process."""
    workers = default_workers() if workers is None else max(1, int(workers))
    tasks = plan(files, workers)
    done = 0
    if mp.current_process().daemon:  # a pool's worker itself may not start processes
        workers = 1
    if min(workers, len(tasks)) > 1:
        try:
            with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=_context()) as pool:
                for summaries in pool.map(summarize, tasks):
                    yield from summaries
                    done += 1
        except BrokenProcessPool:
            pass
    for t in tasks[done:]:
        yield from summarize(t)
