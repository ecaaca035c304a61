"""Real Transformer Engine traces (the trial bank's `te_*` entries: moe_proxy on 2× H200 with TE 2.20.2,
DeepEP and HybridEP built on the device): the analysis names each fix's kernels."""
from pathlib import Path

import pytest

from moetune import analysis
from moetune.analysis.load import open_trace

TRACES = Path(__file__).resolve().parents[2] / "data" / "trial_bank" / "traces"


@pytest.fixture(scope="module")
def combined():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = analysis.analyze([TRACES / f"{name}.sqlite.xz"])["metrics"]["combined"]
        return cache[name]
    return get


def test_te_layers_show_as_te_kernels_and_the_local_spec_has_none(combined):
    """RMSNorm and RoPE run as TE's fused kernels under the TE spec; under the local spec, torch's."""
    assert combined("te_gg")["kernel_class_count"]["te"] > 100
    assert combined("baseline")["kernel_class_count"]["te"] == 0


def test_hybridep_dispatch_and_combine_replace_nccl_all_to_all(combined):
    """In the recorded HybridEP trace, HybridEP's dispatch and combine kernels are classed hybridep and
    no NCCL all-to-all or DeepEP is counted."""
    names = set(open_trace(TRACES / "te_gg_hybridep.sqlite.xz").kernels["name"].astype(str))
    assert {"hybrid_ep::dispatch_kernel", "hybrid_ep::combine_kernel"} <= names
    c = combined("te_gg_hybridep")
    assert c["kernel_class_count"]["hybridep"] > 0
    assert c["kernel_class_count"]["a2a"] == 0 and c["kernel_class_count"]["deepep"] == 0


def test_deepep_under_te_replaces_nccl_all_to_all(combined):
    """In the recorded DeepEP trace DeepEP kernels replace NCCL all-to-all, while the plain TE trace has
    all-to-all and no DeepEP."""
    c = combined("te_gg_deepep")
    assert c["kernel_class_count"]["deepep"] > 0 and c["kernel_class_count"]["a2a"] == 0
    assert combined("te_gg")["kernel_class_count"]["deepep"] == 0
    assert combined("te_gg")["kernel_class_count"]["a2a"] > 0


def test_fp8_blockwise_shows_its_cast_kernels(combined):
    """The blockwise recipe quantizes through block_scaled_1d_cast_transpose_kernel; BF16 has none."""
    names = set(open_trace(TRACES / "te_gg_fp8.sqlite.xz").kernels["name"].astype(str))
    assert any("block_scaled" in n for n in names)
    assert combined("te_gg_fp8")["kernel_class_count"]["fp8_cast"] > 100
    assert combined("te_gg")["kernel_class_count"]["fp8_cast"] == 0


def test_te_cuda_graphs_replace_kernel_launches_with_graph_launches(combined):
    """Attention and the router captured as graphs: graph launches appear, the kernels launched
    one by one per step fall, and attention's kernels leave the kernel table (they run in graphs)."""
    off, on = combined("te_gg"), combined("te_gg_graphs")
    assert off["cuda_graph_launches"] == 0 < on["cuda_graph_launches"]
    assert on["kernels_per_step"] < 0.8 * off["kernels_per_step"]
    assert off["kernel_class_count"]["attention"] > 0 == on["kernel_class_count"]["attention"]


def test_te_grouped_gemm_is_seen_as_expert_gemms_over_extra_streams(combined):
    """TE 2.20's grouped GEMM on Hopper is one cuBLAS GEMM per local expert, named like any GEMM
    (`nvjet_sm90_*`), spread over 4 compute streams besides the main one: the stream count tells."""
    from moetune.decide.applied import verify
    assert combined("te_baseline")["gemm_streams"] == 1
    assert combined("te_gg")["gemm_streams"] == 5
    assert combined("te_gg")["kernel_class_count"]["grouped_gemm"] == 0
    seq = {"metrics": {"combined": combined("te_baseline")}}
    grouped = {"metrics": {"combined": combined("te_gg")}}
    assert verify("grouped_gemm", grouped, seq).status == "applied"
    assert verify("grouped_gemm", seq, seq).status == "not_applied"


def test_exposed_all_to_all_is_mostly_waiting_so_overlap_is_not_proposed(combined):
    """On the device, EP overlap was slower wherever it ran: the raw exposed all-to-all is mostly
    one rank waiting for the other, which overlap cannot hide. The net share is what the rule reads."""
    from moetune.decide import rules
    from moetune.experiment.config import TrainingConfig
    from moetune.experiment.schema import load_experiment
    c = combined("te_gg")
    assert c["exposed_a2a_share"] > 0.1 and c["exposed_a2a_share_net"] < 0.03
    exp = load_experiment("moe_proxy_te")
    config = TrainingConfig.from_dict({**exp.baseline.to_dict(), "grouped_gemm": True})
    an = {"wall": "host_overhead", "metrics": {"combined": c}}
    ids = [p.rule.id for p in rules.proposals(an, config, exp.model, exp.cluster,
                                              check=lambda *a: [])]
    assert "cuda_graphs_te" in ids and "ep_a2a_overlap" not in ids
    raw = {"wall": "host_overhead", "metrics": {"combined": {**c, "a2a_wait_share": 0.0,
                                                             "exposed_a2a_share_net": c["exposed_a2a_share"]}}}
    assert "ep_a2a_overlap" in [p.rule.id for p in rules.proposals(raw, config, exp.model, exp.cluster,
                                                                   check=lambda *a: [])]
