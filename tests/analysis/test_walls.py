"""moetune/analysis/walls.py: wall classification on hand-built traces whose bottleneck is known by
construction, the threshold table, and bad input reaching the analysis as one-line errors."""
import json
import sqlite3

import pytest

from moetune import analysis
from moetune.analysis import TraceError
from moetune.analysis.cli import main as analyze_cli
from moetune.analysis.walls import LIMITS, THRESHOLDS, classify
from tests.nsys_fixture import TraceBuilder, foreign_sqlite

GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def _steps(b, n, step_us):
    for i in range(n):
        b.range(f"iteration {i}", i * step_us, (i + 1) * step_us)


def test_a2a_drowned_is_communication(tmp_path):
    """Steps dominated by exposed all-to-all are the communication wall, by the exposed_a2a rule."""
    b = TraceBuilder()
    _steps(b, 3, 1000)
    for i in range(3):
        t = i * 1000
        b.kernel(GEMM, t + 10, t + 300, launch_us=(t, t + 2)).kernel(SENDRECV, t + 300, t + 990, launch_us=(t + 3, t + 4))
    r = analysis.analyze([b.write(tmp_path / "a.sqlite")])
    assert r["wall"] == "communication"
    assert r["evidence"][0]["rule"] == "exposed_a2a"


def test_hidden_a2a_is_compute(tmp_path):
    """All-to-all hidden under a GEMM on another stream leaves no exposed share: the compute wall."""
    b = TraceBuilder()
    _steps(b, 3, 1000)
    for i in range(3):
        t = i * 1000
        b.kernel(GEMM, t + 5, t + 995, launch_us=(t, t + 2))
        b.kernel(SENDRECV, t + 100, t + 800, stream=9, launch_us=(t + 3, t + 4))
    r = analysis.analyze([b.write(tmp_path / "h.sqlite")])
    assert r["wall"] == "compute"
    assert r["metrics"]["combined"]["exposed_a2a_share"] == pytest.approx(0.0)


def test_tiny_kernels_with_gaps_is_host_overhead(tmp_path):
    """Tiny kernels separated by launch gaps are the host-overhead wall (median kernel 5 us)."""
    b = TraceBuilder()
    _steps(b, 2, 2000)
    t = 0
    while t < 4000:
        b.kernel("vectorized_elementwise_kernel", t + 5, t + 10, launch_us=(t, t + 4))
        t += 20
    r = analysis.analyze([b.write(tmp_path / "k.sqlite")])
    assert r["wall"] == "host_overhead"
    assert r["metrics"]["combined"]["median_kernel_us"] == pytest.approx(5.0)


def test_oom_log_is_memory_without_trace(tmp_path):
    """An out-of-memory line in a log, with no trace, is the memory wall at high confidence."""
    log = tmp_path / "log.txt"
    log.write_text("iteration        1/      20 | consumed samples: 8 | elapsed time per iteration (ms): 900.0 |\n"
                   "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n")
    r = analysis.analyze([], log=log)
    assert r["wall"] == "memory" and r["confidence"] >= 0.9
    assert r["log"]["failure"] == "oom"


def test_memory_near_capacity_is_a_limit_not_a_wall(tmp_path):
    """A completed run whose GPU is busy on GEMMs and whose allocator peaks at 95 % of capacity is
    compute-walled; the near-capacity row stands in its evidence as a limit on the next fixes."""
    b = TraceBuilder(gpu_memory_gb=10).kernel(GEMM, 0, 1000).alloc(0, int(9.5 * 2**30))
    r = analysis.analyze([b.write(tmp_path / "m.sqlite")])
    assert r["wall"] == "compute"
    limit = next(e for e in r["evidence"] if e["rule"] == "memory_near_capacity")
    assert limit["wall"] is None and limit["limits"].startswith("memory") and limit["value"] == 0.95


def test_threshold_rows_name_their_source():
    """Every threshold row names its source, covers the four walls, and rows with no wall are listed
    limits."""
    assert all(row[5] for row in THRESHOLDS)
    assert {row[1] for row in THRESHOLDS} - {None} == {"memory", "communication", "host_overhead", "compute"}
    assert all(row[0] in LIMITS for row in THRESHOLDS if row[1] is None)  # no wall: a limit


def test_classify_prefers_memory_over_everything():
    """An OOM failure makes the memory wall even where communication and idle shares are high."""
    r = classify({"window_ms": 10, "exposed_comm_share_net": 0.9, "gpu_idle_share": 0.9},
                 {"failure": "oom"}, 80)
    assert r["wall"] == "memory"


# -- bad input ------------------------------------------------------------------------------

def test_truncated_file(tmp_path):
    """A truncated trace is a TraceError naming the file."""
    good = TraceBuilder().kernel(GEMM, 0, 100).write(tmp_path / "g.sqlite")
    bad = tmp_path / "trunc.sqlite"
    bad.write_bytes(good.read_bytes()[:3000])
    with pytest.raises(TraceError, match="trunc.sqlite"):
        analysis.analyze([bad])


def test_foreign_sqlite(tmp_path):
    """An SQLite file that is not an Nsight Systems export is refused as such."""
    p = foreign_sqlite(tmp_path / "foreign.sqlite")
    with pytest.raises(TraceError, match="not an Nsight Systems export"):
        analysis.analyze([p])


def test_not_sqlite_and_empty(tmp_path):
    """A text file and an empty file are refused as not SQLite and empty."""
    (tmp_path / "x.sqlite").write_text("hello")
    (tmp_path / "e.sqlite").write_bytes(b"")
    with pytest.raises(TraceError, match="not an SQLite file"):
        analysis.analyze([tmp_path / "x.sqlite"])
    with pytest.raises(TraceError, match="empty file"):
        analysis.analyze([tmp_path / "e.sqlite"])


def test_missing_tables_give_unknown(tmp_path):
    """An export without the kernel tables gives wall unknown, not an error."""
    p = tmp_path / "bare.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
    con.commit()
    con.close()
    r = analysis.analyze([p])
    assert r["wall"] == "unknown"


def test_empty_window_gives_unknown(tmp_path):
    """A trace with a step range but no kernels gives wall unknown."""
    p = TraceBuilder().range("iteration 1", 0, 100).write(tmp_path / "w.sqlite")
    assert analysis.analyze([p])["wall"] == "unknown"


def test_cli_one_line_error_and_json(tmp_path, capsys):
    """The command exits 2 with one line naming a bad file, and prints JSON with wall, confidence,
    evidence and metrics for a good one."""
    (tmp_path / "x.sqlite").write_text("junk")
    assert analyze_cli([str(tmp_path / "x.sqlite")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "x.sqlite" in err
    p = TraceBuilder().kernel(GEMM, 0, 100).write(tmp_path / "ok.sqlite")
    assert analyze_cli([str(p), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"wall", "confidence", "evidence", "metrics"} <= set(out)
    assert set(out["metrics"]) == {"combined", "per_rank"}


def test_host_oom_is_never_the_memory_wall(tmp_path):
    """A job Slurm's cgroup killed for the node's memory (its recorded lines) is not memory-walled,
    with or without a trace, and even near the GPU's capacity: its row stands in the evidence as
    a limit, not a wall."""
    log = tmp_path / "log.txt"
    log.write_text("iteration        1/      20 | consumed samples: 8 | elapsed time per iteration (ms): 900.0 |\n"
                   "srun: error: n2: task 0: Out Of Memory\n"
                   "slurmstepd-n2: error: Detected 1 oom-kill event(s) in StepId=24.0. Some of your "
                   "processes may have been killed by the cgroup out-of-memory handler.\n")
    r = analysis.analyze([], log=log)
    assert r["log"]["failure"] == "host_oom" and r["wall"] == "unknown"
    rows = {e["rule"]: e for e in r["evidence"]}
    assert rows["host_oom_in_log"]["wall"] is None and "host memory" in rows["host_oom_in_log"]["limits"]
    assert "oom_in_log" not in rows
    busy = classify({"window_ms": 10, "sm_util_estimate": 0.9, "peak_memory_gb": 79},
                    {"failure": "host_oom"}, 80)
    assert busy["wall"] == "compute"
    assert all(e["wall"] != "memory" for e in busy["evidence"])
    assert {e["rule"] for e in busy["evidence"]} >= {"host_oom_in_log", "memory_near_capacity"}
