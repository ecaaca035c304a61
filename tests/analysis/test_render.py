"""moetune/analysis/render.py: the text and Markdown views of an analysis show its wall with its
confidence, each evidence row (a limit said as a limit), the headline figures, the kernel classes
by time and the log's failure, on a real analysis of a hand-built trace."""
from pathlib import Path

from moetune import analysis
from moetune.analysis.logs import parse_log
from moetune.analysis.render import HEADLINE, figure_rows, render_markdown, render_text
from tests.nsys_fixture import TraceBuilder

GEMM = "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_TNT"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


def analyzed(tmp_path):
    b = TraceBuilder(gpu_memory_gb=10).kernel(GEMM, 0, 1000).kernel(SENDRECV, 900, 1000)
    return analysis.analyze([b.alloc(0, int(9.5 * 2**30)).write(tmp_path / "t.sqlite")])


def test_text_view_has_wall_evidence_figures_and_kernel_classes(tmp_path):
    """The first line is the wall and its confidence; a near-capacity row reads as a limit; every
    headline figure the analysis has is a line; the kernel classes are listed by time."""
    r = analyzed(tmp_path)
    text = render_text(r)
    assert text.splitlines()[0] == f"wall: {r['wall']} (confidence {r['confidence']:.2f})"
    assert "  because sm_util_estimate = 1 (threshold 0.7; rule busy_compute)" in text
    assert "  limit memory_used_share = 0.95 (threshold 0.92; rule memory_near_capacity): memory:" in text
    c = r["metrics"]["combined"]
    for key in HEADLINE:
        assert (f"  {key:<22} " in text) is (key in c)
    assert "time by kernel class (ms, mean per rank): gemm" in text


def test_text_view_names_the_logs_failure_and_warnings():
    """A log-only result that failed shows its failure and each warning as a line of its own."""
    r = {"wall": "memory", "confidence": 0.95, "evidence": [], "metrics": {"combined": {}},
         "log": {"failure": "oom"}, "warnings": ["graphs traced whole"]}
    assert render_text(r).splitlines() == ["wall: memory (confidence 0.95)", "  log: oom",
                                          "  warning: graphs traced whole"]


def test_markdown_view_is_two_tables(tmp_path):
    """One row per evidence entry in the rule table, one row per headline figure in the metric one."""
    r = analyzed(tmp_path)
    md = render_markdown(r)
    assert md.startswith(f"**Wall: {r['wall']}**")
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and not ln.startswith("| rule")
            and not ln.startswith("| metric |")]
    assert len(rows) == len(r["evidence"]) + len(figure_rows(r)) + \
        sum(k in r["metrics"]["combined"] for k in HEADLINE)
    assert "| peak memory | 9.50 GiB held through CUDA (trace) |" in md


BANK_LOG = Path(__file__).resolve().parents[2] / "data" / "trial_bank" / "logs" / "baseline.log.xz"


def test_trace_and_log_show_the_judged_step_first_and_the_mean_as_secondary():
    """A trace with a stall in its 4 profiled steps (868.6 ± 852.9 ms, as the bank's baseline) and
    its log: the step time is the log's judged median (461.7 ms, what the tuner compares), the
    trace's mean follows labelled, throughput is at the judged step, memory is in GiB with its
    source, and the instability the report warns of is said."""
    r = {"wall": "host_overhead", "confidence": 0.8, "evidence": [], "log": parse_log(BANK_LOG),
         "metrics": {"combined": {"step_time_ms": 868.6, "step_time_std_ms": 852.9, "steps": 4,
                                  "peak_memory_gb": 16.59, "peak_memory_source": "trace"}}}
    lines = render_text(r).splitlines()
    assert lines[1] == "  step time              461.7 ms/step (median of 9 steady log steps ± 64.9 ms)"
    assert lines[2] == ("  profiled step          868.6 ± 852.9 ms, mean of 4 traced steps (a stall "
                        "inflates it)")
    assert lines[3] == "  throughput             70972 tokens/s, 58.9 TFLOP/s/GPU at the judged step"
    assert lines[4] == ("  peak memory            16.59 GiB held through CUDA (trace); 13.36 GiB max allocated "
                        "by PyTorch (log)")
    assert lines[5].startswith("  warning                the steps' mean is unstable: 868.6 ± 852.9 ms")
    assert "| step time | 461.7 ms/step (median of 9 steady log steps ± 64.9 ms) |" in render_markdown(r)
