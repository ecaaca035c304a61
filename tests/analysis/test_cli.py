"""`moetune analyze` as a function (moetune.analysis.cli.main): formats, folders of rank files, log-only
runs, --gpu-memory-gb, and one-line errors with exit 2."""
import json
from pathlib import Path

import pytest

from moetune import analysis
from moetune.analysis.cli import main as analyze_main
from tests.nsys_fixture import PID, TraceBuilder

GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def _rank(path, a2a_us):
    """One rank of 2 steps of 1000 us: a GEMM, then an all-to-all of `a2a_us` alone that ends at
    900 us on every rank (a rank whose GEMM ends sooner starts its all-to-all early and waits)."""
    b = TraceBuilder(gpu_memory_gb=80)
    for i in range(2):
        t = i * 1000
        b.range(f"iteration {i}", t, t + 1000)
        b.kernel(GEMM, t, t + 900 - a2a_us, launch_us=(t - 5, t - 1))
        b.kernel(SENDRECV, t + 900 - a2a_us, t + 900, stream=9, launch_us=(t + 890 - a2a_us, t + 895 - a2a_us))
    return b.write(path)


def _one_line_error(capsys, argv, *must_contain):
    assert analyze_main(argv) == 2
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert len(err.splitlines()) == 1, err
    assert cap.out == ""
    for s in must_contain:
        assert s in err
    return err


def test_folder_is_one_rank_per_file_and_formats(tmp_path, capsys):
    """Two traces in a folder read as two ranks with the hand-computed a2a transfer/wait split and
    the communication wall; one worker and every output format agree."""
    d = tmp_path / "job"
    d.mkdir()
    _rank(d / "trace_0.sqlite", a2a_us=500)
    _rank(d / "trace_1.sqlite", a2a_us=300)
    assert analyze_main([str(d), "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert set(r["metrics"]["per_rank"]) == {"0", "1"}
    c = r["metrics"]["combined"]
    assert c["ranks"] == 2 and c["steps"] == 2
    # rank 0: 500 us of a2a per step from 400 us, rank 1: 300 us from 600 us; rank 0 waits 200 us
    assert c["a2a_transfer_ms"] == pytest.approx(0.3, abs=1e-3)
    assert c["a2a_wait_ms"] == pytest.approx((0.2 + 0.0) / 2, abs=1e-3)
    assert r["metrics"]["per_rank"]["0"]["a2a_wait_ms"] == pytest.approx(0.2, abs=1e-3)
    assert r["wall"] == "communication"
    assert analyze_main([str(d), "--format", "json", "--workers", "1"]) == 0  # in this process
    assert json.loads(capsys.readouterr().out)["metrics"] == r["metrics"]
    assert analyze_main([str(d), "--format", "markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("**Wall: communication**") and "| exposed_comm_share |" in md
    assert analyze_main([str(d)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("wall: communication")


def test_gpu_memory_gb_option_sets_capacity(tmp_path, capsys):
    """--gpu-memory-gb sets the capacity memory_used_share divides by: 9 GB of 80 is no concern, of 9.5
    it is reported as a limit while the completed run's wall stays compute."""
    b = TraceBuilder(gpu_memory_gb=80).kernel(GEMM, 0, 1000).alloc(0, 9 * 2**30)
    p = b.write(tmp_path / "m.sqlite")
    assert analyze_main([str(p), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["wall"] != "memory"  # 9 of 80 GB
    assert analyze_main([str(p), "--format", "json", "--gpu-memory-gb", "9.5"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["wall"] == "compute"  # it completed: near capacity limits the next fixes, no wall
    assert any(e["metric"] == "memory_used_share" and e["value"] == pytest.approx(9 / 9.5, abs=1e-3)
               for e in r["evidence"])
    assert analyze_main([str(p), "--gpu-memory-gb", "9.5"]) == 0
    assert "limit memory_used_share = " in capsys.readouterr().out


def test_log_only_run(tmp_path, capsys):
    """A Megatron log without a trace is analysed alone: its time-limit failure and TFLOP/s are read and
    the wall is unknown."""
    log = tmp_path / "log.txt"
    log.write_text("[2026-11-22 10:00:00] iteration        1/      20 | consumed samples:            8 |"
                   " elapsed time per iteration (ms): 900.0 | throughput per GPU (TFLOP/s/GPU): 35.1 |\n"
                   "slurmstepd: error: *** JOB 12 ON node1 CANCELLED AT 2026-11-22T10:05:00 DUE TO TIME LIMIT ***\n")
    assert analyze_main(["--log", str(log), "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["log"]["failure"] == "time_limit" and r["log"]["tflops_per_gpu"] == pytest.approx(35.1)
    assert r["wall"] == "unknown"


BANK_LOGS = Path(__file__).resolve().parents[2] / "data" / "trial_bank" / "logs"


def test_log_alone_reports_what_the_log_shows(capsys):
    """A recorded log alone (the trial bank's baseline, 16 iterations on 2x H200, a 4-step profile
    window inside): the steady median step the tuner judges by (461.7 ms, as the demo's baseline),
    the mean labelled as such, throughput, peak memory, and how the run ended; no wall, saying a trace
    is needed, instead of a window of 0 ms."""
    log = str(BANK_LOGS / "baseline.log.xz")
    assert analyze_main(["--log", log]) == 0
    out = capsys.readouterr().out
    assert "window_ms" not in out and "unknown" not in out
    assert out.startswith("wall: not judged (no trace given: a wall is judged from a trace")
    flat = " ".join(out.split())
    assert "step time 461.7 ms/step (median of 9 steady log steps ± 64.9 ms)" in flat
    assert "mean step 1297.0 ± 1378.5 ms (after 2 warm-up iterations" in flat
    # throughput at the judged step: 16 x 2048 tokens in 461.7 ms; Megatron printed 58.9 there
    assert "throughput 70972 tokens/s, 58.9 TFLOP/s/GPU at the judged step" in flat
    assert "peak memory 13.36 GiB max allocated by PyTorch (log)" in flat and "ended no failure in the log" in flat
    assert "warning the steps' mean is unstable: 1297.0 ± 1378.5 ms (judged 461.7 ms)" in flat
    assert analyze_main(["--log", log, "--format", "json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["metrics"]["combined"]["steady_median_ms"] == pytest.approx(461.7, abs=0.05)
    assert r["evidence"][0]["rule"] == "no_trace"


def test_log_alone_that_failed_names_the_failure(capsys):
    """An out-of-memory log alone: the memory wall the log itself shows, and the failure's line."""
    assert analyze_main(["--log", str(BANK_LOGS / "mbs32_seq4096_oom.log.xz"), "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("- wall: memory (confidence 0.95; log_oom = 1.0, rule oom_in_log)")
    assert "- ended: oom: [rank0]: torch.OutOfMemoryError: CUDA out of memory." in out


def test_usage_errors_are_one_line(tmp_path, capsys):
    """Each usage error (no input, bad --format, --gpu-memory-gb or --workers, a missing file, a folder
    without traces, a broken .xz) is one line naming the option or file."""
    _one_line_error(capsys, [], "--log")
    _one_line_error(capsys, ["x.sqlite", "--format", "yaml"], "--format")
    _one_line_error(capsys, ["x.sqlite", "--gpu-memory-gb", "-1"], "--gpu-memory-gb")
    _one_line_error(capsys, ["x.sqlite", "--workers", "0"], "--workers")
    _one_line_error(capsys, [str(tmp_path / "missing.sqlite")], "missing.sqlite", "no such file")
    _one_line_error(capsys, [str(tmp_path)], str(tmp_path), "no trace files")
    (tmp_path / "t.sqlite.xz").write_bytes(b"\xfd7zXZ\x00broken")
    _one_line_error(capsys, [str(tmp_path / "t.sqlite.xz")], "t.sqlite.xz")


def test_two_gpus_in_one_file_are_two_ranks(tmp_path):
    """One report of a whole node: ranks are told apart by (globalPid, deviceId)."""
    b = TraceBuilder()
    for dev, pid in ((0, PID), (1, PID + (1 << 24))):
        b.kernel(GEMM, 0, 1000, device=dev, pid=pid)
        b.kernel(SENDRECV, 1000, 1000 + 200 * (dev + 1), device=dev, pid=pid, stream=9)
    r = analysis.analyze([b.write(tmp_path / "node.sqlite")])
    per = r["metrics"]["per_rank"]
    assert len(per) == 2
    assert sorted(m["kernel_class_count"]["a2a"] for m in per.values()) == [1, 1]
    assert sorted(round(m["window_ms"], 3) for m in per.values()) == [1.2, 1.4]


def test_ranks_are_numbered_as_the_job_named_their_reports(tmp_path):
    """Reports of profiled ranks 2 and 10 (trace_<RANK>.sqlite, as the job script names them) are
    ranks 2 and 10 of the analysis, read in that order; files not named for a rank are 0, 1, ..."""
    d = tmp_path / "run"
    d.mkdir()
    for rank in (10, 2):
        _rank(d / f"trace_{rank}.sqlite", 100 + rank)
    r = analysis.analyze([d], workers=1)
    assert sorted(r["metrics"]["per_rank"]) == [2, 10]
    assert [Path(p).name for p in r["sources"]] == ["trace_2.sqlite", "trace_10.sqlite"]
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("node_b", "node_a"):
        _rank(plain / f"{name}.sqlite", 100)
    assert sorted(analysis.analyze([plain], workers=1)["metrics"]["per_rank"]) == [0, 1]
