"""analysis.verdict: the result every analysis ends in. The log's figures fill what the trace leaves
empty and never replace a trace's own; a log alone is judged from its steady steps and says a trace
is needed instead of reporting an empty window; a trace whose CUDA graphs were traced whole carries
the warning naming it."""
from pathlib import Path

from moetune.analysis.logs import parse_log
from moetune.analysis.verdict import NO_TRACE, graph_warnings, log_only, result

GPU = Path(__file__).resolve().parents[1] / "data" / "gpu"


def test_the_log_fills_only_what_the_trace_leaves_empty():
    """Merging a log into a trace result keeps the trace's own figures and takes from the log only those
    the trace lacks (TFLOP/s, peak memory)."""
    log = parse_log(GPU / "megatron_moe_proxy_ep2.log.xz")
    assert log["step_time_ms"] is not None and log["tflops_per_gpu"] is not None
    r = result({"step_time_ms": 1.0}, {}, log, None, ["t.sqlite"])
    c = r["metrics"]["combined"]
    assert c["step_time_ms"] == 1.0  # the trace's own figure stays
    assert c["tflops_per_gpu"] == log["tflops_per_gpu"]  # the trace has none: the log's
    assert c["peak_memory_gb"] == log["max_allocated_gb"]
    assert r["sources"] == ["t.sqlite"] and r["warnings"] == []


def test_a_log_alone_is_judged_from_its_steady_steps_and_asks_for_a_trace():
    """A log alone gives wall unknown with evidence asking for a trace, judged from its steady steps,
    without a no-window rule."""
    log = parse_log(GPU / "big_gemm.log")
    r = log_only(log, None, "big_gemm.log")
    assert r["log_only"] and r["wall"] == "unknown"
    assert r["evidence"][0]["reason"] == NO_TRACE
    assert all(e.get("rule") != "no_window" for e in r["evidence"])
    assert r["metrics"]["combined"]["steady_steps"] > 0


def test_graphs_traced_whole_name_their_files():
    """Traces of whole-iteration CUDA graphs get one warning naming their files and saying idle share is
    overstated; no files, no warning."""
    (line,) = graph_warnings(["trace_0.sqlite", "trace_1.sqlite"])
    assert line.startswith("trace_0.sqlite, trace_1.sqlite: ") and "gpu_idle_share is overstated" in line
    assert graph_warnings([]) == []
