"""Kernel classes (moetune/analysis/kernels.py) by what a kernel is: every kernel name of the recorded
traces (the GPU trial bank, the device tuning run, the test data, and the NVIDIA recipes' names kept
from the one-GPU runs on an H100) is in tests/data/kernel_classes.tsv with the class it was reviewed
to have (benchmarks/kernel_names.py builds the table)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moetune.analysis.kernels import CLASSES, classify_name

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import kernel_names  # noqa: E402

TABLE = kernel_names.read_table()


def test_every_recorded_kernel_name_keeps_its_reviewed_class():
    """Every kernel name recorded on a GPU is classified as its reviewed class, and those classes are
    all known ones."""
    wrong = {n: (classify_name(n), cls) for n, (cls, _) in TABLE.items() if classify_name(n) != cls}
    assert not wrong, f"name: (classified, reviewed) {wrong}"
    assert {cls for cls, _ in TABLE.values()} <= set(CLASSES)


@pytest.mark.parametrize("name", [
    # the SwiGLU backward TorchInductor fused on DeepSeek-V3's dense first stage: "sigmoid" is an op
    "triton_poi_fused_add_cat_mul_rsub_sigmoid_silu_split_0",
    "triton_poi_fused__to_copy_add_cat_mul_rsub_sigmoid_silu_split_0",
    # PyTorch's gather, which dense layers run too
    "vectorized_gather_kernel", "at::native::vectorized_gather_kernel",
])
def test_a_fused_swiglu_and_a_plain_gather_are_neither_router_nor_permute(name):
    """Recorded kernels that merely look like MoE work (fused SwiGLU, plain gathers) are not classed
    router or permute."""
    assert name in TABLE  # recorded on a GPU, not made up
    assert classify_name(name) not in ("moe_router", "moe_permute")


def test_the_routers_top_k_and_the_moe_permutation_kernels_keep_their_classes():
    """The router's top-k and TE's permutation kernels are classed moe_router and moe_permute, as the
    recorded table says."""
    assert classify_name("at::native::sbtopk::gatherTopK") == "moe_router"
    assert classify_name("_row_id_map_pass_1_kernel") == "moe_permute"  # TE's Triton permutation
    assert classify_name("_unpermute_kernel") == "moe_permute"
    for name in ("at::native::sbtopk::gatherTopK", "_row_id_map_pass_1_kernel", "_unpermute_kernel"):
        assert TABLE[name][0] == classify_name(name)


def test_substrings_inside_other_words_do_not_class_a_kernel():
    """Made-up names: a class word inside another word is not that class."""
    assert classify_name("europe_kernel") == "other"  # not rope
    assert classify_name("my_sigmoid_kernel") == "other"  # the router is not a sigmoid
    assert classify_name("regather_rows") == "other"
    assert classify_name("transformer_engine::fused_topk_with_score_function_forward_kernel") == "moe_router"


@pytest.mark.parametrize("path", sorted((REPO / "tests" / "data").glob("**/*.sqlite.xz")),
                         ids=lambda p: str(p.relative_to(REPO / "tests" / "data")))
def test_the_test_datas_traces_hold_no_kernel_name_the_table_lacks(path):
    """A new trace with a kernel name the table lacks fails here, rather than being misfiled
    silently: add it with benchmarks/kernel_names.py and review its class."""
    missing = kernel_names.trace_names(path) - set(TABLE)
    assert not missing, f"{path.name}: kernel names not in {kernel_names.TABLE}: {sorted(missing)[:10]}"
