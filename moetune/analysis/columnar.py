"""Integer columns of an nsys SQLite export straight into numpy, through a columnar reader.

connectorx (Rust; reads SQLite into Arrow without a Python object per value) is about 3x faster
than Python's sqlite3 row by row on the kernel and runtime tables (benchmarks/analysis.py measures
the candidates: connectorx 0.4.6, adbc-driver-sqlite 1.13, sqlite3). sqlite3 stays the fallback:
when connectorx is not installed, when $MOETUNE_TRACE_READER=sqlite3, or when it fails on a file
(then sqlite3 reads it, and a truncated file raises sqlite3's error, which the caller turns into
the one-line TraceError).

    int_frame(con, db_path, table, cols, where="") -> DataFrame of int64 (NULL reads as -1)
    int_frames(con, db_path, queries) -> [DataFrame, ...]   the queries read at once (threads)
"""
from __future__ import annotations

import itertools
import os
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from moetune.analysis import settings

try:
    import connectorx
except ImportError:  # optional at run time: sqlite3 reads the same tables, slower
    connectorx = None


def reader() -> str:
    """The reader in use: connectorx, or sqlite3 (not installed, or chosen by the environment)."""
    chosen = settings.trace_reader()  # read first, so a misspelt value is refused either way
    if connectorx is None or chosen == "sqlite3":
        return "sqlite3"
    return "connectorx"


def _select(table: str, cols, where: str) -> str:
    return f'SELECT {", ".join(f"{chr(34)}{c}{chr(34)}" for c in cols)} FROM {table} {where}'


_USED_IN: set[int] = set()  # processes that have run connectorx (it is not safe across a fork)


def used_here() -> bool:
    """Whether this process has read through connectorx: a process forked from it can crash in
    connectorx's thread pools (seen: a segfault in read_sql), so workers must not be forked off it."""
    return os.getpid() in _USED_IN


def _via_connectorx(db_path: Path, table: str, cols, where: str) -> pd.DataFrame:
    _USED_IN.add(os.getpid())
    uri = "sqlite://" + urllib.parse.quote(str(Path(db_path).resolve()))
    t = connectorx.read_sql(uri, _select(table, cols, where), return_type="arrow")
    out = {}
    for c in cols:  # each column's Arrow buffers are let go once it is in numpy: peak ~ one table
        a = t.column(c)
        t = t.drop_columns([c])
        if a.null_count:
            a = a.fill_null(-1)
        out[c] = a.to_numpy().astype(np.int64, copy=False)
        del a
    return pd.DataFrame(out, copy=False)  # a block per column: no 2-D copy (0.3 s on 2M x 8)


def _via_sqlite3(con, table: str, cols, where: str) -> pd.DataFrame:
    n = con.execute(f"SELECT count(*) FROM {table} {where}").fetchone()[0]
    sel = ", ".join(f'COALESCE("{c}", -1)' for c in cols)
    rows = con.execute(f"SELECT {sel} FROM {table} {where}")
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=n * len(cols))
    return pd.DataFrame(flat.reshape(n, len(cols)), columns=list(cols))


def int_frame(con, db_path: Path | None, table: str, cols, where: str = "") -> pd.DataFrame:
    """`cols` of `table` (rows matching `where`, an SQL WHERE clause or "") as int64 columns."""
    cols = tuple(cols)
    if db_path is not None and reader() == "connectorx":
        try:
            return _via_connectorx(db_path, table, cols, where)
        except Exception:  # noqa: BLE001 - any reader failure: sqlite3 reads it or says why not
            pass
    return _via_sqlite3(con, table, cols, where)


def int_frames(con, db_path: Path | None, queries) -> list[pd.DataFrame]:
    """Several int_frame reads; with connectorx they run in threads (it releases the GIL), so the
    kernel and runtime tables of one rank are read on two cores at once."""
    queries = list(queries)
    if db_path is None or reader() != "connectorx" or len(queries) < 2:
        return [int_frame(con, db_path, *q) for q in queries]
    with ThreadPoolExecutor(len(queries)) as pool:
        futures = [pool.submit(_via_connectorx, db_path, *q) for q in queries]
        out = []
        for f, q in zip(futures, queries, strict=True):
            try:
                out.append(f.result())
            except Exception:  # noqa: BLE001 - fall back to sqlite3 for this table
                out.append(_via_sqlite3(con, *q))
        return out
