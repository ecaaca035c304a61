"""estimate/step.py: the step's terms added up: pipeline fill and drain, host launch time
against the GPU stream (and the measured excess near balance), CUDA graphs and FP8 on the host,
against hand computations."""
import pytest

from moetune.experiment.config import TrainingConfig
from moetune.experiment.model import ModelArch
from moetune.estimate import Node, Rates, bubble_fraction, predict
from moetune.estimate import step

TOY = ModelArch(name="toy", num_layers=8, hidden_size=1024, num_attention_heads=8, num_query_groups=8,
                ffn_hidden_size=4096, moe_ffn_hidden_size=512, num_experts=8, moe_router_topk=2,
                vocab_size=32000, seq_length=1024)
H100_NVLINK, NIC = 450e9, 48.5e9  # experiment/gpus.py, rates.py nic_gb_s
NODE = Node("H100", 8, 8)

def test_bubble_fraction_and_term():
    """PP 4, VPP 2, 8 micro-batches: fill and drain are (4-1)/(2x8) = 3/16 of the steady part, and
    the step's bubble term is (PP-1)/VPP of the slowest stage's micro-batch time (its sends in it,
    as they are without the interleaved schedule's overlap)."""
    c = TrainingConfig(pp=4, vpp=2, micro_batch=1, global_batch=16, overlap_p2p_comm=False)
    assert bubble_fraction(c, 8) == 3 / 16
    p = predict(TOY, c, NODE, world=8)
    assert p.inputs["micro_batches"] == 8 and p.inputs["bubble_fraction"] == 3 / 16
    slowest = max(p.inputs["stage_micro_batch_ms"].values())
    assert p.terms["pipeline_bubble"] == pytest.approx(1.5 * slowest)
    assert p.step_time_ms == pytest.approx(sum(p.terms.values()))


def test_the_interleaved_schedule_sends_beside_compute():
    """With VPP and overlap_p2p_comm (Megatron's default) a micro-batch's sends hide behind the
    stage's compute; only the PP-1 hops forward and backward of the fill and drain wait on them.
    Without virtual stages (Megatron turns the overlap off) or with it off, every send counts."""
    from moetune.estimate import comm
    c = TrainingConfig(pp=4, vpp=2, micro_batch=1, global_batch=16)
    sends = comm.pp_sends(TOY, c, Rates())["ms"]
    p = predict(TOY, c, NODE, world=8)
    off = predict(TOY, c.replace(overlap_p2p_comm=False), NODE, world=8)
    assert sends > 0 and p.terms["pp_sends"] == 0 and off.terms["pp_sends"] == pytest.approx(8 * sends)
    slowest = max(p.inputs["stage_micro_batch_ms"].values())
    assert p.terms["pipeline_bubble"] == pytest.approx(1.5 * slowest + 3 * sends / 2)
    one_f_one_b = TrainingConfig(pp=4, micro_batch=1, global_batch=16)
    assert predict(TOY, one_f_one_b, NODE, world=8).terms["pp_sends"] == pytest.approx(
        8 * comm.pp_sends(TOY, one_f_one_b, Rates())["ms"])


def test_a_micro_batch_lasts_at_least_its_traffic_over_the_nic():
    """Qwen3-30B-A3B at EP 16 over two 8-GPU domains under Megatron FSDP, the EP overlap hiding the
    all-to-all and FSDP hiding its gathers behind compute: each alone fits beside the compute, but
    on a NIC at half the data sheet's rate their traffic together outlasts the micro-batch, which
    then lasts as long as the NIC is busy, the excess in their terms; at the full rate the floor
    does not bind and the micro-batch is the stream's."""
    from moetune.experiment.schema import load_experiment
    m = load_experiment("qwen3_30b_a3b").model
    c = TrainingConfig(ep=16, etp=1, micro_batch=1, global_batch=64, dispatcher="flex", flex_backend="deepep",
                       overlap_ep_a2a=True, fsdp=True, grouped_gemm=True, cuda_graph_impl="transformer_engine")
    full = predict(m, c, NODE, world=16)  # graphed whole, the host out of the way
    assert full.inputs["nic_ms_per_micro_batch"] < full.inputs["stage_micro_batch_ms"]["0"]
    half = predict(m, c, NODE, world=16, rates=Rates(measured={"nic_gb_s": (25.0, "half the NIC (test)")}))
    nic = half.inputs["nic_ms_per_micro_batch"]
    assert half.inputs["stage_micro_batch_ms"]["0"] == pytest.approx(nic)
    a2a_alone = half.inputs["ep_a2a_ms_per_micro_batch"]
    assert a2a_alone < half.inputs["compute_ms_per_micro_batch"] < nic
    assert half.terms["ep_a2a"] > full.terms["ep_a2a"] and half.terms["dp_param_gather"] > full.terms["dp_param_gather"]
    assert half.step_time_ms == pytest.approx(sum(half.terms.values()))


def test_gradient_accumulation_fusion_takes_one_launch_a_te_weight():
    """Where the image has apex (TE spec) each TE linear weight adds its own gradient inside its wgrad
    GEMM: one launch fewer a weight, a layer and micro-batch (attention's 2, each local expert's 2:
    18 at 8 local experts, as measured), so the host's time shrinks by those launches' cost; the local
    spec and an image without apex launch them all."""
    from moetune.estimate import flops
    c = TrainingConfig(ep=1, micro_batch=1, global_batch=8)
    w = flops.stage_work(TOY, c, Rates())[0]
    assert w.grad_adds == TOY.num_layers * (2 + 2 * 8)
    fused = predict(TOY, c, NODE, world=8)
    plain = predict(TOY, c, step.Node("H100", 8, 8, has_apex=False), world=8)
    rates = Rates()
    saved = w.grad_adds * rates["host_us_per_kernel"] / 1e3
    assert plain.inputs["host_launch_ms_per_micro_batch"] - fused.inputs["host_launch_ms_per_micro_batch"] == \
        pytest.approx(saved)
    local = c.replace(transformer_impl="local")
    assert predict(TOY, local, NODE, world=8).inputs["host_launch_ms_per_micro_batch"] == pytest.approx(
        predict(TOY, local, step.Node("H100", 8, 8, has_apex=False), world=8).inputs["host_launch_ms_per_micro_batch"])


def test_mla_attention_has_its_projections_weights():
    from moetune.estimate import flops
    assert flops.attention_weights(TOY) == 2
    assert flops.attention_weights(ModelArch(**{**TOY.__dict__, "multi_latent_attention": True, "q_lora_rank": 64})) == 5
    assert flops.attention_weights(ModelArch(**{**TOY.__dict__, "multi_latent_attention": True})) == 4


def test_graphed_share_of_launches():
    """No graphs: the host launches everything; TE's partial graphs of attn, moe_router and
    moe_preprocess remove the measured 0.4251 of a micro-batch's launches, one of the three scopes a
    third of it; a whole-iteration graph removes them all."""
    r = Rates()
    te = TrainingConfig(cuda_graph_impl="transformer_engine")
    assert step.graphed_share(TrainingConfig(), r) == 0.0
    assert step.graphed_share(te.replace(cuda_graph_modules=("attn", "moe_router", "moe_preprocess")), r) == 0.4251
    assert step.graphed_share(te.replace(cuda_graph_modules=("attn",)), r) == pytest.approx(0.4251 / 3)
    assert step.graphed_share(TrainingConfig(cuda_graph_impl="full_iteration"), r) == 1.0


def test_host_time_of_launches():
    """1000 kernels at the measured cost a launch, whatever CPUs a rank has (a count the model no
    longer reads: the step did not move with it where measured); FP8 launches fp8_launch_factor
    times as many; graphs of all three scopes leave 1 - cuda_graph_te_launches_removed of them."""
    r, c = Rates(), TrainingConfig()
    us = r["host_us_per_kernel"]
    assert step.host_ms(1000, c, r) == pytest.approx(us)
    fp8 = c.replace(fp8_format="e4m3", fp8_recipe="tensorwise")
    assert step.host_ms(1000, fp8, r) == pytest.approx(us * r["fp8_launch_factor"])
    graphs = c.replace(cuda_graph_impl="transformer_engine", cuda_graph_modules=("attn", "moe_router", "moe_preprocess"))
    assert step.host_ms(1000, graphs, r) == pytest.approx(us * (1 - r["cuda_graph_te_launches_removed"]))
    slow = Rates(measured={"host_us_per_kernel": (2 * us, "a cluster's calibration")})
    assert step.host_ms(1000, c, slow) == pytest.approx(2 * us)


def test_virtual_stages_add_the_hosts_passes():
    """A rank's VPP stages make 2 (VPP - 1) passes a micro-batch beyond one stage's, each at the
    measured host time a pass; none at PP 1, at one virtual stage or under a whole-iteration graph.
    In a prediction the stage's host time a micro-batch grows by exactly that."""
    r = Rates()
    per = r["host_ms_per_virtual_stage_pass"]
    c = TrainingConfig(pp=4, vpp=4, micro_batch=1, global_batch=16)
    assert step.virtual_stage_host_ms(c, r) == pytest.approx(6 * per)
    assert step.virtual_stage_host_ms(c.replace(vpp=2), r) == pytest.approx(2 * per)
    assert step.virtual_stage_host_ms(c.replace(vpp=None), r) == 0.0
    assert step.virtual_stage_host_ms(c.replace(cuda_graph_impl="full_iteration"), r) == 0.0
    assert step.virtual_stage_host_ms(TrainingConfig(pp=1), r) == 0.0
    interleaved = predict(TOY, c.replace(vpp=2), NODE, world=8)
    none = predict(TOY, c.replace(vpp=None), NODE, world=8)
    assert (interleaved.inputs["host_launch_ms_per_micro_batch"] - none.inputs["host_launch_ms_per_micro_batch"]
            == pytest.approx(2 * per))


def _host_exposed(host: float, stream: float) -> float:
    """What step.py adds to a stream for its host, by hand: the larger of the two, and the
    measured excess at their ratio."""
    return max(host, stream) * (1 + Rates().curve("host_wait_excess").at(host / stream)) - stream


def test_host_shows_beyond_the_gpu_stream_and_near_balance():
    """One GPU, no communication: a micro-batch takes the larger of the host's launch time and the
    GPU's compute, times one plus the measured excess at their ratio. Micro batch 1 on a host 8x
    slower a launch (as a cluster's calibration could say): the host sets the pace and the host
    term is what it takes beyond the compute with that excess; micro batch 16 on a host 4x faster:
    the GPU's 16 sequences take longer than the same launches, and the host shows only as the
    excess at that ratio."""
    us = Rates()["host_us_per_kernel"]
    host_at = lambda k: Rates(measured={"host_us_per_kernel": (k * us, "test")})  # noqa: E731
    c = TrainingConfig(micro_batch=1, global_batch=4)
    slow = predict(TOY, c, NODE, world=1, rates=host_at(8))
    i = slow.inputs
    host, gpu = i["host_launch_ms_per_micro_batch"], i["compute_ms_per_micro_batch"]
    assert host > gpu
    assert slow.terms["host_launch"] == pytest.approx(4 * _host_exposed(host, gpu))
    assert slow.inputs["stage_micro_batch_ms"]["0"] == pytest.approx(gpu + _host_exposed(host, gpu))
    big = TrainingConfig(micro_batch=16, global_batch=64)
    fast = predict(TOY, big, NODE, world=1, rates=host_at(0.25))
    host, gpu = fast.inputs["host_launch_ms_per_micro_batch"], fast.inputs["compute_ms_per_micro_batch"]
    assert host < gpu
    assert fast.terms["host_launch"] == pytest.approx(4 * _host_exposed(host, gpu))
    assert fast.terms["host_launch"] < 0.25 * 4 * gpu


def test_the_wait_excess_peaks_at_balance_and_fades_either_way():
    """host_wait_excess: 0 with no host, the most at host = stream, less the further either is
    ahead, and read on straight lines between its points (held beyond the last)."""
    curve = Rates().curve("host_wait_excess")
    at = {r: curve.at(r) for r in (0.0, 0.4, 0.88, 1.0, 1.5, 3.0, 50.0)}
    assert at[0.0] == 0.0
    assert at[1.0] == max(at.values()) > at[0.88] > at[0.4] > 0
    assert at[1.0] > at[1.5] > at[3.0] >= at[50.0] > 0
    (x0, y0), (x1, y1) = curve.points[3], curve.points[4]
    assert curve.at((x0 + x1) / 2) == pytest.approx((y0 + y1) / 2)


def test_the_ep_overlap_hides_only_the_micro_batches_that_pair_up():
    """Without a pipeline the first forward and the last backward run alone: (M-1)/M of the
    passes pair up, none of one micro-batch's; with interleaved 1F1B, the chunks past the warm-up;
    so with one micro-batch a step the overlap hides nothing and with more it hides more."""
    assert step.ep_overlapped_share(TrainingConfig(), 1) == 0.0
    assert step.ep_overlapped_share(TrainingConfig(), 2) == 0.5
    assert step.ep_overlapped_share(TrainingConfig(), 64) == pytest.approx(63 / 64)
    # PP 8 VPP 4, 32 micro-batches: stage 0 warms up (8-1)*2 + 3*8 = 38 of 128 chunks, the last 24
    c = TrainingConfig(pp=8, vpp=4)
    assert step.ep_overlapped_share(c, 32, 0) == pytest.approx(90 / 128)
    assert step.ep_overlapped_share(c, 32, 7) == pytest.approx(104 / 128)
    node, exp_model = NODE, TOY
    base = TrainingConfig(ep=8, micro_batch=1, global_batch=1)
    one = predict(exp_model, base.replace(overlap_ep_a2a=True), node, 8)
    assert one.terms["ep_a2a"] == pytest.approx(predict(exp_model, base, node, 8).terms["ep_a2a"])
    many = base.replace(global_batch=16)
    assert predict(exp_model, many.replace(overlap_ep_a2a=True), node, 8).terms["ep_a2a"] < \
        predict(exp_model, many, node, 8).terms["ep_a2a"]


def test_fsdp_exposes_a_passs_first_gather_and_last_reduce_and_what_its_compute_cannot_hide():
    """Eight layers, 80 ms to gather forward and backward and to reduce: with ample compute only the
    first layer's gathers and the last layer's reduce (10 ms each) are left; with 50 ms of forward and
    100 ms of backward the rest shows too, the backward's split between gather and reduce by volume."""
    fs = {"forward_gather_ms": 80.0, "backward_gather_ms": 80.0, "backward_reduce_ms": 80.0}
    assert step.fsdp_exposed(fs, 8, 1e3, 2e3) == pytest.approx((20.0, 10.0))
    gather, reduce = step.fsdp_exposed(fs, 8, 50.0, 100.0)
    assert gather == pytest.approx(10 + 20 + 10 + 40 / 2) and reduce == pytest.approx(10 + 40 / 2)


def test_fsdp_replaces_the_data_parallel_collectives_in_the_step():
    """Under FSDP the step's DP terms are its micro-batches' exposed gathers and reduces, part of each
    micro-batch's time; the terms still add up to the step, and the JSON says what was gathered."""
    c = TrainingConfig(ep=8, etp=1, micro_batch=1, global_batch=32, distributed_optimizer=True)
    node = NODE
    dist, fsdp = predict(TOY, c, node, world=16), predict(TOY, c.replace(fsdp=True), node, world=16)
    d = fsdp.inputs["dp_sync"]
    assert fsdp.inputs["fsdp"] and d["strategy"] == "optim_grads_params" and d["forward_gather_ms"] > 0
    mb = fsdp.inputs["micro_batches"]
    assert fsdp.terms["dp_param_gather"] == pytest.approx(mb * d["exposed_gather_ms_per_micro_batch"])
    assert fsdp.terms["dp_grad_reduce"] == pytest.approx(mb * d["exposed_reduce_ms_per_micro_batch"])
    assert fsdp.terms["compute"] == pytest.approx(dist.terms["compute"])
    assert fsdp.step_time_ms == pytest.approx(sum(fsdp.terms.values()))
    assert not dist.inputs["fsdp"] and "forward_gather_ms" not in dist.inputs["dp_sync"]
