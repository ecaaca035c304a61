"""moetune/analysis/render.py: the text and Markdown views of an analysis show its wall with its
confidence, each evidence row (a limit said as a limit), the headline figures, the kernel classes
by time and the log's failure, on a real analysis of a hand-built trace."""
from moetune import analysis
from moetune.analysis.render import HEADLINE, render_markdown, render_text
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
    assert len(rows) == len(r["evidence"]) + sum(k in r["metrics"]["combined"] for k in HEADLINE)
