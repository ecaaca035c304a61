"""moetune's figures against NVIDIA's Nsight Systems recipes on the same real reports (one H200,
nsys 2025.3.1, tests/data/gpu/recipes/README.md says how they were recorded): kernel time per name
within 1 %, GPU busy share within 2 points, over the recipe's window."""
from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from moetune import analysis
from moetune.analysis import recipes

DATA = Path(__file__).resolve().parent / "data" / "gpu" / "recipes"
RECORDED = ("plain", "one_rank_nccl")


@pytest.mark.parametrize("name", RECORDED)
def test_kernel_time_per_name_agrees_with_cuda_gpu_kern_sum(name):
    c = recipes.compare(DATA / name / "run.sqlite.xz", DATA / name)
    assert len(c["kernels"]) >= 5  # every kernel name the recipe lists is compared
    assert all(k["rel_diff"] <= recipes.KERNEL_TOLERANCE for k in c["kernels"]), c["kernels"]
    assert c["disagreements"] == []


@pytest.mark.parametrize("name", RECORDED)
def test_busy_share_agrees_with_gpu_time_util(name):
    c = recipes.compare(DATA / name / "run.sqlite.xz", DATA / name)
    b, = c["busy"]
    assert abs(b["moetune"] - b["recipe"]) <= recipes.BUSY_TOLERANCE
    assert 0.05 < b["recipe"] < 0.2  # the workload's idle gaps: mostly idle, as recorded


def test_the_naming_rule_is_needed_and_applied():
    """By design moetune names a kernel with its namespace and the recipe does not: the comparison
    matches them on the short name, and without that rule the names would not meet."""
    ours = {str(n) for _, k, *_ in analysis.rank_frames([str(DATA / "plain" / "run.sqlite.xz")])
            for n in k["name"].unique()}
    theirs = set(recipes.read_recipes(DATA / "plain")["kernel_ms"])
    assert "at::native::reduce_kernel" in ours and "reduce_kernel" in theirs
    assert not theirs <= ours and theirs <= {recipes.short_name(n) for n in ours}


def test_the_window_rule_is_the_recipes(tmp_path):
    """gpu_time_util's window is its Start and Duration; moetune's busy share over the steps'
    window alone (what the wall is decided on) is another figure and leaves out the warm-up."""
    r = analysis.analyze([str(DATA / "plain" / "run.sqlite.xz")])
    steps_busy = r["metrics"]["combined"]["gpu_busy_share"]
    b, = recipes.compare(DATA / "plain" / "run.sqlite.xz", DATA / "plain")["busy"]
    assert abs(steps_busy - b["recipe"]) > recipes.BUSY_TOLERANCE  # the rule matters here


def test_a_disagreement_is_flagged(tmp_path):
    shutil.copytree(DATA / "plain", tmp_path / "plain")
    kern = tmp_path / "plain" / "cuda_gpu_kern_sum" / "all_stats.parquet"
    df = pd.read_parquet(kern)
    df.loc[df.index[0], "Sum"] = int(df["Sum"].iloc[0] * 1.05)
    df.to_parquet(kern)
    util = tmp_path / "plain" / "gpu_time_util" / "analysis.parquet"
    u = pd.read_parquet(util)
    u["In-Use"] = u["In-Use"] + 5.0
    u.to_parquet(util)
    c = recipes.compare(tmp_path / "plain" / "run.sqlite.xz", tmp_path / "plain")
    assert len(c["disagreements"]) == 2
    assert "cuda_gpu_kern_sum" in c["disagreements"][0] and "gpu_time_util" in c["disagreements"][1]


def test_a_foreign_recipe_output_is_one_line(tmp_path):
    (tmp_path / "gpu_time_util").mkdir()
    (tmp_path / "gpu_time_util" / "analysis.parquet").write_text("not parquet")
    with pytest.raises(analysis.TraceError) as e:
        recipes.read_recipes(tmp_path)
    assert "\n" not in str(e.value) and str(tmp_path) in str(e.value)


@pytest.mark.nsys
def test_nsys_2022_has_no_recipes_and_the_export_says_so(nsys_bin):
    from moetune.analysis.nsys import has_recipes
    assert has_recipes(nsys_bin) is False


def test_the_report_shows_the_recipes_beside_moetune():
    from moetune.pipeline.report.study import recipes_markdown
    c = recipes.compare(DATA / "plain" / "run.sqlite.xz", DATA / "plain")
    lines = recipes_markdown({"trace_0.sqlite": c})
    assert lines[0].startswith("- Beside Nsight's recipes (trace_0.sqlite): 6 kernel names")
    assert "gpu_time_util 10.8%" in lines[0] and "disagrees" not in "".join(lines)
    c["disagreements"] = ["GPU 0 busy: moetune 10.8%, gpu_time_util 20.0%"]
    assert any(l.startswith("  - **disagrees**: GPU 0 busy") for l in recipes_markdown({"t": c}))
