"""moetune/analysis/summary.py: the per-rank summaries (what a post-processing job writes beside each report)
combined on the login node give exactly analyze()'s result, on every recorded trace, and on the two
reports of one two-rank run, whose all-to-all split needs both."""
import json
from pathlib import Path

import pytest

from moetune import analysis
from moetune.analysis.summary import combine_summaries, rank_summary, summary_path

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tests" / "data" / "gpu"
RECIPES = GPU / "recipes"
BANK = ROOT / "data" / "trial_bank" / "traces"
ALL = sorted(GPU.glob("*.sqlite.xz")) + sorted((ROOT / "tests/data/cpu").glob("*.sqlite.xz")) + \
    sorted(BANK.glob("*.sqlite.xz"))


def _json(x):  # what goes through a file: the summary and the analysis are both stored as JSON
    return json.loads(json.dumps(x, sort_keys=True, default=str))


@pytest.mark.parametrize("trace", ALL, ids=lambda p: p.name)
def test_one_file_summary_combines_to_analyze(trace):
    """Each recorded trace (with its log where one is kept): its summary, through JSON, combines to
    exactly analyze()'s result."""
    log = trace.with_name(trace.name.split(".")[0] + ".log")
    log = log if log.exists() else (log.with_name(log.name + ".xz") if log.with_name(log.name + ".xz").exists() else None)
    want = analysis.analyze([str(trace)], log=str(log) if log else None)
    got = combine_summaries([_json(rank_summary(trace))], log=str(log) if log else None)
    assert _json(got) == _json(want)


def test_several_files_keep_the_cross_rank_all_to_all_split():
    """Two files of one run (moe_proxy at EP 2 on two H200s, one report per rank, recorded together:
    tests/data/gpu/recipes/README.md) as two summaries: the skew split needs every rank's all-to-all
    starts, so each file alone shows no wait, and the combined summaries give analyze() of both
    files, rank 0 waiting for its late peer."""
    files = [str(RECIPES / f"moe_proxy_ep2_rank{r}" / "run.sqlite.xz") for r in (0, 1)]
    want = analysis.analyze(files)
    got = combine_summaries([_json(rank_summary(f)) for f in files])
    assert _json(got) == _json(want)
    assert got["metrics"]["combined"]["ranks"] == 2
    assert [analysis.analyze([f])["metrics"]["combined"]["a2a_wait_ms"] for f in files] == [0.0, 0.0]
    assert got["metrics"]["per_rank"][0]["a2a_wait_ms"] > 100 * got["metrics"]["per_rank"][1]["a2a_wait_ms"] > 0


def test_skew_trace_split_is_from_the_summaries():
    """The skew trace (two ranks in one file): its summary keeps each rank's all-to-all starts, and
    the wait comes from them."""
    s = _json(rank_summary(GPU / "skew.sqlite.xz"))
    assert len(s["ranks"]) >= 2 and all(r["a2a"]["start"] for r in s["ranks"])
    got = combine_summaries([s])
    assert got["metrics"]["combined"]["a2a_wait_ms"] > 0


def test_summary_path_and_bad_version():
    """A report's summary sits beside it as trace_R.metrics.json; a summary of another version is
    refused by name."""
    assert summary_path("/x/trace_3.sqlite").name == "trace_3.metrics.json"
    with pytest.raises(analysis.TraceError, match="summary version"):
        combine_summaries([{"version": 0, "source": "trace_0.metrics.json", "ranks": []}])


def test_written_summary_reads_back_to_the_same_analysis(tmp_path):
    """What the post-processing job writes (workloads/postprocess.py write_summary) and the login node
    reads (load_summary: kernel lists as arrays) combine to analyze() of the file; the job it was
    made for is at the file's head, where the analyze stage looks for it."""
    import shutil
    from moetune.analysis.summary import load_summary
    from moetune.trial.traces import _for_job
    from moetune.workloads.postprocess import write_summary
    trace = tmp_path / "trace_0.sqlite.xz"
    shutil.copy(GPU / "skew.sqlite.xz", trace)
    out = write_summary(trace, for_job="4242")
    assert out == tmp_path / "trace_0.metrics.json" and _for_job(out) == "4242"
    got = combine_summaries([load_summary(out)])
    assert _json(got) == _json(analysis.analyze([str(trace)]))
    assert out.stat().st_size < trace.stat().st_size  # small beside its report
