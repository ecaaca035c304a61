"""SM activity from GPU metrics sampling tables (GPU_METRICS + TARGET_INFO_GPU_METRICS), on hand-built
traces; the GPU traces in tests/data/gpu were recorded without sampling, so these use the export's
table and column names with made-up samples."""
import sqlite3

import pytest

from moetune import analysis
from tests.nsys_fixture import PID, TraceBuilder

GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT"
TYPE_GPU = 0x10000  # low byte: the GPU


def _add_samples(path, samples, names=((1, "SMs Active [Throughput %]"), (2, "DRAM Read Bandwidth [Throughput %]"))):
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL, "
                "typeName TEXT NOT NULL, metricId INTEGER NOT NULL, metricName TEXT NOT NULL)")
    con.execute("CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER NOT NULL, "
                "metricId INTEGER NOT NULL, value INTEGER NOT NULL)")
    devices = sorted({d for d, _, _, _ in samples})
    con.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GH100', ?, ?)",
                    [(TYPE_GPU | d, mid, name) for d in devices for mid, name in names])
    con.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?)",
                    [(int(t_us * 1000), TYPE_GPU | d, mid, v) for d, t_us, mid, v in samples])
    con.commit()
    con.close()
    return path


def test_sm_active_share_is_mean_of_samples_in_window(tmp_path):
    """sm_active_share is the mean of the SM-active samples inside the window only (other metrics and
    samples outside are left out), beside the timeline estimate."""
    p = TraceBuilder().kernel(GEMM, 100, 1100).write(tmp_path / "t.sqlite")  # window 100..1100 us
    _add_samples(p, [(0, 50, 1, 0),      # before the window: left out
                     (0, 200, 1, 40), (0, 600, 1, 80), (0, 1000, 1, 90),
                     (0, 600, 2, 5),     # another metric: left out
                     (0, 1500, 1, 0)])   # after the window
    m = analysis.analyze([p])["metrics"]["per_rank"][0]
    assert m["sm_active_share"] == pytest.approx((0.4 + 0.8 + 0.9) / 3, abs=1e-4)
    assert m["sm_util_estimate"] == pytest.approx(1.0)  # the timeline estimate stays beside it


def test_samples_go_to_their_gpu(tmp_path):
    """In one file holding two GPUs, each GPU's samples go to its own rank."""
    b = TraceBuilder()
    b.kernel(GEMM, 0, 1000, device=0, pid=PID)
    b.kernel(GEMM, 0, 1000, device=1, pid=PID + (1 << 24))
    p = _add_samples(b.write(tmp_path / "node.sqlite"), [(0, 500, 1, 20), (1, 500, 1, 60)])
    per = analysis.analyze([p])["metrics"]["per_rank"]
    assert sorted(m["sm_active_share"] for m in per.values()) == [pytest.approx(0.2), pytest.approx(0.6)]


def test_no_sampling_tables_no_metric(tmp_path):
    """Without GPU-metric tables, or with only other metrics sampled, no sm_active_share is reported."""
    p = TraceBuilder().kernel(GEMM, 0, 1000).write(tmp_path / "t.sqlite")
    assert "sm_active_share" not in analysis.analyze([p])["metrics"]["per_rank"][0]
    q = _add_samples(TraceBuilder().kernel(GEMM, 0, 1000).write(tmp_path / "u.sqlite"), [(0, 500, 2, 70)],
                     names=((2, "DRAM Read Bandwidth [Throughput %]"),))
    assert "sm_active_share" not in analysis.analyze([q])["metrics"]["per_rank"][0]
