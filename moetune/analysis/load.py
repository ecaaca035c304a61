"""Open an Nsight Systems SQLite export (2022.4 or 2025.x schema) into pandas frames.

Only the tables and columns the metrics need are read (the kernel and runtime tables through
analysis.columnar, both at once; a rank's rows only where analysis.ranks asks, by SQL conditions);
names are resolved through `StringIds`, once per distinct id. A table that is absent (no CUDA, no
NVTX, no memory events) gives an empty frame. open_trace() reads a whole file (analysis.recipes
compares it with nsys's own figures); analyze() reads rank by rank (analysis.ranks.read_ranks).
"""
from __future__ import annotations

import hashlib
import lzma
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moetune.analysis import settings
from moetune.analysis.columnar import int_frames
from moetune.analysis.errors import TraceError
from moetune.analysis.gpu_metrics import read_sm_active
from moetune.analysis.nsys import nsys_binary

SQLITE_MAGIC = b"SQLite format 3\x00"
PID_MASK = ~0xFFFFFF  # globalTid = globalPid | tid (low 24 bits)

KERNEL_COLS = ("start", "end", "deviceId", "correlationId", "globalPid")
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
                "cudaGraphLaunch", "cuGraphLaunch", "cudaLaunchCooperativeKernel")
SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cudaStreamWaitEvent",
              "cudaMemcpy", "cuMemcpyDtoH", "cudaMemcpyAsync")


@dataclass
class Trace:
    """The frames of one export. Times are ns on the trace's clock."""

    path: Path
    version: str
    kernels: pd.DataFrame  # start end deviceId streamId correlationId globalPid name
    copies: pd.DataFrame  # start end deviceId streamId globalPid kind (memcpy|memset)
    runtime: pd.DataFrame  # start end globalPid correlationId name
    nvtx: pd.DataFrame  # start end globalPid text
    memory: pd.DataFrame  # start deviceId globalPid bytes op (0 alloc, 1 free)
    gpus: pd.DataFrame = field(default_factory=pd.DataFrame)  # id name totalMemory
    tables: frozenset = frozenset()
    sm_active: pd.DataFrame = field(default_factory=pd.DataFrame)  # timestamp deviceId value (0..1)


def _check_file(path: Path) -> None:
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory; give the trace files in it")
    with open(path, "rb") as f:
        head = f.read(16)
    if head != SQLITE_MAGIC:
        what = "empty file" if not head else "not an SQLite file"
        raise TraceError(f"{path}: {what}; expected an nsys SQLite export (.sqlite) or .nsys-rep")


def cache_dir() -> Path:
    """Where decompressed traces are kept: $MOETUNE_CACHE, else ~/.cache/moetune, else the temp dir."""
    for base in (settings.cache(), Path.home() / ".cache" / "moetune", tempfile.gettempdir()):
        if not base:
            continue
        d = Path(base) / "traces"
        try:
            d.mkdir(parents=True, exist_ok=True)
            return d
        except OSError:
            continue
    raise TraceError("no writable folder for decompressed traces: set MOETUNE_CACHE")


def materialize(path: Path) -> Path:
    """A local SQLite path for a .sqlite, .sqlite.xz or .nsys-rep input. A .xz is decompressed into
    cache_dir() under a name keyed by its path, size and time (never beside it: a trace kept in a
    repository would gain a file 5-10x its size); a .nsys-rep is exported beside it, as nsys does."""
    name = path.name
    if name.endswith(".xz"):
        st = path.stat()
        key = hashlib.sha1(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
        out = cache_dir() / f"{key}-{name[:-3]}"
        if not out.exists():
            part = f"{out}.{os.getpid()}.part"
            try:
                with lzma.open(path) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            except (lzma.LZMAError, EOFError) as e:
                os.unlink(part)
                raise TraceError(f"{path}: broken xz file ({e})") from None
            os.replace(part, out)
        return materialize(out)
    if name.endswith(".nsys-rep"):
        out = path.with_suffix(".sqlite")
        if not out.exists() or out.stat().st_mtime < path.stat().st_mtime:
            export_sqlite(path, out)
        return out
    return path


def export_sqlite(rep: Path, out: Path) -> None:
    try:
        nsys = nsys_binary()
    except TraceError as e:
        raise TraceError(f"{rep}: exporting needs {e}") from None
    proc = subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
                           "-o", str(out), str(rep)], capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise TraceError(f"{rep}: nsys export failed: {last[0]}")


def _tables(con) -> dict[str, set[str]]:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {n: {r[1] for r in con.execute(f'PRAGMA table_info("{n}")')} for n in names}


def _read(con, sql: str) -> pd.DataFrame:
    return pd.read_sql_query(sql, con)


def _strings(con, ids) -> dict[int, str]:
    """StringIds values of these ids."""
    q = ",".join(str(int(i)) for i in ids) or "NULL"
    return dict(con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({q})").fetchall())


def _categorical(names: list[str], codes) -> pd.Categorical:
    """Rows' names as a categorical: `codes` index into `names` (one entry per distinct key)."""
    cats = pd.Index(names).unique()
    return pd.Categorical.from_codes(cats.get_indexer(names)[codes] if len(codes) else codes, categories=cats)


def _names(con, ids: pd.Series, clean=None) -> pd.Categorical:
    """StringIds values for an id column, as a categorical (one lookup per distinct id)."""
    codes, uniques = pd.factorize(ids)
    found = _strings(con, uniques)
    names = [found.get(int(u), "?") for u in uniques]
    if clean:
        names = [clean(n) for n in names]
    return _categorical(names, codes)


def open_trace(path: str | Path) -> Trace:
    path = Path(path)
    with connect(path) as (con, local):
        return read_trace(con, path, local)


class connect:
    """`with connect(path) as (con, local)`: a read-only sqlite3 connection to the trace (a .xz or
    .nsys-rep made local first) and the local file's path; an SQLite error inside the block (a
    truncated file) becomes the one-line TraceError naming `path`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __enter__(self):
        path = self.path
        _check_file(path) if not path.name.endswith((".xz", ".nsys-rep")) else None
        local = materialize(path)
        _check_file(local)
        try:
            self.con = sqlite3.connect(f"file:{local}?mode=ro&immutable=1", uri=True)
        except sqlite3.DatabaseError as e:
            raise TraceError(f"{path}: unreadable SQLite ({e}); the file may be truncated") from None
        return self.con, local

    def __exit__(self, kind, err, tb):
        self.con.close()
        if isinstance(err, sqlite3.DatabaseError):
            raise TraceError(f"{self.path}: unreadable SQLite ({err}); the file may be truncated") from None
        return False


def tables_of(con, path: Path) -> dict[str, set[str]]:
    """{table: its columns}; a file without StringIds is not an nsys export (one-line TraceError)."""
    tables = _tables(con)
    if "StringIds" not in tables:
        raise TraceError(f"{path}: not an Nsight Systems export (no StringIds table)")
    return tables


def export_version(con, tables) -> str:
    version = ""
    for t in ("META_DATA_EXPORT", "EXPORT_META_DATA"):  # 2025.x, 2022.4
        if t in tables and {"name", "value"} <= tables[t]:
            meta = dict(con.execute(f"SELECT name, value FROM {t}").fetchall())
            version = str(meta.get("EXPORT_PROGRAM_VERSION") or meta.get("EXPORT_PRODUCT_VERSION")
                          or meta.get("EXPORT_SCHEMA_VERSION") or "")
    return version


def read_trace(con, path: Path, local: Path | None = None) -> Trace:
    """Every frame of the trace open on `con` (open_trace's reader)."""
    tables = tables_of(con, path)
    kernels, runtime = kernels_and_runtime(con, local, tables)
    return Trace(path=path, version=export_version(con, tables), kernels=kernels,
                 copies=read_copies(con, tables), runtime=runtime,
                 nvtx=read_nvtx(con, tables), memory=read_memory(con, tables),
                 gpus=read_gpus(con, tables),
                 tables=frozenset(tables), sm_active=read_sm_active(con, tables))


KERNEL_TABLE, RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"


def both(*conds: str) -> str:
    """SQL conditions joined by AND; empty ones left out."""
    return " AND ".join(c for c in conds if c)


def _where(*conds: str) -> str:
    return f"WHERE {both(*conds)}" if both(*conds) else ""


def _kernel_cols(cols) -> tuple[str, ...]:
    stream = ("streamId",) if "streamId" in cols else ()  # TE's grouped GEMM spreads over streams
    if "shortName" in cols and "demangledName" in cols:
        return (*KERNEL_COLS, *stream, "shortName", "demangledName")
    return (*KERNEL_COLS, *stream, "shortName" if "shortName" in cols else "demangledName")


def kernels_and_runtime(con, local, tables, kernel_where: str = "", runtime_where: str = ""):
    """The kernel and runtime frames (rows matching the SQL conditions), both tables read at once."""
    queries, which = [], []
    if KERNEL_TABLE in tables:
        queries.append((KERNEL_TABLE, _kernel_cols(tables[KERNEL_TABLE]), _where(kernel_where)))
        which.append("k")
    if RUNTIME_TABLE in tables:
        queries.append((RUNTIME_TABLE, RUNTIME_COLS, _where(runtime_where)))
        which.append("rt")
    frames = dict(zip(which, int_frames(con, local, queries), strict=True))
    kernels = (_kernel_names(con, frames["k"]) if "k" in frames
               else pd.DataFrame(columns=[*KERNEL_COLS, "name"]))
    runtime = (_runtime_names(con, frames["rt"]) if "rt" in frames
               else pd.DataFrame(columns=["start", "end", "globalPid", "correlationId", "name"]))
    return kernels, runtime


def _kernel_names(con, df: pd.DataFrame) -> pd.DataFrame:
    if "shortName" in df and "demangledName" in df:
        df["name"] = _qualified_names(con, df.pop("shortName"), df.pop("demangledName"))
    else:
        df["name"] = _names(con, df.pop("shortName" if "shortName" in df else "demangledName"))
    return df


def qualified_name(short: str, demangled: str) -> str:
    """A kernel's short name with the namespaces the demangled name puts it in, and without template
    or parameter lists: `deep_ep::intranode::dispatch`, `at::native::vectorized_elementwise_kernel`.
    Short names alone lose what library a kernel is from (DeepEP's is plain `dispatch`)."""
    head = re.split(r"[<(]", demangled, maxsplit=1)[0].rsplit(" ", 1)[-1]
    return head if head.endswith("::" + short) else short


def _qualified_names(con, short: pd.Series, demangled: pd.Series) -> pd.Categorical:
    """qualified_name of each kernel, one lookup per distinct (short, demangled) pair."""
    s, d = short.to_numpy(np.int64), demangled.to_numpy(np.int64)  # NULL ids read as -1
    width = int(d.max(initial=0)) + 2
    codes, uniques = pd.factorize(s * width + d + 1)
    pairs = [(int(u) // width, int(u) % width - 1) for u in uniques]
    found = _strings(con, {i for pair in pairs for i in pair})
    return _categorical([qualified_name(found.get(a, "?"), found.get(b, "")) for a, b in pairs], codes)


GRAPH_LAUNCH_CALLS = ("cudaGraphLaunch", "cuGraphLaunch")
GRAPHS_WHOLE = ("CUDA graphs traced as whole graphs (nsys --cuda-graph-trace=graph): their kernels are "
                "not in the kernel table; profile with --cuda-graph-trace=node")


def graphs_traced_whole(con, tables) -> bool:
    """Whether the report's CUDA graphs were traced as whole graphs (nsys --cuda-graph-trace=graph,
    its default): graphs were launched, yet no kernel row names a graph node. Their kernels are then
    absent from the kernel table, and every busy or idle figure drawn from it misses their time. A
    kernel table without graphNodeId (older exports) cannot tell: False."""
    if RUNTIME_TABLE not in tables or "graphNodeId" not in tables.get(KERNEL_TABLE, ()):
        return False
    like = " OR ".join(f"value LIKE '{c}%'" for c in GRAPH_LAUNCH_CALLS)
    ids = [r[0] for r in con.execute(f"SELECT id FROM StringIds WHERE {like}")]
    if not ids:
        return False
    # both stop at the first row found: only a graph-level trace scans its kernel table whole
    launched = con.execute(f"SELECT EXISTS (SELECT 1 FROM {RUNTIME_TABLE} WHERE nameId IN "
                           f"({','.join(map(str, ids))}))").fetchone()[0]
    return bool(launched) and not con.execute(
        f"SELECT EXISTS (SELECT 1 FROM {KERNEL_TABLE} WHERE graphNodeId IS NOT NULL)").fetchone()[0]


def graphs_traced_whole_in(path: str | Path) -> bool:
    with connect(path) as (con, _local):
        return graphs_traced_whole(con, tables_of(con, Path(path)))


def read_copies(con, tables, where: str = "") -> pd.DataFrame:
    parts = []
    for t, kind in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if t in tables:
            df = _read(con, f'SELECT start, "end", deviceId, streamId, globalPid FROM {t} {_where(where)}')
            df["kind"] = kind
            parts.append(df)
    if not parts:
        return pd.DataFrame(columns=["start", "end", "deviceId", "streamId", "globalPid", "kind"])
    return pd.concat(parts, ignore_index=True)


RUNTIME_COLS = ("start", "end", "globalTid", "correlationId", "nameId")


def _runtime_names(con, df: pd.DataFrame) -> pd.DataFrame:
    df["globalPid"] = df.pop("globalTid") & PID_MASK
    df["name"] = _names(con, df.pop("nameId"), clean=lambda n: re.sub(r"_v\d+$", "", n))
    return df


def read_nvtx(con, tables, where: str = "") -> pd.DataFrame:
    t = "NVTX_EVENTS"
    if t not in tables:
        return pd.DataFrame(columns=["start", "end", "globalPid", "text"])
    cols = tables[t]
    text = "COALESCE(n.text, s.value)" if "textId" in cols else "n.text"
    join = "LEFT JOIN StringIds s ON s.id = n.textId" if "textId" in cols else ""
    # eventType 59: push/pop range, 60: start/end range (both schemas)
    df = _read(con, f'SELECT n.start, n."end", n.globalTid, {text} AS text FROM {t} n {join} '
                    f'WHERE n."end" IS NOT NULL AND n.eventType IN (59, 60) {"AND " + where if where else ""}')
    df["globalPid"] = df.pop("globalTid").astype("int64") & PID_MASK
    df["text"] = df["text"].fillna("")
    return df


def read_memory(con, tables, where: str = "") -> pd.DataFrame:
    t = "CUDA_GPU_MEMORY_USAGE_EVENTS"
    if t not in tables:
        return pd.DataFrame(columns=["start", "deviceId", "globalPid", "bytes", "op"])
    return _read(con, f"SELECT start, deviceId, globalPid, bytes, memoryOperationType AS op FROM {t} {_where(where)}")


def read_gpus(con, tables) -> pd.DataFrame:
    t = "TARGET_INFO_GPU"
    if t not in tables:
        return pd.DataFrame(columns=["id", "name", "totalMemory"])
    cols = [c for c in ("id", "name", "totalMemory") if c in tables[t]]
    return _read(con, f"SELECT {', '.join(cols)} FROM {t}")
