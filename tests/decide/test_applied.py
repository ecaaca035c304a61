"""decide/applied.py: did the fix take effect? applied.verify on traces (hand-built SQLite in the
nsys schema, read by the real analysis) calls a fix applied only where its kernels show, not_applied
where they do not, unverified without trace metrics. (That the tuner then records not_applied and
bars the rule on that cluster is proved by tests/tune/test_loop.py, which runs the tuner.)"""
import sys
from pathlib import Path

from moetune import analysis
from moetune.decide import applied

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import standin_bank  # noqa: E402

STEP = dict(standin_bank.BASE_STEP)


def analyzed(tmp_path, name, **kw):
    p = standin_bank.write_trace(tmp_path / f"{name}.sqlite", name, kw.pop("step", STEP), **kw)
    return analysis.analyze([str(p)])


def test_deepep_config_whose_trace_shows_only_sendrecv_is_not_applied(tmp_path):
    """A flex/DeepEP config whose trace shows NCCL SendRecv and no DeepEP kernel fell back:
    not_applied, with the kernel counts as evidence."""
    parent = analyzed(tmp_path, "alltoall")
    fell_back = analyzed(tmp_path, "deepep_fallback")  # flex/deepep asked, NCCL SendRecv ran
    v = applied.verify("flex_dispatch", fell_back, parent)
    assert v.status == "not_applied" and "NCCL SendRecv" in v.reason
    assert v.evidence["nccl_sendrecv_kernels"] > 0 and v.evidence["deepep_or_hybridep_kernels"] == 0


def test_deepep_kernels_without_sendrecv_is_applied(tmp_path):
    """DeepEP's own dispatch kernels in place of NCCL SendRecv: the fix is applied."""
    parent = analyzed(tmp_path, "alltoall")
    deepep = analyzed(tmp_path, "deepep", sendrecv_name="deep_ep::intranode::dispatch<8>")
    v = applied.verify("flex_dispatch", deepep, parent)
    assert v.status == "applied", v.reason


def test_overlap_must_lower_exposed_all_to_all(tmp_path):
    """The EP overlap is applied only where the exposed all-to-all fell from its parent's; the same
    exposure is not_applied."""
    parent = analyzed(tmp_path, "plain")
    hidden = dict(STEP, hidden=STEP["a2a"] * 0.7, a2a=STEP["a2a"] * 0.3)
    assert applied.verify("overlap", analyzed(tmp_path, "overlap", step=hidden), parent).applied
    v = applied.verify("overlap", analyzed(tmp_path, "no_overlap"), parent)
    assert v.status == "not_applied" and "did not fall" in v.reason


def test_fp8_and_recompute_need_their_kernels(tmp_path):
    """FP8 needs its cast kernels and recompute its extra forward GEMMs in the trace; the parent's
    kernels alone are not_applied."""
    parent = analyzed(tmp_path, "bf16")
    assert applied.verify("fp8", analyzed(tmp_path, "bf16_again"), parent).status == "not_applied"
    fp8 = analyzed(tmp_path, "fp8", extra_kernels=("transformer_engine::fp8_quantize_kernel",))
    assert applied.verify("fp8", fp8, parent).applied
    assert applied.verify("recompute", analyzed(tmp_path, "same"), parent).status == "not_applied"
    more = analyzed(tmp_path, "recompute", extra_kernels=("nvjet_sm90_recompute_fwd_gemm",))
    assert applied.verify("recompute", more, parent).applied


def test_cuda_graphs_need_graph_launches():
    """CUDA graphs are applied only where the trace counts graph launches."""
    with_graphs = {"metrics": {"combined": {"kernel_class_count": {"gemm": 10},
                                            "cuda_graph_launches": 12}}}
    without = {"metrics": {"combined": {"kernel_class_count": {"gemm": 10}, "cuda_graph_launches": 0}}}
    assert applied.verify("cuda_graphs", with_graphs, without).applied
    assert applied.verify("cuda_graphs", without, without).status == "not_applied"


def test_no_trace_metrics_is_unverified_not_refused():
    """With only a log (no kernel counts) a fix is unverified and still counted as applied, not
    refused."""
    log_only = {"metrics": {"combined": {"step_time_ms": 100.0}}}
    v = applied.verify("flex_dispatch", log_only, log_only)
    assert v.status == "unverified" and v.applied
