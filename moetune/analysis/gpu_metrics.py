"""SM activity from Nsight Systems GPU metrics sampling (`nsys profile --gpu-metrics-devices=...`).

The export keeps samples in `GPU_METRICS` (timestamp, typeId, metricId, value) and their names in
`TARGET_INFO_GPU_METRICS` (typeId, metricId, metricName, ...). The low byte of typeId is the GPU.
"SMs Active" (older exports: "SM Active") is a percentage of SMs with a resident warp, per sample
period. Traces without sampling have no such tables: an empty frame, and no metric.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

SM_ACTIVE_NAMES = ("SMs Active", "SM Active")
COLUMNS = ["timestamp", "deviceId", "value"]


def read_sm_active(con, tables: dict) -> pd.DataFrame:
    """Samples of SM activity: timestamp (ns), deviceId, value (0..1)."""
    if not {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"} <= set(tables):
        return pd.DataFrame(columns=COLUMNS)
    like = " OR ".join("i.metricName LIKE ?" for _ in SM_ACTIVE_NAMES)
    ids = con.execute(f"SELECT DISTINCT i.typeId, i.metricId FROM TARGET_INFO_GPU_METRICS i "
                      f"WHERE {like}", [n + "%" for n in SM_ACTIVE_NAMES]).fetchall()
    if not ids:
        return pd.DataFrame(columns=COLUMNS)
    cond = " OR ".join("(typeId = ? AND metricId = ?)" for _ in ids)
    rows = con.execute(f"SELECT timestamp, typeId, value FROM GPU_METRICS WHERE {cond}",
                       [x for pair in ids for x in pair]).fetchall()
    a = np.array(rows, dtype=np.float64).reshape(-1, 3)
    return pd.DataFrame({"timestamp": a[:, 0].astype(np.int64),
                         "deviceId": (a[:, 1].astype(np.int64) & 0xFF),
                         "value": a[:, 2] / 100.0})


def for_device(samples: pd.DataFrame, device: int) -> pd.DataFrame:
    """One GPU's samples; a trace that sampled a single GPU gives it to every rank of that GPU."""
    if samples.empty:
        return samples
    mine = samples[samples["deviceId"] == device]
    return mine if not mine.empty or samples["deviceId"].nunique() > 1 else samples


def sm_active_share(samples: pd.DataFrame, start: int, end: int) -> float | None:
    """Mean SM activity of the samples inside [start, end); None without samples there."""
    if samples.empty or end <= start:
        return None
    inside = samples[(samples["timestamp"] >= start) & (samples["timestamp"] < end)]
    return round(float(inside["value"].mean()), 4) if not inside.empty else None
