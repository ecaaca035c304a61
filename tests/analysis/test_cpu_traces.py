"""Real CPU traces from Debian's Nsight Systems 2022.4 (tests/data/cpu): the 2022.4 schema loads,
NVTX iterations give the step times, and with no CUDA tables the wall is `unknown`, not a crash."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from moetune import analysis
from moetune.analysis.cli import main as analyze_cli
from moetune.analysis.load import open_trace

DATA = Path(__file__).resolve().parents[1] / "data" / "cpu"
NVTX_INCLUDE = "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nvtx/include"
needs_nsys = pytest.mark.skipif(shutil.which("nsys") is None,
                                reason="nsys not installed (scripts/nsys-up installs Debian's 2022.4)")


@pytest.fixture
def committed(tmp_path):
    """A copy of the committed trace."""
    dst = tmp_path / "steps_nvtx_osrt.sqlite.xz"
    dst.write_bytes((DATA / dst.name).read_bytes())
    return dst


def _check_cpu_trace(path, steps, min_step_ms):
    t = open_trace(path)
    assert t.version.startswith("2022.4")
    assert t.kernels.empty and t.runtime.empty and t.copies.empty
    assert (t.nvtx["text"] == "forward").sum() == steps
    r = analysis.analyze([path])
    assert r["wall"] == "unknown" and r["confidence"] == 0.0
    c = r["metrics"]["combined"]
    assert c["steps"] == steps
    # each iteration spins on the CPU then sleeps 5 ms: the step is longer than the sleep alone
    assert c["step_time_ms"] > min_step_ms
    iters = t.nvtx[t.nvtx["text"].str.startswith("iteration")]
    assert c["step_time_ms"] == pytest.approx(((iters["end"] - iters["start"]) / 1e6).mean(), rel=1e-3)
    return r


def test_committed_2022_trace(committed):
    """The committed nsys 2022.4 CPU-only trace reads: five NVTX steps, no kernels, step time equal to
    the mean iteration range, wall unknown."""
    _check_cpu_trace(committed, steps=5, min_step_ms=5.0)


def test_cli_on_cpu_trace_is_json(committed, capsys):
    """The analysis command prints the CPU-only trace as JSON with wall unknown and its five steps."""
    assert analyze_cli([str(committed), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["wall"] == "unknown" and out["metrics"]["combined"]["steps"] == 5


@pytest.mark.nsys
@needs_nsys
def test_record_fresh_trace_with_nsys(tmp_path):
    """Profile steps.c now with the installed nsys and analyze the .nsys-rep (export cached beside it)."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed: cannot build the profiled program")
    exe = tmp_path / "steps"
    subprocess.run(["gcc", "-O1", f"-I{NVTX_INCLUDE}", "-o", str(exe), str(DATA / "steps.c"), "-ldl"],
                   check=True)
    rep = tmp_path / "run"
    report = tmp_path / "run.nsys-rep"
    # nsys 2022.4 has failed here without writing a report ("Local Endpoint is not available"
    # seen once by hand) while other nsys sessions ran on the machine; try once more before failing
    for _ in range(2):
        proc = subprocess.run(["nsys", "profile", "-t", "osrt,nvtx", "-s", "none", "--cpuctxsw", "none",
                               "-o", str(rep), "-f", "true", str(exe), "3"],
                              capture_output=True, text=True, timeout=300)
        if report.exists():
            break
    assert report.exists(), f"nsys profile wrote no report (run scripts/nsys-up): {proc.stderr[-500:]}"
    _check_cpu_trace(report, steps=3, min_step_ms=5.0)
    assert (tmp_path / "run.sqlite").exists()
